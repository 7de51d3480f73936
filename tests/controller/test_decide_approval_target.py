"""decide(): a decision is bound to the call's TARGET (the tool's definition, the lap image, the
arguments digest: api.approval.target_sha256), not only to the call; a target that changes under a
pending or approved call is asked again (one ApprovalStale Event), never executed; four eyes
(spec.approval.approvers, distinctFromCreator); a decision that is not recorded leaves the
annotations before the status asks anything new (Decision.writes)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controller_world import T0, World, make_spec, ok_read, record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_CALL_ID,
    ANN_CREATED_BY,
    ANN_DECIDED_BY,
    ANN_TARGET_SHA256,
    arguments_sha256,
    target_sha256,
)
from agentrun.api.reasons import Reason
from agentrun.controller import decide as d
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import ANNOTATION_APPROVAL, RunIdentity, build_job

SHA = arguments_sha256({"x": 1})  # the pending call of controller_world.record(pending=True)
IMAGE = "registry.example/agentrun:1"  # World.lap_image
URL = "https://user:hunter2@pay.example/refund?token=abc123"


def _tool(url: str = URL, **kw: Any) -> dict[str, Any]:
    http = {"url": url, "method": "POST", "headersSecretRef": {"name": "pay-headers", "key": "h"}}
    http.update(kw.pop("http", {}))
    return {"name": "refund", "description": "refunds", "requiresApproval": True, "http": http, **kw}


def _spec(tool: dict[str, Any] | None = None, image: str | None = None, **approval: Any):
    agent = {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]},
             "tools": [tool or _tool()]}
    if image:
        agent["image"] = image
    return make_spec(agent=agent, approval={"owner": "ops", "timeout": "1h", "onTimeout": "reject", **approval})


def _waiting(**approval: Any) -> World:
    w = World(_spec(**approval))
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.phase == "AwaitingApproval" and w.status.approval.state == "Pending"
    return w


def _respec(w: World, **kw: Any) -> None:
    approval = w.spec.approval.model_dump(by_alias=True)
    approval.update(kw.pop("approval", {}))
    w.spec = _spec(kw.pop("tool", None), kw.pop("image", None), **approval)
    w.generation += 1


def _approve(w: World, who: str, **more: str) -> d.Decision:
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: who, **more})
    return w.reconcile()


def _executing(w: World) -> list[d.CreateJob]:
    lap = w.status.lap
    return [a for a in w.create_actions if a.lap > lap]


# ----------------------------------------------------------------------------- the target in status


def test_the_pending_approval_shows_its_target_without_credentials_and_binds_its_digest():
    w = _waiting()
    ap = w.status.approval
    assert ap.target is not None
    assert (ap.target.method, ap.target.url, ap.target.headers_secret, ap.target.image) == (
        "POST", "https://pay.example/refund?token=…", "pay-headers", IMAGE)
    assert "hunter2" not in ap.model_dump_json() and "abc123" not in ap.model_dump_json()
    assert ap.target_sha256 == target_sha256(w.spec.tool("refund"), IMAGE, SHA)
    assert ap.approvals_required == 1 and ap.approved_by == []
    assert "POST https://pay.example/refund" in w.status.message


def test_the_executing_job_carries_the_target_digest_in_env_and_annotation():
    w = _waiting()
    _approve(w, "alice")
    (create,) = _executing(w)
    assert create.approval is not None and create.approval.target_sha256 == w.status.approval.target_sha256
    job = build_job(RunIdentity("ns", "run", "u"), w.spec, create.lap, 1, "v1", OperatorConfig(lap_image=IMAGE),
                    approval=create.approval, store=create.store)
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_APPROVAL_TARGET_SHA256"] == create.approval.target_sha256
    assert env["AGENTRUN_APPROVAL_ARGUMENTS_SHA256"] == SHA and env["AGENTRUN_IMAGE"] == IMAGE
    assert create.approval.target_sha256 in job["metadata"]["annotations"][ANNOTATION_APPROVAL]


# ----------------------------------------------------------------------------- stale: asked again


def test_a_url_changed_under_a_pending_call_asks_again_with_one_stale_event():
    w = _waiting()
    old = w.status.approval
    w.now = T0 + timedelta(minutes=10)
    _respec(w, tool=_tool("https://evil.example/refund"))
    dec = w.reconcile()
    ap = w.status.approval
    stale = [e for e in dec.of(d.Event) if e.reason == Reason.APPROVAL_STALE]
    assert len(stale) == 1 and "url https://pay.example/refund?token=… -> https://evil.example/refund" in stale[0].message
    assert ap.state == "Pending" and ap.target.url == "https://evil.example/refund"
    assert ap.requested_at == w.now and ap.deadline == w.now + timedelta(hours=1)
    assert ap.target_sha256 != old.target_sha256 and ap.notified is None
    assert w.status.phase == "AwaitingApproval" and _executing(w) == []
    assert w.reconcile().of(d.Event) == []  # once


def test_a_decision_waiting_in_the_annotations_for_the_old_target_is_removed_first_and_not_applied():
    w = _waiting()
    _respec(w, tool=_tool("https://evil.example/refund"))
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: "alice", ANN_CALL_ID: "c1"})
    w.refuse_status = 1  # even when the new Pending status is refused, the old decision is gone
    dec = w.reconcile_once()
    writes = dec.writes()
    assert isinstance(writes[0], d.RemoveAnnotations) and writes[0].before_status
    assert isinstance(writes[1], d.PatchStatus) and writes[1].status.approval.state == "Pending"
    assert w.annotations == {}
    w.reconcile()
    assert w.status.approval.state == "Pending" and w.status.approval.target.url == "https://evil.example/refund"
    assert _executing(w) == []


def test_an_approved_call_whose_target_changed_before_its_job_is_not_executed_and_asked_again():
    w = _waiting()
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: "alice"})
    w.reconcile_once()  # the decision recorded (write-ahead); the Job would follow on the next pass
    assert w.status.approval.state == "Approved" and _executing(w) == []
    _respec(w, tool=_tool(URL, http={"headersSecretRef": {"name": "attacker-headers", "key": "h"}}))
    dec = w.reconcile()
    assert _executing(w) == [] and w.status.approval.state == "Pending"
    (stale,) = [e for e in dec.of(d.Event) if e.reason == Reason.APPROVAL_STALE]
    assert "was approved for another target" in stale.message
    assert "headers Secret pay-headers -> attacker-headers" in stale.message
    _approve(w, "alice")
    (create,) = _executing(w)
    assert create.approval.target_sha256 == target_sha256(w.spec.tool("refund"), IMAGE, SHA)


def test_an_image_change_and_a_parameters_change_are_stale_a_description_change_is_not():
    w = _waiting()
    _respec(w, image="registry.example/other:2")
    (e,) = [e for e in w.reconcile().of(d.Event) if e.reason == Reason.APPROVAL_STALE]
    assert f"image {IMAGE} -> registry.example/other:2" in e.message
    _respec(w, image="registry.example/other:2", tool=_tool(parameters={"type": "object", "properties": {}}))
    (e,) = [e for e in w.reconcile().of(d.Event) if e.reason == Reason.APPROVAL_STALE]
    assert "the tool's definition (parameters" in e.message
    digest = w.status.approval.target_sha256
    _respec(w, image="registry.example/other:2",
            tool=_tool(parameters={"type": "object", "properties": {}}, description="reworded"))
    assert w.reconcile().of(d.Event) == [] and w.status.approval.target_sha256 == digest


def test_the_operators_default_image_is_the_effective_one():
    w = _waiting()
    w.lap_image = "registry.example/agentrun:2"
    (e,) = [e for e in w.reconcile().of(d.Event) if e.reason == Reason.APPROVAL_STALE]
    assert "image registry.example/agentrun:1 -> registry.example/agentrun:2" in e.message


def test_a_decision_bound_to_another_target_is_refused():
    w = _waiting()
    dec = _approve(w, "alice", **{ANN_TARGET_SHA256: "0" * 64})
    assert w.status.approval.state == "Pending" and w.annotations == {}
    assert Reason.APPROVAL_BINDING_MISMATCH in [e.reason for e in dec.of(d.Event)]
    _approve(w, "alice", **{ANN_TARGET_SHA256: w.status.approval.target_sha256})
    assert w.status.approval.state == "Approved"


def test_an_approval_of_an_earlier_release_is_bound_to_the_current_spec_without_an_event():
    w = _waiting()
    w.status.approval.target, w.status.approval.target_sha256 = None, None
    dec = w.reconcile()
    assert w.status.approval.target_sha256 == target_sha256(w.spec.tool("refund"), IMAGE, SHA)
    assert dec.of(d.Event) == []


def test_a_lap_that_ran_with_another_target_is_shown_the_current_one_with_a_warning():
    w = World(_spec())
    w.reconcile()
    rec = record(1, "awaiting-approval", pending=True)
    pa = rec.pending_approval.model_copy(update={"tool": "refund", "target_sha256": "1" * 64})
    w.store[1] = ok_read(rec.model_copy(update={"pending_approval": pa}))
    w.finish_job("awaiting-approval")
    dec = w.reconcile()
    assert w.status.approval.target_sha256 == target_sha256(w.spec.tool("refund"), IMAGE, SHA)
    assert Reason.APPROVAL_STALE in [e.reason for e in dec.of(d.Event)]


# ----------------------------------------------------------------------------- four eyes


def test_two_approvers_one_of_two_then_the_same_user_refused_then_a_second_user_completes():
    w = _waiting(approvers=2)
    assert w.status.approval.approvals_required == 2
    dec = _approve(w, "alice", reason="ok")
    ap = w.status.approval
    assert ap.state == "Pending" and [v.user for v in ap.approved_by] == ["alice"] and ap.decision is None
    assert ap.decided_by is None and w.annotations == {} and _executing(w) == []
    (rec,) = [e for e in dec.of(d.Event) if e.reason == Reason.APPROVAL_RECORDED]
    assert "(1 of 2)" in rec.message and "1 of 2" in w.status.message
    dec = _approve(w, "alice")
    (dup,) = [e for e in dec.of(d.Event) if e.reason == Reason.APPROVAL_DUPLICATE_APPROVER]
    assert "already approved by alice; needs a different approver" in dup.message
    assert w.annotations == {} and len(w.status.approval.approved_by) == 1 and _executing(w) == []
    _approve(w, "bob")
    assert w.status.approval.state == "Approved" and [v.user for v in w.status.approval.approved_by] == ["alice", "bob"]
    assert len(_executing(w)) == 1


def test_one_rejection_by_any_approver_rejects():
    w = _waiting(approvers=3)
    _approve(w, "alice")
    w.annotations.update({ANN_APPROVED: "false", ANN_DECIDED_BY: "bob"})
    w.reconcile()
    assert w.status.approval.state == "Rejected"
    (create,) = _executing(w)
    assert create.approval.decision == "rejected"


def test_the_status_route_moves_each_approval_into_approved_by():
    w = _waiting(approvers=2)
    w.status = w.status.model_copy(deep=True)
    w.status.approval.decision, w.status.approval.decided_by = "approved", "alice"
    w.reconcile()
    ap = w.status.approval
    assert ap.state == "Pending" and ap.decision is None and ap.decided_by is None
    assert [v.user for v in ap.approved_by] == ["alice"]
    w.status.approval.decision, w.status.approval.decided_by = "approved", "bob"
    w.reconcile()
    assert w.status.approval.state == "Approved" and len(_executing(w)) == 1


def test_more_than_one_approver_needs_the_decider_stamped():
    w = _waiting(approvers=2)
    w.annotations[ANN_APPROVED] = "true"
    dec = w.reconcile()
    assert w.status.approval.state == "Pending" and w.status.approval.approved_by == []
    assert any("names no approver" in e.message for e in dec.of(d.Event))


def test_the_creator_may_not_decide_when_distinct_from_creator():
    w = _waiting(distinctFromCreator=True)
    w.annotations[ANN_CREATED_BY] = "carol"
    dec = _approve(w, "carol")
    (e,) = [e for e in dec.of(d.Event) if e.reason == Reason.APPROVAL_CREATOR_REFUSED]
    assert "carol created the run" in e.message and "distinctFromCreator" in e.message
    assert w.status.approval.state == "Pending" and set(w.annotations) == {ANN_CREATED_BY}
    _approve(w, "dave")
    assert w.status.approval.state == "Approved"


def test_lowering_approvers_while_waiting_does_not_lower_the_pending_request():
    w = _waiting(approvers=2)
    _respec(w, approval={"approvers": 1})
    _approve(w, "alice")
    assert w.status.approval.state == "Pending" and w.status.approval.approvals_required == 2


# ----------------------------------------------------------------------------- the order of the writes


def test_a_stray_annotation_goes_before_the_new_pending_status_is_written():
    """Item 7: while the lap runs, an `approved` annotation arrives; the lap then asks for approval.
    The stray annotation is removed BEFORE the Pending status, so a refused status write cannot
    leave it to approve the new request."""
    w = World(_spec())
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: "mallory"})
    w.refuse_status = 1
    dec = w.reconcile_once()
    writes = dec.writes()
    assert [type(x) for x in writes] == [d.RemoveAnnotations, d.PatchStatus] and writes[0].before_status
    assert writes[1].status.approval.state == "Pending"
    assert w.annotations == {}  # gone although the status write was refused
    w.reconcile()
    assert w.status.approval.state == "Pending" and _executing(w) == []


def test_a_recorded_decision_leaves_the_annotations_after_its_status():
    w = _waiting()
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: "alice"})
    writes = w.reconcile_once().writes()
    assert [type(x) for x in writes] == [d.PatchStatus, d.RemoveAnnotations] and not writes[1].before_status


# ----------------------------------------------------------------------------- property


_URLS = ["https://pay.example/refund", "https://evil.example/refund"]
_IMAGES = [None, "registry.example/other:2"]
_step = st.one_of(
    st.tuples(st.just("url"), st.sampled_from(_URLS)),
    st.tuples(st.just("image"), st.sampled_from(_IMAGES)),
    st.tuples(st.just("approve"), st.sampled_from(["alice", "bob", "carol"])),
    st.tuples(st.just("reject"), st.sampled_from(["alice", "bob"])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(approvers=st.integers(1, 3), steps=st.lists(_step, max_size=10))
def test_no_call_is_executed_for_a_target_nobody_approved_and_never_with_fewer_approvers(approvers, steps):
    w = _waiting(approvers=approvers)
    url, image = _URLS[0], None
    for kind, value in steps:
        if kind == "url":
            url = value
        elif kind == "image":
            image = value
        if kind in ("url", "image"):
            _respec(w, tool=_tool(url), image=image)
            w.reconcile()
        else:
            w.annotations.update({ANN_APPROVED: "true" if kind == "approve" else "false", ANN_DECIDED_BY: value})
            before = len(w.create_actions)
            w.reconcile()
            for create in w.create_actions[before:]:
                if create.approval is not None and create.approval.decision == "approved":
                    ap = w.status.approval
                    # executed only for the target of the spec it runs with, by enough distinct approvers
                    assert create.approval.target_sha256 == target_sha256(w.spec.tool("refund"), image or IMAGE, SHA)
                    assert len({v.user for v in ap.approved_by}) >= approvers
        if w.status.phase != "AwaitingApproval":
            break
        assert ANN_APPROVED not in w.annotations


def test_decision_writes_orders_annotations_around_the_last_status():
    st1, st2 = World(_spec()).status, World(_spec()).status.model_copy(update={"lap": 1})
    dec = d.Decision([d.PatchStatus(st1), d.RemoveAnnotations(("b",)), d.RemoveAnnotations(("a",), before_status=True),
                      d.PatchStatus(st2)])
    writes = dec.writes()
    assert [getattr(x, "keys", None) for x in writes] == [("a",), None, ("b",)]
    assert isinstance(writes[1], d.PatchStatus) and writes[1].status is st2
