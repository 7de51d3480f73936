"""controller/execute.py: the executor performs a decision's actions and reports the write that did
not go through as a typed setback; what the run then says and does is ``decide_after``'s, and the
executor performs it: one Event per refusal streak, the run's backoff, nothing after the refused write;
a Job create refused, a store outage, the order of the run's writes. Against an in-memory API server
(fake_kube.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from controller_world import STORE, World, make_spec
from fake_kube import BODY, KEY, FakeKube, execute, executor
from kubernetes.client.exceptions import ApiException
from test_decide_jobs import CFG, RUN

from agentrun.checkpoint.schema import RunRef
from agentrun.controller import decide as d
from agentrun.controller import execute as execute_module
from agentrun.controller.cache import Cache
from agentrun.controller.decide.jobs import build_job, spec_json
from agentrun.controller.execute import Outcome, RetryWithBackoff, StatusRefused

TOO_LONG = {"kind": "Status", "code": 422, "reason": "Invalid", "details": {"causes": [
    {"field": "status.approval.decidedBy", "message": "Too long: may not be more than 256 bytes"}]}}


class StatusKube(FakeKube):
    """Status patches answered with ``status_error`` (an ApiException), or stored without ``prune``."""

    def __init__(self, status_error: ApiException | None = None, prune: str | None = None) -> None:
        super().__init__()
        self.status_error, self.prune = status_error, prune

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        if method == "PATCH" and path_.endswith("/status"):
            self.requests.append((method, path_, kw.get("body")))
            if self.status_error is not None:
                raise self.status_error
            stored = dict(kw["body"][1]["value"])
            stored.pop(self.prune or "", None)
            return {"metadata": {**BODY["metadata"], "resourceVersion": "6"}, "status": stored}
        return await super().request(method, path_, **kw)


def refused(status: int, doc: dict[str, Any]) -> ApiException:
    exc = ApiException(status=status, reason="Unprocessable Entity")
    exc.body = json.dumps(doc)
    return exc


def pass_with_status_and_more() -> tuple[d.Observed, d.Decision]:
    o = World(spec=make_spec()).observed()
    return o, d.Decision([d.PatchStatus(o.status.model_copy(update={"phase": "Running"})),
                          d.RemoveAnnotations(("agentrun.dev/approved",)),
                          d.Event("Normal", "ApprovalDecided", "approved")])


def removed_annotations(kube: FakeKube) -> list[Any]:
    return [b for m, p, b in kube.requests if m == "PATCH" and not p.endswith("/status")]


def test_a_refused_status_write_posts_one_event_per_refusal_and_does_nothing_after_it():
    kube = StatusKube(refused(422, TOO_LONG))
    ex = executor(kube)
    for _ in range(3):
        o, dec = pass_with_status_and_more()
        with pytest.raises(StatusRefused):
            execute(ex, o, dec)
    [event] = kube.events()
    assert (event["type"], event["reason"]) == ("Warning", "StatusUpdateRefused")
    assert event["message"] == ("the API server refused the status update: status.approval.decidedBy: "
                                "Too long: may not be more than 256 bytes")
    assert removed_annotations(kube) == [] and len(kube.status_patches()) == 3  # nothing after the status
    ex.succeeded(KEY)  # a reconcile got through: the next refusal is a new streak, with its Event
    o, dec = pass_with_status_and_more()
    with pytest.raises(RetryWithBackoff):
        execute(ex, o, dec)
    assert len(kube.events()) == 2


def test_a_status_field_an_older_crd_prunes_is_said_once_and_backs_off():
    kube = StatusKube(prune="phase")
    ex = executor(kube)
    for _ in range(2):
        o, dec = pass_with_status_and_more()
        with pytest.raises(StatusRefused, match="did not store status.phase"):
            execute(ex, o, dec)
    assert [e["reason"] for e in kube.events()] == ["StatusUpdateRefused"]
    assert removed_annotations(kube) == []


@pytest.mark.parametrize("error", [refused(409, {"kind": "Status", "code": 409}),
                                   refused(422, {"kind": "Status", "code": 422})])  # the failed rv test
def test_a_run_that_changed_under_its_status_write_is_decided_again_soon_without_an_event(error):
    kube = StatusKube(error)
    o, dec = pass_with_status_and_more()
    out = execute(executor(kube), o, dec)
    assert isinstance(out, Outcome) and out.requeue == 0.2 and not out.wrote
    assert kube.events() == [] and removed_annotations(kube) == []


def test_the_executor_dumps_a_runs_spec_once_while_the_parsed_spec_is_the_same(monkeypatch: pytest.MonkeyPatch):
    """The lap spec env (``AGENTRUN_SPEC``) is ``spec_json`` of the run's parsed spec, made again only
    when the parsed spec is another object (a spec change) or the run was forgotten."""
    dumps: list[object] = []
    monkeypatch.setattr(execute_module, "spec_json", lambda spec: dumps.append(spec) or spec_json(spec))
    ex = execute_module.Executor(CFG, None, Cache(on_change=lambda key: None))  # type: ignore[arg-type]
    key = ("ns", "run")
    spec = make_spec()
    text = ex.spec_text(key, spec)
    assert text == spec_json(spec) and ex.spec_text(key, spec) == text and len(dumps) == 1
    changed = make_spec(task="another task")
    assert json.loads(ex.spec_text(key, changed))["task"] == "another task" and len(dumps) == 2
    ex.forget(key)
    ex.spec_text(key, changed)
    assert len(dumps) == 3
    env = {e["name"]: e.get("value") for e in build_job(RUN, changed, 1, 1, "v1", CFG, spec_text=text)[
        "spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_SPEC"] == text  # what was handed in


# ------------------------------------------------------------- a refused Job create, a store outage


def api_error(status: int, reason: str, doc: dict[str, Any] | None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(doc) if doc is not None else None
    return exc


def create_job() -> tuple[d.Observed, d.Decision]:
    o = World(spec=make_spec()).observed()
    return o, d.Decision(actions=[d.CreateJob(lap=1, attempt=1, agent_version="v1", name="run-l1-a1", store=STORE)])


QUOTA = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
         "message": 'jobs.batch "run-l1-a1" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
                    "used: count/jobs.batch=5, limited: count/jobs.batch=5",
         "details": {"name": "run-l1-a1", "group": "batch", "kind": "jobs"}}


@pytest.mark.parametrize("error", [
    api_error(403, "Forbidden", QUOTA),
    api_error(500, "Internal Server Error", {"kind": "Status", "code": 500, "message": "etcdserver: timeout"}),
    api_error(429, "Too Many Requests", None),
    api_error(403, "Forbidden", {"kind": "Status", "code": 403, "reason": "Forbidden",
                                 "message": 'jobs.batch "run-l1-a1" is forbidden: status unknown for quota: jobs, '
                                            "resources: count/jobs.batch"}),
])
def test_a_job_create_refused_for_a_quota_or_a_busy_api_server_is_retried_with_one_event(error):
    """A ResourceQuota on count/jobs.batch (403 "exceeded quota"), 5xx or 429 pass: the run is not
    failed; the reconcile is retried with the run's backoff and ONE Warning Event names the cause."""
    kube = FakeKube(error)
    ex = executor(kube)
    for _ in range(3):
        o, decision = create_job()
        decision.actions.append(d.PatchStatus(o.status.model_copy(update={"phase": "Running"})))
        with pytest.raises(RetryWithBackoff):
            execute(ex, o, decision)
    # nothing of the decision after the Job (no Failed, no Running): the status says why it waits,
    # once per streak, as the Event does
    [patch] = kube.status_patches()
    said = patch[1]["value"]
    assert said.get("phase") == o.status.phase and said["message"].startswith("the lap Job run-l1-a1 was refused")
    [progressing] = [c for c in said["conditions"] if c["type"] == "Progressing"]
    assert progressing["status"] == "False" and progressing["reason"] == "JobRefused"
    assert progressing["message"] == said["message"]
    events = kube.events()
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "JobRefused")]
    if error.status == 403:  # the API server's words: the quota and the resource
        assert "quota: jobs" in events[0]["message"] and "count/jobs.batch" in events[0]["message"]
    ex.succeeded(KEY)  # the Job was created at last: a later refusal is a new streak with its Event
    o, decision = create_job()
    with pytest.raises(RetryWithBackoff):
        execute(ex, o, decision)
    assert len(kube.events()) == 2 and len(kube.status_patches()) == 2


def test_an_invalid_job_fails_the_run_naming_the_field():
    """422 Invalid (the Job itself is bad): the run fails for good, and the message names the field
    from the API server's causes, not the HTTP reason phrase."""
    invalid = {"kind": "Status", "code": 422, "reason": "Invalid",
               "message": 'Job.batch "run-l1-a1" is invalid: spec.template.spec.containers[0].image: Required value',
               "details": {"name": "run-l1-a1", "kind": "Job", "causes": [
                   {"reason": "FieldValueRequired", "message": "Required value",
                    "field": "spec.template.spec.containers[0].image"}]}}
    kube = FakeKube(api_error(422, "Unprocessable Entity", invalid))
    o, decision = create_job()
    execute(executor(kube), o, decision)
    [patch] = kube.status_patches()
    status = patch[1]["value"]
    assert status["phase"] == "Failed"
    assert "spec.template.spec.containers[0].image: Required value" in status["message"]
    assert "Unprocessable Entity" not in status["message"]
    assert [e["reason"] for e in kube.events()] == ["JobRefused"]


def test_a_forbidden_job_names_what_the_api_server_said_bounded():
    denied = {"kind": "Status", "code": 403, "reason": "Forbidden",
              "message": "admission webhook \"deny.example\" denied the request: " + "x\x1b" * 2000}
    kube = FakeKube(api_error(403, "Forbidden", denied))
    o, decision = create_job()
    execute(executor(kube), o, decision)
    status = kube.status_patches()[0][1]["value"]
    assert status["phase"] == "Failed" and 'admission webhook "deny.example" denied' in status["message"]
    assert "\x1b" not in status["message"] and len(status["message"]) < 800


def test_a_checkpoint_delete_failing_during_a_store_outage_posts_one_event_per_streak():
    """Retention Delete with the store away: ONE CheckpointDeleteFailed Event per failure streak,
    and the run's rate-limited backoff (RetryWithBackoff), not an Event every store_retry_seconds."""
    kube = FakeKube()
    ex = executor(kube)
    calls = []

    class Store:
        def delete_run(self, run: RunRef) -> int:
            calls.append(run)
            raise ConnectionError("store unreachable")

    ex.store = lambda spec, loc: Store()  # type: ignore[method-assign]  # the store port: an outage
    o = World(spec=make_spec(), deleting=True).observed()
    for _ in range(5):
        with pytest.raises(RetryWithBackoff, match="store unreachable"):
            execute(ex, o, d.Decision(actions=[d.DeleteCheckpoints()]))
    assert len(calls) == 5
    assert [e["reason"] for e in kube.events()] == ["CheckpointDeleteFailed"]
    ex.succeeded(KEY)
    with pytest.raises(RetryWithBackoff):
        execute(ex, o, d.Decision(actions=[d.DeleteCheckpoints()]))
    assert len(kube.events()) == 2


# -------------------------------------------------------------------- the order of the run's writes


def _run_writes(kube: FakeKube) -> list[tuple[str, object]]:
    return [("status" if p.endswith("/status") else "annotations", b) for m, p, b in kube.requests
            if m == "PATCH" and ("annotations" in str(b) or p.endswith("/status"))]


def test_annotations_of_an_unrecorded_decision_go_first_guarded_by_the_resource_version():
    o = World(spec=make_spec()).observed()
    status = o.status.model_copy(update={"phase": "AwaitingApproval"})
    dec = d.Decision([d.PatchStatus(status), d.RemoveAnnotations(("approved",), before_status=True)])
    kube = FakeKube()
    execute(executor(kube), o, dec)
    (first, meta), (second, _) = _run_writes(kube)
    assert (first, second) == ("annotations", "status")
    assert meta == {"metadata": {"annotations": {"approved": None}, "resourceVersion": BODY["metadata"]["resourceVersion"]}}


def test_a_recorded_decisions_annotations_go_after_its_status_unguarded():
    o = World(spec=make_spec()).observed()
    dec = d.Decision([d.RemoveAnnotations(("approved",)), d.PatchStatus(o.status.model_copy(update={"lap": 1}))])
    kube = FakeKube()
    execute(executor(kube), o, dec)
    (first, _), (second, meta) = _run_writes(kube)
    assert (first, second) == ("status", "annotations")
    assert meta == {"metadata": {"annotations": {"approved": None}}}


class ConflictingKube(FakeKube):
    def request(self, method, path_, **kw):
        if method == "PATCH" and not path_.endswith("/status"):
            self.requests.append((method, path_, kw.get("body")))
            raise ApiException(status=409, reason="Conflict")
        return super().request(method, path_, **kw)


def test_a_conflict_on_the_first_removal_writes_no_status_and_decides_again():
    o = World(spec=make_spec()).observed()
    dec = d.Decision([d.PatchStatus(o.status.model_copy(update={"lap": 1})),
                      d.RemoveAnnotations(("approved",), before_status=True)])
    kube = ConflictingKube()
    out = execute(executor(kube), o, dec)
    assert isinstance(out, Outcome) and out.requeue == 0.2
    assert kube.status_patches() == []
