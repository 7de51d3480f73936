"""Concurrency limits (an AgentRunPolicy's ``maxActiveRuns``): which runs hold a slot, the order of
the ones that wait, and what ``decide`` does with a run that waits.

A run **holds a slot** from its first lap Job (the status records ``activeJob``, a lap, or a phase
past the start) until it finishes; it never gives its slot back between laps, in a backoff or while
an approval waits, so an admitted run is never queued again. A run that has not started and is not
finished **waits**: the waiting runs of a namespace are ordered by ``spec.priority`` (higher first),
then ``metadata.creationTimestamp``, then name, and the one at position *p* (1-based) is admitted
when ``active + p <= limit``.

The shell computes both from its watch cache (``controller/cache.py`` keeps the two sets per
namespace; ``controller/reconciler.py`` places a waiting run), never from a counter: a restart or a
new leader lists the runs and computes the same. Two runs placed from caches of different age still
keep the bound: a run admitted a moment ago but not yet seen started is still counted among the
waiting ones before the next, so the next one's position covers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from agentrun.api.reasons import Reason
from agentrun.api.status import TERMINAL_PHASES, QueueStatus

from .actions import Decision, RequeueAfter
from .context import Ctx
from .observed import QueueSlot

#: Phases that mean the run has started (it holds a slot whatever else its status says).
STARTED_PHASES: frozenset[str] = frozenset({"Running", "Retrying", "AwaitingApproval"})
#: Phases of a run that has not started (with no lap, Job or checkpoint recorded).
NOT_STARTED_PHASES: frozenset[str] = frozenset({"Pending", "Queued"})
#: How soon a queued run is looked at again besides the wake-ups of the cache (a slot freed).
QUEUED_RECHECK_SECONDS = 300.0

SlotState = Literal["holds", "waits"]


def slot_state(run: Mapping[str, Any]) -> SlotState | None:
    """``holds`` (started, not finished), ``waits`` (not started, not finished, not suspended, not being
    deleted) or None (finished, suspended before it started, or being deleted), from the run's object
    as the cache holds it."""
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    phase = st.get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        return None
    if st.get("activeJob") or (st.get("lap") or 0) > 0 or st.get("checkpoint") or phase in STARTED_PHASES:
        return "holds"
    if meta.get("deletionTimestamp") or (run.get("spec") or {}).get("suspend") is True:
        return None
    return "waits"


def waits(c: Ctx) -> bool:
    """Whether ``decide`` treats the run as waiting (as :func:`slot_state` does from the cache)."""
    st = c.st
    return (st.lap == 0 and st.active_job is None and st.checkpoint is None and st.phase in NOT_STARTED_PHASES
            and not c.spec.suspend)


OrderKey = tuple[int, str, str]
"""A waiting run's place in the admission order: (-spec.priority, creationTimestamp, name)."""


def order_key(run: Mapping[str, Any]) -> OrderKey:
    """The admission order of a waiting run: higher ``spec.priority`` first, then older, then name."""
    meta = run.get("metadata") or {}
    priority = (run.get("spec") or {}).get("priority")
    p = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    return -p, str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def place(mine: OrderKey, waiting: Iterable[OrderKey], active: int, limit: int, policy: str) -> QueueSlot:
    """Where the waiting run with order ``mine`` stands among ``waiting`` (the order keys of the
    namespace's waiting runs): 1 + the runs before it."""
    position = 1 + sum(1 for o in waiting if o < mine)
    return QueueSlot(position=position, active=active, limit=limit, policy=policy)


def hold_in_queue(c: Ctx, slot: QueueSlot) -> Decision:
    """The run waits for a slot: phase Queued (no Job), its place in ``status.queue``, one Normal
    Event when it starts waiting."""
    st = c.st
    message = (f"waiting for a slot: {slot.active} of {slot.limit} runs active in namespace {c.o.namespace} "
               f"(AgentRunPolicy {slot.policy} maxActiveRuns); position {slot.position} in its queue")
    if st.phase != "Queued":
        c.event("Normal", Reason.QUEUED, message)
    st.queue = QueueStatus(position=slot.position, active=slot.active, limit=slot.limit, policy=slot.policy)
    c.phase("Queued", Reason.QUEUED, message)
    c.act(RequeueAfter(QUEUED_RECHECK_SECONDS))
    return c.finish()


def admit(c: Ctx) -> None:
    """A queued run got a slot (or its namespace's limit went away): one Normal Event, phase Pending
    until its first lap starts (whatever holds it then says so), ``status.queue`` cleared."""
    st = c.st
    if st.phase == "Queued" and not c.spec.suspend:  # (suspended: the phase says so next)
        message = f"admitted: a slot is free in namespace {c.o.namespace}"
        c.event("Normal", Reason.ADMITTED, message)
        c.phase("Pending", Reason.ADMITTED, message)
    st.queue = None
