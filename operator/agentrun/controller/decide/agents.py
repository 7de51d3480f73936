"""Runs of an Agent (``spec.agentRef``): which definition a run runs, decided before anything else
of it (``core.decide``), from the facts the shell gathered (``Observed.request``, ``agent_current``,
``agent_pinned``).

* Not pinned yet (``status.agent`` unset): the current resolution of the Agent with the run's
  parameters is stored content-addressed (``StoreAgent``, create-only; the shell reads it back),
  then recorded in ``status.agent`` alone (write-ahead: no lap Job before the status names the
  copy it runs; ``RequeueAfter(0)``). A resolution problem (no such Agent, an invalid Agent, a
  missing, undeclared or ill-typed parameter, a task template naming no parameter) holds the run
  Pending: the ``Progressing`` condition False with the problem's reason and message naming the
  field, ONE Warning Event per problem (the condition remembers it), looked at again when the Agent
  changes (the cache queues its runs) and every :data:`REFUSED_RETRY_SECONDS`. Nothing is lost:
  fixing the Agent starts the run.
* Pinned: the run runs its pinned copy. An Agent with ``rollout: FollowLatest`` whose current
  resolution has another digest moves the pin at a lap boundary (:func:`at_boundary`: no Job in
  flight, or the active one seen finished; no approval pending; not terminal): stored and recorded
  the same way (the status alone, before the next Job), with a Normal ``AgentRolledOut`` Event.
  A Pinned Agent's edits, its deletion, an Agent of the same name created again (another uid:
  :func:`same_object`), or a problem of its current resolution leave a pinned run as it is.
* The effective spec (:func:`agentrun.api.agent.effective_spec`) replaces ``Observed.spec`` for the
  rest of ``decide``; the agent version each lap records is the pinned copy's.
"""

from __future__ import annotations

import dataclasses

from agentrun.api.agent import AgentProblem, ResolvedAgent, effective_spec
from agentrun.api.lifecycle import ANN_RETRY
from agentrun.api.reasons import ConditionType, Reason
from agentrun.api.status import TERMINAL_PHASES, PinnedAgent
from agentrun.api.text import one_line

from .actions import Decision, RequeueAfter, StoreAgent
from .context import MAX_CONDITION_MESSAGE_CHARS, StatusWriter, condition, hold
from .lifecycle import cancel_run, refuse_retry
from .observed import Observed

#: How soon a run whose Agent cannot be resolved is looked at again (besides every change of the Agent).
REFUSED_RETRY_SECONDS = 60.0


def resolve_agent(o: Observed) -> tuple[Observed, Decision | None]:
    """``o`` with ``spec`` the run's effective spec, or the Decision that comes first (store the
    copy, record the pin, hold the run). A run with an inline ``spec.agent``: ``o`` as it is."""
    req = o.request
    if req is None:
        return o, None
    w = StatusWriter(o)
    st = w.st
    pin = o.status.agent
    cur = o.agent_current
    terminal = st.phase in TERMINAL_PHASES
    if pin is None:
        if terminal:  # ended before it ever ran (a cancel): nothing to run, nor to continue
            if ANN_RETRY in o.annotations:
                refuse_retry(w, f"the run ended {st.phase} before its Agent was resolved: no lap ran, so there is "
                             "nothing to continue; create the run again (same spec, another name)")
            return o, w.finish(touch_generation=False)
        cancelled = cancel_run(w, req.cancel)  # a cancel of a run held on its Agent is taken as it is
        if cancelled is not None:
            return o, cancelled
        if isinstance(cur, ResolvedAgent):
            return o, _pin(w, cur, first=True)
        return o, _refuse(w, cur or AgentProblem(Reason.AGENT_NOT_FOUND, f"spec.agentRef.name: Agent "
                                                 f"{req.agent_ref.name if req.agent_ref else ''} not found"))
    if (isinstance(cur, ResolvedAgent) and cur.rollout == "FollowLatest" and not terminal
            and at_boundary(o) and cur.digest() != pin.digest and same_object(pin.uid, cur.uid)):
        return o, _pin(w, cur, first=False)
    read = o.agent_pinned
    if read is None or read.digest != pin.digest or read.kind != "ok" or read.resolved is None:
        detail = read.error if read is not None and read.error else "not read"
        return o, _hold(w, Reason.PINNED_AGENT_UNREADABLE,
                        f"the run's pinned Agent copy {pin.name} (version {pin.version}, sha256 {pin.digest}) "
                        f"cannot be read from the checkpoint store: {detail}")
    return dataclasses.replace(o, spec=effective_spec(req, read.resolved)), None


def same_object(pinned_uid: str | None, current_uid: str | None) -> bool:
    """Whether the current Agent is the object the run pinned: an Agent deleted and created again under
    the same name is another object, and a FollowLatest run does not follow it (whoever may create
    Agents could otherwise swap a run's tools under it; the admission policy guards only edits). A pin
    recorded before uids were (no ``pinned_uid``) is taken as the same object."""
    return pinned_uid is None or pinned_uid == current_uid


def at_boundary(o: Observed) -> bool:
    """Between two Jobs of the run: none in flight (no ``status.activeJob``, or its Job is seen
    finished: the decision that records its end creates the next one, which then runs the new pin)
    and no approval pending."""
    if o.status.phase == "AwaitingApproval":
        return False
    aj = o.status.active_job
    if aj is None:
        return True
    return any(j.name == aj.name and j.state != "active" for j in o.jobs)


def _pin(w: StatusWriter, cur: ResolvedAgent, first: bool) -> Decision:
    """Store ``cur``, then record it in status.agent (alone, then requeue)."""
    digest = cur.digest()
    read = w.o.agent_pinned
    if read is None or read.digest != digest:
        return Decision([StoreAgent(cur, digest)])
    if read.kind != "ok":
        return _hold(w, Reason.PINNED_AGENT_UNREADABLE, f"cannot store the run's Agent copy {cur.name} "
                     f"(version {cur.version}, sha256 {digest}) in the checkpoint store: {read.error}")
    old = w.st.agent
    w.st.agent = PinnedAgent(name=cur.name, version=cur.version, digest=digest, uid=cur.uid, pinned_at=w.o.now)
    if first:
        w.event("Normal", Reason.AGENT_PINNED, f"Agent {cur.name} version {cur.version} pinned (sha256 {digest})")
    else:
        w.event("Normal", Reason.AGENT_ROLLED_OUT, f"Agent {cur.name} changed (rollout FollowLatest): version "
                f"{old.version if old else '?'} -> {cur.version} (sha256 {digest}) from the next lap")
    w.act(RequeueAfter(0.0))
    return w.finish()


def _refuse(w: StatusWriter, problem: AgentProblem) -> Decision:
    return _hold(w, problem.reason, f"the run cannot start: {problem.message}")


def _hold(w: StatusWriter, reason: str, message: str) -> Decision:
    """The run waits (phase as it is): the Progressing condition False with ``reason`` and
    ``message``, ONE Warning Event per problem, looked at again later."""
    old = condition(w.st, ConditionType.PROGRESSING)
    if old is None or old.status != "False" or old.reason != reason \
            or old.message != one_line(message, MAX_CONDITION_MESSAGE_CHARS):
        hold(w, reason, message)
        w.event("Warning", reason, message)
    w.act(RequeueAfter(REFUSED_RETRY_SECONDS))
    return w.finish()
