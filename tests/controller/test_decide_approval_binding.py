"""decide(): a decision is bound to the call it approves, its inputs are bounded, it is in status
before the Job that executes it exists (write-ahead), and the run's store is pinned in status."""

from __future__ import annotations

from datetime import timedelta

import pytest
from controller_world import STORE, T0, UID, World, make_spec, ok_read, record

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_REASON,
    ANN_REASON_SHORT,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    arguments_sha256,
)
from agentrun.api.status import ActiveJob, CheckpointRef, StoreLocation
from agentrun.controller import decide as d
from agentrun.controller.decide.jobs import approval_annotation

SHA = arguments_sha256({"x": 1})  # the pending call of controller_world.record(pending=True)
SPEC = {"approval": {"owner": "ops", "timeout": "1h", "onTimeout": "reject"}}


def _waiting(**spec) -> World:
    w = World(make_spec(**{**SPEC, **spec}))
    w.reconcile()
    w.finish_job("continue")
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.phase == "AwaitingApproval" and w.status.approval.state == "Pending"
    return w


def _resolving_jobs(w: World) -> list[str]:
    """Jobs of a lap after the one that asked for approval: they resolve (execute) the approval."""
    ap = w.status.approval
    lap = ap.lap if ap is not None else 0
    return [j.name for j in w.jobs.values() if j.lap > lap]


def _control_free(text: str) -> bool:
    return not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in text)


# ----------------------------------------------------------------------------- the digest in status


def test_status_holds_the_digest_of_the_full_arguments_not_of_the_4k_cut():
    w = World(make_spec(**SPEC))
    w.reconcile()
    big = {"note": "y" * 10_000, "amount": 12}
    rec = record(1, "awaiting-approval", pending=True)
    rec = rec.model_copy(update={"pending_approval": rec.pending_approval.model_copy(update={"arguments": big})})
    w.store[1] = ok_read(rec)
    w.finish_job("awaiting-approval")
    w.reconcile()
    ap = w.status.approval
    assert ap.arguments_sha256 == arguments_sha256(big) and ap.arguments_truncated is True
    assert len(ap.arguments) <= 4096
    assert _waiting().status.approval.arguments_truncated is False


# ----------------------------------------------------------------------------- binding


def test_decision_bound_to_the_pending_call_is_applied_and_carried_by_the_job():
    w = _waiting()
    w.annotations.update({ANN_APPROVED: "true", ANN_CALL_ID: "c1", ANN_ARGUMENTS_SHA256: SHA.upper(),
                          ANN_DECIDED_BY: "alice", ANN_REASON: "checked"})
    dec = w.reconcile()
    assert w.annotations == {} and w.status.approval.state == "Approved"
    assert w.status.approval.decided_by == "alice" and w.status.approval.reason == "checked"
    (create,) = dec.of(d.CreateJob)
    assert create.approval.call_id == "c1" and create.approval.arguments_sha256 == SHA
    assert w.jobs[create.name].approval == approval_annotation(create.approval)
    assert "ApprovalDecided" in w.reasons() and not [e for e in w.events if e.type == "Warning"]


def test_bare_approval_is_valid_for_the_call_pending_now():
    w = _waiting()
    w.annotations[ANN_APPROVED] = "true"
    dec = w.reconcile()
    assert w.status.approval.state == "Approved" and dec.of(d.CreateJob)[0].approval.call_id == "c1"


@pytest.mark.parametrize("binding,expected,given", [
    ({ANN_CALL_ID: "c0"}, "'c1'", "'c0'"),
    ({ANN_CALL_ID: "c1", ANN_ARGUMENTS_SHA256: "0" * 64}, SHA, "0" * 64),
    ({ANN_ARGUMENTS_SHA256: "f" * 64}, SHA, "f" * 64),
])
def test_decision_bound_to_another_call_is_refused_once_and_the_run_keeps_waiting(binding, expected, given):
    w = _waiting()
    w.annotations.update({ANN_APPROVED: "true", ANN_DECIDED_BY: "alice", **binding})
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and _resolving_jobs(w) == []
    assert w.annotations == {}  # consumed: it is not read again
    assert w.status.phase == "AwaitingApproval" and w.status.approval.state == "Pending"
    assert w.status.approval.decided_by is None and w.status.approval.decision is None
    (warning,) = [e for e in w.events if e.type == "Warning"]
    assert warning.reason == "ApprovalBindingMismatch"
    assert expected in warning.message and given in warning.message and "still waits for call c1" in warning.message
    again = w.reconcile()
    assert again.actions == [] or not again.of(d.Event)  # no second Event, no loop
    # then a correct decision proceeds
    w.annotations.update({ANN_APPROVED: "true", ANN_CALL_ID: "c1", ANN_ARGUMENTS_SHA256: SHA})
    assert w.reconcile().of(d.CreateJob) and w.status.approval.state == "Approved"


def test_digest_binding_of_an_approval_requested_by_an_earlier_release_reads_the_record():
    w = _waiting()
    w.status.approval.arguments_sha256 = None  # status written by the previous release
    w.annotations.update({ANN_APPROVED: "true", ANN_ARGUMENTS_SHA256: SHA})
    first = d.decide(w.observed())
    assert first.actions == [d.ReadCheckpoint(2)]
    w.reconcile()
    assert w.status.approval.state == "Approved" and w.status.approval.arguments_sha256 == SHA


def test_digest_binding_of_an_earlier_release_refused_when_the_record_cannot_be_read():
    w = _waiting()
    w.status.approval.arguments_sha256 = None
    del w.store[2]
    w.annotations.update({ANN_APPROVED: "true", ANN_ARGUMENTS_SHA256: SHA})
    w.reconcile()
    assert w.status.approval.state == "Pending" and w.annotations == {}
    assert w.reasons().count("ApprovalBindingMismatch") == 1
    assert f"decide without {ANN_ARGUMENTS_SHA256}" in w.events[-1].message


# ----------------------------------------------------------------------------- bounded inputs


@pytest.mark.parametrize("annotations,field", [
    ({ANN_APPROVED: "maybe"}, ANN_APPROVED),
    ({ANN_APPROVED: "true", ANN_REASON: "r" * (MAX_REASON_CHARS + 1)}, ANN_REASON),
    ({ANN_APPROVED: "true", ANN_REASON_SHORT: "r" * 100_000}, ANN_REASON_SHORT),
    ({ANN_APPROVED: "true", ANN_DECIDED_BY: "u" * (MAX_DECIDED_BY_CHARS + 1)}, ANN_DECIDED_BY),
    ({ANN_APPROVED: "true", ANN_DECIDED_BY: "alice\x1b[2J\r"}, ANN_DECIDED_BY),
    ({ANN_APPROVED: "true", ANN_CALL_ID: "c1; rm -rf /"}, ANN_CALL_ID),
    ({ANN_APPROVED: "true", ANN_CALL_ID: "c" * 65}, ANN_CALL_ID),
    ({ANN_APPROVED: "true", ANN_ARGUMENTS_SHA256: "xyz"}, ANN_ARGUMENTS_SHA256),
    ({ANN_APPROVED: "tru\x1b]0;owned\x07e"}, ANN_APPROVED),
])
def test_malformed_decision_gives_one_warning_naming_the_field_and_keeps_waiting(annotations, field):
    w = _waiting()
    w.annotations.update(annotations)
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and w.annotations == {}
    assert w.status.approval.state == "Pending" and w.status.phase == "AwaitingApproval"
    (warning,) = [e for e in w.events if e.type == "Warning"]
    assert warning.reason == "ApprovalInvalid" and field in warning.message, warning.message
    assert len(warning.message) <= 1024 and _control_free(warning.message)
    for _ in range(3):  # nothing left to read: no second Event, no loop
        assert not w.reconcile().of(d.Event)


def test_control_characters_in_a_reason_are_escaped_with_one_warning():
    w = _waiting()
    w.annotations.update({ANN_APPROVED: "true", ANN_REASON: "ok\nsee \x1b[31mticket\u202e 42"})
    dec = w.reconcile()
    ap = w.status.approval
    assert ap.state == "Approved" and ap.reason == "ok\\nsee \\x1b[31mticket\\u202e 42"
    assert [e.reason for e in w.events if e.type == "Warning"] == ["ApprovalReasonEscaped"]
    assert all(_control_free(e.message) and "\u202e" not in e.message for e in w.events)
    assert dec.of(d.CreateJob)[0].approval.reason == ap.reason


def test_status_route_reason_with_control_characters_is_escaped():
    w = _waiting()
    w.status.approval.decision = "approved"
    w.status.approval.reason = "fine\x1b[0m"
    w.status.approval.decided_by = "bob"
    w.reconcile()
    assert w.status.approval.reason == "fine\\x1b[0m" and w.status.approval.decided_by == "bob"
    assert w.reasons().count("ApprovalReasonEscaped") == 1


# ----------------------------------------------------------------------------- write-ahead


@pytest.mark.parametrize("how", ["annotation", "status", "timeout"])
def test_the_decision_is_stored_before_the_job_that_executes_it(how):
    w = _waiting()
    if how == "annotation":
        w.annotations[ANN_APPROVED] = "true"
    elif how == "status":
        w.status.approval.decision = "approved"
    else:
        w.now += timedelta(hours=2)
    first = w.reconcile_once()
    assert first.of(d.CreateJob) == [] and first.requeue_after == 0.0
    assert first.status.approval.state in ("Approved", "TimedOut") and first.status.approval.decided_at == w.now
    assert first.status.phase == "Running" and first.status.active_job is None
    second = w.reconcile_once()
    (create,) = second.of(d.CreateJob)
    assert create.lap == 3 and create.approval.call_id == "c1"


def test_a_refused_status_write_never_lets_the_job_run_ahead_of_the_decision():
    w = _waiting()
    w.annotations[ANN_APPROVED] = "true"
    w.refuse_status = 1
    w.reconcile()  # the API server refuses the status write that records the decision
    assert w.status.approval.state == "Pending" and _resolving_jobs(w) == []
    assert w.annotations == {ANN_APPROVED: "true"}  # the decision stands: applied once status takes it
    assert "ApprovalDecided" not in w.reasons()
    w.reconcile()
    assert w.status.approval.state == "Approved" and len(_resolving_jobs(w)) == 1
    assert w.reasons().count("ApprovalDecided") == 1


def test_an_adopted_job_carrying_another_decision_is_not_adopted():
    w = _waiting()
    w.annotations[ANN_APPROVED] = "false"
    w.reconcile_once()  # the decision (rejected) is stored; the Job is next
    name = d.job_name("run", UID, 3, 1)
    forged = d.ApprovalEnv("approved", "c1", arguments_sha256=SHA)
    w.jobs[name] = d.ObservedJob(name, 3, 1, "active", agent_version="v1", approval=approval_annotation(forged))
    dec = w.reconcile_once()
    assert d.DeleteJob(name) in dec.actions and dec.of(d.CreateJob) == []
    assert w.reasons()[-2:] == ["JobMismatch", "LapRetry"] and "approved" in w.events[-2].message
    assert w.status.active_job is None and w.status.retries[-1].last_reason.startswith("JobMismatch")


def test_a_job_of_an_earlier_release_without_the_annotation_is_adopted():
    w = _waiting()
    w.annotations[ANN_APPROVED] = "true"
    w.reconcile_once()
    name = d.job_name("run", UID, 3, 1)
    w.jobs[name] = d.ObservedJob(name, 3, 1, "active", agent_version="v1")
    w.reconcile_once()
    assert w.status.active_job.name == name and "JobMismatch" not in w.reasons()


# ----------------------------------------------------------------------------- the pinned store


def test_new_run_pins_its_store_before_the_first_job_and_keeps_it():
    w = World(make_spec())
    first = w.reconcile_once()
    assert first.of(d.CreateJob) == [] and first.status.store == STORE and first.requeue_after == 0.0
    (create,) = w.reconcile_once().of(d.CreateJob)
    assert create.store == STORE
    w.resolved_store = StoreLocation(uri="s3://new-default/elsewhere")  # the operator's default changes
    w.finish_job("continue")
    (create,) = w.reconcile().of(d.CreateJob)
    assert create.store == STORE and w.status.store == STORE
    # ... a new run takes the new default
    other = World(make_spec(), resolved_store=StoreLocation(uri="s3://new-default/elsewhere"))
    other.reconcile()
    assert other.status.store.uri == "s3://new-default/elsewhere"


def test_run_of_an_earlier_release_is_pinned_from_status_checkpoint_not_the_new_default():
    w = World(make_spec(), resolved_store=StoreLocation(uri="s3://new-default/p2", endpoint="http://new:1"))
    w.status.lap = 4
    w.status.phase = "Running"
    w.status.checkpoint = CheckpointRef(
        lap=4, key=f"old/prefix/ns/run/{UID}/laps/00000004.json",
        uri=f"s3://old-bucket/old/prefix/ns/run/{UID}/laps/00000004.json", sha256="ab" * 32,
        agent_version="v1", schema_version=2, endpoint="http://old:9000", region="eu-west-1", path_style=True)
    first = w.reconcile_once()
    assert first.of(d.CreateJob) == []
    assert w.status.store == StoreLocation(uri="s3://old-bucket/old/prefix", endpoint="http://old:9000",
                                           region="eu-west-1", path_style=True)
    assert "StorePinned" in w.reasons()
    (create,) = w.reconcile_once().of(d.CreateJob)
    assert create.lap == 5 and create.store == w.status.store


def test_run_of_an_earlier_release_in_its_first_lap_is_pinned_from_its_job():
    w = World(make_spec(), resolved_store=StoreLocation(uri="s3://new-default/p2"))
    name = d.job_name("run", UID, 1, 1)
    old = StoreLocation(uri="s3://old-bucket/p", endpoint="http://old:9000", path_style=True)
    w.status.phase = "Running"
    w.status.active_job = ActiveJob(name=name, lap=1, attempt=1, agent_version="v1", started_at=T0)
    w.jobs[name] = d.ObservedJob(name, 1, 1, "active", agent_version="v1", store=old)
    w.reconcile()
    assert w.status.store == old


def test_fork_pins_its_own_store():
    w = World(make_spec(forkFrom={"name": "src", "uid": "5eed0000-0000-0000-0000-000000000000", "lap": 2}),
              resolved_store=StoreLocation(uri="s3://fork-store/p"))
    first = w.reconcile_once()
    assert first.of(d.ForkCheckpoint) == [] and w.status.store.uri == "s3://fork-store/p"


def test_no_store_at_all_fails_naming_the_setting():
    w = World(make_spec(), resolved_store=None)
    w.reconcile()
    assert w.status.phase == "Failed" and w.created == []
    assert w.reasons() == ["InvalidConfiguration"]


def test_pinned_store_of_checkpoint_uris():
    assert d.store_uri_of_checkpoint(f"s3://b-1/ns/run/{UID}/laps/00000001.json", "ns", "run", UID) == "s3://b-1"
    assert d.store_uri_of_checkpoint(f"s3://b-1/a/b/ns/run/{UID}/snapshots/1.json", "ns", "run", UID) == "s3://b-1/a/b"
    assert d.store_uri_of_checkpoint("s3://b-1/elsewhere/laps/1.json", "ns", "run", UID) is None


def test_run_of_an_earlier_release_without_a_readable_location_says_so():
    w = World(make_spec())
    w.status.lap = 1
    w.status.phase = "Running"
    w.status.checkpoint = CheckpointRef(lap=1, key="k", sha256="ab" * 32, agent_version="v1", schema_version=2)
    w.reconcile_once()
    assert w.status.store == STORE
    (ev,) = w.events
    assert ev.type == "Warning" and ev.reason == "StorePinned" and STORE.uri in ev.message
