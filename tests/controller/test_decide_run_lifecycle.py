"""decide(): retry in place, cancel and the run deadline (issue 31, agentrun.api.lifecycle)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from controller_world import T0, World, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.lifecycle import (
    ANN_CANCELLED_BY,
    ANN_RETRY,
    ANN_RETRY_FROM_LAP,
    ANN_RETRY_REQUESTED_BY,
    CANCEL_GRACE_SECONDS,
    RETRY_ANNOTATIONS,
)
from agentrun.controller import decide as d


def _spec(w: World, **over: object) -> None:
    doc = w.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    for k, v in over.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    w.spec = make_spec(**doc)
    w.generation += 1


def _retry(w: World, n: int, by: str = "alice", **extra: str) -> d.Decision:
    w.annotations.update({ANN_RETRY: str(n), ANN_RETRY_REQUESTED_BY: by, **extra})
    return w.reconcile()


def _failed_after_exhausted_attempts() -> World:
    w = World(make_spec())
    w.reconcile()
    for _ in range(3):
        w.fail_job(75)
        w.reconcile()
        w.now = w.status.next_attempt_at or w.now
        w.reconcile()
    assert w.status.phase == "Failed" and w.created == [(1, 1), (1, 2), (1, 3)]
    return w


def test_a_retry_continues_a_failed_run_in_place_as_the_next_attempt():
    w = _failed_after_exhausted_attempts()
    w.events.clear()
    _retry(w, 1)
    assert w.created[-1] == (1, 4), "the failed lap starts again as its next attempt (Job names stay distinct)"
    assert w.status.phase == "Running" and w.status.completed_at is None
    lc = w.status.lifecycle
    assert lc is not None and lc.retries == 1 and lc.last_retry_by == "alice" and lc.last_retry_from_phase == "Failed"
    assert not set(RETRY_ANNOTATIONS) & set(w.annotations), "the request is consumed"
    assert w.reasons()[0] == "Retried" and "same idempotency keys" in w.events[0].message
    # attemptsPerLap counts again from the retry: two more failures retry, the third fails the run
    for _ in range(2):
        w.fail_job(75)
        w.reconcile()
        assert w.status.phase == "Retrying"
        w.now = w.status.next_attempt_at or w.now
        w.reconcile()
    w.fail_job(75)
    w.reconcile()
    assert w.status.phase == "Failed" and "since retry 1" in (w.status.message or "")
    assert w.created[-3:] == [(1, 4), (1, 5), (1, 6)]


def test_a_retry_after_a_permanent_failure_does_not_reuse_the_failed_jobs_name():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(2)
    w.failure_reports[(1, 1)] = {"message": "tool refund answered 400"}
    w.reconcile()
    assert w.status.phase == "Failed"
    _retry(w, 1)
    assert w.created == [(1, 1), (1, 2)]


def test_a_stale_or_malformed_retry_is_refused_once_and_removed():
    w = _failed_after_exhausted_attempts()
    w.events.clear()
    for value, text in (("2", "is stale"), ("yes", "is not a retry number")):
        w.annotations.update({ANN_RETRY: value, ANN_RETRY_REQUESTED_BY: "bob"})
        w.reconcile()
        assert w.reasons() == ["RetryRefused"] and text in w.events[0].message
        assert w.status.phase == "Failed" and ANN_RETRY not in w.annotations
        w.reconcile()
        assert w.reasons() == ["RetryRefused"], "one Event per refused request, no hot loop"
        w.events.clear()


def test_a_retry_applied_whose_annotation_removal_was_lost_is_not_applied_twice():
    w = _failed_after_exhausted_attempts()
    _retry(w, 1)
    created = list(w.created)
    w.annotations[ANN_RETRY] = "1"  # the removal after the status write was lost
    w.events.clear()
    w.reconcile()
    assert w.status.lifecycle is not None and w.status.lifecycle.retries == 1
    assert w.created == created and "Retried" not in w.reasons() and ANN_RETRY not in w.annotations


def test_a_succeeded_or_live_run_is_not_retried():
    w = World(make_spec())
    w.reconcile()
    w.events.clear()
    _retry(w, 1)
    assert w.reasons() == ["RetryRefused"] and "not finished" in w.events[0].message
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded"
    w.events.clear()
    _retry(w, 1)
    assert w.reasons() == ["RetryRefused"] and "fork" in w.events[0].message and w.status.phase == "Succeeded"


def test_budget_exceeded_is_retried_only_after_a_top_up_naming_the_budget():
    w = World(make_spec(budget={"maxLaps": 1}))
    w.reconcile()
    w.finish_job()
    w.reconcile()
    assert w.status.phase == "BudgetExceeded"
    w.events.clear()
    _retry(w, 1)
    assert w.reasons() == ["RetryRefused"] and "raise spec.budget.maxLaps" in w.events[0].message
    _spec(w, budget={"maxLaps": 3, "maxCostUSD": "0.10"})
    w.events.clear()
    _retry(w, 1)
    assert "raise spec.budget.maxCostUSD" in w.events[0].message and w.status.phase == "BudgetExceeded"
    _spec(w, budget={"maxLaps": 3, "maxCostUSD": "5"})
    _retry(w, 1)
    assert w.created[-1] == (2, 1) and w.status.phase == "Running"


def test_cancel_mid_lap_deletes_the_job_with_a_grace_period_and_a_retry_runs_the_next_attempt():
    w = World(make_spec())
    w.reconcile()
    job = w.active().name
    _spec(w, cancel={"reason": "wrong\x1b[31m customer"})
    w.annotations[ANN_CANCELLED_BY] = "carol"
    dec = w.reconcile()
    assert d.DeleteJob(job, grace_seconds=CANCEL_GRACE_SECONDS) in dec.actions
    assert w.status.phase == "Cancelled" and w.status.active_job is None
    lc = w.status.lifecycle
    assert lc is not None and lc.cancelled_by == "carol" and "\x1b" not in (lc.cancel_reason or "")
    assert "Cancelled" in w.reasons()
    assert {c.type: c.reason for c in w.status.conditions}["Progressing"] == "Cancelled"
    w.events.clear()
    _retry(w, 1)
    assert "remove spec.cancel" in w.events[0].message and w.status.phase == "Cancelled"
    _spec(w, cancel=None)
    _retry(w, 1)
    assert w.created == [(1, 1), (1, 2)] and w.status.phase == "Running"


def test_cancel_while_awaiting_approval_withdraws_it_and_a_retry_asks_again():
    w = World(make_spec(approval={"owner": "ops", "timeout": "1h"}))
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.phase == "AwaitingApproval"
    _spec(w, cancel={"reason": "not needed"})
    w.reconcile()
    assert w.status.phase == "Cancelled" and w.status.approval is not None
    assert w.status.approval.state == "Withdrawn" and "ApprovalWithdrawn" in w.reasons()
    _spec(w, cancel=None)
    w.now += timedelta(hours=5)
    _retry(w, 1)
    ap = w.status.approval
    assert w.status.phase == "AwaitingApproval" and ap is not None and ap.state == "Pending"
    assert ap.deadline == w.now + timedelta(hours=1) and w.created == [(1, 1)]


def test_the_deadline_requeues_exactly_then_and_ends_the_run_deadline_exceeded():
    w = World(make_spec(activeDeadline="90s"))
    dec = w.reconcile()
    assert w.status.started_at == T0 and dec.requeue_after is not None
    w.now = T0 + timedelta(seconds=30)
    assert d.decide(w.observed()).requeue_after == 60.0
    job = w.active().name
    w.now = T0 + timedelta(seconds=90)
    dec = w.reconcile()
    assert d.DeleteJob(job, grace_seconds=CANCEL_GRACE_SECONDS) in dec.actions
    assert w.status.phase == "DeadlineExceeded" and "spec.activeDeadline=90s" in (w.status.message or "")
    w.events.clear()
    _retry(w, 1)
    assert "raise spec.activeDeadline" in w.events[0].message
    _spec(w, activeDeadline="1h")
    _retry(w, 1)
    assert w.created == [(1, 1), (1, 2)]


def test_retry_from_an_earlier_lap_after_a_side_effect_is_refused_naming_fork():
    w = World(make_spec(budget={"maxLaps": 1}))
    w.reconcile()
    w.sent[1] = [d.SentCall(1, "call_1", "refund")]
    w.finish_job()
    w.reconcile()
    _spec(w, budget={"maxLaps": 5})
    w.events.clear()
    _retry(w, 1, **{ANN_RETRY_FROM_LAP: "0"})
    assert w.reasons() == ["RetryRefused"] and "fork" in w.events[0].message


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["fail", "cancel", "retry", "dup", "uncancel", "tick"]), max_size=14))
def test_lifecycle_never_runs_two_jobs_or_reuses_an_attempt(ops):
    w = World(make_spec(retry={"attemptsPerLap": 2, "backoff": {"initial": "1s", "max": "2s", "factor": 2}},
                        activeDeadline="1h"))
    w.reconcile()
    for op in ops:
        lc = w.status.lifecycle
        done = lc.retries if lc is not None else 0
        if op == "fail" and w.status.active_job is not None and w.status.active_job.name in w.jobs:
            w.fail_job(75)
        elif op == "cancel":
            _spec(w, cancel={"reason": "x"})
        elif op == "uncancel":
            _spec(w, cancel=None)
        elif op == "retry":
            w.annotations.update({ANN_RETRY: str(done + 1), ANN_RETRY_REQUESTED_BY: "u"})
        elif op == "dup":
            w.annotations.update({ANN_RETRY: str(done), ANN_RETRY_REQUESTED_BY: "u"})
        elif op == "tick":
            w.now += timedelta(seconds=5)
        w.reconcile()
        assert len(w.created) == len(set(w.created)), "an attempt's Job was created twice"
        assert sum(j.state == "active" for j in w.jobs.values()) <= 1
        if w.status.phase in ("Cancelled", "Failed"):
            assert w.status.active_job is None
        assert not set(RETRY_ANNOTATIONS) & set(w.annotations)



def test_a_retry_of_a_run_whose_spec_cannot_be_used_is_refused_once():
    w = World(make_spec())
    w.status = w.status.model_copy(update={"phase": "Failed"})
    obs = dataclasses.replace(w.observed(), spec=None, spec_error="spec.agent: field required",
                              annotations={ANN_RETRY: "1", ANN_RETRY_REQUESTED_BY: "alice"})
    dec = d.decide(obs)
    assert [e.reason for e in dec.of(d.Event)] == ["RetryRefused"]
    assert "spec.agent: field required" in dec.of(d.Event)[0].message
    assert dec.of(d.RemoveAnnotations) == [d.RemoveAnnotations(RETRY_ANNOTATIONS, before_status=True)]
