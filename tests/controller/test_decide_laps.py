"""decide(): laps, checkpoints, budgets, adoption and fencing, suspension, terminal runs, finalizers (the in-memory world: no cluster, no store)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from controller_world import T0, UID, World, make_spec, ok_read, record

from agentrun.controller import decide as d
from agentrun.controller.decide.jobs import job_name


def test_new_run_creates_lap_one_job_and_is_idempotent():
    w = World(make_spec())
    dec = w.reconcile()
    (create,) = dec.of(d.CreateJob)
    assert (create.lap, create.attempt, create.agent_version) == (1, 1, "v1")
    assert create.name == job_name("run", UID, 1, 1)
    assert w.status.phase == "Running" and w.status.active_job.name == create.name
    assert w.status.observed_generation == 1
    assert {c.type: c.status for c in w.status.conditions}["Progressing"] == "True"
    again = w.reconcile()
    assert again.of(d.CreateJob) == [] and again.of(d.PatchStatus) == []


def test_laps_progress_to_succeeded_with_cost_and_checkpoint():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("continue", cost="0.10")
    w.reconcile()
    assert w.status.lap == 1 and w.status.cost.usd == "0.10" and w.status.checkpoint.lap == 1
    assert w.status.checkpoint.sha256 == "ab" * 32 and w.status.last_checkpoint_time == T0 + timedelta(seconds=1)
    assert w.status.active_job.lap == 2
    w.finish_job("done", cost="0.25")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.status.lap == 2 and w.status.cost.usd == "0.25"
    assert w.status.cost.input_tokens == 20 and w.status.completed_at is not None
    conds = {c.type: c for c in w.status.conditions}
    assert conds["Complete"].status == "True" and conds["Progressing"].status == "False"
    assert all(c.observed_generation == 1 for c in conds.values())
    assert w.created == [(1, 1), (2, 1)]
    assert w.reasons().count("LapCheckpointed") == 2
    w.now += timedelta(hours=1)
    assert w.reconcile().actions == []


def test_failed_outcome_fails_the_run():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("failed", message="tool removed")
    w.reconcile()
    assert w.status.phase == "Failed" and "tool removed" in w.status.message


def test_first_decision_reads_checkpoint_and_nothing_else():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    dec = d.decide(w.observed())
    assert dec.actions == [d.ReadCheckpoint(1)]


def test_exit_3_reads_the_checkpoint_not_a_failure():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("continue", exit_code=3)
    w.reconcile()
    assert w.status.lap == 1 and w.status.total_retries == 0 and w.status.active_job.lap == 2


def test_budget_max_laps_before_the_lap():
    w = World(make_spec(budget={"maxLaps": 2}))
    w.reconcile()
    w.finish_job()
    w.reconcile()
    w.finish_job()
    w.reconcile()
    assert w.status.phase == "BudgetExceeded" and "spec.budget.maxLaps=2" in w.status.message
    assert w.created == [(1, 1), (2, 1)]


def test_budget_max_cost():
    w = World(make_spec(budget={"maxLaps": 10, "maxCostUSD": "0.50"}))
    w.reconcile()
    w.finish_job(cost="0.60")
    w.reconcile()
    assert w.status.phase == "BudgetExceeded" and "maxCostUSD" in w.status.message
    assert w.created == [(1, 1)]


def test_unreadable_checkpoint_fails_once_no_crash_loop():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.store[1] = d.CheckpointRead(lap=1, kind="unreadable", error="schemaVersion 9 is newer than 2")
    w.reconcile()
    assert w.status.phase == "Failed" and "schemaVersion 9" in w.status.message
    assert {c.type: c.reason for c in w.status.conditions}["Failed"] == "CheckpointUnreadable"
    assert w.reconcile().actions == [] and w.created == [(1, 1)]


def test_store_unavailable_requeues_without_failing():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.store[1] = d.CheckpointRead(lap=1, kind="unavailable", error="connection refused")
    dec = w.reconcile()
    assert dec.requeue_after and w.status.phase == "Running" and w.status.active_job is not None


def test_lost_status_write_adopts_existing_job():
    w = World(make_spec())
    w.reconcile_once()  # pins the store (write-ahead): the Job comes on the next pass
    assert w.created == [] and w.status.store is not None
    dec = d.decide(w.observed())
    (create,) = dec.of(d.CreateJob)
    w.jobs[create.name] = d.ObservedJob(create.name, 1, 1, "active", agent_version="v1")  # created; status lost
    w.reconcile()
    assert w.created == [] and w.status.active_job.name == create.name


def test_a_lost_status_write_at_a_lap_boundary_neither_fences_nor_repeats_the_next_lap():
    """The pass that reads lap 1's checkpoint creates lap 2's Job, then its status write is lost
    (refused, or the operator is killed in between): the status still shows lap 1's Job as the
    active one. Lap 2's Job is not a stray: it is adopted, not deleted and created a second time
    (chaos seeds 156519 and 363088: "Job ...-l2-a1 created 2 times")."""
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.refuse_status = 1
    w.reconcile()
    assert w.created == [(1, 1), (2, 1)] and w.status.active_job.lap == 1  # the status is behind
    dec = w.reconcile()
    assert not dec.of(d.DeleteJob) and not dec.of(d.CreateJob), dec.actions
    assert w.created == [(1, 1), (2, 1)] and (w.status.lap, w.status.active_job.lap) == (1, 2)
    assert w.jobs[w.status.active_job.name].state == "active"
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.created == [(1, 1), (2, 1)]


def test_a_lost_status_write_after_a_failed_attempt_adopts_the_retry():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(75)
    w.refuse_status = 1
    w.reconcile()
    w.now += timedelta(minutes=10)  # past any backoff
    w.reconcile()
    assert len(w.created) == len(set(w.created)), w.created
    assert not [j for j in w.jobs.values() if j.state == "active" and j.name != w.status.active_job.name]


def test_an_adopted_job_that_ended_already_is_observed_next_pass():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.refuse_status = 1
    w.reconcile()  # lap 2's Job created, the status write lost
    (lap2,) = [n for n, j in w.jobs.items() if j.lap == 2]
    w.jobs[lap2] = dataclasses.replace(w.jobs[lap2], state="succeeded", exit_code=0)  # and it ended
    w.store[2] = ok_read(record(2, "done"))
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.status.lap == 2 and w.created == [(1, 1), (2, 1)]


def test_a_job_two_steps_ahead_of_the_status_is_still_a_stray():
    w = World(make_spec())
    w.reconcile()
    w.jobs["zombie-l3"] = d.ObservedJob("zombie-l3", 3, 1, "active")
    assert d.DeleteJob("zombie-l3") in w.reconcile().actions


def test_stray_active_job_is_deleted():
    w = World(make_spec())
    w.reconcile()
    w.jobs["zombie"] = d.ObservedJob("zombie", 1, 9, "active")
    dec = w.reconcile()
    assert d.DeleteJob("zombie") in dec.actions


def test_suspend_between_laps_and_resume():
    w = World(make_spec())
    w.reconcile()
    w.spec = make_spec(suspend=True)
    w.generation = 2
    assert w.reconcile().of(d.CreateJob) == []  # the running lap finishes
    w.finish_job()
    w.reconcile()
    assert w.status.phase == "Suspended" and w.status.lap == 1 and w.created == [(1, 1)]
    assert {c.type: c.status for c in w.status.conditions}["Suspended"] == "True"
    assert w.reconcile().actions == []
    w.spec = make_spec(suspend=False)
    w.generation = 3
    dec = w.reconcile()
    assert dec.of(d.CreateJob)[0].lap == 2 and "Resumed" in w.reasons()
    assert w.status.observed_generation == 3


def test_version_change_takes_effect_next_lap_with_event():
    w = World(make_spec())
    w.reconcile()
    w.spec = make_spec(agent={"version": "v2", "model": {"provider": "scripted", "script": [{"content": "x"}]}})
    assert w.reconcile().of(d.CreateJob) == []
    w.finish_job()
    dec = w.reconcile()
    assert dec.of(d.CreateJob)[0].agent_version == "v2"
    (ev,) = [e for e in w.events if e.reason == "VersionChanged"]
    assert "v2" in ev.message and "v1" in ev.message


def test_terminal_does_nothing():
    w = World(make_spec())
    w.status = w.status.model_copy(update={"phase": "Succeeded"})
    assert w.reconcile().actions == []


def test_invalid_spec_fails_readably():
    w = World(make_spec())
    obs = w.observed()
    obs = d.Observed(**{**obs.__dict__, "spec": None, "spec_error": "spec.agent.model.script: field required"})
    dec = d.decide(obs)
    assert dec.status.phase == "Failed" and "spec.agent.model.script" in dec.status.message


def test_retention_delete_finalizer_lifecycle():
    w = World(make_spec(checkpoint={"retention": "Delete"}))
    dec = w.reconcile()
    assert d.AddFinalizer() in dec.actions and w.finalizers == [d.FINALIZER]
    w.deleting = True
    dec = d.decide(w.observed())
    assert dec.actions == [d.DeleteCheckpoints(), d.RemoveFinalizer()]


def test_retention_retain_adds_no_finalizer():
    w = World(make_spec())
    dec = w.reconcile()
    assert not dec.of(d.AddFinalizer) and w.finalizers == []
    w.deleting = True
    assert d.decide(w.observed()).actions == []


def test_store_unavailable_posts_one_event_per_lap_attempt_while_requeueing():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    good = w.store[1]
    w.store[1] = d.CheckpointRead(lap=1, kind="unavailable", error="connection refused")
    for i in range(5):  # five requeues while the store is down
        w.now += timedelta(seconds=10)
        dec = w.reconcile()
        assert dec.requeue_after, i
        if i > 0:
            assert dec.of(d.PatchStatus) == [], i  # nothing changes: no status write, no Event
    assert w.reasons().count("StoreUnavailable") == 1
    (ev,) = [e for e in w.events if e.reason == "StoreUnavailable"]
    assert ev.lap == 1 and ev.attempt == 1 and "connection refused" in ev.message
    assert w.status.phase == "Running" and {c.type: c.reason for c in w.status.conditions}["Progressing"] == "StoreUnavailable"
    w.store[1] = good  # the store is back
    w.reconcile()
    assert w.status.lap == 1 and w.status.active_job.lap == 2
    assert {c.type: c.reason for c in w.status.conditions}["Progressing"] == "LapRunning"
    w.finish_job()
    w.store[2] = d.CheckpointRead(lap=2, kind="unavailable", error="timeout")
    w.reconcile()
    w.reconcile()
    assert w.reasons().count("StoreUnavailable") == 2  # once more, for lap 2


def test_status_storage_is_the_records_count_plus_the_record_itself():
    from agentrun.checkpoint.schema import Storage

    w = World(make_spec())
    w.reconcile()
    rec = record(1).model_copy(update={"storage": Storage(bytes=1000, objects=3)})
    w.store[1] = dataclasses.replace(ok_read(rec), size=500)
    w.finish_job()
    decision = w.reconcile()
    assert w.status.storage is not None and (w.status.storage.bytes, w.status.storage.objects) == (1500, 4)
    (fin,) = [a for a in decision.actions if isinstance(a, d.LapFinished)]
    assert fin.checkpoint_bytes == 500
    w.finish_job()
    w.store[2] = dataclasses.replace(ok_read(record(2).model_copy(update={"storage": Storage(bytes=1900, objects=5)})), size=600)
    decision = w.reconcile()
    (fin,) = [a for a in decision.actions if isinstance(a, d.LapFinished)]
    assert (w.status.storage.bytes, fin.checkpoint_bytes) == (2500, 1000)  # the record + what came before it


def test_records_without_storage_leave_status_storage_unset():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.reconcile()
    assert w.status.lap == 1 and w.status.storage is None


def test_a_job_started_before_a_lost_write_is_adopted_even_if_suspended_since():
    """The lap's Job exists (its status write lost) and the run was suspended meanwhile: the lap in
    flight is adopted and ends, as any lap in flight does; the status says so (not Suspended)."""
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.refuse_status = 1
    w.reconcile()  # lap 2's Job created, its status write lost
    w.spec = make_spec(suspend=True)
    w.generation = 2
    dec = w.reconcile()
    assert not dec.of(d.DeleteJob) and not dec.of(d.CreateJob)
    assert w.status.phase == "Running" and w.status.active_job.lap == 2
    assert w.reconcile().actions == []  # settled
    w.finish_job()
    w.reconcile()
    assert w.status.phase == "Suspended" and w.status.lap == 2 and w.created == [(1, 1), (2, 1)]
