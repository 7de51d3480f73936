"""``agentrun wait | suspend | resume | cancel | retry RUN``: a run's lifecycle from the command line.

The writes are the routes of the lifecycle contract (``agentrun.api.lifecycle``), exactly what a
user would write with kubectl:

* ``suspend`` / ``resume``: ``spec.suspend: true|false`` (a merge patch);
* ``cancel [--reason R]``: ``spec.cancel: {reason: R}``; the API server stamps who (annotation
  ``agentrun.dev/cancelled-by``), the operator stops the lap and sets phase Cancelled;
* ``retry [--from-lap N]``: the annotation ``agentrun.dev/retry`` = ``status.lifecycle.retries + 1``
  (and ``agentrun.dev/retry-from-lap``), guarded by the resourceVersion that was read; a retry of a
  Cancelled run removes ``spec.cancel`` in the same patch. It needs the ``retry`` verb. With N before
  the last checkpointed lap the operator rewinds the run in place (a new history after lap N, with its
  own journal and keys), or refuses with one Warning Event naming the first side-effecting call that
  executed after lap N.

``wait`` polls the run until it ends (or is in the ``--for`` phase) and exits by its outcome
(``cli.exitcodes.OUTCOME_CODES``). ``wait_result`` and the patch builders are pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar, get_args

import click

from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.api.lifecycle import (
    ANN_RETRY,
    ANN_RETRY_FROM_LAP,
    ANN_RETRY_REQUESTED_BY,
    MAX_CANCEL_REASON_CHARS,
    PHASE_CANCELLED,
    RETRYABLE_PHASES,
    retry_request_value,
)
from agentrun.api.status import TERMINAL_PHASES, Phase
from agentrun.api.text import one_line
from agentrun.cli.exitcodes import ExitCode, outcome_code
from agentrun.cli.kube import CLIError, api_error, complete_runs, connect, current_options, get_run, kube_options
from agentrun.cli.output import output_option, parse_duration, render, run_name

F = TypeVar("F", bound=Callable[..., Any])
WRITE_FORMATS = ("text", "json", "yaml", "name")
PHASES: tuple[str, ...] = get_args(Phase)


# ------------------------------------------------------------------------------------ pure parts

def settled(run: dict[str, Any]) -> bool:
    """Whether the status reflects the run's latest request: the operator has seen the current
    generation (spec.cancel, spec.suspend) and no retry annotation is waiting to be consumed."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    observed = st.get("observedGeneration")
    if observed is not None and meta.get("generation") is not None and int(observed) < int(meta["generation"]):
        return False
    return ANN_RETRY not in (meta.get("annotations") or {})


def wait_result(run: dict[str, Any], target: str | None) -> ExitCode | None:
    """The exit code once waiting is over, else None. ``target`` None: until the run ends (0 for
    Succeeded, the outcome's code otherwise); a phase: 0 once the run is in it, the outcome's code
    if the run ends in another (CONFLICT if it Succeeded: it never will be in ``target``)."""
    if not settled(run):
        return None
    phase = (run.get("status") or {}).get("phase") or "Pending"
    if target is not None and phase == target:
        return ExitCode.OK
    if phase in TERMINAL_PHASES:
        code = outcome_code(phase)
        return ExitCode.CONFLICT if target is not None and code == ExitCode.OK else code
    return None


def parse_for(value: str | None) -> str | None:
    """``--for``: ``phase=PHASE`` or ``PHASE`` (kubectl's form first), None for "until it ends"."""
    if value is None:
        return None
    phase = value.split("=", 1)[1] if value.startswith("phase=") else value
    if phase not in PHASES:
        raise click.BadParameter(f"{value!r}: expected phase=PHASE, PHASE one of {', '.join(PHASES)}",
                                 param_hint="--for")
    return phase


def cancel_patch(reason: str | None) -> dict[str, Any]:
    return {"spec": {"cancel": {"reason": reason} if reason else {}}}


def retry_patch(run: dict[str, Any], from_lap: int | None, requested_by: str | None) -> dict[str, Any]:
    """The merge patch of a retry in place: the retry number expected (lifecycle.retries + 1), the
    lap to rewind to, who asks (overwritten by the API server where it stamps it), the
    resourceVersion read (a concurrent retry is refused, 409) and, for a cancelled run, spec.cancel
    removed."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    retries = int((st.get("lifecycle") or {}).get("retries") or 0)
    annotations = {ANN_RETRY: retry_request_value(retries)}
    if from_lap is not None:
        annotations[ANN_RETRY_FROM_LAP] = str(from_lap)
    if requested_by:
        annotations[ANN_RETRY_REQUESTED_BY] = requested_by
    body: dict[str, Any] = {"metadata": {"annotations": annotations}}
    if meta.get("resourceVersion"):
        body["metadata"]["resourceVersion"] = meta["resourceVersion"]
    if (run.get("spec") or {}).get("cancel") is not None or st.get("phase") == PHASE_CANCELLED:
        body["spec"] = {"cancel": None}
    return body


def summary(run: dict[str, Any]) -> str:
    """``ns/name: Phase (lap N, $cost): message``, one bounded line."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    msg = one_line(str(st.get("message")), 300) if st.get("message") else ""
    return (f"agentrun {meta.get('namespace')}/{meta.get('name')}: {st.get('phase') or 'Pending'} (lap "
            f"{int(st.get('lap') or 0)}, ${(st.get('cost') or {}).get('usd', '0.00')})" + (f": {msg}" if msg else ""))


# ------------------------------------------------------------------------------------------ I/O

def _patch(api: Any, ns: str, name: str, body: dict[str, Any], verb: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    from agentrun.api.approval import refusal
    from agentrun.cli.kube import status_code, unreachable

    try:
        patched: dict[str, Any] = api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)
        return patched
    except ApiException as e:
        if e.status == 409:
            raise CLIError(f"agentrun {ns}/{name} changed while asking to {verb}; check it with `agentrun "
                           f"describe {name} -n {ns}` and try again", ExitCode.CONFLICT) from None
        why = refusal(e) if e.status in (400, 403, 422) else None
        if why:
            raise CLIError(f"cannot {verb} agentrun {ns}/{name}: {one_line(why, 1024)}", status_code(e.status)) from None
        raise api_error(e, f'patch agentrun "{name}" in namespace "{ns}"') from None
    except Exception as e:
        raise unreachable(e) from None


def _echo(output: str, obj: dict[str, Any], name: str, text: str) -> None:
    if output == "text":
        click.echo(text)
    else:
        click.echo(render(output, obj, names=lambda: [run_name(name)]), nl=not output.startswith("jsonpath="))


def _write_output() -> Callable[[F], F]:
    return output_option(WRITE_FORMATS, default="text",
                         help="text (one line), the AgentRun as JSON/YAML, name, or jsonpath=TEMPLATE.")


@click.command("wait", short_help="Wait until RUN ends (or is in a phase); exit by its outcome.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--for", "for_", default=None, metavar="phase=PHASE",
              help="Wait until RUN is in PHASE (default: until it ends: Succeeded, Failed, BudgetExceeded, "
                   "Cancelled, DeadlineExceeded).")
@click.option("--timeout", default=None, metavar="DURATION",
              help="Give up after DURATION (30s, 5m, 2h) with exit code 7; 0 checks once. Default: no limit.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between reads of the run.")
@_write_output()
def wait_command(run: str, for_: str | None, timeout: str | None, interval: float, output: str) -> None:
    """Wait until RUN ends and exit by its outcome: 0 Succeeded, 10 Failed, 11 BudgetExceeded,
    12 Cancelled, 13 DeadlineExceeded, 7 when --timeout passes first (docs/cli.md, "Exit codes").
    With --for=phase=PHASE: exit 0 once RUN is in PHASE (or the outcome's code if it ends in
    another). A retry or a cancel not yet seen by the operator is waited for, never taken for the
    old phase."""
    target = parse_for(for_)
    try:
        limit = parse_duration(timeout) if timeout is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--timeout") from None
    api, ns = connect(current_options())
    ends = time.monotonic() + limit if limit is not None else None
    while True:
        obj = get_run(api, ns, run)
        code = wait_result(obj, target)
        if code is not None:
            _echo(output, obj, run, summary(obj))
            raise SystemExit(int(code))
        if ends is not None and time.monotonic() >= ends:
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            raise CLIError(f"timed out after {timeout} waiting for agentrun {ns}/{run} "
                           f"{'to be ' + target if target else 'to end'} (phase {phase})", ExitCode.TIMEOUT)
        time.sleep(min(interval, max(0.0, ends - time.monotonic())) if ends is not None else interval)


def _set_suspend(run: str, suspend: bool, output: str) -> None:
    api, ns = connect(current_options())
    obj = get_run(api, ns, run)
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        raise CLIError(f"agentrun {ns}/{run} has ended (phase {phase}); nothing to "
                       f"{'suspend' if suspend else 'resume'} (`agentrun retry` continues a failed run)",
                       ExitCode.CONFLICT)
    patched = _patch(api, ns, run, {"spec": {"suspend": suspend}}, "suspend" if suspend else "resume")
    _echo(output, patched, run, f"agentrun {ns}/{run} {'suspended' if suspend else 'resumed'} (spec.suspend: "
          f"{'true' if suspend else 'false'}); " + ("no new lap starts; a lap in flight finishes"
                                                   if suspend else "the next lap starts"))


@click.command("suspend", short_help="Suspend RUN (spec.suspend: true): no new lap starts.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@_write_output()
def suspend_command(run: str, output: str) -> None:
    """Set spec.suspend: true. The lap in flight finishes and checkpoints; no new lap starts until
    `agentrun resume RUN`."""
    _set_suspend(run, True, output)


@click.command("resume", short_help="Resume RUN (spec.suspend: false).")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@_write_output()
def resume_command(run: str, output: str) -> None:
    """Set spec.suspend: false: the run continues with its next lap."""
    _set_suspend(run, False, output)


@click.command("cancel", short_help="Cancel RUN (spec.cancel): stop the lap in flight, phase Cancelled.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--reason", default=None, help=f"Why (spec.cancel.reason; at most {MAX_CANCEL_REASON_CHARS} characters).")
@_write_output()
def cancel_command(run: str, reason: str | None, output: str) -> None:
    """Cancel RUN: sets spec.cancel {reason}. The operator stops a lap in flight (its Job is deleted
    with a grace period; the lap journals what finished), withdraws a pending approval and sets
    phase Cancelled, recording who cancelled (stamped by the API server) and why. Nothing is lost:
    `agentrun retry RUN` continues it with the same idempotency keys."""
    if reason is not None and (not reason.strip() or len(reason) > MAX_CANCEL_REASON_CHARS):
        raise click.BadParameter(f"must be 1..{MAX_CANCEL_REASON_CHARS} characters", param_hint="--reason")
    api, ns = connect(current_options())
    obj = get_run(api, ns, run)
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        raise CLIError(f"agentrun {ns}/{run} has already ended (phase {phase}); nothing to cancel", ExitCode.CONFLICT)
    if (obj.get("spec") or {}).get("cancel") is not None:
        _echo(output, obj, run, f"agentrun {ns}/{run} is already cancelled (spec.cancel is set; phase {phase})")
        return
    patched = _patch(api, ns, run, cancel_patch(reason), "cancel")
    _echo(output, patched, run, f"agentrun {ns}/{run} cancelled (spec.cancel set"
          + (f", reason {one_line(reason, 200)!r}" if reason else "") + "); the operator stops the run "
          "(`agentrun wait` exits 12 once it is Cancelled)")


@click.command("retry", short_help="Retry RUN in place (same uid, same idempotency keys).")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@click.option("--from-lap", type=click.IntRange(min=0), default=None,
              help="Rewind in place to checkpointed lap N first: the laps after N are redone as a new "
                   "history (same uid; the redone laps get their own journal and idempotency keys). Refused "
                   "by the operator, with an Event naming the call, if a side-effecting call after lap N "
                   "has executed; fork for a deliberate new history then.")
@_write_output()
def retry_command(run: str, from_lap: int | None, output: str) -> None:
    """Retry a Failed, BudgetExceeded, Cancelled or DeadlineExceeded RUN in place: the same uid and
    the same idempotency keys, so calls that already executed are answered from the journal, never
    repeated. Sets the annotation agentrun.dev/retry to status.lifecycle.retries + 1 (a stale or
    duplicated retry is refused), and removes spec.cancel of a cancelled run in the same patch.
    Raise spec.budget first when the run ran out of it. Needs the "retry" verb on agentruns
    (ClusterRole agentrun-retrier)."""
    api, ns = connect(current_options())
    obj = get_run(api, ns, run)
    st = obj.get("status") or {}
    phase = st.get("phase") or "Pending"
    if phase not in RETRYABLE_PHASES:
        hint = " (a Succeeded run is final: `agentrun fork` starts a new history)" if phase == "Succeeded" else ""
        raise CLIError(f"agentrun {ns}/{run} is {phase}; only a {', '.join(RETRYABLE_PHASES)} run can be "
                       f"retried{hint}", ExitCode.CONFLICT)
    if ANN_RETRY in ((obj.get("metadata") or {}).get("annotations") or {}):
        raise CLIError(f"agentrun {ns}/{run} already has a retry request ({ANN_RETRY}) the operator has not "
                       "applied yet", ExitCode.CONFLICT)
    last = int(st.get("lap") or 0)
    if from_lap is not None and from_lap > last:
        raise CLIError(f"lap {from_lap} of agentrun \"{run}\" was never checkpointed (its last checkpointed lap is "
                       f"{last})")
    from agentrun.cli.approvals import _whoami

    body = retry_patch(obj, from_lap, _whoami())
    patched = _patch(api, ns, run, body, "retry")
    n = body["metadata"]["annotations"][ANN_RETRY]
    rewinding = from_lap is not None and from_lap < last
    if from_lap is not None and from_lap < last:
        how = (f", rewinding in place to lap {from_lap} (laps {from_lap + 1}..{last} abandoned; refused with a "
               f"RetryRefused Event if a side-effecting call after lap {from_lap} executed)")
    else:
        how = f", from lap {from_lap}" if from_lap is not None else ""
    _echo(output, patched, run, f"agentrun {ns}/{run}: retry {n} requested from phase {phase}" + how
          + (f"; the run continues in place (same uid, same idempotency keys): `agentrun wait {run}`"
             if not rewinding else f"; `agentrun wait {run}`, `agentrun describe {run}`"))
