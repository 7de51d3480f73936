"""The status being built by one decision, and the actions gathered so far.

:class:`StatusWriter` works without a usable spec (a terminal run, an invalid spec);
:class:`Ctx` is made only after ``decide`` checked the spec once, so everything that needs the
spec reads ``c.spec`` (never None) instead of asserting.
"""

from __future__ import annotations

import copy
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from agentrun.api.reasons import ConditionType, Reason
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import TERMINAL_PHASES, AgentRunStatus, Condition
from agentrun.api.text import one_line

from .actions import Action, Decision, Event, PatchStatus
from .observed import Observed

CONDITION_TYPES: tuple[str, ...] = tuple(ConditionType)
MAX_MESSAGE_CHARS = 4096
MAX_CONDITION_MESSAGE_CHARS = 1024
MAX_EVENT_MESSAGE_CHARS = 1024
EventType = Literal["Normal", "Warning"]
M = TypeVar("M", bound=BaseModel)
_IMMUTABLE = (str, int, float, bool, type(None), datetime, date, time, timedelta, Decimal, Enum)


def _copied(value: Any) -> Any:
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, BaseModel):
        return copy_model(value)
    if type(value) is list:
        return [_copied(v) for v in value]
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    return copy.deepcopy(value)


def copy_model(model: M) -> M:
    """A deep copy of a pydantic model tree, as ``model_copy(deep=True)`` makes, without
    ``copy.deepcopy``'s generic machinery (a memo lookup and ``__reduce__`` per value, for a tree
    without shared or cyclic parts): models, lists and dicts are copied, immutable leaves shared."""
    new = model.model_copy()  # shallow: a new __dict__, fields set, extras, private attributes
    fields = new.__dict__
    for k, v in fields.items():
        if not isinstance(v, _IMMUTABLE):
            fields[k] = _copied(v)
    return new


def condition(st: AgentRunStatus, ctype: str) -> Condition | None:
    return next((x for x in st.conditions if x.type == ctype), None)


def _own(st: AgentRunStatus, ctype: ConditionType, old: Condition | None) -> tuple[str, str]:
    """(reason, message) of a condition that is False and not explained by the phase: its own."""
    if ctype is ConditionType.AWAITING_APPROVAL:
        ap = st.approval
        if ap is not None and ap.state != "Pending":
            reason = {"Approved": Reason.APPROVAL_APPROVED, "Rejected": Reason.APPROVAL_REJECTED,
                      "TimedOut": Reason.APPROVAL_TIMED_OUT, "Withdrawn": Reason.APPROVAL_WITHDRAWN}[ap.state]
            by = f" by {ap.decided_by}" if ap.decided_by else ""
            return reason, f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) was {ap.state.lower()}{by}"
        return Reason.NO_APPROVAL_PENDING, "no tool call waits for a decision"
    if ctype is ConditionType.SUSPENDED:
        if old is not None and (old.status == "True" or old.reason == Reason.RESUMED):
            return Reason.RESUMED, f"resumed after lap {st.lap}" if old.status == "True" else old.message
        return Reason.NOT_SUSPENDED, "spec.suspend is false"
    if ctype is ConditionType.COMPLETE:
        if st.phase in TERMINAL_PHASES:
            return Reason.NOT_COMPLETE, f"the run ended {st.phase} before the agent finished"
        return Reason.NOT_COMPLETE, "the agent has not finished"
    return Reason.NOT_FAILED, "no permanent failure"


def conditions_for(st: AgentRunStatus, phase: str, reason: str, message: str, generation: int,
                   now: datetime) -> list[Condition]:
    """The run's conditions for ``phase``: each type with its own status, reason and message.

    The phase's reason and message go to the conditions the phase explains: Progressing (True while
    Pending/Running/Retrying; False says why nothing runs) and the one condition the phase makes
    True (AwaitingApproval, Suspended, Complete or Failed). Every other condition is False with a
    reason of its own (``NoApprovalPending``, ``ApprovalApproved``, ``NotSuspended``, ``Resumed``,
    ``NotComplete``, ``NotFailed``), never the phase's."""
    truth = {
        ConditionType.PROGRESSING: phase in ("Pending", "Running", "Retrying"),
        ConditionType.AWAITING_APPROVAL: phase == "AwaitingApproval",
        ConditionType.SUSPENDED: phase == "Suspended",
        ConditionType.COMPLETE: phase == "Succeeded",
        ConditionType.FAILED: phase in ("Failed", "BudgetExceeded"),
    }
    by_type = {c.type: c for c in st.conditions}
    conds = []
    for ctype in ConditionType:
        value: Literal["True", "False"] = "True" if truth[ctype] else "False"
        old = by_type.get(ctype)
        if truth[ctype] or ctype is ConditionType.PROGRESSING:
            why, text = reason, message
        else:
            why, text = _own(st, ctype, old)
        conds.append(_condition(ctype, value, why, text, generation, now, old))
    conds += [c for c in st.conditions if c.type not in CONDITION_TYPES]
    return conds[:16]


def _condition(ctype: ConditionType, value: Literal["True", "False"], reason: str, message: str, generation: int,
               now: datetime, old: Condition | None) -> Condition:
    """One condition; its lastTransitionTime moves only when its status changes."""
    return Condition(
        type=str(ctype), status=value, reason=str(reason), message=one_line(message, MAX_CONDITION_MESSAGE_CHARS),
        observed_generation=generation,
        last_transition_time=now if old is None or old.status != value else old.last_transition_time,
    )


class StatusWriter:
    """The status being built (a deep copy of the observed one) and the actions gathered so far."""

    def __init__(self, o: Observed) -> None:
        self.o = o
        self.st = copy_model(o.status)
        self.actions: list[Action] = []

    def act(self, a: Action) -> None:
        self.actions.append(a)

    def event(self, type_: EventType, reason: str, message: str, lap: int | None = None,
              attempt: int | None = None) -> None:
        self.actions.append(Event(type_, str(reason), one_line(message, MAX_EVENT_MESSAGE_CHARS), lap, attempt))

    def phase(self, phase: str, reason: str, message: str) -> None:
        st, now = self.st, self.o.now
        st.phase = phase  # type: ignore[assignment]
        st.message = one_line(message, MAX_MESSAGE_CHARS)
        st.conditions = conditions_for(st, phase, reason, message, self.o.generation, now)
        if phase in TERMINAL_PHASES:
            st.completed_at = st.completed_at or now
            st.waiting_on = None
            st.active_job = None
            st.next_attempt_at = None
            st.kueue = None
        elif phase != "AwaitingApproval":
            st.waiting_on = None

    def fail(self, reason: str, message: str, phase: str = "Failed",
             lap: int | None = None, attempt: int | None = None) -> Decision:
        self.phase(phase, reason, message)
        self.event("Warning", reason, message, lap, attempt)
        return self.finish()

    def finish(self, touch_generation: bool = True) -> Decision:
        st = self.st
        if touch_generation:
            st.observed_generation = self.o.generation
            for cond in st.conditions:  # decided against this generation, whether or not they changed
                if cond.type in CONDITION_TYPES:
                    cond.observed_generation = self.o.generation
        if st != self.o.status:  # field by field, as model_dump() would compare them
            self.actions.append(PatchStatus(st))
        return Decision(self.actions)


class Ctx(StatusWriter):
    """A :class:`StatusWriter` of a run whose spec was checked: ``spec`` is never None."""

    def __init__(self, o: Observed, spec: AgentRunSpec) -> None:
        super().__init__(o)
        self.spec = spec


def failed_status(o: Observed, status: AgentRunStatus | None, reason: str, message: str) -> AgentRunStatus:
    """``status`` (else the observed one) turned Failed with ``reason`` and ``message``, its
    conditions set as ``decide`` sets them: for ``decide_after``, when an action the shell performs
    fails for good (the Job refused by the API server, an invalid configuration)."""
    w = StatusWriter(o)
    if status is not None:
        w.st = copy_model(status)
    w.phase("Failed", reason, message)
    w.st.observed_generation = o.generation
    return w.st


def deferred_status(o: Observed, reason: str, message: str) -> AgentRunStatus:
    """The observed status saying that the decision waits on something outside it (a lap Job
    refused for a ResourceQuota or a busy API server, retried with backoff): ``message`` and a
    ``Progressing`` condition False with ``reason`` and ``message``; the phase and the other
    conditions as they are. The decision that gets through sets its phase and conditions again."""
    w = StatusWriter(o)
    hold(w, reason, message)
    return w.st


def hold(w: StatusWriter, reason: str, message: str) -> None:
    """``w``'s status saying that nothing progresses, and why: ``message`` and a ``Progressing``
    condition False with ``reason`` and ``message``; the phase and the other conditions as they are."""
    st, o = w.st, w.o
    progressing = _condition(ConditionType.PROGRESSING, "False", reason, message, o.generation, o.now,
                             condition(st, ConditionType.PROGRESSING))
    st.conditions = [progressing] + [c for c in st.conditions if c.type != ConditionType.PROGRESSING]
    st.message = one_line(message, MAX_MESSAGE_CHARS)
