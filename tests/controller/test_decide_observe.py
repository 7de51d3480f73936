"""decide/observe.py, pure: the watch cache's JSON (run, Jobs, pods) -> decide.Observed, pod details
of the current attempt only."""

from __future__ import annotations

from datetime import UTC, datetime

import pydantic
import pytest
from pod_check_objects import GRACE, job_doc

from agentrun.api.spec import AgentRunSpec
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID, job_name
from agentrun.controller.decide.observe import job_state, needs_pod_read, observe, pod_check_due, spec_error_text
from agentrun.controller.decide.observe import job_state as _job_state
from agentrun.controller.decide.observe import pod_exit as _pod_exit

UID = "0123456789abcdef0123456789abcdef"


def run_body(**status):
    return {"metadata": {"namespace": "ns", "name": "r", "uid": UID, "resourceVersion": "9", "generation": 2,
                         "annotations": {"a": "b"}, "finalizers": ["f"]},
            "spec": {"task": "t", "agent": {"version": "v1", "model": {"provider": "scripted", "script": []}}},
            "status": status}


def job(lap, attempt, *, cond=None):
    return {"metadata": {"namespace": "ns", "name": job_name("r", UID, lap, attempt), "resourceVersion": "5",
                         "labels": {LABEL_RUN_UID: UID, LABEL_LAP: str(lap), LABEL_ATTEMPT: str(attempt)}},
            "status": {"conditions": [{"type": cond, "status": "True"}] if cond else []}}


def pod(exit_code=None, waiting=None, message=None):
    state = {"terminated": {"exitCode": exit_code, "message": message}} if exit_code is not None else \
        {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    phase = "Pending" if exit_code is None else "Succeeded" if exit_code == 0 else "Failed"
    return {"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": phase, "containerStatuses": [{"name": "lap", "state": state}]}}


def test_a_job_whose_pod_exited_0_has_succeeded_before_the_job_controller_says_so():
    """docs/concepts.md "When a lap is over": the pod is the lap. Its exit 0 wins over the Job's
    conditions, also a Failed one set after it (the lap timeout passing in between); other exits
    and pods that have not exited leave the Job to its conditions."""
    assert job_state(job(1, 1), [pod(0)]) == ("succeeded", None)
    assert job_state(job(1, 1, cond="Failed"), [pod(0)]) == ("succeeded", None)
    assert job_state(job(1, 1), [pod(75)]) == ("active", None)
    assert job_state(job(1, 1), [pod(waiting=("ContainerCreating", ""))]) == ("active", None)
    assert job_state(job(1, 1)) == ("active", None)
    # a pod the Job does not control (someone else's, with the Job's label) does not end the lap
    owned = job(1, 1)
    owned["metadata"]["uid"] = "job-uid"
    assert job_state(owned, [pod(0)]) == ("active", None)
    mine = pod(0)
    mine["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": "job-uid", "controller": True}]
    assert job_state(owned, [mine]) == ("succeeded", None)
    # a Job whose pod exited has no pod check left (its status says not ready: it is over)
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert pod_check_due(job(1, 1), now, 30.0, [pod(0)]) is None
    assert pod_check_due(job(1, 1), now, 30.0, []) == 0.0
    # observed: the current attempt (pods read) and an older Job the Job controller has not marked
    # yet: both ended, so neither is fenced as a stray (decide deletes active Jobs it does not know)
    j1, j2 = job(1, 1), job(2, 1)
    pods = {j1["metadata"]["name"]: [pod(0)], j2["metadata"]["name"]: [pod(0)]}
    o = observe(run_body(lap=1, activeJob={"name": j2["metadata"]["name"], "lap": 2, "attempt": 1,
                                           "agentVersion": "v1"}),
                [j1, j2], lambda name: pods[name], OperatorConfig(checkpoint_uri="s3://b/p"), now)
    by_lap = {j.lap: j for j in o.jobs}
    assert by_lap[1].state == "succeeded" and by_lap[2].state == "succeeded" and by_lap[2].exit_code == 0


def test_observe_reads_pods_of_the_current_attempt_only():
    j1, j2 = job(1, 1, cond="Failed"), job(2, 1, cond="Failed")  # lap 1 is history, lap 2 the next attempt
    pods = {j1["metadata"]["name"]: [pod(75)],
            j2["metadata"]["name"]: [pod(2, message='{"msg": "lap failed", "error": "model endpoint unreachable"}')]}
    o = observe(run_body(lap=1), [j1, j2], lambda name: pods[name], OperatorConfig(checkpoint_uri="s3://b/p"),
                datetime(2026, 1, 1, tzinfo=UTC))
    by_lap = {j.lap: j for j in o.jobs}
    assert by_lap[1].exit_code is None and by_lap[1].state == "failed"  # not current: pods not read
    assert by_lap[2].exit_code == 2 and by_lap[2].message == "model endpoint unreachable"
    assert o.generation == 2 and o.annotations == {"a": "b"} and o.finalizers == ("f",)
    assert o.resolved_store is not None and o.spec is not None and o.spec_error is None


def test_observe_sees_a_pod_waiting_on_its_configuration():
    j = job(1, 1)
    o = observe(run_body(), [j], lambda name: [pod(waiting=("CreateContainerConfigError", 'secret "s" not found'))],
                OperatorConfig(), datetime(2026, 1, 1, tzinfo=UTC))
    assert o.jobs[0].state == "active" and o.jobs[0].waiting_reason == "CreateContainerConfigError"
    assert o.store_error  # no URI anywhere: said, not raised


def test_a_failed_job_without_a_seen_exit_needs_one_pod_read():
    assert needs_pod_read(job(1, 1, cond="Failed"), [])
    assert not needs_pod_read(job(1, 1, cond="Failed"), [pod(75)])
    assert not needs_pod_read(job(1, 1), [])
    # a Job that succeeded exited 0: its pod adds nothing, so no read (one request per lap saved)
    assert not needs_pod_read(job(1, 1, cond="Complete"), [])


def test_an_invalid_spec_is_observed_with_its_error():
    body = run_body()
    body["spec"] = {"task": 5}
    o = observe(body, [], lambda name: [], OperatorConfig(), datetime(2026, 1, 1, tzinfo=UTC))
    assert o.spec is None and o.spec_error and "spec." in o.spec_error


def test_job_state():
    assert _job_state({"status": {}}) == ("active", None)
    assert _job_state({"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}) == ("active", None)
    assert _job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == ("succeeded", None)
    assert _job_state({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}) \
        == ("failed", "DeadlineExceeded")


def test_pod_exit():
    pod = {"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"},
           "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 75, "reason": "Error"}}}]}}
    assert _pod_exit([pod]) == (75, "Error")
    evicted = {"metadata": {"creationTimestamp": "2030-01-01T00:00:01Z"}, "status": {"reason": "Evicted"}}
    assert _pod_exit([pod, evicted]) == (None, "Evicted")
    assert _pod_exit([]) == (None, None)


def test_spec_error_names_the_field():
    with pytest.raises(pydantic.ValidationError) as err:
        AgentRunSpec.model_validate({"task": "t", "agent": {"version": "1", "model": {"provider": "nope"}}})
    assert "spec.agent.model.provider" in spec_error_text(err.value)


def test_pod_check_due_waits_for_the_grace_of_an_active_job_that_is_not_ready():
    now = datetime.now(UTC)
    assert 19 < (pod_check_due(job_doc(10), now, GRACE) or 0) <= 20
    assert pod_check_due(job_doc(31), now, GRACE) == 0
    assert pod_check_due(job_doc(31, ready=1), now, GRACE) is None  # it started
    done = job_doc(31)
    done["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert pod_check_due(done, now, GRACE) is None  # finished: the failed-Job read covers it
    no_time = job_doc(1)
    del no_time["metadata"]["creationTimestamp"]
    assert pod_check_due(no_time, now, GRACE) == 0
