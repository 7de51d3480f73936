"""The run's lifecycle (issue 31, ``agentrun.api.lifecycle``): a retry in place of a finished run
(annotation ``agentrun.dev/retry``), a cancel (``spec.cancel``) and the run deadline
(``spec.activeDeadline``). Pure, like the rest of ``decide``.

A retry keeps the run's uid, so its idempotency keys: the lap that failed starts again as its next
attempt (the attempt numbers go on, so Job names stay distinct), and the lap answers every call its
earlier attempts journaled from the journal (the journal of an unfinished lap is deleted only once
that lap is checkpointed, never at a terminal phase).

A retry with ``agentrun.dev/retry-from-lap`` N before the last checkpointed lap *rewinds in place*:
the shell surveys the store first (``ReadRewind``: the state through lap N and every tool call sent
after it), and the rewind is refused, naming the first call, when any of those calls has side
effects under the run's spec (a tool no longer declared counts as one). Otherwise the run stands at
lap N again and starts history ``len(status.lifecycle.rewinds)`` (``api.contract.history_of``): the
laps it writes from N+1 on live under their own store prefix, with their own journal and
idempotency keys; the abandoned laps are kept, never read.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from agentrun.api.contract import MAX_REWINDS
from agentrun.api.lifecycle import (
    ANN_CANCELLED_BY,
    ANN_RETRY,
    ANN_RETRY_FROM_LAP,
    ANN_RETRY_REQUESTED_BY,
    APPROVAL_WITHDRAWN,
    CANCEL_GRACE_SECONDS,
    MAX_RETRIES,
    PHASE_CANCELLED,
    PHASE_DEADLINE_EXCEEDED,
    RETRY_ANNOTATIONS,
    RETRYABLE_PHASES,
    parse_from_lap,
    parse_retry_value,
    retry_request_value,
)
from agentrun.api.mcp import find_mcp_tool
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunSpec, CancelSpec
from agentrun.api.status import TERMINAL_PHASES, AgentRunStatus, CheckpointRef, CostStatus, LapRetries, LifecycleStatus
from agentrun.api.types import format_usd, parse_duration

from .actions import Decision, DeleteJob, ReadRewind, RemoveAnnotations, RequeueAfter
from .context import Ctx, StatusWriter
from .observed import RewindRead, SentCall
from .retries import MAX_RETRY_ENTRIES, next_lap_attempt
from .text import bounded_decider, bounded_reason, shown


def lifecycle_of(st: AgentRunStatus) -> LifecycleStatus:
    if st.lifecycle is None:
        st.lifecycle = LifecycleStatus()
    return st.lifecycle


def attempts_allowed(st: AgentRunStatus, spec: AgentRunSpec, lap: int) -> int:
    """The highest attempt number lap ``lap`` may run: spec.retry.attemptsPerLap, counted from the
    last retry when that retry started this lap again."""
    lc = st.lifecycle
    base = lc.attempts_before_retry if lc is not None and lc.retried_lap == lap else 0
    return spec.retry.attempts_per_lap + base


# ------------------------------------------------------------------------------------------ retry

def take_retry(c: Ctx) -> Decision | None:
    """A retry request (annotation :data:`ANN_RETRY`): applied to a run in a retryable terminal phase
    with headroom, else refused with ONE Warning Event naming what to change; the request's
    annotations are removed either way. Returns the Decision to stop with, or None (no request)."""
    o, st, spec = c.o, c.st, c.spec
    if ANN_RETRY not in o.annotations:
        return None
    raw = o.annotations.get(ANN_RETRY, "")
    n = parse_retry_value(raw)
    done = lifecycle_of(st).retries if st.lifecycle is not None else 0
    if n is not None and n == done and done > 0:
        # applied already (the status was written, the removal of the annotations was lost)
        c.act(RemoveAnnotations(RETRY_ANNOTATIONS))
        return c.finish()
    back = rewind_point(c)
    problem = retry_problem(c, raw, n, done, headroom=back is None)
    if problem is None and back is not None:
        wait = settling_seconds(c)
        if wait is not None:  # the stopped lap's pod may still journal its call in flight: survey after it
            return Decision([RequeueAfter(wait)])
        rw = o.rewind
        if rw is None or (rw.from_lap, rw.through_lap) != (back, st.lap):
            return Decision([ReadRewind(back, st.lap)])  # the survey first; nothing written yet
        if rw.kind == "unavailable":  # the store does not answer now: the request waits, no Event per try
            return Decision([RequeueAfter(max(0.5, o.store_retry_seconds))])
        problem = rewind_problem(c, rw) or headroom_problem(c, back, _usd(rw.totals.cost_usd) if rw.totals else None)
        if problem is None:
            rewind(c, rw)
    if problem is not None:
        refuse_retry(c, problem)
        return c.finish()
    assert n is not None
    lap, attempt = next_lap_attempt(st)
    # attempts of this lap that already ran (a permanent failure, a cancelled or timed-out Job) are
    # not recorded in status.retries: the Jobs still seen name them, so no Job name is reused
    seen = max([j.attempt for j in o.jobs if j.lap == lap] + [attempt - 1])
    if seen >= attempt:
        _note_attempt(st, lap, seen, None)
    lc = lifecycle_of(st)
    by = bounded_decider(o.annotations.get(ANN_RETRY_REQUESTED_BY))
    was = st.phase
    lc.retries = n
    lc.last_retry_by, lc.last_retry_at, lc.last_retry_from_phase = by, o.now, was
    lc.last_retry_from_lap = back
    lc.retried_lap, lc.attempts_before_retry = lap, max(seen, attempt - 1)
    st.completed_at = None
    st.next_attempt_at = None
    who = f" by {by}" if by else ""
    ap = st.approval
    if back is not None:
        msg = (f"retry {n}{who} (was {was}): rewound in place to lap {back}; lap {lap} starts again as attempt "
               f"{max(seen, attempt - 1) + 1} in history {len(lc.rewinds)} (its own journal and idempotency keys); "
               f"laps {back + 1}..{o.rewind.through_lap if o.rewind else back} are abandoned (kept, never read)")
        c.phase("Running", Reason.RETRIED, msg)
    elif ap is not None and ap.state == APPROVAL_WITHDRAWN and ap.lap == st.lap:
        # the run was cancelled while it waited: ask again, with a fresh deadline
        ap.state, ap.decision, ap.reason, ap.decided_by, ap.decided_at = "Pending", None, None, None, None
        ap.approved_by, ap.notified = [], None
        ap.requested_at = o.now
        ap.deadline = o.now + timedelta(seconds=parse_duration(spec.approval.timeout))
        st.waiting_on = spec.approval.owner
        msg = (f"retry {n}{who} (was {was}): call {ap.call_id} of tool {ap.tool} waits for {spec.approval.owner} "
               f"again until {ap.deadline.isoformat()}")
        c.phase("AwaitingApproval", Reason.RETRIED, msg)
    else:
        msg = (f"retry {n}{who} (was {was}): lap {lap} starts again as attempt {max(seen, attempt - 1) + 1}, "
               "same idempotency keys; calls already executed are answered from the journal")
        c.phase("Running", Reason.RETRIED, msg)
    c.event("Normal", Reason.RETRIED, msg)
    c.act(RemoveAnnotations(RETRY_ANNOTATIONS))
    c.act(RequeueAfter(0.0))  # write-ahead: the retry is in status before its Job
    return c.finish()


def refuse_retry(c: StatusWriter, problem: str) -> None:
    """ONE Warning Event naming why, and the request's annotations removed before any status write."""
    o = c.o
    c.act(RemoveAnnotations(RETRY_ANNOTATIONS, before_status=True))
    c.event("Warning", Reason.RETRY_REFUSED, f"retry of agentrun {o.namespace}/{o.name} refused: {problem}")


def _from_lap(c: Ctx) -> int | None:
    """The lap of the request's :data:`ANN_RETRY_FROM_LAP`, when it parses."""
    raw = c.o.annotations.get(ANN_RETRY_FROM_LAP)
    return parse_from_lap(raw) if raw is not None else None


REWIND_SETTLE_SECONDS = 2 * CANCEL_GRACE_SECONDS
"""How long after a cancel or a passed deadline a rewind waits before it surveys the store: the lap
Job's DELETE grace, then its pod's own grace (SIGTERM; the lap journals the call in flight, which
the survey must see)."""


def settling_seconds(c: Ctx) -> float | None:
    """Seconds a rewind of a run stopped by a cancel or its deadline still waits, or None."""
    st = c.st
    if st.phase not in (PHASE_CANCELLED, PHASE_DEADLINE_EXCEEDED) or st.completed_at is None:
        return None
    left = (st.completed_at + timedelta(seconds=REWIND_SETTLE_SECONDS) - c.o.now).total_seconds()
    return left if left > 0 else None


def rewind_point(c: Ctx) -> int | None:
    """The lap a retry request rewinds to, when it rewinds (before the last checkpointed lap)."""
    lap = _from_lap(c)
    return lap if lap is not None and lap < c.st.lap else None


def side_effecting(spec: AgentRunSpec, tool: str) -> bool:
    """Whether a call of ``tool`` has side effects under ``spec``: its HTTP tool's sideEffects, its MCP
    server's sideEffects patterns; a tool the spec no longer declares counts as side-effecting."""
    for t in spec.agent.tools:
        if t.name == tool:
            return t.side_effects
    ref = find_mcp_tool(spec.agent, tool)
    return True if ref is None else ref.side_effects


def first_side_effect(spec: AgentRunSpec, calls: tuple[SentCall, ...]) -> SentCall | None:
    """The first call (in lap and call order) that has side effects, or None."""
    return next((call for call in calls if side_effecting(spec, call.tool)), None)


def rewind_problem(c: Ctx, rw: RewindRead) -> str | None:
    """Why the surveyed rewind cannot be applied, or None."""
    st, spec = c.st, c.spec
    back = rw.from_lap
    if rw.kind != "ok":
        return (f"annotation {ANN_RETRY_FROM_LAP}={back}: the checkpoints after lap {back} cannot be read "
                f"({shown(rw.error or rw.kind, 300)}); fork from lap {back} for a new history (agentrun fork)")
    call = first_side_effect(spec, rw.calls)
    if call is not None:
        executed = ("may have executed (the lap stopped before it journaled the answer)" if call.unconfirmed
                    else "executed")
        return (f"annotation {ANN_RETRY_FROM_LAP}={back}: call {call.call_id} of tool {shown(call.tool, 80)} in lap "
                f"{call.lap} has side effects and {executed} after lap {back}, so a rewind cannot undo it; retry "
                f"from lap {st.lap} (in place, same idempotency keys), or fork from lap {back} for a new history "
                "(agentrun fork)")
    if rw.outcome == "awaiting-approval":
        return (f"annotation {ANN_RETRY_FROM_LAP}={back}: lap {back} ended waiting for an approval, decided "
                f"since; rewind to lap {back - 1} (its call is asked for again) or to a later lap")
    return None


def _usd(text: str) -> str:
    try:
        return format_usd(Decimal(text))
    except (InvalidOperation, ValueError):
        return "0.00"


def rewind(c: Ctx, rw: RewindRead) -> None:
    """The run stands at lap ``rw.from_lap`` again, in a new history: its checkpoint and cost as of
    that lap, the abandoned laps' approval, attempt counts and finished Jobs gone."""
    o, st = c.o, c.st
    back, lc = rw.from_lap, lifecycle_of(st)
    lc.rewinds = [*lc.rewinds, back]
    p = rw.point
    st.lap = back
    if p is not None and rw.totals is not None:
        st.checkpoint = CheckpointRef(
            lap=back, key=p.key or "", uri=p.uri, sha256=p.sha256 or "", written_at=p.written_at,
            agent_version=rw.agent_version or st.agent_version or c.spec.agent.version,
            schema_version=p.record.schema_version if p.record is not None else None,
            endpoint=p.endpoint, region=p.region, path_style=p.path_style,
        )
        st.last_checkpoint_time = p.written_at or st.last_checkpoint_time
    elif back == 0:
        st.checkpoint = None
    if rw.totals is not None:
        t = rw.totals
        st.cost = CostStatus(usd=_usd(t.cost_usd), input_tokens=t.input_tokens, output_tokens=t.output_tokens)
    if st.approval is not None and st.approval.lap > back:
        st.approval, st.waiting_on = None, None
    st.retries = [r for r in st.retries if r.lap <= back + 1]
    for j in o.jobs:  # the abandoned laps' finished Jobs: the new history's laps will use their names
        if j.lap > back + 1:
            c.act(DeleteJob(j.name))


def retry_problem(c: Ctx, raw: str, n: int | None, done: int, headroom: bool = True) -> str | None:
    """Why a retry request cannot be applied (the text of the refusal), or None. ``headroom``: also
    check the budget and deadline left (a rewind checks them once the run stands at its lap)."""
    o, st, spec = c.o, c.st, c.spec
    if st.phase not in RETRYABLE_PHASES:
        if st.phase == "Succeeded":
            return "the run Succeeded; a finished success is not retried (fork it for a new history: agentrun fork)"
        return f"the run is {st.phase}, not finished; only a {', '.join(RETRYABLE_PHASES)} run can be retried"
    if n is None:
        return (f"annotation {ANN_RETRY}={shown(raw, 32)} is not a retry number; set it to "
                f"{retry_request_value(done)} (status.lifecycle.retries + 1; agentrun retry does)")
    if n != done + 1:
        return (f"annotation {ANN_RETRY}={n} is stale: the run has had {done} retr{'y' if done == 1 else 'ies'}, so "
                f"the next is {done + 1}; read the run again and set {ANN_RETRY}={done + 1}")
    if done >= MAX_RETRIES:
        return f"the run was retried {done} times, the most one run may be; fork it for a new history"
    if spec.cancel is not None:
        return "spec.cancel is still set; remove spec.cancel in the same patch as the retry (agentrun retry does)"
    if ANN_RETRY_FROM_LAP in o.annotations:
        raw_lap = o.annotations[ANN_RETRY_FROM_LAP]
        lap = parse_from_lap(raw_lap)
        if lap is None:
            return f"annotation {ANN_RETRY_FROM_LAP}={shown(raw_lap, 32)} is not a lap number"
        if lap > st.lap:
            return (f"annotation {ANN_RETRY_FROM_LAP}={lap}: lap {lap} was never checkpointed (the last "
                    f"checkpointed lap is {st.lap}); retry from lap {st.lap} or before")
        base = spec.fork_from.lap if spec.fork_from is not None else 0
        if lap < st.lap and lap < base:
            return (f"annotation {ANN_RETRY_FROM_LAP}={lap}: the run is a fork from lap {base} of "
                    f"{spec.fork_from.name if spec.fork_from else '?'}; laps before {base} are that run's, so it "
                    f"rewinds to lap {base} at the earliest (fork the source for an earlier lap)")
        if lap < st.lap and len(lifecycle_of(st).rewinds) >= MAX_REWINDS:
            return (f"annotation {ANN_RETRY_FROM_LAP}={lap}: the run was rewound {MAX_REWINDS} times, the most "
                    f"one run may be; retry from lap {st.lap}, or fork from lap {lap} for a new history")
    return headroom_problem(c) if headroom else None


def headroom_problem(c: Ctx, at_lap: int | None = None, usd: str | None = None) -> str | None:
    """No budget or deadline left for the lap after ``at_lap`` (default ``status.lap``) at the cost
    ``usd`` (default ``status.cost.usd``): what to raise."""
    o, st, spec = c.o, c.st, c.spec
    lap = (st.lap if at_lap is None else at_lap) + 1
    usd = st.cost.usd if usd is None else usd
    if lap > spec.budget.max_laps:
        return (f"no headroom: lap {lap} would pass spec.budget.maxLaps={spec.budget.max_laps}; raise "
                "spec.budget.maxLaps, then retry")
    if spec.budget.max_cost_usd is not None and Decimal(usd) >= Decimal(spec.budget.max_cost_usd):
        return (f"no headroom: cost ${usd} reached spec.budget.maxCostUSD=${spec.budget.max_cost_usd}; "
                "raise spec.budget.maxCostUSD, then retry")
    if spec.active_deadline is not None and st.started_at is not None:
        end = st.started_at + timedelta(seconds=parse_duration(spec.active_deadline))
        if o.now >= end:
            return (f"no headroom: spec.activeDeadline={spec.active_deadline} passed at {end.isoformat()} "
                    f"(status.startedAt {st.started_at.isoformat()}); raise spec.activeDeadline, then retry")
    return None


def _note_attempt(st: AgentRunStatus, lap: int, attempt: int, reason: str | None) -> None:
    """Record that lap ``lap`` ran attempt ``attempt`` (status.retries), so its next Job is attempt+1."""
    entries = {r.lap: r for r in st.retries}
    entry = entries.get(lap) or LapRetries(lap=lap, retries=0)
    entry.retries = max(entry.retries, attempt)
    if reason is not None:
        entry.last_reason = reason
    entries[lap] = entry
    st.retries = sorted(entries.values(), key=lambda r: r.lap)[-MAX_RETRY_ENTRIES:]


# ------------------------------------------------------------------------------- cancel, deadline

def _stop(c: StatusWriter, phase: str, reason: Reason, message: str, why: str) -> Decision:
    """End a live run now: the Job in flight deleted with a grace period (the lap gets SIGTERM and
    keeps what it journaled), its attempt recorded (a retry runs the next one), a pending approval
    withdrawn."""
    o, st = c.o, c.st
    aj = st.active_job
    for j in o.jobs:
        if j.state == "active":
            c.act(DeleteJob(j.name, grace_seconds=CANCEL_GRACE_SECONDS))
    if aj is not None:
        _note_attempt(st, aj.lap, aj.attempt, why)
        if not any(j.name == aj.name and j.state == "active" for j in o.jobs):
            c.act(DeleteJob(aj.name, grace_seconds=CANCEL_GRACE_SECONDS))
    ap = st.approval
    if ap is not None and ap.state == "Pending":
        ap.state = APPROVAL_WITHDRAWN
        c.event("Normal", Reason.APPROVAL_WITHDRAWN,
                f"the approval of call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) is withdrawn: {why}")
    c.phase(phase, reason, message)
    c.event("Warning", reason, message)
    return c.finish()


def take_cancel(c: Ctx) -> Decision | None:
    """``spec.cancel`` on a live run: stop it, phase Cancelled, who and why in status.lifecycle."""
    return cancel_run(c, c.spec.cancel)


def cancel_run(c: StatusWriter, cancel: CancelSpec | None) -> Decision | None:
    """:func:`take_cancel` of a run whose spec is not resolved yet (a run of an Agent held before
    its first lap: ``decide/agents.py``)."""
    o, st = c.o, c.st
    if cancel is None or st.phase in TERMINAL_PHASES:
        return None
    lc = lifecycle_of(st)
    lc.cancelled_by = bounded_decider(o.annotations.get(ANN_CANCELLED_BY))
    lc.cancel_reason = bounded_reason(cancel.reason or None)[0]
    lc.cancelled_at = o.now
    who = f" by {lc.cancelled_by}" if lc.cancelled_by else ""
    why = f": {lc.cancel_reason}" if lc.cancel_reason else ""
    stopped = f"; lap {st.active_job.lap} attempt {st.active_job.attempt} stopped (its journal is kept)" \
        if st.active_job is not None else ""
    msg = f"cancelled{who}{why}{stopped}; `agentrun retry` continues the run in place"
    return _stop(c, PHASE_CANCELLED, Reason.CANCELLED, msg, f"the run was cancelled{who}")


def requeue_at_deadline(c: Ctx) -> None:
    """Come back when spec.activeDeadline passes (the run has started)."""
    st, spec = c.st, c.spec
    if spec.active_deadline is not None and st.started_at is not None:
        end = st.started_at + timedelta(seconds=parse_duration(spec.active_deadline))
        c.act(RequeueAfter(max(0.5, (end - c.o.now).total_seconds())))


def take_deadline(c: Ctx) -> Decision | None:
    """``spec.activeDeadline`` passed since status.startedAt: stop the run DeadlineExceeded; before
    it, come back exactly then (no polling)."""
    o, st, spec = c.o, c.st, c.spec
    if spec.active_deadline is None or st.started_at is None or st.phase in TERMINAL_PHASES:
        return None
    end = st.started_at + timedelta(seconds=parse_duration(spec.active_deadline))
    left = (end - o.now).total_seconds()
    if left > 0:
        c.act(RequeueAfter(left))
        return None
    msg = (f"spec.activeDeadline={spec.active_deadline} passed at {end.isoformat()} (the run started at "
           f"{st.started_at.isoformat()}) after lap {st.lap}; raise spec.activeDeadline and `agentrun retry` to go on")
    return _stop(c, PHASE_DEADLINE_EXCEEDED, Reason.DEADLINE_EXCEEDED, msg, "the run's spec.activeDeadline passed")
