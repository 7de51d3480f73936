"""decide(): the store probe before the first lap, and spec.ttlSecondsAfterFinished."""

from __future__ import annotations

from datetime import timedelta

from controller_world import T0, World, fork_read, make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.controller import decide as d

UNSAFE = d.StoreProbeRead("unsafe", "http://old-minio:9000", "ckpt",
                          "a second PUT with If-None-Match: * of an existing object succeeded")
DOWN = d.StoreProbeRead("unavailable", "http://s3:9000", "ckpt", "cannot reach the store")


# ---- the store probe ------------------------------------------------------------------------


def test_a_new_run_asks_for_the_probe_and_nothing_else():
    w = World(make_spec(), probe=None)
    pin = w.reconcile_once()  # write-ahead: the store is pinned in status first (issue 11)
    assert pin.of(d.ProbeStore) == [] and pin.of(d.CreateJob) == [] and w.status.store is not None
    dec = d.decide(w.observed())
    assert dec.actions == [d.ProbeStore()] and dec.needs_read


def test_a_safe_store_lets_the_first_lap_start_and_is_not_asked_again_mid_run():
    w = World(make_spec(), probe=None)
    w.reconcile()
    assert w.probes == 1 and w.created == [(1, 1)]
    w.probe = None  # a new operator process: nothing cached
    w.finish_job()
    w.reconcile()
    assert w.probes == 1, "a run past lap 0 was probed again"
    assert w.created == [(1, 1), (2, 1)]


def test_an_unsafe_store_fails_the_run_naming_the_endpoint_before_any_lap():
    w = World(make_spec(), probe=None, probe_answer=UNSAFE)
    w.reconcile()
    assert w.created == [] and w.jobs == {}
    assert w.status.phase == "Failed"
    failed = {c.type: c for c in w.status.conditions}["Failed"]
    assert failed.status == "True" and failed.reason == "StoreUnsafe"
    assert "http://old-minio:9000" in failed.message and "bucket ckpt" in failed.message
    assert "If-None-Match" in failed.message
    assert w.reasons() == ["StoreUnsafe"]
    again = w.reconcile()
    assert again.of(d.CreateJob) == [] and again.of(d.Event) == []


def test_an_unsafe_store_stops_a_fork_before_its_snapshot_is_written():
    w = World(make_spec(forkFrom={"name": "src", "uid": "5eed0000-0000-0000-0000-000000000000", "lap": 2}),
              probe=None, probe_answer=UNSAFE, fork_reads=[fork_read(2)])
    w.reconcile()
    assert w.fork_calls == [] and w.status.phase == "Failed"


def test_a_store_that_cannot_be_probed_waits_with_one_event_then_starts():
    w = World(make_spec(), probe=None, probe_answer=DOWN)
    dec = w.reconcile()
    assert w.status.phase == "Pending" and dec.requeue_after == 10.0 and w.created == []
    progressing = {c.type: c for c in w.status.conditions}["Progressing"]
    assert progressing.reason == "StoreUnavailable" and "http://s3:9000" in progressing.message
    w.probe = None
    w.reconcile()
    assert w.reasons().count("StoreUnavailable") == 1, "one Event, not one per requeue"
    w.probe, w.probe_answer = None, World(make_spec()).probe_answer
    w.reconcile()
    assert w.created == [(1, 1)] and w.status.phase == "Running"


# ---- ttlSecondsAfterFinished ----------------------------------------------------------------


def finished(ttl: int | None, retention: str = "Retain") -> World:
    spec = make_spec(checkpoint={"retention": retention},
                     **({} if ttl is None else {"ttlSecondsAfterFinished": ttl}))
    w = World(spec)
    w.reconcile()
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.status.completed_at == T0
    return w


def test_without_a_ttl_a_finished_run_stays():
    w = finished(None)
    w.now += timedelta(days=365)
    dec = w.reconcile()
    assert dec.of(d.DeleteRun) == [] and dec.requeue_after is None and not w.deleted


def test_a_finished_run_is_deleted_once_the_ttl_passed_and_not_before():
    w = finished(60)
    w.now = T0 + timedelta(seconds=20)
    dec = w.reconcile()
    assert dec.of(d.DeleteRun) == [] and dec.requeue_after == 40.0
    w.now = T0 + timedelta(seconds=60)
    dec = w.reconcile()
    assert dec.of(d.DeleteRun) == [d.DeleteRun(60)] and w.deleted
    (ev,) = [e for e in w.events if e.reason == "TTLExpired"]
    assert "ttlSecondsAfterFinished=60s" in ev.message and "kept" in ev.message


def test_ttl_zero_deletes_at_the_next_reconcile_and_retention_delete_takes_the_checkpoints():
    w = finished(0, retention="Delete")
    assert d.FINALIZER in w.finalizers
    w.reconcile()
    assert w.deleted
    dec = w.reconcile()  # now deleting: the finalizer path
    assert dec.actions == [d.DeleteCheckpoints(), d.RemoveFinalizer()]


def test_a_running_run_is_never_deleted_by_its_ttl():
    w = World(make_spec(ttlSecondsAfterFinished=0))
    w.reconcile()
    w.now += timedelta(days=1)
    dec = w.reconcile()
    assert dec.of(d.DeleteRun) == [] and not w.deleted


def test_a_failed_run_expires_too():
    w = World(make_spec(ttlSecondsAfterFinished=5), probe=None, probe_answer=UNSAFE)
    w.reconcile()
    assert w.status.phase == "Failed"
    w.now = w.status.completed_at + timedelta(seconds=5)
    assert w.reconcile().of(d.DeleteRun) == [d.DeleteRun(5)]


# ---- properties -----------------------------------------------------------------------------

LIFE_EVENTS = st.one_of(
    st.tuples(st.just("finish"), st.sampled_from(["continue", "done", "failed"])),
    st.tuples(st.just("exit"), st.sampled_from([75, 2, None])),
    st.tuples(st.just("tick"), st.floats(min_value=0.1, max_value=30)),
    st.tuples(st.just("restart"), st.none()),  # a new operator process: the probe cache is empty
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(LIFE_EVENTS, max_size=30), ttl=st.sampled_from([None, 0, 5, 60]),
       probe=st.sampled_from(["ok", "unsafe", "unavailable"]))
def test_no_lap_on_an_unsafe_store_and_no_delete_before_the_ttl(events, ttl, probe):
    answer = {"ok": World(make_spec()).probe_answer, "unsafe": UNSAFE, "unavailable": DOWN}[probe]
    w = World(make_spec(**({} if ttl is None else {"ttlSecondsAfterFinished": ttl})), probe=None,
              probe_answer=answer)
    for kind, arg in events:
        if w.deleted:
            break
        before = w.status
        aj = w.status.active_job
        if kind == "finish" and aj and aj.name in w.jobs:
            w.finish_job(arg)
        elif kind == "exit" and aj and aj.name in w.jobs:
            w.fail_job(arg)
        elif kind == "tick":
            w.now += timedelta(seconds=arg)
        elif kind == "restart":
            w.probe = None
        dec = w.reconcile()
        if probe != "ok":
            assert w.created == [] and dec.of(d.CreateJob) == []
        if probe == "unsafe":
            assert w.status.phase == "Failed"
        for a in dec.of(d.DeleteRun):
            assert ttl is not None and a.ttl_seconds == ttl
            assert before.phase in ("Succeeded", "Failed", "BudgetExceeded")
            assert before.completed_at is not None
            assert w.now >= before.completed_at + timedelta(seconds=ttl)
        if ttl is None:
            assert not w.deleted


def test_a_store_that_cannot_be_configured_fails_the_run_once():
    bad = d.StoreProbeRead("invalid", detail="spec.checkpoint.uri is not set and the operator has no default")
    w = World(make_spec(), probe=None, probe_answer=bad)
    w.reconcile()
    assert w.created == [] and w.status.phase == "Failed"
    assert {c.type: c for c in w.status.conditions}["Failed"].reason == "InvalidConfiguration"
    assert "spec.checkpoint.uri is not set" in w.status.message
    assert w.reconcile().of(d.Event) == []
