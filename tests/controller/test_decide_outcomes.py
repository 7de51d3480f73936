"""decide/outcomes.py, pure: what a run does when a write of its decision did not go through
(``decide_after``). A refused write is an error with backoff and ONE Event, never a hot loop; the
run fails only when the Job itself is refused; the status says nothing untrue."""

from __future__ import annotations

import dataclasses
import json

from controller_world import STORE, World, make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.api.reasons import Reason
from agentrun.controller import decide as d
from agentrun.controller.decide.outcomes import (
    CONFLICT_RETRY_SECONDS,
    DELETE_DEFERRED,
    JOB_DEFERRED,
    job_refusal,
    pruned_field,
    status_refusal,
)

CREATE = d.CreateJob(lap=1, attempt=1, agent_version="v1", name="run-l1-a1", store=STORE)
QUOTA = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden",
                    "message": 'jobs.batch "run-l1-a1" is forbidden: exceeded quota: jobs, requested: '
                               "count/jobs.batch=1, used: count/jobs.batch=5, limited: count/jobs.batch=5"})
INVALID = json.dumps({"kind": "Status", "code": 422, "reason": "Invalid", "details": {"causes": [
    {"field": "spec.template.spec.containers[0].image", "message": "Required value"}]}})
DENIED = json.dumps({"kind": "Status", "code": 403, "message": 'admission webhook "deny" said ' + "x\x1b" * 900})
BODIES = st.sampled_from([None, "", "not json", "[1]", QUOTA, INVALID, DENIED, json.dumps({"details": {}})])
TEXT = st.text(max_size=2000)
WARNINGS = {Reason.JOB_REFUSED, Reason.INVALID_CONFIGURATION, Reason.STATUS_UPDATE_REFUSED,
            Reason.CHECKPOINT_DELETE_FAILED}


def observed(refusal: str | None = None) -> d.Observed:
    return dataclasses.replace(World(spec=make_spec()).observed(), refusal=refusal)


def decision(o: d.Observed) -> d.Decision:
    """A pass that starts a lap: the Job, its status, a recorded decision's annotations, an Event."""
    running = o.status.model_copy(update={"phase": "Running"})
    return d.Decision([CREATE, d.RemoveAnnotations(("a",)), d.PatchStatus(running),
                       d.Event("Normal", Reason.LAP_STARTING, "lap 1 starting"), d.RequeueAfter(30.0)])


SETBACKS = st.one_of(
    st.builds(d.Refused, st.just(CREATE), st.sampled_from([400, 403, 422, 429, 500, 503]),
              st.sampled_from([None, "Forbidden", "Too Many Requests"]), BODIES),
    st.builds(d.Refused, st.builds(d.PatchStatus, st.just(observed().status)),
              st.sampled_from([400, 403, 409, 422]), st.none(), BODIES),
    st.builds(d.Conflict, st.sampled_from([d.RemoveAnnotations(("a",), before_status=True), d.DeleteRun(60)])),
    st.builds(d.Invalid, st.just(CREATE), TEXT),
    st.builds(d.NotStored, st.sampled_from(["status.store", "status.approval.targetSha256"])),
    st.builds(d.StoreFailed, st.just(d.DeleteCheckpoints()), TEXT),
)
STREAKS = st.one_of(st.none(), st.sampled_from([JOB_DEFERRED, DELETE_DEFERRED]), TEXT)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setback=SETBACKS, refusal=STREAKS)
def test_a_setback_ends_in_a_requeue_a_backoff_with_one_event_per_streak_or_a_failed_run(setback, refusal):
    o = observed(refusal)
    dec = decision(o)
    before = list(dec.actions)
    follow = d.decide_after(o, dec, setback)
    assert dec.actions == before  # pure: the decision is not changed
    assert d.decide_after(o, dec, setback) == follow
    assert not follow.of(d.CreateJob) and not follow.of(d.DeleteJob)  # the Jobs were done (or refused)
    new_events = [e for e in follow.of(d.Event) if e not in dec.of(d.Event)]
    assert len(new_events) <= 1 and all(e.type == "Warning" and e.reason in WARNINGS for e in new_events)
    backoffs = follow.of(d.Backoff)
    if follow.actions == [d.RequeueAfter(CONFLICT_RETRY_SECONDS)]:  # changed since read: decide again
        assert isinstance(setback, (d.Conflict, d.Refused))
    elif backoffs:  # an error with backoff: the Backoff last, at most its Event and a best-effort status
        assert follow.actions[-1] == backoffs[0] and len(backoffs) == 1
        said = follow.actions[:-1]
        assert all(isinstance(a, d.Event) or (isinstance(a, d.PatchStatus) and a.best_effort) for a in said)
        assert (len(new_events) == 1) == (refusal != backoffs[0].streak)
        if new_events:
            assert new_events[0].reason == backoffs[0].reason and new_events[0].message == backoffs[0].message
        # never a hot loop: the same setback again, in the same streak, says nothing more
        again = d.decide_after(dataclasses.replace(o, refusal=backoffs[0].streak), dec, setback)
        assert again.actions == [backoffs[0]]
        for p in follow.of(d.PatchStatus):  # a run that waits: its phase as it was
            assert p.status.phase == o.status.phase
    else:  # the Job itself refused: the run fails, naming why, with the rest of its decision
        assert isinstance(setback, (d.Refused, d.Invalid)) and isinstance(setback.action, d.CreateJob)
        [patch] = follow.of(d.PatchStatus)
        assert patch.status.phase == "Failed" and not patch.best_effort
        reason = Reason.JOB_REFUSED if isinstance(setback, d.Refused) else Reason.INVALID_CONFIGURATION
        assert [e.reason for e in new_events] == [reason] and follow.actions[-1] == new_events[0]
        assert d.RemoveAnnotations(("a",)) in follow.actions and d.RequeueAfter(30.0) in follow.actions
    for e in new_events:
        if not isinstance(setback, d.Invalid):  # the API server's or the store's words: bounded, no controls
            assert len(e.message) < 1024 and "\x1b" not in e.message


def test_a_job_refused_for_a_quota_waits_saying_so_once_per_streak():
    o = observed()
    follow = d.decide_after(o, decision(o), d.Refused(CREATE, 403, "Forbidden", QUOTA))
    status, event, backoff = follow.actions
    assert isinstance(status, d.PatchStatus) and status.best_effort
    text = ('the lap Job run-l1-a1 was refused by the API server (retrying with backoff): jobs.batch "run-l1-a1" '
            "is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, used: count/jobs.batch=5, "
            "limited: count/jobs.batch=5")
    assert event == d.Event("Warning", Reason.JOB_REFUSED, text)
    assert backoff == d.Backoff(JOB_DEFERRED, Reason.JOB_REFUSED, text)
    [progressing] = [c for c in status.status.conditions if c.type == "Progressing"]
    assert (progressing.status, progressing.reason, progressing.message) == ("False", "JobRefused", text)
    assert status.status.message == text and status.status.phase == o.status.phase


def test_an_invalid_job_fails_the_run_naming_the_field():
    o = observed()
    follow = d.decide_after(o, decision(o), d.Refused(CREATE, 422, "Unprocessable Entity", INVALID))
    [patch] = follow.of(d.PatchStatus)
    text = "the lap Job was refused by the API server: spec.template.spec.containers[0].image: Required value"
    assert patch.status.phase == "Failed" and patch.status.message == text
    assert follow.of(d.Event)[-1] == d.Event("Warning", Reason.JOB_REFUSED, text)
    assert not follow.of(d.Backoff)


def test_a_job_that_cannot_be_built_fails_the_run_with_invalid_configuration():
    o = observed()
    follow = d.decide_after(o, decision(o), d.Invalid(CREATE, "spec.agent.image: no image and no AGENTRUN_LAP_IMAGE"))
    [patch] = follow.of(d.PatchStatus)
    assert patch.status.phase == "Failed"
    assert follow.of(d.Event)[-1] == d.Event("Warning", Reason.INVALID_CONFIGURATION,
                                              "spec.agent.image: no image and no AGENTRUN_LAP_IMAGE")


def test_a_refused_status_write_posts_one_event_per_distinct_refusal():
    o = observed()
    refused = d.Refused(d.PatchStatus(o.status), 422, "Unprocessable Entity", json.dumps(
        {"details": {"causes": [{"field": "status.approval.decidedBy", "message": "Too long"}]}}))
    text = "the API server refused the status update: status.approval.decidedBy: Too long"
    assert d.decide_after(o, decision(o), refused).actions == [
        d.Event("Warning", Reason.STATUS_UPDATE_REFUSED, text), d.Backoff(text, Reason.STATUS_UPDATE_REFUSED, text)]
    assert d.decide_after(dataclasses.replace(o, refusal=text), decision(o), refused).actions == [
        d.Backoff(text, Reason.STATUS_UPDATE_REFUSED, text)]
    # the 422 of the failed resourceVersion test carries no details: the run changed, decide again
    stale = d.Refused(d.PatchStatus(o.status), 422, None, json.dumps({"kind": "Status", "code": 422}))
    assert d.decide_after(o, decision(o), stale).actions == [d.RequeueAfter(CONFLICT_RETRY_SECONDS)]


def test_a_field_an_older_crd_dropped_and_a_store_outage_are_said_once():
    o = observed()
    [event, _] = d.decide_after(o, decision(o), d.NotStored("status.store")).actions
    assert event.message == ("the API server did not store status.store: the AgentRun CRD is older than the "
                             "operator; apply the CRD of this release")
    [event, backoff] = d.decide_after(o, d.Decision([d.DeleteCheckpoints()]),
                                      d.StoreFailed(d.DeleteCheckpoints(), "store unreachable")).actions
    assert event == d.Event("Warning", Reason.CHECKPOINT_DELETE_FAILED, 'cannot delete checkpoints yet: store unreachable')
    assert backoff.streak == DELETE_DEFERRED


def test_the_refusal_helpers():
    assert job_refusal(403, QUOTA, "Forbidden")[0] and job_refusal(429, None, "Too Many Requests") == (
        True, "HTTP 429 Too Many Requests")
    assert job_refusal(422, INVALID, None) == (False, "spec.template.spec.containers[0].image: Required value")
    assert status_refusal(409, "{}") is None and status_refusal(403, "not json") == "HTTP 403"
    assert pruned_field({"a": {"b": 1}}, {"a": {}}) == "status.a.b" and pruned_field({"a": 1}, {"a": 2}) is None


def test_status_refusal_tells_a_validation_error_from_a_conflict():
    stale_test = json.dumps({"kind": "Status", "message": "the server rejected our request due to an error in our "
                             "request", "reason": "Invalid", "details": {}, "code": 422})
    assert status_refusal(422, stale_test) is None  # the json-patch test of resourceVersion failed: read again
    assert status_refusal(409, "{}") is None
    invalid = json.dumps({"reason": "Invalid", "code": 422, "details": {"name": "r1", "kind": "AgentRun", "causes": [
        {"reason": "FieldValueTooLong", "message": "Too long: may not be more than 256 bytes",
         "field": "status.approval.decidedBy"},
        {"reason": "FieldValueInvalid", "message": "some validation rules were not checked", "field": "<nil>"}]}})
    assert status_refusal(422, invalid) == "status.approval.decidedBy: Too long: may not be more than 256 bytes"
    denied = json.dumps({"message": "agentruns.agentrun.dev \"r1\" is forbidden: ValidatingAdmissionPolicy 'p' "
                         "denied request: no\x1b[2J", "code": 422,
                         "details": {"name": "r1", "causes": [{"message": "denied"}]}})
    text = status_refusal(422, denied)
    assert "ValidatingAdmissionPolicy 'p' denied request" in text and "\x1b" not in text
    assert status_refusal(403, "not json") == "HTTP 403"


def test_pruned_field_finds_what_an_older_crd_dropped():
    sent = {"phase": "Running", "store": {"uri": "s3://b/p"}, "approval": {"argumentsSha256": "ab"}}
    assert pruned_field(sent, dict(sent)) is None
    assert pruned_field(sent, {"phase": "Running", "approval": {"argumentsSha256": "ab"}}) == "status.store"
    assert pruned_field(sent, {"phase": "Running", "store": {"uri": "s3://b/p"}, "approval": {}}) == \
        "status.approval.argumentsSha256"
    assert pruned_field(sent, None) == "status"
