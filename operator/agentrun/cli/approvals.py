"""``agentrun approvals``: the approval queue from the command line.

``list`` shows the runs in phase AwaitingApproval, oldest request first; ``show`` prints one
pending call (its arguments and deadline); ``approve`` / ``reject`` set exactly the annotations a
user would type with kubectl (``approved=true|false`` and ``agentrun.dev/reason``), and only on
a run that is waiting right now, so a decision is never queued in advance.

The formatting (``queue_rows``, ``format_table``; columns and durations from ``cli.output``) is
pure: rows are built from AgentRun dicts and ``now``; the Kubernetes I/O lives in ``_api`` and the
click commands.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from agentrun.api.approval import ANN_APPROVED, ANN_REASON
from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.api.types import parse_time
from agentrun.cli.kube import (
    CLIError,
    api_error,
    check_namespace_flags,
    connect,
    current_options,
    get_run,
    kube_options,
    list_runs,
)
from agentrun.cli.output import columns, human_duration

AWAITING = "AwaitingApproval"
COLUMNS = ("NAMESPACE", "NAME", "OWNER", "TOOL", "LAP", "AGE", "DEADLINE", "ON-TIMEOUT")


# ------------------------------------------------------------------------------- pure formatting

def queue_rows(runs: list[dict], now: datetime, owner: str | None = None) -> list[dict]:
    """The approval queue: one row per run in phase AwaitingApproval (optionally of one owner),
    oldest request first (then namespace, name). ``now`` must be timezone-aware."""
    rows = []
    for run in runs:
        st = run.get("status") or {}
        if st.get("phase") != AWAITING:
            continue
        meta = run.get("metadata") or {}
        spec_ap = (run.get("spec") or {}).get("approval") or {}
        ap = st.get("approval") or {}
        who = ap.get("owner") or st.get("waitingOn") or spec_ap.get("owner") or "unassigned"
        if owner is not None and who != owner:
            continue
        requested = parse_time(ap.get("requestedAt")) or parse_time(meta.get("creationTimestamp"))
        deadline = parse_time(ap.get("deadline"))
        rows.append({
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "owner": who,
            "tool": ap.get("tool") or "",
            "lap": ap.get("lap", st.get("lap")),
            "callId": ap.get("callId"),
            "requestedAt": ap.get("requestedAt"),
            "deadline": ap.get("deadline"),
            "ageSeconds": int((now - requested).total_seconds()) if requested else None,
            "secondsLeft": int((deadline - now).total_seconds()) if deadline else None,
            "onTimeout": spec_ap.get("onTimeout", "reject"),
            "_sort": requested or datetime.max.replace(tzinfo=UTC),
        })
    rows.sort(key=lambda r: (r["_sort"], r["namespace"], r["name"]))
    for r in rows:
        del r["_sort"]
    return rows


def deadline_cell(seconds_left: int | None) -> str:
    if seconds_left is None:
        return "<none>"
    return "overdue" if seconds_left <= 0 else human_duration(seconds_left)


def table_cells(row: dict) -> list[str]:
    return [
        row["namespace"], row["name"], row["owner"], row["tool"] or "<none>",
        "<none>" if row["lap"] is None else str(row["lap"]),
        "<unknown>" if row["ageSeconds"] is None else human_duration(row["ageSeconds"]),
        deadline_cell(row["secondsLeft"]), row["onTimeout"],
    ]


def format_table(rows: list[dict]) -> str:
    """kubectl-like columns, left-aligned, three spaces apart."""
    return columns(COLUMNS, [table_cells(r) for r in rows])


def show_text(run: dict, now: datetime) -> str:
    """The pending call of one waiting run: who, which tool, its arguments (JSON), the deadline."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    ap = st.get("approval") or {}
    rows = queue_rows([run], now)
    row = rows[0] if rows else None
    args_raw = ap.get("arguments")
    try:
        args = json.dumps(json.loads(args_raw), indent=2, sort_keys=True) if args_raw else "<none>"
    except ValueError:  # truncated to 4 KiB by the status: print it as stored
        args = args_raw
    out = [
        f"Name:        {meta.get('namespace', '')}/{meta.get('name', '')}",
        f"Phase:       {st.get('phase', 'Pending')}",
        f"Approval:    {ap.get('state', '<none>')}",
        f"Owner:       {row['owner'] if row else ap.get('owner', '<none>')}",
        f"Tool:        {ap.get('tool', '<none>')}",
        f"Lap:         {ap.get('lap', '<none>')}",
        f"Call id:     {ap.get('callId', '<none>')}",
        f"Requested:   {ap.get('requestedAt', '<none>')}"
        + (f" ({human_duration(row['ageSeconds'])} ago)" if row and row["ageSeconds"] is not None else ""),
        f"Deadline:    {ap.get('deadline', '<none>')}"
        + (f" ({deadline_cell(row['secondsLeft'])}{' left' if row['secondsLeft'] > 0 else ''})"
           if row and row["secondsLeft"] is not None else ""),
        f"On timeout:  {((run.get('spec') or {}).get('approval') or {}).get('onTimeout', 'reject')}",
    ]
    if ap.get("decision"):
        out.append(f"Decision:    {ap['decision']}" + (f" ({ap['reason']})" if ap.get("reason") else ""))
    out += ["Arguments:", args]
    return "\n".join(out)


def decision_patch(approve: bool, reason: str | None, resource_version: str | None) -> dict:
    """The metadata merge patch of a decision: the annotations a user would type with kubectl.
    With the resourceVersion the run was read at, the API server refuses the patch (409) if the
    run changed in between (e.g. timed out), so the check and the decision are one step."""
    annotations = {ANN_APPROVED: "true" if approve else "false"}
    if reason:
        annotations[ANN_REASON] = reason
    meta: dict[str, Any] = {"annotations": annotations}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


# ------------------------------------------------------------------------------------------ I/O

def _api() -> tuple[Any, str]:
    """A CustomObjectsApi and the default namespace, from the command's kubectl-like flags."""
    return connect()


def _now() -> datetime:
    return datetime.now(UTC)


def _get_run(api: Any, ns: str, name: str) -> dict:
    return get_run(api, ns, name)


@click.group("approvals", invoke_without_command=True, short_help="The approval queue (every namespace); list, show, approve, reject.")
@kube_options(all_namespaces=True)
@click.option("--owner", default=None, help="Only runs waiting on this owner.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def approvals_command(ctx: click.Context, owner: str | None, output: str) -> None:
    """The approval queue: list, show, approve and reject runs waiting for a human decision.

    Without a subcommand, lists the queue of every namespace (or of -n NAMESPACE): the runs in
    phase AwaitingApproval with owner, tool, lap, age, deadline and onTimeout, oldest first."""
    if ctx.invoked_subcommand is None:
        opts = current_options()
        _list(owner, output, all_namespaces=opts.all_namespaces or not opts.namespace)


@approvals_command.command("list")
@kube_options(all_namespaces=True)
@click.option("--owner", default=None, help="Only runs waiting on this owner.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def list_command(owner: str | None, output: str) -> None:
    """Runs in phase AwaitingApproval, oldest request first (default: the context's namespace)."""
    _list(owner, output, all_namespaces=current_options().all_namespaces)


def _list(owner: str | None, output: str, all_namespaces: bool) -> None:
    opts = current_options()
    check_namespace_flags(opts)
    namespace = opts.namespace
    api, default_ns = _api()
    items = list_runs(api, None if all_namespaces else (namespace or default_ns))
    rows = queue_rows(items, _now(), owner=owner)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        click.echo(format_table(rows))
    else:
        where = "any namespace" if all_namespaces else f"namespace {namespace or default_ns}"
        click.echo(f"No runs awaiting approval in {where}" + (f" for owner {owner}" if owner else "") + ".",
                   err=True)


@approvals_command.command("show")
@click.argument("name")
@kube_options()
def show_command(name: str) -> None:
    """The pending call of a run: its arguments (JSON) and the deadline."""
    api, default_ns = _api()
    run = _get_run(api, current_options().namespace or default_ns, name)
    click.echo(show_text(run, _now()))


def _decide(name: str, reason: str | None, approve: bool) -> None:
    from kubernetes.client.exceptions import ApiException

    api, default_ns = _api()
    ns = current_options().namespace or default_ns
    run = _get_run(api, ns, name)
    st = run.get("status") or {}
    phase = st.get("phase") or "Pending"
    verb = "approve" if approve else "reject"
    if phase != AWAITING:
        raise CLIError(f"agentrun {ns}/{name} is not awaiting approval (phase {phase}); "
                       f"nothing to {verb}. A decision is never queued in advance.")
    ap = st.get("approval") or {}
    deadline = parse_time(ap.get("deadline"))
    if deadline is not None and deadline <= _now():
        click.echo(f"warning: the deadline {ap.get('deadline')} has passed by this machine's clock; if the "
                   f"operator has already applied onTimeout, this decision is ignored (check the phase with "
                   f"`kubectl get agentrun {name} -n {ns}`).", err=True)
    body = decision_patch(approve, reason, (run.get("metadata") or {}).get("resourceVersion"))
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)
    except ApiException as e:
        if e.status == 409:
            raise CLIError(f"agentrun {ns}/{name} changed while deciding; run `agentrun approvals show "
                           f"{name} -n {ns}` and try again.") from None
        raise api_error(e, f'patch agentrun "{name}" in namespace "{ns}"') from None
    except Exception as e:
        raise CLIError(f"cannot patch agentrun {ns}/{name}: {e}") from None
    annotations = " ".join(f"{k}={json.dumps(v) if ' ' in v else v}"
                           for k, v in body["metadata"]["annotations"].items())
    click.echo(f"agentrun {ns}/{name}: {'approved' if approve else 'rejected'} call {ap.get('callId', '?')} of tool {ap.get('tool', '?')} "
               f"(lap {ap.get('lap', '?')}), annotated {annotations}; the operator resumes the run.")


@approvals_command.command("approve")
@click.argument("name")
@kube_options()
@click.option("--reason", default=None, help="Reason recorded with the decision (agentrun.dev/reason).")
def approve_command(name: str, reason: str | None) -> None:
    """Approve the pending call of a waiting run (annotation approved=true)."""
    _decide(name, reason, approve=True)


@approvals_command.command("reject")
@click.argument("name")
@kube_options()
@click.option("--reason", default=None, help="Reason recorded with the decision (agentrun.dev/reason).")
def reject_command(name: str, reason: str | None) -> None:
    """Reject the pending call of a waiting run (annotation approved=false)."""
    _decide(name, reason, approve=False)


# The top-level verbs: `agentrun approve RUN [--reason]`, `agentrun reject RUN --reason`.

@click.command("approve", short_help="Approve the pending tool call of RUN.")
@click.argument("run")
@kube_options()
@click.option("--reason", default=None, help="Reason recorded with the decision (agentrun.dev/reason).")
def approve_run_command(run: str, reason: str | None) -> None:
    """Approve the pending tool call of RUN: sets the annotations `approved=true` (and
    `agentrun.dev/reason`), exactly what `kubectl annotate agentrun RUN approved=true` sets.
    Refused unless RUN is in phase AwaitingApproval."""
    _decide(run, reason, approve=True)


@click.command("reject", short_help="Reject the pending tool call of RUN (--reason required).")
@click.argument("run")
@kube_options()
@click.option("--reason", required=True, help="Why the call is rejected (required; agentrun.dev/reason).")
def reject_run_command(run: str, reason: str) -> None:
    """Reject the pending tool call of RUN: sets `approved=false` and `agentrun.dev/reason`. The
    agent gets the rejection as the tool's result and the run continues. Refused unless RUN is in
    phase AwaitingApproval."""
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")
    _decide(run, reason, approve=False)
