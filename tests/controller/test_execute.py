"""controller/execute.py: the executor performs a decision's actions and reports the write that did
not go through as a typed setback; what the run then says and does is ``decide_after``'s, and the
executor performs it: one Event per refusal streak, the run's backoff, nothing after the refused write.
(Job creates refused, store outages, the order of the run's writes: test_shell_robustness.py,
test_shell_write_order.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from controller_world import World, make_spec
from kubernetes.client.exceptions import ApiException
from test_decide_jobs import CFG, RUN
from test_shell_robustness import BODY, FakeKube, execute, executor

from agentrun.controller import decide as d
from agentrun.controller import execute as execute_module
from agentrun.controller.cache import Cache
from agentrun.controller.decide.jobs import build_job, spec_json
from agentrun.controller.execute import Outcome, RetryWithBackoff, StatusRefused

KEY = ("ns", "run")
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
