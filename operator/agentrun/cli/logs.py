"""``agentrun logs RUN [--lap N] [-f]``: what a lap printed, from its pod while the pod exists (the
pod log API), else the lap's stored output from the checkpoint store (the LapRecord: the model's
messages and the tool calls with their results; what ``agentrun trace`` reads).

The lap pods are found by the labels the operator puts on every lap Job's pod template
(``controller/decide/jobs.py``; the names are checked against it by tests/cli/test_verbs.py): the run's uid
and the lap. With ``-f`` the current lap's pod log is streamed, then each next lap's, until the run
ends. ``stored_lines`` is pure; every model or tool text is bounded and its control characters
escaped (``api.text.one_line``) before it reaches the terminal.
"""

from __future__ import annotations

import os
import time
from typing import Any

import click

from agentrun.api.contract import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID
from agentrun.api.status import TERMINAL_PHASES
from agentrun.api.text import one_line
from agentrun.checkpoint.errors import CheckpointError, CheckpointNotFound
from agentrun.checkpoint.schema import LapRecord, RunRef
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.kube import CLIError, complete_runs, connect, core_api, current_options, get_run, kube_options

MAX_LINE_CHARS = 4096
MAX_TEXT_LINES = 200


def stored_lines(record: LapRecord) -> list[str]:
    """The stored output of a lap: each message's text (line by line, bounded), each tool call with
    its status and result, then the outcome."""
    out = [f"# lap {record.lap} attempt {record.attempt} (from the checkpoint store), outcome {record.outcome.type}"]
    for m in record.messages:
        text = (m.content or "").splitlines()
        who = m.role + (f"[{m.tool_call_id}]" if m.tool_call_id else "")
        for line in text[:MAX_TEXT_LINES]:
            out.append(f"{who}: {one_line(line, MAX_LINE_CHARS)}")
        if len(text) > MAX_TEXT_LINES:
            out.append(f"{who}: ... ({len(text) - MAX_TEXT_LINES} more lines: `agentrun trace --lap {record.lap} -o json`)")
        for tc in m.tool_calls:
            out.append(f"{who}: calls {one_line(tc.name, 128)}#{one_line(tc.id, 128)}")
    for c in record.tool_calls:
        http = f" http {c.http_status}" if c.http_status is not None else ""
        out.append(f"tool {one_line(c.tool, 128)} call {one_line(c.call_id, 128)}: {c.status}{http}"
                   + (" (replayed)" if c.replayed else ""))
        if c.result is not None:
            out.append(f"  result {one_line(c.result, MAX_LINE_CHARS)}")
    if record.outcome.message:
        out.append(f"# {record.outcome.type}: {one_line(record.outcome.message, 1024)}")
    return out


def pod_key(pod: Any) -> tuple[int, int, str]:
    labels = pod.metadata.labels or {}

    def num(v: Any) -> int:
        return int(v) if str(v).isdigit() else 0

    return num(labels.get(LABEL_LAP)), num(labels.get(LABEL_ATTEMPT)), str(pod.metadata.creation_timestamp or "")


def _pods(ns: str, uid: str, lap: int | None) -> list[Any]:
    selector = f"{LABEL_RUN_UID}={uid}" + (f",{LABEL_LAP}={lap}" if lap is not None else "")
    try:
        return sorted(core_api().list_namespaced_pod(ns, label_selector=selector).items, key=pod_key)
    except Exception as e:
        from agentrun.cli.kube import api_error

        raise api_error(e, f'list the lap pods of agentrun uid {uid} in namespace "{ns}"') from None


def _started(pod: Any) -> bool:
    return (pod.status.phase or "") in ("Running", "Succeeded", "Failed")


def _print_pod(ns: str, pod: Any, follow: bool) -> bool:
    """Print (or stream) the pod's log; False when it cannot be read (e.g. the pod went away)."""
    lap, attempt, _ = pod_key(pod)
    click.echo(f"# lap {lap} attempt {attempt} (pod {pod.metadata.name})", err=True)
    try:
        if not follow:
            text = core_api().read_namespaced_pod_log(pod.metadata.name, ns)
            click.echo(text, nl=False)
            return True
        resp = core_api().read_namespaced_pod_log(pod.metadata.name, ns, follow=True, _preload_content=False)
        try:
            for chunk in resp.stream(4096):
                click.echo(chunk.decode("utf-8", "replace"), nl=False)
        finally:
            resp.release_conn()
        return True
    except Exception as e:
        click.echo(f"warning: the log of pod {pod.metadata.name} is not readable "
                   f"({getattr(e, 'status', '') or type(e).__name__})", err=True)
        return False


def _print_stored(run: dict[str, Any], lap: int) -> None:
    from agentrun.checkpoint.locate import resolve_store
    from agentrun.cli.trace import open_store, store_error

    meta = run["metadata"]
    where = resolve_store({}, os.environ, run)
    if not where["uri"]:
        raise CLIError(f'no pod of lap {lap} of agentrun "{meta["name"]}" and no checkpoint store known: set '
                       "AGENTRUN_CHECKPOINT_URI (or see `agentrun trace --help`)")
    store = open_store(where, run)
    ref = RunRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
    try:
        record, _ = store.get_lap(ref, lap)
    except CheckpointNotFound:
        raise CLIError(f'lap {lap} of agentrun "{meta["name"]}" has no pod and was never checkpointed',
                       ExitCode.NOT_FOUND) from None
    except CheckpointError as e:
        raise store_error(e, where) from None
    click.echo("\n".join(stored_lines(record)))


@click.command("logs", short_help="What a lap printed: its pod's log, else its stored output.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--lap", type=click.IntRange(min=1), default=None,
              help="This lap (default: the lap in flight, else the last checkpointed one).")
@click.option("-f", "--follow", is_flag=True, help="Stream the log, then each next lap's, until the run ends.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between looks for the next lap's pod with -f.")
def logs_command(run: str, lap: int | None, follow: bool, interval: float) -> None:
    """Print what a lap of RUN printed: the log of its pod (the newest attempt) while the pod exists,
    else the lap's stored output from the checkpoint store (the model's messages, the tool calls
    and their results). With -f, stream it and then each next lap's pod until the run ends."""
    api, ns = connect(current_options())
    obj = get_run(api, ns, run)
    uid = obj["metadata"]["uid"]
    pods = [p for p in _pods(ns, uid, lap) if _started(p)]
    done: set[str] = set()
    if pods:
        newest = pods[-1]
        done.add(newest.metadata.name)
        if not _print_pod(ns, newest, follow) and pod_key(newest)[0]:
            _print_stored(obj, pod_key(newest)[0])  # the pod's log is gone (or not served): the stored output
    else:
        at = lap or int((obj.get("status") or {}).get("lap") or 0)
        if at:
            _print_stored(obj, at)
        elif not follow:
            raise CLIError(f'agentrun {ns}/{run} has no lap yet', ExitCode.NOT_FOUND)
    if not follow or lap is not None:
        return
    while True:
        fresh = [p for p in _pods(ns, uid, None) if _started(p) and p.metadata.name not in done]
        if fresh:
            done.add(fresh[-1].metadata.name)
            _print_pod(ns, fresh[-1], True)
            continue
        st = get_run(api, ns, run).get("status") or {}
        if st.get("phase") in TERMINAL_PHASES:
            click.echo(f"# agentrun {ns}/{run}: {st.get('phase')}", err=True)
            return
        time.sleep(interval)
