"""decide(): failed lap attempts: typed reasons, backoff, the end of the attempts, permanent failures (the in-memory world)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from controller_world import T0, World, make_spec

from agentrun.controller import decide as d


@pytest.mark.parametrize("exit_code,reason", [(75, None), (None, "DeadlineExceeded"), (137, "Evicted"), (1, None)])
def test_retryable_failures_retry_with_backoff(exit_code, reason):
    w = World(make_spec())
    w.reconcile()
    w.fail_job(exit_code, reason)
    dec = w.reconcile()
    assert w.status.phase == "Retrying" and w.status.total_retries == 1
    assert w.status.retries[0].lap == 1 and w.status.retries[0].retries == 1
    assert dec.requeue_after == 2.0 and w.status.next_attempt_at == T0 + timedelta(seconds=2)
    assert dec.of(d.LapRetried) and "LapRetry" in w.reasons()
    w.now += timedelta(seconds=1)
    assert w.reconcile().of(d.CreateJob) == []
    w.now += timedelta(seconds=1)
    (create,) = w.reconcile().of(d.CreateJob)
    assert (create.lap, create.attempt) == (1, 2)
    w.fail_job(75)
    dec = w.reconcile()
    assert dec.requeue_after == 4.0  # initial * factor
    w.now += timedelta(seconds=4)
    w.reconcile()
    w.fail_job(75)
    w.reconcile()
    assert w.status.phase == "Failed" and "3 of 3" in w.status.message
    assert w.created == [(1, 1), (1, 2), (1, 3)]


def test_backoff_is_capped():
    spec = make_spec(retry={"attemptsPerLap": 10, "backoff": {"initial": "2s", "max": "5s", "factor": 3}})
    assert [d.backoff_seconds(spec, n) for n in (1, 2, 3)] == [2.0, 5.0, 5.0]


def test_exit_2_fails_with_message_from_store():
    w = World(make_spec())
    w.reconcile()
    w.failure_reports[(1, 1)] = {"exitClass": "permanent", "message": "tool 'refund' was removed from the spec"}
    w.fail_job(2)
    w.reconcile()
    assert w.status.phase == "Failed" and "tool 'refund' was removed" in w.status.message
    assert w.created == [(1, 1)]


def test_exit_2_without_report_still_fails_readably():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(2)
    w.reconcile()
    assert w.status.phase == "Failed" and "no failure report" in w.status.message


def test_job_missing_after_restart_reads_checkpoint():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.jobs.clear()  # finished and TTL-deleted while the operator was down
    w.reconcile()
    assert w.status.lap == 1 and w.created == [(1, 1), (2, 1)]


def test_job_missing_without_checkpoint_is_a_retry():
    w = World(make_spec())
    w.reconcile()
    w.jobs.clear()
    w.reconcile()
    assert w.status.phase == "Retrying" and "JobMissing" in w.status.retries[0].last_reason


def test_lap_retry_event_names_the_failing_lap_for_the_log():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.reconcile()  # lap 1 checkpointed; lap 2 running
    w.fail_job(75)
    w.reconcile()
    (ev,) = [e for e in w.events if e.reason == "LapRetry"]
    assert (ev.lap, ev.attempt) == (2, 1) and w.status.lap == 1


def test_exit_2_with_an_unreadable_checkpoint_report_fails_checkpoint_unreadable():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.reconcile()  # lap 2 running
    key = "p/ns/run/uid/laps/00000001.json"
    w.failure_reports[(2, 1)] = {"exitClass": "permanent", "reason": "CheckpointUnreadable",
                                 "message": f"checkpoint {key}: sha256 mismatch"}
    w.fail_job(2)
    w.reconcile()
    assert w.status.phase == "Failed" and key in w.status.message
    assert {c.type: c.reason for c in w.status.conditions}["Failed"] == "CheckpointUnreadable"
    assert "CheckpointUnreadable" in w.reasons() and w.status.total_retries == 0
    assert w.reconcile().actions == [] and w.created == [(1, 1), (2, 1)]


def test_exit_2_with_a_checkpoint_too_large_report_fails_naming_lap_size_and_limit():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.reconcile()  # lap 2 running
    msg = ("lap 2: its checkpoint is 9437184 bytes (compressed), over the limit of 8388608 bytes per lap "
           "(spec.checkpoint.maxLapBytes); the lap record was not written")
    w.failure_reports[(2, 1)] = {"exitClass": "permanent", "reason": "CheckpointTooLarge", "message": msg}
    w.fail_job(2)
    w.reconcile()
    assert w.status.phase == "Failed" and msg in w.status.message
    assert {c.type: c.reason for c in w.status.conditions}["Failed"] == "CheckpointTooLarge"
    assert "CheckpointTooLarge" in w.reasons() and w.status.total_retries == 0
    assert w.reconcile().actions == [] and w.created == [(1, 1), (2, 1)]  # never retried


@pytest.mark.parametrize("exit_code,reason,lost", [
    (137, None, True),                 # SIGKILL: the runner never ended its lap span
    (None, "OOMKilled", True),
    (None, "Evicted", True),           # the pod gone, its exit unknown
    (None, "DeadlineExceeded", True),
    (143, None, False),                # SIGTERM: the runner ends and sends its spans, then exits 143
    (75, None, False),                 # exits of the runner itself send the span
    (1, None, False),
])
def test_a_failed_attempt_that_could_not_send_its_lap_span_gets_one_from_the_operator(exit_code, reason, lost):
    w = World(make_spec())
    w.tracing = True
    w.reconcile()
    started = w.status.active_job.started_at
    w.now += timedelta(seconds=30)
    w.fail_job(exit_code, reason)
    (retried,) = w.reconcile().of(d.LapRetried)
    if not lost:
        assert retried.lost_span is None
        return
    span = retried.lost_span
    assert span is not None and (retried.lap, span.attempt) == (1, 1)
    assert (span.started_at, span.ended_at) == (started, w.now)
    assert span.message == w.status.retries[0].last_reason


def test_no_lost_lap_span_without_tracing_or_for_a_lost_job_in_place_of_a_killed_one():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(137)
    (retried,) = w.reconcile().of(d.LapRetried)
    assert retried.lost_span is None, "tracing off: nothing to send"
    w = World(make_spec())
    w.tracing = True
    w.reconcile()
    w.jobs.clear()  # the Job (and its pod) disappeared mid-lap
    (retried,) = w.reconcile().of(d.LapRetried)
    assert retried.lost_span is not None and retried.reason == "job_missing"
