"""decide() for a lap pod stuck on its configuration (a missing Secret or key: the kubelet's
CreateContainerConfigError): past the grace the run says so, once, naming the Secret and key, and
keeps waiting; when the Secret appears the pod runs and the run goes on. Pure, no cluster."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from controller_world import T0, World, make_spec

from agentrun.controller import decide as d

MISSING = ("CreateContainerConfigError", 'secret "openai-key" not found')
NO_KEY = ("CreateContainerConfigError", "couldn't find key api-key in Secret ns/openai-key")


@pytest.mark.parametrize("reason,message,expect", [
    (*MISSING, ("SecretMissing", "Secret 'openai-key' does not exist in the run's namespace")),
    (*NO_KEY, ("SecretMissing", "Secret 'openai-key' has no key 'api-key'")),
    ("CreateContainerConfigError", "unsupported fieldRef 'x'", ("LapPodConfigError",
                                                               "CreateContainerConfigError: unsupported fieldRef 'x'")),
    ("InvalidImageName", None, ("LapPodConfigError", "InvalidImageName: InvalidImageName")),
    ("ContainerCreating", None, None),
    ("ImagePullBackOff", "back-off pulling", None),  # may heal by itself; lapTimeout bounds it
    (None, None, None),
])
def test_pod_config_problem_names_the_secret_and_key(reason, message, expect):
    assert d.pod_config_problem(reason, message) == expect


def _waiting(w: World, reason_message: tuple[str, str], since_seconds: float) -> None:
    j = w.active()
    w.jobs[j.name] = dataclasses.replace(j, waiting_reason=reason_message[0], waiting_message=reason_message[1],
                                         waiting_since=w.now - timedelta(seconds=since_seconds))


def test_within_the_grace_nothing_is_said_but_a_requeue_at_its_end():
    w = World(make_spec())
    w.reconcile()
    _waiting(w, MISSING, since_seconds=10)
    dec = w.reconcile()
    assert w.status.phase == "Running" and "SecretMissing" not in w.reasons()
    assert dec.requeue_after == pytest.approx(20.0)
    assert dec.of(d.CreateJob) == [] and dec.of(d.DeleteJob) == []


def test_past_the_grace_a_condition_and_one_warning_event_then_it_recovers():
    w = World(make_spec())
    w.reconcile()
    job = w.active().name
    _waiting(w, NO_KEY, since_seconds=31)
    dec = w.reconcile()
    assert w.status.phase == "Pending", w.status
    progressing = {c.type: c for c in w.status.conditions}["Progressing"]
    assert progressing.status == "True" and progressing.reason == "SecretMissing"
    assert "lap 1 attempt 1 cannot start: Secret 'openai-key' has no key 'api-key'" in progressing.message
    assert "spec.lapTimeout" in w.status.message
    events = [e for e in w.events if e.reason == "SecretMissing"]
    assert len(events) == 1 and events[0].type == "Warning" and "'openai-key'" in events[0].message
    assert dec.requeue_after == 15.0
    # the run keeps its Job (the kubelet starts the pod once the Secret exists): no new Job, no retry
    assert dec.of(d.CreateJob) == [] and dec.of(d.DeleteJob) == [] and w.status.total_retries == 0
    # later reconciles while still waiting: no new Event, no status write
    w.now += timedelta(seconds=30)
    again = w.reconcile()
    assert [e for e in w.events if e.reason == "SecretMissing"] == events and again.of(d.PatchStatus) == []
    # the Secret is created: the pod runs, the run is Running again, and the lap finishes normally
    j = w.active()
    assert j.name == job
    w.jobs[job] = dataclasses.replace(j, waiting_reason=None, waiting_message=None, waiting_since=None)
    w.reconcile()
    assert w.status.phase == "Running" and w.status.active_job.name == job
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.created == [(1, 1)]


def test_a_different_problem_after_the_first_is_reported_too():
    w = World(make_spec())
    w.reconcile()
    _waiting(w, MISSING, since_seconds=40)
    w.reconcile()
    _waiting(w, NO_KEY, since_seconds=50)
    w.reconcile()
    msgs = [e.message for e in w.events if e.reason == "SecretMissing"]
    assert len(msgs) == 2 and "does not exist" in msgs[0] and "has no key 'api-key'" in msgs[1]


def test_the_grace_comes_from_the_observation():
    w = World(make_spec())
    w.reconcile()
    _waiting(w, MISSING, since_seconds=6)
    obs = dataclasses.replace(w.observed(), pod_config_grace_seconds=5.0)
    dec = d.decide(obs)
    assert dec.status is not None and dec.status.phase == "Pending"
    assert T0 <= w.now


# ------------------------------------------------------------ the runner's message when no report exists


def _failed_pod(message: str) -> dict:
    return {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 2, "reason": "Error",
                                                                       "message": message}}}]}}


def test_the_runner_failure_message_is_taken_from_the_termination_message():
    from agentrun.controller.decide.observe import pod_failure_message as _pod_failure_message

    tail = "\n".join([
        '{"msg": "lap starting", "level": "info"}',
        '{"msg": "lap failed", "level": "error", "exit_code": 2, "error": "S3 HeadObject k: 403 (HTTP 403); the store '
        "refused the credentials from Secret 's3-creds' (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)\"}",
        '{"msg": "attempt report not written", "level": "warning", "error": "StoreConfigError"}',
    ])
    msg = _pod_failure_message([_failed_pod(tail)])
    assert msg is not None and msg.startswith("S3 HeadObject k: 403") and "Secret 's3-creds'" in msg
    assert _pod_failure_message([_failed_pod("Traceback ...\nnot json")]) is None
    assert _pod_failure_message([]) is None
    assert len(_pod_failure_message([_failed_pod('{"msg": "lap failed", "error": "' + "x" * 5000 + '"}')])) == 600


def test_a_permanent_failure_without_a_report_uses_the_runner_message():
    w = World(make_spec())
    w.reconcile()
    j = w.active()
    w.jobs[j.name] = dataclasses.replace(j, state="failed", exit_code=2,
                                         message="S3 HeadObject k: 403 (HTTP 403); the store refused the credentials "
                                                 "from Secret 's3-creds'")
    w.reconcile()
    assert w.status.phase == "Failed"
    failed = {c.type: c for c in w.status.conditions}["Failed"]
    assert failed.reason == "LapFailedPermanently" and "Secret 's3-creds'" in failed.message, failed
