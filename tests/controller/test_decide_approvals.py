"""decide(): approvals: decisions by annotation or status patch, the deadline, stray annotations (the in-memory world)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from controller_world import T0, World, make_spec

from agentrun.controller import decide as d


def _await_approval(w: World) -> None:
    w.reconcile()
    w.finish_job("continue")
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.phase == "AwaitingApproval"


def test_awaiting_approval_no_job_and_requeue_at_deadline():
    w = World(make_spec())
    _await_approval(w)
    ap = w.status.approval
    assert ap.state == "Pending" and ap.owner == "ops" and ap.lap == 2 and ap.call_id == "c1"
    assert ap.deadline == T0 + timedelta(seconds=3) and w.status.waiting_on == "ops"
    assert "ApprovalRequested" in w.reasons()
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and dec.requeue_after == 3.0


@pytest.mark.parametrize("value,state,decision", [("true", "Approved", "approved"), ("false", "Rejected", "rejected")])
def test_annotation_decides_and_is_removed(value, state, decision):
    w = World(make_spec())
    _await_approval(w)
    w.annotations.update({"approved": value, "agentrun.dev/reason": "checked", "other": "x"})
    w.now += timedelta(seconds=1)
    dec = w.reconcile()
    assert w.annotations == {"other": "x"}
    assert w.status.approval.state == state and w.status.approval.reason == "checked"
    assert w.status.approval.decided_at == w.now and w.status.waiting_on is None
    (create,) = dec.of(d.CreateJob)
    assert create.lap == 3 and create.approval.decision == decision and create.approval.call_id == "c1"
    assert create.approval.reason == "checked" and "ApprovalDecided" in w.reasons()
    w.finish_job("continue")
    w.reconcile()
    assert w.create_actions[-1].approval is None  # delivered once


def test_plain_reason_annotation_accepted():
    w = World(make_spec())
    _await_approval(w)
    w.annotations.update({"approved": "true", "reason": "ok by me"})
    w.reconcile()
    assert w.status.approval.reason == "ok by me" and w.annotations == {}


def test_status_patch_decision():
    w = World(make_spec())
    _await_approval(w)
    w.status.approval.decision = "rejected"
    w.status.approval.decided_by = "alice"
    dec = w.reconcile()
    assert w.status.approval.state == "Rejected" and dec.of(d.CreateJob)[0].approval.decided_by == "alice"


def test_timeout_reject_is_timed_out_not_rejected():
    w = World(make_spec())
    _await_approval(w)
    w.now += timedelta(seconds=3)
    dec = w.reconcile()
    assert w.status.approval.state == "TimedOut"
    assert dec.of(d.CreateJob)[0].approval.decision == "timed-out"
    assert "ApprovalTimedOut" in w.reasons()


def test_timeout_fail():
    w = World(make_spec(approval={"owner": "ops", "timeout": "3s", "onTimeout": "fail"}))
    _await_approval(w)
    w.now += timedelta(seconds=5)
    w.annotations["approved"] = "true"  # too late
    w.reconcile()
    assert w.status.phase == "Failed" and w.status.approval.state == "TimedOut"
    assert w.annotations == {} and "onTimeout is fail" in w.status.message


def test_annotation_on_a_run_not_waiting_is_ignored_and_removed():
    w = World(make_spec())
    w.reconcile()
    w.annotations["approved"] = "true"
    dec = w.reconcile()
    assert w.annotations == {} and "ApprovalIgnored" in w.reasons()
    assert dec.of(d.CreateJob) == []
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.approval.state == "Pending"  # not approved in advance


def test_invalid_annotation_value_is_removed_and_still_waiting():
    w = World(make_spec())
    _await_approval(w)
    w.annotations["approved"] = "maybe"
    w.reconcile()
    assert w.annotations == {} and w.status.approval.state == "Pending"
    assert any("neither true nor false" in e.message for e in w.events)


def test_an_annotation_consumed_twice_in_one_decision_gives_one_warning():
    """The status write that recorded a lap asking for approval was lost, and an approval arrives
    after its deadline: the decision reads the status (not waiting: the annotation is stray) and
    then the lap's checkpoint (waiting, and timed out): the annotation is removed once, with one
    Warning (hypothesis seed 69 of test_invariants)."""
    w = World(make_spec(approval={"owner": "ops", "timeout": "5s", "onTimeout": "fail"}))
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.refuse_status = 1
    w.reconcile()
    w.now += timedelta(seconds=30)
    w.annotations["approved"] = "true"
    dec = w.reconcile()
    assert len([e for e in dec.of(d.Event) if e.reason == "ApprovalIgnored"]) == 1, dec.actions
    assert len(dec.of(d.RemoveAnnotations)) == 1 and w.status.phase == "Failed"
