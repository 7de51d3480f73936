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
from agentrun.controller.decide.queue import QUEUED_RECHECK_SECONDS, order_key, place, slot_state


def run(name: str, phase: str | None = None, *, priority: int | None = None, created: str = "2026-12-01T00:00:00Z",
        **status: Any) -> dict[str, Any]:
    st: dict[str, Any] = dict(status)
    if phase is not None:
        st["phase"] = phase
    spec: dict[str, Any] = {} if priority is None else {"priority": priority}
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created}, "spec": spec, "status": st}


def at(name: str, runs: list[dict[str, Any]], active: int, limit: int, policy: str) -> d.QueueSlot:
    """``place`` of the run ``name`` among ``runs``, from their order keys (as the shell calls it)."""
    mine = next(order_key(r) for r in runs if r["metadata"]["name"] == name)
    return place(mine, [order_key(r) for r in runs], active, limit, policy)


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
