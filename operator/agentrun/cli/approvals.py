"""``agentrun approvals``: the approval queue from the command line.

``list`` shows the runs in phase AwaitingApproval, oldest request first; ``show`` prints one
pending call: its full arguments read from the checkpoint store (not the 4 KiB cut in status) and
their sha256 (``api.approval.arguments_sha256``); ``approve`` / ``reject`` set the annotations a
user would type with kubectl (``approved=true|false`` and ``agentrun.dev/reason``) plus the
binding of what was shown (``agentrun.dev/call-id``, ``agentrun.dev/arguments-sha256``) and the
decider (``agentrun.dev/decided-by``, the user's name from a SelfSubjectReview: required where the
API server has no MutatingAdmissionPolicy, overwritten by it where it has, see docs/security.md),
and only on a run that is waiting right now, so a decision is never queued in advance. A decision
the API server refuses (no ``approve`` permission) is one line naming the permission.

What a pending approval is, its queue rows, the binding of the call that was shown, the decision
patch and the refusal text are ``agentrun.api.approval``'s, shared with the inbox and the operator;
this module formats them (``format_table``, ``show_text``) and does the Kubernetes I/O (``_api`` and
the click commands).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from agentrun.api.approval import (
    ANN_DECIDED_BY,
    AWAITING,
    StoredCall,
    approval_lap,
    approvals_text,
    binding,
    decision_patch,
    queue_rows,
    refusal,
    target_text,
)
from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.api.text import one_line
from agentrun.api.types import human_duration, parse_time
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.kube import (
    CLIError,
    api_error,
    check_namespace_flags,
    complete_runs,
    connect,
    current_options,
    get_run,
    kube_options,
    list_runs,
)
from agentrun.cli.output import columns, output_option, render, run_name

F = TypeVar("F", bound=Callable[..., Any])
COLUMNS = ("NAMESPACE", "NAME", "OWNER", "TOOL", "TARGET", "APPROVALS", "LAP", "AGE", "DEADLINE", "ON-TIMEOUT")
TARGET_CELL_CHARS = 60


# ------------------------------------------------------------------------------- pure formatting

def deadline_cell(seconds_left: int | None) -> str:
    if seconds_left is None:
        return "<none>"
    return "overdue" if seconds_left <= 0 else human_duration(seconds_left)


def table_cells(row: dict[str, Any]) -> list[str]:
    return [
        row["namespace"], row["name"], row["owner"], row["tool"] or "<none>",
        target_text({"target": row["target"]}, TARGET_CELL_CHARS), row["approvals"],
        "<none>" if row["lap"] is None else str(row["lap"]),
        "<unknown>" if row["ageSeconds"] is None else human_duration(row["ageSeconds"]),
        deadline_cell(row["secondsLeft"]), row["onTimeout"],
    ]


def format_table(rows: list[dict[str, Any]], wide: bool = False) -> str:
    """kubectl-like columns, left-aligned, three spaces apart; ``wide`` adds CALL-ID and APPROVED-BY
    and does not cut TARGET."""
    if not wide:
        return columns(COLUMNS, [table_cells(r) for r in rows])
    cells = []
    for r in rows:
        c = table_cells(r)
        c[4] = target_text({"target": r["target"]})
        cells.append(c + [r.get("callId") or "<none>",
                          ",".join(one_line(str(u), 256) for u in r.get("approvedBy") or []) or "<none>"])
    return columns([*COLUMNS, "CALL-ID", "APPROVED-BY"], cells)


def render_queue(rows: list[dict[str, Any]], output: str) -> str:
    return render(output, rows, table=lambda: format_table(rows), wide=lambda: format_table(rows, wide=True),
                  names=lambda: [run_name(r["name"]) for r in rows], items=rows)


def show_text(run: dict[str, Any], now: datetime, stored: StoredCall | None = None) -> str:
    """The pending call of one waiting run: who, which tool, its arguments (JSON; the full ones from
    the checkpoint store when ``stored`` has them, else the 4 KiB cut of status), their sha256,
    the deadline."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    ap = st.get("approval") or {}
    rows = queue_rows([run], now)
    row = rows[0] if rows else None
    target = ap.get("target") or {}
    stored = stored or StoredCall()
    _, sha, _ = binding(run, stored)
    if stored.arguments is not None:
        args = json.dumps(stored.arguments, indent=2, sort_keys=True, ensure_ascii=False)
        source = f"from the checkpoint store, lap {stored.lap}"
    else:
        args_raw = ap.get("arguments")
        try:
            args = json.dumps(json.loads(args_raw), indent=2, sort_keys=True) if args_raw else "<none>"
        except ValueError:  # truncated to 4 KiB by the status: print it as stored
            args = str(args_raw)
        source = "from status, cut at 4 KiB"
    out = [
        f"Name:        {meta.get('namespace', '')}/{meta.get('name', '')}",
        f"Phase:       {st.get('phase', 'Pending')}",
        f"Approval:    {ap.get('state', '<none>')}",
        f"Owner:       {row['owner'] if row else ap.get('owner', '<none>')}",
        f"Tool:        {ap.get('tool', '<none>')}",
        f"Lap:         {ap.get('lap', '<none>')}",
        f"Call id:     {ap.get('callId', '<none>')}",
        f"Target:      {target_text(ap)}",
        f"Headers:     {one_line('Secret ' + target['headersSecret'], 300) if target.get('headersSecret') else '<none>'}",
        f"Image:       {one_line(target.get('image') or '<unknown>', 1024)}",
        f"Target sha256: {ap.get('targetSha256') or '<unknown>'} (the tool's definition, image and arguments; what "
        "approve binds the decision to)",
        f"Approvals:   {approvals_text(ap)}"
        + (" (" + ", ".join(one_line(str(v.get('user')), 256) + (f" at {v.get('at')}" if v.get('at') else "")
                           for v in ap.get('approvedBy') or []) + ")" if ap.get("approvedBy") else ""),
        f"Requested:   {ap.get('requestedAt', '<none>')}"
        + (f" ({human_duration(row['ageSeconds'])} ago)" if row and row["ageSeconds"] is not None else ""),
        f"Deadline:    {ap.get('deadline', '<none>')}"
        + (f" ({deadline_cell(row['secondsLeft'])}{' left' if row['secondsLeft'] > 0 else ''})"
           if row and row["secondsLeft"] is not None else ""),
        f"On timeout:  {((run.get('spec') or {}).get('approval') or {}).get('onTimeout', 'reject')}",
    ]
    if ap.get("decision"):
        out.append(f"Decision:    {ap['decision']}" + (f" ({ap['reason']})" if ap.get("reason") else "")
                   + (f" by {ap['decidedBy']}" if ap.get("decidedBy") else ""))
    out.append(f"Sha256:      {sha or '<unknown>'}"
               + (" (of the full arguments, what approve binds the decision to)" if sha else ""))
    out += [f"Arguments ({source}):", args]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ I/O

def _api() -> tuple[Any, str]:
    """A CustomObjectsApi and the default namespace, from the command's kubectl-like flags."""
    return connect()


def _now() -> datetime:
    return datetime.now(UTC)


def _get_run(api: Any, ns: str, name: str) -> dict[str, Any]:
    return get_run(api, ns, name)


def _stored_call(run: dict[str, Any]) -> StoredCall:
    """The pending call from the run's checkpoint store: the lap record of status.approval.lap
    holds it (``pendingApproval``). The store is found as ``agentrun trace`` finds it
    (``checkpoint.locate.resolve_store``: AGENTRUN_CHECKPOINT_URI/AGENTRUN_S3_*, spec, status); credentials
    from the AWS chain. Never raises: an unreadable store is reported in ``error``."""
    from agentrun.checkpoint.errors import CheckpointError
    from agentrun.checkpoint.locate import resolve_store
    from agentrun.checkpoint.schema import RunRef
    from agentrun.cli.trace import open_store, store_error

    meta = run.get("metadata") or {}
    lap = approval_lap(run)
    if lap is None:
        return StoredCall(error="the run has no lap yet")
    where = resolve_store({}, os.environ, run)
    if not where["uri"]:
        return StoredCall(error="no checkpoint store known (no status.checkpoint, spec.checkpoint.uri or "
                                "AGENTRUN_CHECKPOINT_URI)")
    try:
        store = open_store(where, run)
        ref = RunRef(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""))
        record, _ = store.get_lap(ref, lap)
    except CLIError as e:
        return StoredCall(error=e.format_message())
    except CheckpointError as e:
        return StoredCall(error=store_error(e, where).format_message())
    except Exception as e:  # credentials, network: say so, show what status has
        return StoredCall(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return StoredCall.of(record)


def _whoami() -> str | None:
    """The requesting user's name as the API server authenticates it (SelfSubjectReview,
    authentication.k8s.io/v1, Kubernetes >= 1.28), or None when it cannot be asked."""
    from kubernetes import client

    from agentrun.cli.kube import api_client

    try:  # on the configured client: with --as, the impersonated user (whom the API server stamps too)
        review = client.AuthenticationV1Api(api_client()).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
    except Exception:
        return None
    info = getattr(getattr(review, "status", None), "user_info", None)
    return getattr(info, "username", None) or None


@click.group("approvals", invoke_without_command=True, short_help="The approval queue (every namespace); list, show, approve, reject.")
@kube_options(all_namespaces=True)
@click.option("--owner", default=None, help="Only runs waiting on this owner.")
@output_option()
@click.pass_context
def approvals_command(ctx: click.Context, owner: str | None, output: str) -> None:
    """The approval queue: list, show, approve and reject runs waiting for a human decision.

    Without a subcommand, lists the queue of every namespace (or of -n NAMESPACE): the runs in
    phase AwaitingApproval with owner, tool, target (method and URL), approvals so far ("1 of 2"),
    lap, age, deadline and onTimeout, oldest first."""
    if ctx.invoked_subcommand is None:
        opts = current_options()
        _list(owner, output, all_namespaces=opts.all_namespaces or not opts.namespace)


@approvals_command.command("list")
@kube_options(all_namespaces=True)
@click.option("--owner", default=None, help="Only runs waiting on this owner.")
@output_option()
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
    if rows or output not in ("table", "wide", "name"):
        click.echo(render_queue(rows, output), nl=not output.startswith("jsonpath="))
    else:
        where = "any namespace" if all_namespaces else f"namespace {namespace or default_ns}"
        click.echo(f"No runs awaiting approval in {where}" + (f" for owner {owner}" if owner else "") + ".",
                   err=True)


@approvals_command.command("show")
@click.argument("name", shell_complete=complete_runs)
@kube_options()
def show_command(name: str) -> None:
    """The pending call of a run: where it goes (method, URL, headers Secret, image), its arguments
    (JSON), the approvals so far ("1 of 2") and the deadline."""
    api, default_ns = _api()
    run = _get_run(api, current_options().namespace or default_ns, name)
    stored = _stored_call(run) if (run.get("status") or {}).get("approval") else StoredCall()
    for w in binding(run, stored)[2]:
        click.echo(f"warning: {w}", err=True)
    click.echo(show_text(run, _now(), stored))


def _decide(name: str, reason: str | None, approve: bool, output: str = "text") -> None:
    from kubernetes.client.exceptions import ApiException

    api, default_ns = _api()
    ns = current_options().namespace or default_ns
    run = _get_run(api, ns, name)
    st = run.get("status") or {}
    phase = st.get("phase") or "Pending"
    verb = "approve" if approve else "reject"
    if phase != AWAITING:
        raise CLIError(f"agentrun {ns}/{name} is not awaiting approval (phase {phase}); "
                       f"nothing to {verb}. A decision is never queued in advance.", ExitCode.CONFLICT)
    ap = st.get("approval") or {}
    deadline = parse_time(ap.get("deadline"))
    if deadline is not None and deadline <= _now():
        click.echo(f"warning: the deadline {ap.get('deadline')} has passed by this machine's clock; if the "
                   f"operator has already applied onTimeout, this decision is ignored (check the phase with "
                   f"`kubectl get agentrun {name} -n {ns}`).", err=True)
    stored = _stored_call(run)
    call_id, sha, warnings = binding(run, stored)
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    who = _whoami()
    if who is None:
        click.echo("warning: cannot ask the API server who you are (SelfSubjectReview); the decision is sent "
                   f"without {ANN_DECIDED_BY} (a cluster with the MutatingAdmissionPolicy records you anyway)",
                   err=True)
    body = decision_patch(approve, reason, (run.get("metadata") or {}).get("resourceVersion"),
                          call_id=call_id, sha256=sha, decided_by=who, target_sha256=ap.get("targetSha256"))
    try:
        patched = api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)
    except ApiException as e:
        if e.status == 409:
            raise CLIError(f"agentrun {ns}/{name} changed while deciding; run `agentrun approvals show "
                           f"{name} -n {ns}` and try again.", ExitCode.CONFLICT) from None
        why = refusal(e) if e.status in (400, 403, 422) else None
        if why:
            raise CLIError(f"cannot {verb} agentrun {ns}/{name}: {why}",
                           ExitCode.FORBIDDEN if e.status == 403 else ExitCode.ERROR) from None
        raise api_error(e, f'patch agentrun "{name}" in namespace "{ns}"') from None
    except Exception as e:
        raise CLIError(f"cannot patch agentrun {ns}/{name}: {e}") from None
    if output != "text":
        click.echo(render(output, patched, names=lambda: [run_name(name)]), nl=not output.startswith("jsonpath="))
        return
    annotations = " ".join(f"{k}={json.dumps(v) if ' ' in v else v}"
                           for k, v in body["metadata"]["annotations"].items())
    click.echo(f"agentrun {ns}/{name}: {'approved' if approve else 'rejected'} call {ap.get('callId', '?')} of tool {ap.get('tool', '?')} "
               f"({target_text(ap, 200)}, lap {ap.get('lap', '?')}), annotated {annotations}; the operator "
               + ("counts the approval" + (f" ({approvals_text(ap)} before it)" if (ap.get("approvalsRequired") or 1) > 1
                                           else "") + " and resumes the run once enough distinct users approved."
                  if approve else "resumes the run."))


DECISION_FORMATS = ("text", "json", "yaml", "name")


def decision_output() -> Callable[[F], F]:
    return output_option(DECISION_FORMATS, default="text",
                         help="text (one line), the patched AgentRun as JSON/YAML, name, or jsonpath=TEMPLATE.")


def _reason_required(reason: str) -> str:
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")
    return reason


@approvals_command.command("approve")
@click.argument("name", shell_complete=complete_runs)
@kube_options()
@click.option("--reason", default=None, help="Reason recorded with the decision (agentrun.dev/reason).")
@decision_output()
def approve_command(name: str, reason: str | None, output: str) -> None:
    """Approve the pending call of a waiting run (annotation approved=true)."""
    _decide(name, reason, approve=True, output=output)


@approvals_command.command("reject")
@click.argument("name", shell_complete=complete_runs)
@kube_options()
@click.option("--reason", required=True, help="Why the call is rejected (required; agentrun.dev/reason).")
@decision_output()
def reject_command(name: str, reason: str, output: str) -> None:
    """Reject the pending call of a waiting run (annotation approved=false; --reason required)."""
    _decide(name, _reason_required(reason), approve=False, output=output)


# The top-level verbs: `agentrun approve RUN [--reason]`, `agentrun reject RUN --reason`.

@click.command("approve", short_help="Approve the pending tool call of RUN.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--reason", default=None, help="Reason recorded with the decision (agentrun.dev/reason).")
@decision_output()
def approve_run_command(run: str, reason: str | None, output: str) -> None:
    """Approve the pending tool call of RUN: sets the annotations `approved=true` (and
    `agentrun.dev/reason`), exactly what `kubectl annotate agentrun RUN approved=true` sets.
    Refused unless RUN is in phase AwaitingApproval."""
    _decide(run, reason, approve=True, output=output)


@click.command("reject", short_help="Reject the pending tool call of RUN (--reason required).")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--reason", required=True, help="Why the call is rejected (required; agentrun.dev/reason).")
@decision_output()
def reject_run_command(run: str, reason: str, output: str) -> None:
    """Reject the pending tool call of RUN: sets `approved=false` and `agentrun.dev/reason`. The
    agent gets the rejection as the tool's result and the run continues. Refused unless RUN is in
    phase AwaitingApproval."""
    _decide(run, _reason_required(reason), approve=False, output=output)
