"""``agentrun trace RUN``: the per-lap trace of a run, read from its checkpoint store.

The run's UID and the store's location are found in the cluster; flags and the environment
override them (for each of uri, endpoint, region, path style, the first that is set wins):

1. the flags ``--uri``, ``--endpoint``, ``--region``, ``--path-style``;
2. the environment ``AGENTRUN_CHECKPOINT_URI``, ``AGENTRUN_S3_ENDPOINT``, ``AGENTRUN_S3_REGION``,
   ``AGENTRUN_S3_PATH_STYLE`` (the lap Job's variables);
3. the AgentRun's ``spec.checkpoint`` (uri, endpoint, region, pathStyle);
4. the AgentRun's ``status.checkpoint``: the operator records the full ``s3://`` URI of the last
   checkpoint object (the store prefix is what precedes ``<ns>/<name>/<uid>/``) and the endpoint,
   region and path style it reads the store with (its defaults, e.g. the Helm values).

Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, ...), as for every S3 client. With ``--uid`` and a URI (flag or environment) the
cluster is not asked at all.

Output: ``-o text`` (default) is a table per lap with the messages, tool calls (arguments,
idempotency key, status, result) and approvals under it; ``-o json`` is ONE JSON document
``{"run", "store", "forkedFrom", "retries", "laps": [LapRecord...], "totals"}`` (``retries``: the
run's retries in place from status.lifecycle, null without any or with ``--uid``); with ``--follow``, JSON
lines: one ``LapRecord`` object per line as laps are written, then one ``{"kind": "End", ...}``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import click

from agentrun.api.contract import history_dir
from agentrun.api.status import TERMINAL_PHASES
from agentrun.checkpoint.errors import CheckpointError, CheckpointNotFound
from agentrun.checkpoint.locate import open_located, resolve_store
from agentrun.checkpoint.schema import LapRecord, RunRef
from agentrun.checkpoint.trace import format_lap, format_trace, lap_doc, one_line
from agentrun.cli.exitcodes import outcome_code
from agentrun.cli.kube import CLIError, complete_runs, connect, current_options, get_run, kube_options, load_config
from agentrun.cli.output import OutputFormat, render, terminal_width

# ------------------------------------------------------------------------------------ pure parts

#: status.lifecycle's fields about retries in place, as the trace reports them (``retries``)
RETRY_FIELDS = ("retries", "lastRetryBy", "lastRetryAt", "lastRetryFromPhase", "lastRetryFromLap", "retriedLap",
                "attemptsBeforeRetry", "rewinds")


def retries_of(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The run's retries in place (status.lifecycle, written by the operator; the requester stamped
    by the API server), or None when it has none or the cluster was not asked (``--uid``): the
    store keeps the laps, not who asked for them again."""
    life = (((body or {}).get("status") or {}).get("lifecycle")) or {}
    if not life.get("retries"):
        return None
    return {k: life[k] for k in RETRY_FIELDS if life.get(k) is not None}


def trace_doc(run: RunRef, store: Mapping[str, Any], forked_from: Mapping[str, Any] | None,
              laps: list[tuple[LapRecord, Any]], retries: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON document of ``agentrun trace -o json``."""
    last = laps[-1][0] if laps else None
    return {
        "run": run.to_api(),
        "store": {k: store[k] for k in ("uri", "endpoint", "region", "pathStyle")},
        "forkedFrom": dict(forked_from) if forked_from else None,
        "retries": dict(retries) if retries else None,
        "laps": [lap_doc(r, getattr(o, "key", None), getattr(o, "sha256", None), getattr(o, "size", None))
                 for r, o in laps],
        "totals": last.totals.to_api() if last else None,
    }


def detail_lines(record: LapRecord, width: int = 120, size: int | None = None) -> list[str]:
    """Everything a lap did, under its summary row: messages (role, text, tool calls), each tool
    call with its arguments, idempotency key, status, HTTP status and result, the timings, and the
    bytes its checkpoint stores (``size``: the lap object's stored size, when known)."""
    ind = " " * 8
    room = max(20, width - len(ind) - 4)
    lines = []
    for m in record.messages:
        if m.role == "assistant" and m.content:
            continue  # already under the summary row
        text = m.content or ""
        if m.tool_calls:
            text = (text + " " if text else "") + "calls " + ", ".join(f"{c.name}#{c.id}" for c in m.tool_calls)
        who = m.role + (f"[{m.tool_call_id}]" if m.tool_call_id else "")
        lines.append(f"{ind}{who}: " + one_line(text, room - len(who)))
    for c in record.tool_calls:
        http = f" http {c.http_status}" if c.http_status is not None else ""
        replay = " replayed" if c.replayed else ""
        lines.append(f"{ind}tool {c.tool} call {c.call_id}: {c.status}{http}{replay}  key {c.idempotency_key}")
        lines.append(f"{ind}  args {one_line(json.dumps(c.arguments, sort_keys=True), room - 7)}")
        if c.result is not None:
            lines.append(f"{ind}  result {one_line(c.result, room - 9)}")
    t = record.timings
    lines.append(f"{ind}tokens {record.usage.input_tokens} in / {record.usage.output_tokens} out, cost "
                 f"{record.cost_usd} USD, model {t.model_seconds:.2f}s, tools {t.tools_seconds:.2f}s, "
                 f"{t.started_at.isoformat()} .. {t.finished_at.isoformat()}")
    if size is not None:
        run_total = ""
        if record.storage is not None:
            run_total = (f"; the run's checkpoints through this lap: {record.storage.bytes + size} B in "
                         f"{record.storage.objects + 1} objects")
        lines.append(f"{ind}stored {size} B (lap record, gzip){run_total}")
    return lines


def text_lap(record: LapRecord, width: int, size: int | None = None) -> list[str]:
    return format_lap(record, width) + detail_lines(record, width, size)


# ------------------------------------------------------------------------------------------ I/O

def _first_line(error: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        err = error.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "input"
        return f"{field}: {err['msg']}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def open_store(where: Mapping[str, Any], run: Mapping[str, Any] | None = None) -> Any:
    """The store at ``where``, bound to the rewinds of ``run`` (its object) when given."""
    try:
        return open_located(where, run)
    except CheckpointError as e:
        raise CLIError(str(e)) from None
    except ValueError as e:  # bad URI / endpoint
        raise CLIError(_first_line(e)) from None


def store_error(e: CheckpointError, where: Mapping[str, Any]) -> CLIError:
    at = where.get("endpoint") or "AWS"
    return CLIError(f"checkpoint store {where.get('uri')} at {at}: {_first_line(e)}")


@click.command("trace", short_help="The per-lap trace of RUN from the checkpoint store.")
@click.argument("run", required=False, shell_complete=complete_runs)
@kube_options()
@click.option("--name", "name_opt", default=None, hidden=True, help="Same as RUN (older form).")
@click.option("--uid", default=None, help="UID of the run (default: read from the cluster).")
@click.option("--lap", type=click.IntRange(min=1), default=None, help="Only this lap.")
@click.option("--from-lap", type=click.IntRange(min=1), default=1, show_default=True, help="First lap to print.")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new laps until the run ends; exit by its outcome (as `agentrun wait`).")
@click.option("-o", "--output", type=OutputFormat(("text", "json", "yaml")), default="text", show_default=True,
              help="text, JSON (one document; JSON lines with --follow), YAML, or jsonpath=TEMPLATE over the "
                   "JSON document.")
@click.option("--uri", default=None, help="Store s3://bucket/prefix (default: env, spec, status).")
@click.option("--endpoint", default=None, help="S3 endpoint URL (default: env, spec, status; else AWS).")
@click.option("--region", default=None, help="S3 region.")
@click.option("--path-style/--no-path-style", default=None, help="Path-style addressing (MinIO, moto).")
@click.option("--width", type=click.IntRange(min=40), default=None,
              help="Cut lines at this width (default: the terminal's, else 120).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between polls with --follow.")
def trace_command(run: str | None, name_opt: str | None, uid: str | None, lap: int | None, from_lap: int,
                  follow: bool, output: str, uri: str | None, endpoint: str | None, region: str | None,
                  path_style: bool | None, width: int | None, interval: float) -> None:
    """Print the per-lap trace of RUN from its checkpoint store: each lap's outcome, messages, tool
    calls with arguments, results and idempotency keys, tokens, cost and timings; for a fork, where
    it was forked from. The store is found from the cluster (see docs/cli.md); flags and the
    AGENTRUN_CHECKPOINT_URI / AGENTRUN_S3_* variables override it."""
    name = run or name_opt
    if not name:
        raise click.UsageError("RUN is required")
    if follow and output not in ("text", "json"):
        raise click.UsageError("--follow prints text or JSON lines (-o text|json)")
    width = width or terminal_width()
    if run and name_opt and run != name_opt:
        raise click.UsageError("RUN and --name differ")
    flags = {"uri": uri, "endpoint": endpoint, "region": region, "path_style": path_style}
    opts = current_options()
    env = os.environ
    body: dict[str, Any] | None = None
    api = None
    if uid and (uri or env.get("AGENTRUN_CHECKPOINT_URI")):
        namespace = opts.namespace or _namespace_quietly()
    else:
        api, namespace = connect(opts)
        body = get_run(api, namespace, name)
        uid = uid or body["metadata"]["uid"]
    where = resolve_store(flags, env, body)
    if not where["uri"]:
        raise CLIError(f'no checkpoint store known for agentrun "{name}" in namespace "{namespace}": it has no '
                       "checkpoint yet and no spec.checkpoint.uri; pass --uri or set AGENTRUN_CHECKPOINT_URI")
    try:
        ref = RunRef(namespace=namespace, name=name, uid=uid or "")
    except ValueError as e:
        raise CLIError(_first_line(e)) from None
    store = open_store(where, body)
    try:
        store.run_prefix(ref)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if body is None:  # no run object: the rewinds in place as the store's markers say
        try:
            store = store.along(store.read_rewinds(ref))
        except CheckpointError as e:
            raise store_error(e, where) from None
    fork = ((body or {}).get("spec") or {}).get("forkFrom")
    start = lap or from_lap
    try:
        forked_from = _provenance(store, ref, fork)
        if lap is not None and not follow:
            try:
                rec, obj = store.get_lap(ref, lap)
            except CheckpointNotFound:
                raise CLIError(_no_lap(name, lap, fork)) from None
            laps = [(rec, obj)]
        elif follow:
            _follow(store, ref, api, namespace, name, start, lap, output, width, interval, forked_from)
            return
        else:
            laps = list(store.iter_laps(ref, start=start))
    except CheckpointError as e:
        raise store_error(e, where) from None
    if output != "text":
        click.echo(render(output, trace_doc(ref, where, forked_from, laps, retries_of(body))),
                   nl=not output.startswith("jsonpath="))
        return
    click.echo(_heading(ref, store, forked_from, retries_of(body)), nl=False)
    click.echo(_text(laps, width), nl=False)


def _text(laps: list[tuple[LapRecord, Any]], width: int) -> str:
    # format_trace's table, with the detail lines under each lap
    head, *_ = format_trace([], width=width).splitlines()
    lines = [head]
    for record, obj in laps:
        lines += text_lap(record, width, getattr(obj, "size", None))
    if not laps:
        lines.append("(no laps)")
    else:
        t = laps[-1][0].totals
        lines.append(f"totals through lap {laps[-1][0].lap}: {t.laps} laps, {t.input_tokens}/{t.output_tokens} "
                     f"tokens, {t.cost_usd} USD")
    return "\n".join(lines) + "\n"


def retry_line(retries: Mapping[str, Any]) -> str:
    """One line for the text heading: how many retries in place, and the last one's who, when, from
    what and which lap started again (its attempts go on from attemptsBeforeRetry + 1, same keys)."""
    n = int(retries.get("retries") or 0)
    out = f"retried in place {n} time{'s' if n != 1 else ''}; the last by {one_line(str(retries.get('lastRetryBy') or '?'), 120)}"
    if retries.get("lastRetryAt"):
        out += f" at {one_line(str(retries['lastRetryAt']), 40)}"
    if retries.get("lastRetryFromPhase"):
        out += f" after {one_line(str(retries['lastRetryFromPhase']), 32)}"
    if retries.get("lastRetryFromLap") is not None:
        out += f", rewound to lap {int(retries['lastRetryFromLap'])}"
    if retries.get("retriedLap") is not None:
        rewound = retries.get("lastRetryFromLap") is not None and retries.get("rewinds")
        keys = (f"history {len(retries['rewinds'])}'s own journal and idempotency keys" if rewound
                else "the same idempotency keys")
        out += (f": lap {int(retries['retriedLap'])} started again at attempt "
                f"{int(retries.get('attemptsBeforeRetry') or 0) + 1}, with {keys}")
    return out + "\n" + rewinds_line(retries.get("rewinds") or [])


def rewinds_line(rewinds: list[Any]) -> str:
    """For the text heading, of a run rewound in place: which laps each history holds (the laps shown)."""
    if not rewinds:
        return ""
    parts = [f"history {h} (laps after {int(b)}, under {history_dir(h)})" for h, b in enumerate(rewinds, start=1)]
    return (f"rewound in place {len(rewinds)} time{'s' if len(rewinds) != 1 else ''}: " + ", ".join(parts)
            + "; the laps shown are the run's current history, abandoned laps are kept in the store, not shown\n")


def _heading(ref: RunRef, store: Any, forked_from: Mapping[str, Any] | None,
             retries: Mapping[str, Any] | None = None) -> str:
    out = f"agentrun {ref.namespace}/{ref.name} (uid {ref.uid}) at s3://{store.config.bucket}/{store.run_prefix(ref)}\n"
    if retries:
        out += retry_line(retries)
    if forked_from:
        src = forked_from["run"]
        out += (f"forked from {src['namespace']}/{src['name']} (uid {src['uid']}) at lap {forked_from['lap']} "
                f"(sha256 {forked_from.get('sha256') or '?'}); laps 1..{forked_from['lap']} are in "
                f"`agentrun trace {src['name']}`\n")
    return out


def _provenance(store: Any, ref: RunRef, fork: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not fork or not fork.get("lap"):
        return None
    try:
        state, _ = store.get_snapshot(ref, int(fork["lap"]))
    except CheckpointNotFound:  # not forked yet: say what the spec asks for
        return {"run": {"namespace": ref.namespace, "name": fork.get("name"), "uid": fork.get("uid")},
                "lap": fork.get("lap"), "sha256": None}
    return state.forked_from.to_api() if state.forked_from else None


def _no_lap(name: str, lap: int, fork: Mapping[str, Any] | None) -> str:
    msg = f'lap {lap} of agentrun "{name}" was never checkpointed'
    if fork and lap <= int(fork.get("lap") or 0):
        msg += f" (it is a fork from lap {fork['lap']} of {fork.get('name')}: see `agentrun trace {fork.get('name')}`)"
    return msg


def _namespace_quietly() -> str:
    try:
        return load_config(current_options())
    except CLIError:
        return "default"


def _follow(store: Any, ref: RunRef, api: Any, namespace: str, name: str, start: int, only: int | None,
            output: str, width: int, interval: float, forked_from: Mapping[str, Any] | None) -> None:
    """Print laps as they are written until the run is terminal (the CR's phase, or without a
    cluster the last lap's outcome done/failed). JSON lines with -o json. Exits by the outcome
    (``cli.exitcodes.OUTCOME_CODES``: 0 Succeeded) when the cluster says it; without a cluster, 0
    for a lap outcome ``done`` and 10 (FAILED) for ``failed``."""
    if output == "text":
        click.echo(_heading(ref, store, forked_from) + format_trace([], width=width).splitlines()[0])
    next_lap, phase, last = start, None, None
    while True:
        for record, obj in store.iter_laps(ref, start=next_lap):
            if only is None or record.lap == only:
                if output == "json":
                    click.echo(json.dumps(lap_doc(record, obj.key, obj.sha256, obj.size), separators=(",", ":")))
                else:
                    click.echo("\n".join(text_lap(record, width, obj.size)))
            next_lap, last = record.lap + 1, record
        if only is not None and next_lap > only:
            break
        if api is not None:
            st = (get_run(api, namespace, name).get("status") or {})
            new_phase = st.get("phase") or "Pending"
            if new_phase != phase and output == "text":
                click.echo(f"-- phase {new_phase}: {st.get('message') or ''}".rstrip(": "))
            phase = new_phase
            if phase in TERMINAL_PHASES and int(st.get("lap") or 0) < next_lap:
                break
        elif last is not None and last.outcome.type in ("done", "failed"):
            break
        time.sleep(interval)
    if output == "json":
        end = {"kind": "End", "phase": phase, "lastLap": last.lap if last else None,
               "totals": last.totals.to_api() if last else None}
        click.echo(json.dumps(end, separators=(",", ":")))
    elif last is not None:
        t = last.totals
        click.echo(f"totals through lap {last.lap}: {t.laps} laps, {t.input_tokens}/{t.output_tokens} tokens, "
                   f"{t.cost_usd} USD")
    if only is not None:
        return
    if phase is None and last is not None:
        phase = {"done": "Succeeded", "failed": "Failed"}.get(last.outcome.type)
    code = outcome_code(phase)
    if code:
        raise SystemExit(int(code))
