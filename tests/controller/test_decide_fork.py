"""decide() for a fork (spec.forkFrom): the fork snapshot first, then lap N+1; failures named."""

from __future__ import annotations

from datetime import timedelta

from controller_world import T0, World, fork_read, make_spec

from agentrun.controller import decide as d

FORK = {"name": "src", "uid": "5eed0000-0000-0000-0000-000000000000", "lap": 2}


def test_first_decision_of_a_fork_asks_for_the_fork_snapshot_and_nothing_else():
    w = World(make_spec(forkFrom=FORK))
    pin = d.decide(w.observed())  # a fork pins its own store first (its spec, the operator's defaults)
    assert pin.of(d.ForkCheckpoint) == [] and pin.status.store == w.resolved_store
    w.status = pin.status
    dec = d.decide(w.observed())
    assert dec.actions == [d.ForkCheckpoint("src", FORK["uid"], 2)]
    assert dec.needs_read


def test_fork_starts_at_lap_n_plus_1_with_totals_and_checkpoint_carried_over():
    w = World(make_spec(forkFrom=FORK), fork_reads=[fork_read(2, cost="0.30")])
    dec = w.reconcile()
    (create,) = dec.of(d.CreateJob)
    assert (create.lap, create.attempt) == (3, 1)
    st = w.status
    assert st.lap == 2 and st.phase == "Running" and st.active_job.lap == 3
    assert st.checkpoint.key.endswith("snapshots/00000002.json") and st.checkpoint.sha256 == "ef" * 32
    assert st.checkpoint.endpoint == "http://s3:9000"
    assert st.cost.usd == "0.30" and st.cost.input_tokens == 20 and st.agent_version == "v0"
    assert "Forked" in w.reasons()
    # the snapshot is written once: later reconciles never ask again, and laps go on from 3
    again = w.reconcile()
    assert again.actions == [] and len(w.fork_calls) == 1
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.created == [(3, 1)] and len(w.fork_calls) == 1


def test_a_store_outage_retries_then_forks():
    w = World(make_spec(forkFrom=FORK), fork_reads=[fork_read(2, kind="unavailable"), fork_read(2)])
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and dec.requeue_after == 10.0
    assert w.status.phase == "Pending" and w.reasons() == ["StoreUnavailable"]
    w.now += timedelta(seconds=10)
    dec = w.reconcile()
    assert [c.lap for c in dec.of(d.CreateJob)] == [3]


def test_a_missing_or_unreadable_source_lap_fails_naming_it():
    for kind, why in (("missing", "never checkpointed"), ("unreadable", "cannot be read")):
        w = World(make_spec(forkFrom=FORK), fork_reads=[fork_read(2, kind=kind)])
        dec = w.reconcile()
        assert dec.of(d.CreateJob) == []
        assert w.status.phase == "Failed", w.status
        failed = {c.type: c for c in w.status.conditions}["Failed"]
        assert failed.status == "True" and failed.reason == "ForkSourceUnavailable"
        assert f"lap 2 of agentrun ns/src (uid {FORK['uid']})" in w.status.message and why in w.status.message
        assert w.reconcile().actions == []  # terminal: nothing more, no new fork attempt
        assert len(w.fork_calls) == 1


def test_a_fork_of_a_lap_awaiting_approval_waits_for_approval_with_a_fresh_deadline():
    w = World(make_spec(forkFrom=FORK), fork_reads=[fork_read(2, outcome="awaiting-approval", pending=True)])
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == []
    st = w.status
    assert st.phase == "AwaitingApproval" and st.waiting_on == "ops" and st.approval.lap == 2
    assert st.approval.requested_at == T0 and st.approval.deadline == T0 + timedelta(seconds=3)
    w.annotations["approved"] = "true"
    dec = w.reconcile()
    (create,) = dec.of(d.CreateJob)
    assert create.lap == 3 and create.approval.decision == "approved" and create.approval.call_id == "c1"


def test_a_fork_of_a_final_lap_ends_like_the_source():
    w = World(make_spec(forkFrom=FORK), fork_reads=[fork_read(2, outcome="done")])
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.created == []


def test_a_run_without_fork_from_never_forks():
    w = World(make_spec())
    w.reconcile()
    assert w.fork_calls == [] and w.created == [(1, 1)]


def test_budget_counts_the_source_laps():
    w = World(make_spec(forkFrom=FORK, budget={"maxLaps": 2}), fork_reads=[fork_read(2)])
    w.reconcile()
    assert w.status.phase == "BudgetExceeded" and w.created == []
