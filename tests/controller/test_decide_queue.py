"""Concurrency limits (decide/queue.py): which runs hold a slot, the admission order, a queued run
held with one Event and its place in status, and the bound kept when runs are placed concurrently
from one snapshot of the cache."""

from __future__ import annotations

from typing import Any

from controller_world import World, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.reasons import Reason
from agentrun.controller import decide as d
from agentrun.controller.decide.queue import (
    NO_GROUP,
    QUEUED_RECHECK_SECONDS,
    Group,
    Limits,
    group_of,
    order_key,
    place,
    slot_state,
)


def run(name: str, phase: str | None = None, *, priority: int | None = None, created: str = "2026-12-01T00:00:00Z",
        **status: Any) -> dict[str, Any]:
    st: dict[str, Any] = dict(status)
    if phase is not None:
        st["phase"] = phase
    spec: dict[str, Any] = {} if priority is None else {"priority": priority}
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created}, "spec": spec, "status": st}


def at(name: str, runs: list[dict[str, Any]], active: int, limit: int, policy: str) -> d.QueueSlot:
    """``place`` of the run ``name`` among ``runs`` with a namespace limit only (as the shell calls it)."""
    mine = next(order_key(r) for r in runs if r["metadata"]["name"] == name)
    slot = place(mine, NO_GROUP, [(order_key(r), NO_GROUP) for r in runs], [NO_GROUP] * active,
                 Limits(namespace=(limit, policy)))
    assert slot is not None
    return slot


def test_slot_state_from_the_cached_object() -> None:
    assert slot_state(run("a")) == "waits"  # never reconciled
    assert slot_state(run("a", "Pending")) == "waits"
    assert slot_state(run("a", "Queued")) == "waits"
    assert slot_state(run("a", "Pending", activeJob={"name": "j"})) == "holds"  # e.g. a Secret missing
    assert slot_state(run("a", "Running")) == "holds"
    assert slot_state(run("a", "AwaitingApproval")) == "holds"
    assert slot_state(run("a", "Suspended", lap=3)) == "holds"  # started, paused: keeps its slot
    assert slot_state(run("a", "Retrying")) == "holds"
    for phase in ("Succeeded", "Failed", "BudgetExceeded", "Cancelled", "DeadlineExceeded"):
        assert slot_state(run("a", phase, lap=2)) is None
    suspended = run("a", "Suspended")
    suspended["spec"]["suspend"] = True
    assert slot_state(suspended) is None  # suspended before it started: neither holds nor waits
    deleting = run("a", "Queued")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:01Z"
    assert slot_state(deleting) is None


def test_admission_order_priority_then_creation_then_name() -> None:
    runs = [run("c", created="2026-12-01T00:00:02Z"), run("b", created="2026-12-01T00:00:01Z"),
            run("z", priority=5, created="2026-12-01T00:00:09Z"), run("a", created="2026-12-01T00:00:01Z")]
    assert [k[2] for k in sorted(order_key(r) for r in runs)] == ["z", "a", "b", "c"]
    assert at("b", runs, active=1, limit=3, policy="p").position == 3
    assert not at("b", runs, active=1, limit=3, policy="p").admitted
    assert at("a", runs, active=1, limit=3, policy="p").admitted


def test_a_queued_run_waits_with_one_event_then_starts_when_admitted() -> None:
    w = World(make_spec())
    w.queue = d.QueueSlot(position=2, active=2, limit=2, policy="team-a")
    for _ in range(3):
        dec = w.reconcile()
        assert not dec.of(d.CreateJob) and d.RequeueAfter(QUEUED_RECHECK_SECONDS) in dec.actions
    assert w.status.phase == "Queued" and w.status.queue is not None
    assert (w.status.queue.position, w.status.queue.limit, w.status.queue.policy) == (2, 2, "team-a")
    assert [e.reason for e in w.events] == [Reason.QUEUED]
    progressing = next(c for c in w.status.conditions if c.type == "Progressing")
    assert progressing.status == "False" and progressing.reason == Reason.QUEUED
    assert "2 of 2 runs active" in progressing.message and "team-a" in progressing.message
    w.queue = d.QueueSlot(position=1, active=1, limit=2, policy="team-a")  # one finished
    dec = w.reconcile()
    assert dec.of(d.CreateJob) and w.status.phase == "Running" and w.status.queue is None
    assert [e.reason for e in w.events][:2] == [Reason.QUEUED, Reason.ADMITTED]


def test_a_started_run_is_never_queued_again() -> None:
    w = World(make_spec())
    w.reconcile()
    assert w.status.active_job is not None
    w.queue = d.QueueSlot(position=5, active=9, limit=1, policy="p")  # the shell would not even place it
    dec = w.reconcile()
    assert w.status.phase != "Queued" and not any(e.reason == Reason.QUEUED for e in w.events), dec


def test_a_queued_run_can_be_cancelled() -> None:
    from agentrun.api.spec import CancelSpec
    w = World(make_spec())
    w.queue = d.QueueSlot(position=1, active=3, limit=3, policy="p")
    w.reconcile()
    w.spec = w.spec.model_copy(update={"cancel": CancelSpec(reason="not needed")})
    w.reconcile()
    assert w.status.phase == "Cancelled" and not w.created


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 4), priorities=st.lists(st.integers(-2, 2), min_size=1, max_size=9),
       steps=st.lists(st.tuples(st.sets(st.integers(0, 8), max_size=4), st.sets(st.integers(0, 8), max_size=3)),
                      max_size=30))
def test_the_bound_holds_when_runs_are_placed_concurrently_from_one_snapshot(
        limit: int, priorities: list[int], steps: list[tuple[set[int], set[int]]]) -> None:
    """Each step places a batch of waiting runs from the SAME snapshot (concurrent workers reading
    one cache), admits those whose place fits, then some active runs finish. At no moment do more
    than ``limit`` runs hold a slot, runs are admitted in the admission order, and once every active
    run finished, the waiting ones are all admitted in turn."""
    runs = {i: run(f"r{i}", "Pending", priority=p, created=f"2026-12-01T00:00:{i:02d}Z")
            for i, p in enumerate(priorities)}
    admitted_order: list[str] = []

    def place_batch(batch: set[int]) -> None:
        waiting = [r for r in runs.values() if slot_state(r) == "waits"]
        active = sum(1 for r in runs.values() if slot_state(r) == "holds")
        for i in sorted(batch):
            if i in runs and slot_state(runs[i]) == "waits" and at(f"r{i}", waiting, active, limit, "p").admitted:
                runs[i] = run(f"r{i}", "Running", priority=priorities[i], created=f"2026-12-01T00:00:{i:02d}Z",
                              activeJob={"name": f"j{i}"})
                admitted_order.append(f"r{i}")
        assert sum(1 for r in runs.values() if slot_state(r) == "holds") <= limit

    for batch, finishing in steps:
        place_batch(batch)
        for i in finishing:
            if i in runs and slot_state(runs[i]) == "holds":
                runs[i] = run(f"r{i}", "Succeeded", lap=1)
    for _ in range(len(runs)):
        for i in list(runs):
            if slot_state(runs[i]) == "holds":
                runs[i] = run(f"r{i}", "Succeeded", lap=1)
        place_batch(set(runs))
    assert all(slot_state(r) != "waits" for r in runs.values())
    assert len(set(admitted_order)) == len(admitted_order) == len(runs)  # each admitted once


def test_a_batch_admits_the_head_of_the_queue_not_whoever_was_placed_first() -> None:
    """With one slot free, a later run placed before the head of the queue is not admitted: the slot
    is the head's."""
    runs = [run("head", "Pending", created="2026-12-01T00:00:01Z"), run("later", "Pending", created="2026-12-01T00:00:02Z")]
    assert not at("later", runs, active=1, limit=2, policy="p").admitted
    assert at("head", runs, active=1, limit=2, policy="p").admitted
    assert at("later", runs, active=0, limit=2, policy="p").admitted  # two free slots: both


# ------------------------------------------------------------------ per Agent and per model


def test_groups_from_the_run_object_and_the_agents_model() -> None:
    models = {"clerk": "gpt-4o"}.get
    assert group_of({"spec": {"agentRef": {"name": "clerk"}}}, models) == ("clerk", "gpt-4o")
    assert group_of({"spec": {"agentRef": {"name": "gone"}}}, models) == ("gone", None)  # Agent not in the cache
    assert group_of({"spec": {"agent": {"model": {"provider": "openai", "name": "o3"}}}}, models) == (None, "o3")
    assert group_of({"spec": {"agent": {"model": {"provider": "scripted"}}}}, models) == (None, "scripted")
    assert group_of({"spec": {}}, models) == NO_GROUP


def test_a_run_waiting_for_its_agent_does_not_hold_up_the_runs_behind_it() -> None:
    limits = Limits(namespace=(3, "ns-cap"), agents={"clerk": (1, "clerk-cap")})
    waiting: list[tuple[Any, Group]] = [((0, "t1", "a1"), ("clerk", None)), ((0, "t2", "a2"), ("clerk", None)),
                                        ((0, "t3", "b1"), ("other", None))]
    holding: list[Group] = [("clerk", None)]  # the one clerk run allowed is active
    a1 = place((0, "t1", "a1"), ("clerk", None), waiting, holding, limits)
    assert a1 is not None and not a1.admitted
    assert (a1.scope, a1.position, a1.active, a1.limit, a1.policy) == ("Agent clerk", 1, 1, 1, "clerk-cap")
    a2 = place((0, "t2", "a2"), ("clerk", None), waiting, holding, limits)
    assert a2 is not None and (a2.scope, a2.position, a2.admitted) == ("Agent clerk", 2, False)
    b1 = place((0, "t3", "b1"), ("other", None), waiting, holding, limits)
    assert b1 is not None and b1.admitted and (b1.scope, b1.position) == ("namespace", 1)  # a1, a2 skipped
    # a model limit counts runs of every Agent with that model; no limit at all for a run: None
    by_model = Limits(models={"gpt-4o": (1, "m")})
    slot = place((0, "t3", "b1"), ("other", "gpt-4o"), [((0, "t3", "b1"), ("other", "gpt-4o"))],
                 [("clerk", "gpt-4o")], by_model)
    assert slot is not None and (slot.scope, slot.admitted) == ("model gpt-4o", False)
    assert place((0, "t3", "b1"), ("other", "o3"), [], [], by_model) is None


def test_a_queued_run_says_which_limit_holds_it() -> None:
    w = World(make_spec())
    w.queue = d.QueueSlot(position=2, active=1, limit=1, policy="team-a", scope="model gpt-4o")
    w.reconcile()
    assert w.status.phase == "Queued" and w.status.queue is not None and w.status.queue.scope == "model gpt-4o"
    assert "runs of model gpt-4o active" in (w.status.message or "") and "maxActiveRunsPerModel" in (w.status.message or "")


AGENTS = ["a", "b", None]
MODELS = ["m1", "m2"]


@settings(max_examples=300, deadline=None)
@given(ns_limit=st.one_of(st.none(), st.integers(1, 4)),
       agent_limits=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(1, 3)),
       model_limits=st.dictionaries(st.sampled_from(MODELS), st.integers(1, 3)),
       runs=st.lists(st.tuples(st.integers(-1, 1), st.sampled_from(AGENTS), st.sampled_from(MODELS)),
                     min_size=1, max_size=10),
       steps=st.lists(st.tuples(st.lists(st.integers(0, 9), max_size=5), st.sets(st.integers(0, 9), max_size=3)),
                      max_size=20))
def test_serialized_placements_keep_every_limit_and_leave_no_fitting_run_waiting(
        ns_limit, agent_limits, model_limits, runs, steps) -> None:
    """Placements one at a time (the shell's per-namespace placement lock), each seeing the ones
    before it: no scope ever holds more runs than its limit, and after a pass over every waiting run
    none is left waiting whose every limit has room (no head-of-line blocking by a narrower limit)."""
    limits = Limits(namespace=(ns_limit, "p") if ns_limit else None,
                    agents={k: (v, "p") for k, v in agent_limits.items()},
                    models={k: (v, "p") for k, v in model_limits.items()})
    group = {i: (agent, model) for i, (_, agent, model) in enumerate(runs)}
    order = {i: (-prio, f"t{i:02d}", f"r{i}") for i, (prio, _, _) in enumerate(runs)}
    state = dict.fromkeys(range(len(runs)), "waits")

    def counts() -> dict[str, int]:
        out: dict[str, int] = {"namespace": 0}
        for i, s in state.items():
            if s == "holds":
                out["namespace"] += 1
                agent, model = group[i]
                for key in ([f"Agent {agent}"] if agent in limits.agents else []) + \
                        ([f"model {model}"] if model in limits.models else []):
                    out[key] = out.get(key, 0) + 1
        return out

    def within() -> None:
        c = counts()
        if limits.namespace:
            assert c["namespace"] <= limits.namespace[0]
        for a, (n, _) in limits.agents.items():
            assert c.get(f"Agent {a}", 0) <= n
        for m, (n, _) in limits.models.items():
            assert c.get(f"model {m}", 0) <= n

    def place_one(i: int) -> None:
        if state.get(i) != "waits":
            return
        waiting = [(order[j], group[j]) for j, s in state.items() if s == "waits"]
        holding = [group[j] for j, s in state.items() if s == "holds"]
        slot = place(order[i], group[i], waiting, holding, limits)
        if slot is None or slot.admitted:
            state[i] = "holds"
        within()

    for batch, finishing in steps:
        for i in batch:
            place_one(i)
        for i in finishing:
            if state.get(i) == "holds":
                state[i] = "done"
    for i in sorted(state, key=order.get):  # a pass over every waiting run, in order
        place_one(i)
    c = counts()
    ns_full = limits.namespace is not None and c["namespace"] >= limits.namespace[0]
    for i, s in state.items():
        if s != "waits":
            continue
        agent, model = group[i]
        room = (agent not in limits.agents or c.get(f"Agent {agent}", 0) < limits.agents[agent][0]) and \
               (model not in limits.models or c.get(f"model {model}", 0) < limits.models[model][0])
        assert ns_full or not room, (i, state, c)
