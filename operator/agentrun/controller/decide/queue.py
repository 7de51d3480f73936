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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrun.api.reasons import Reason
from agentrun.api.status import TERMINAL_PHASES, QueueStatus
from agentrun.api.text import one_line

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


Group = tuple[str | None, str | None]
"""What a run's per-Agent and per-model limits count it under: (its Agent's name, its model's name)."""
NO_GROUP: Group = (None, None)


@dataclass(frozen=True)
class Limits:
    """The concurrency limits of a namespace, each with the AgentRunPolicy it comes from (the lowest
    of the policies that apply: ``controller/tenancy.py``)."""

    namespace: tuple[int, str] | None = None
    """``maxActiveRuns``: all the namespace's runs."""
    agents: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """``maxActiveRunsPerAgent``: Agent name -> limit."""
    models: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """``maxActiveRunsPerModel``: model name -> limit."""

    @property
    def per_group(self) -> bool:
        return bool(self.agents or self.models)


def group_of(run: Mapping[str, Any], model_of_agent: Callable[[str], str | None]) -> Group:
    """The (Agent, model) of a run from its object: ``spec.agentRef.name`` and that Agent's model
    (``model_of_agent``, from the watch cache), or the inline ``spec.agent.model.name``."""
    spec = run.get("spec") or {}
    ref = (spec.get("agentRef") or {}).get("name") if isinstance(spec.get("agentRef"), dict) else None
    if isinstance(ref, str) and ref:
        return ref, model_of_agent(ref)
    model = ((spec.get("agent") or {}).get("model") or {}) if isinstance(spec.get("agent"), dict) else {}
    name = model.get("name", "scripted") if isinstance(model, dict) and model else None
    return None, name if isinstance(name, str) else None


def _scopes(group: Group, limits: Limits) -> list[tuple[str, int, str]]:
    """The per-group limits that count a run of ``group``: (scope, limit, policy)."""
    agent, model = group
    out = []
    if agent is not None and agent in limits.agents:
        out.append((f"Agent {agent}", *limits.agents[agent]))
    if model is not None and model in limits.models:
        out.append((f"model {model}", *limits.models[model]))
    return out


def place(mine: OrderKey, group: Group, waiting: Iterable[tuple[OrderKey, Group]], holding: Iterable[Group],
          limits: Limits) -> QueueSlot | None:
    """Where the waiting run with order ``mine`` and ``group`` stands, among ``waiting`` (the order
    keys and groups of the namespace's waiting runs, itself included) with ``holding`` (the groups
    of the runs that hold a slot); None when no limit counts it.

    The runs before it are admitted in order, each where every limit that counts it (the
    namespace's, its Agent's, its model's) still has room after the ones admitted before it. It is
    admitted when it would be next: so a run held back by its Agent's or model's limit does not hold
    up the runs behind it, and a slot is kept for every earlier run that fits. Placements are
    serialized per namespace by the shell (each sees the admissions before it: that keeps the limits
    when runs skip each other). A run that does not fit reports the first limit it does not fit, with
    its place among the runs before it that wait for that limit."""
    held = list(holding)
    if not limits.per_group:  # the namespace's limit only: the greedy order below reduces to a count
        if limits.namespace is None:
            return None
        limit, policy = limits.namespace
        return QueueSlot(position=1 + sum(1 for order, _ in waiting if order < mine), active=len(held),
                         limit=limit, policy=policy)

    def scopes(g: Group) -> list[tuple[str, int, str]]:
        return ([("namespace", *limits.namespace)] if limits.namespace is not None else []) + _scopes(g, limits)

    mine_scopes = scopes(group)
    if not mine_scopes:
        return None
    active: dict[str, int] = {"namespace": len(held)}
    for g in held:
        for scope, _, _ in _scopes(g, limits):
            active[scope] = active.get(scope, 0) + 1
    taken: dict[str, int] = {}  # runs before it that are admitted first, per limit
    ahead: dict[str, int] = {}  # runs before it that wait for that limit only (or for none)
    for order, g in sorted(waiting):
        if order >= mine:
            break
        its = scopes(g)
        short = [s for s, limit, _ in its if active.get(s, 0) + taken.get(s, 0) + 1 > limit]
        for s, _, _ in its:
            if not short or short == [s]:
                ahead[s] = ahead.get(s, 0) + 1
        if not short:
            for s, _, _ in its:
                taken[s] = taken.get(s, 0) + 1
    for s, limit, policy in mine_scopes:
        if active.get(s, 0) + taken.get(s, 0) + 1 > limit:
            return QueueSlot(position=ahead.get(s, 0) + 1, active=active.get(s, 0), limit=limit, policy=policy, scope=s)
    s, limit, policy = mine_scopes[0]
    return QueueSlot(position=taken.get(s, 0) + 1, active=active.get(s, 0), limit=limit, policy=policy, scope=s)


def hold_in_queue(c: Ctx, slot: QueueSlot) -> Decision:
    """The run waits for a slot: phase Queued (no Job), its place in ``status.queue``, one Normal
    Event when it starts waiting."""
    st = c.st
    if slot.scope == "namespace":
        what, rule = f"runs active in namespace {c.o.namespace}", "maxActiveRuns"
    else:
        kind = slot.scope.split(" ", 1)[0]
        what = f"runs of {slot.scope} active in namespace {c.o.namespace}"
        rule = "maxActiveRunsPerAgent" if kind == "Agent" else "maxActiveRunsPerModel"
    message = (f"waiting for a slot: {slot.active} of {slot.limit} {what} (AgentRunPolicy {slot.policy} {rule}); "
               f"position {slot.position} in its queue")
    if st.phase != "Queued":
        c.event("Normal", Reason.QUEUED, message)
    st.queue = QueueStatus(position=slot.position, active=slot.active, limit=slot.limit, policy=slot.policy,
                           scope=one_line(slot.scope, 300))
    c.phase("Queued", Reason.QUEUED, message)
    c.act(RequeueAfter(QUEUED_RECHECK_SECONDS))
    return c.finish()


def admit(c: Ctx) -> None:
    """A queued run got a slot (or its namespace's limit went away): one Normal Event, phase Pending
    until its first lap starts (whatever holds it then says so), ``status.queue`` cleared."""
    st = c.st
    # (Queued with no place in the queue: Kueue holds its Job, decide/kueue.py; suspended: the phase says so next)
    if st.phase == "Queued" and st.queue is not None and not c.spec.suspend:
        message = f"admitted: a slot is free in namespace {c.o.namespace}"
        c.event("Normal", Reason.ADMITTED, message)
        c.phase("Pending", Reason.ADMITTED, message)
    st.queue = None
