"""``decide(observed) -> Decision``: the order of the concerns, each in its own module."""

from __future__ import annotations

from agentrun.api.approval import ANN_APPROVED
from agentrun.api.contract import run_trace_id
from agentrun.api.lifecycle import ANN_RETRY
from agentrun.api.reasons import Reason
from agentrun.api.status import TERMINAL_PHASES

from .actions import FINALIZER, AddFinalizer, Decision, DeleteCheckpoints, DeleteJob, RemoveFinalizer
from .admission import hold_decision
from .agents import resolve_agent
from .approvals import consume_annotation, take_decision
from .context import Ctx, StatusWriter
from .finish import expire
from .fork import apply_fork
from .jobs import job_name
from .laps import adopt, next_step, observe_active, successors
from .lifecycle import refuse_retry, take_cancel, take_deadline, take_retry
from .observed import Observed
from .queue import admit, hold_in_queue
from .queue import waits as queue_waits
from .retries import next_lap_attempt
from .store import check_store_probe, pin_store


def decide(o: Observed) -> Decision:
    """What to do next for one AgentRun. Pure: no I/O, no clock (``o.now``)."""
    # Deletion: the Job goes with the owner (GC); the checkpoints only when retention is Delete.
    if o.deleting:
        return Decision([DeleteCheckpoints(), RemoveFinalizer()] if FINALIZER in o.finalizers else [])
    if o.request is None:
        return _decide(o)
    # A run of an Agent: its store first (the pinned copy lives there), then the definition it runs.
    if o.status.store is None and o.status.phase not in TERMINAL_PHASES:
        return pin_store(StatusWriter(o))
    resolved, first = resolve_agent(o)
    if first is not None:
        return first
    decision = _decide(resolved)
    decision.spec = resolved.spec
    return decision


def _decide(o: Observed) -> Decision:
    if o.spec is None:
        return _without_spec(StatusWriter(o))
    c = Ctx(o, o.spec)
    st, spec = c.st, c.spec

    if spec.checkpoint.retention == "Delete" and FINALIZER not in o.finalizers:
        c.act(AddFinalizer())
    elif spec.checkpoint.retention == "Retain" and FINALIZER in o.finalizers:
        c.act(RemoveFinalizer())

    # The lifecycle first: a retry re-opens a finished run; a cancel or a passed deadline ends a
    # live one before any decision or Job of it is applied.
    retried = take_retry(c)
    if retried is not None:
        return retried
    stopped = take_cancel(c) or take_deadline(c)
    if stopped is not None:
        return stopped

    terminal = st.phase in TERMINAL_PHASES
    if o.tracing and st.trace_id is None and not terminal:  # written with the pass's other changes
        st.trace_id = run_trace_id(o.uid)
    # The store is pinned in status (write-ahead) before anything of a live run touches it.
    if not terminal and st.store is None:
        return pin_store(c)

    # A decision made while the admission policies are not in place was checked by nobody: not taken.
    if o.admission is not None and not terminal:
        held = hold_decision(c)
        if held is not None:
            return held
    stop, waiting = take_decision(c)
    if stop is not None:
        return stop
    if terminal:
        return _terminal(c)

    # Tenancy: a run that no longer complies with its AgentRunPolicy (tightened after apply) stops
    # before the operator touches its store or starts a lap (a lap in flight ends first).
    if o.policy_check is not None and not o.policy_check.ok and st.active_job is None:
        return c.fail(Reason.POLICY_VIOLATION, o.policy_check.message)

    # A concurrency limit (AgentRunPolicy maxActiveRuns): a run that has not started waits for a slot.
    if queue_waits(c) and o.queue is not None and not o.queue.admitted:
        return hold_in_queue(c, o.queue)
    admit(c)

    # Fencing rests on the store honouring If-None-Match: probe it before the run's first write.
    fresh = st.lap == 0 and st.active_job is None and st.checkpoint is None
    if fresh:
        blocked = check_store_probe(c)
        if blocked is not None:
            return blocked

    # A fork starts from the source's lap N: its fork snapshot first, then lap N+1.
    if fresh and spec.fork_from is not None:
        return apply_fork(c, spec.fork_from) or next_step(c)

    jobs = {j.name: j for j in o.jobs}

    # Adopt a Job whose creation was not recorded (lost status write, restart).
    if st.active_job is None and not waiting:
        lap, attempt = next_lap_attempt(st)
        name = job_name(o.name, o.uid, lap, attempt)
        if name in jobs:
            stop = adopt(c, jobs[name])
            if stop is not None:
                return stop

    # Fence stray Jobs: an active Job that is not the run's current attempt must not write. One
    # exception: the attempt a pass started right after the current one ended, in a status write
    # that was then lost (the status is behind, not the Job): the run adopts it when it gets there
    # (``next_step``), so deleting it would only run that attempt twice.
    keep: set[str] = set()
    if st.active_job is not None:
        keep = {st.active_job.name} | {job_name(o.name, o.uid, lap, attempt)
                                       for lap, attempt in successors(st.active_job)}
    for j in o.jobs:
        if j.state == "active" and j.name not in keep:
            c.act(DeleteJob(j.name))

    aj = st.active_job
    if aj is not None:
        result = observe_active(c, aj, jobs.get(aj.name))
        if result is not None:
            return result
    return next_step(c)


def _terminal(w: StatusWriter) -> Decision:
    """A finished run does nothing but remove a leftover Job and, past its ttl, itself."""
    for j in w.o.jobs:
        if j.state == "active":
            w.act(DeleteJob(j.name))
    expire(w)
    return w.finish(touch_generation=False)


def _without_spec(w: StatusWriter) -> Decision:
    """The spec cannot be used (it does not validate): a live run fails InvalidSpec; a finished
    one stays as it is. A decision annotation has nothing to apply to."""
    o = w.o
    if ANN_APPROVED in o.annotations:
        consume_annotation(w, f"the run is not awaiting approval (phase {w.st.phase})"
                           if w.st.phase != "AwaitingApproval" else "the run's spec cannot be used")
    if ANN_RETRY in o.annotations:
        refuse_retry(w, f"the run's spec cannot be used ({o.spec_error or 'unknown error'}); fix the spec first")
    if w.st.phase in TERMINAL_PHASES:
        return _terminal(w)
    return w.fail(Reason.INVALID_SPEC, f"the spec cannot be used: {o.spec_error or 'unknown error'}")
