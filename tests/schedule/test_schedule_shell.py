"""The schedule's shell, narrowly: what it sends for a plan, a refusal and a run that exists already,
against a recording stand-in of agentrun.kube's client (the real client, informer and API server
are in tests/e2e/test_schedules.py), and how the run cache's changes queue the schedule."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api.approval import ANN_CREATED_BY
from agentrun.api.schedule import LABEL_SCHEDULE, run_name
from agentrun.schedule.shell import ScheduleController

NOW = datetime(2030, 1, 1, 0, 1, 5, tzinfo=UTC)


class Recorder:
    def __init__(self, create_status: int | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.create_status = create_status

    async def request(self, method: str, path_: str, *, query: Any = None, body: Any = None,
                      content_type: str | None = None, timeout: Any = 30.0) -> Any:
        self.calls.append((method, path_, body))
        if path_.endswith("/selfsubjectreviews"):
            return {"status": {"userInfo": {"username": "system:serviceaccount:agentrun-system:agentrun-operator"}}}
        if method == "POST" and path_.endswith("/agentruns") and self.create_status:
            raise ApiException(status=self.create_status, reason="x", body=json.dumps({
                "message": "admission webhook denied: AgentRunPolicy default: spec.agent.image not allowed"}))
        if path_.endswith("/status"):
            doc = schedule_body()
            return {**doc, "metadata": {**doc["metadata"], "resourceVersion": "99"},
                    "status": {k: v for k, v in body["status"].items() if v is not None}}
        return {}

    def of(self, method: str, suffix: str) -> list[Any]:
        return [b for m, p, b in self.calls if m == method and p.endswith(suffix)]


def schedule_body() -> dict[str, Any]:
    return {"metadata": {"name": "nightly", "namespace": "ns", "uid": "s-uid", "generation": 1, "resourceVersion": "5",
                         "creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"schedule": "* * * * *", "runTemplate": {"spec": {
                "task": "t", "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{}]}}}}}}


def controller(kube: Recorder, runs: dict | None = None) -> ScheduleController:
    sc = ScheduleController(kube, runs if runs is not None else {}, lambda: True, [None], lambda ns: True, "op",  # type: ignore[arg-type]
                            clock=lambda: NOW)
    sc.replace("agentschedules", None, [schedule_body()])
    return sc


def test_a_due_time_creates_its_run_posts_one_event_and_writes_the_status():
    async def go() -> tuple[Recorder, ScheduleController]:
        kube = Recorder()
        sc = controller(kube)
        await sc.reconcile(("ns", "nightly"))
        return kube, sc

    kube, sc = asyncio.run(go())
    (run,) = kube.of("POST", "/agentruns")
    assert run["metadata"]["name"] == run_name("nightly", NOW.replace(second=0))
    assert run["metadata"]["annotations"][ANN_CREATED_BY] == "system:serviceaccount:agentrun-system:agentrun-operator"
    assert [e["reason"] for e in kube.of("POST", "/events")] == ["RunCreated"]
    (status,) = kube.of("PATCH", "/agentschedules/nightly/status")
    assert status["metadata"] == {"uid": "s-uid"}  # a precondition: never another schedule of that name
    assert status["status"]["lastScheduleTime"] == "2030-01-01T00:01:00Z"
    assert sc.schedules[("ns", "nightly")]["metadata"]["resourceVersion"] == "99"  # written through


def test_a_run_that_exists_already_is_done_without_a_second_event():
    async def go() -> Recorder:
        kube = Recorder(create_status=409)
        await controller(kube).reconcile(("ns", "nightly"))
        return kube

    kube = asyncio.run(go())
    assert kube.of("POST", "/events") == []
    assert kube.of("PATCH", "/status")[0]["status"]["lastScheduleTime"] == "2030-01-01T00:01:00Z"


def test_a_refused_run_is_a_condition_one_event_and_a_backoff():
    async def go() -> tuple[Recorder, ScheduleController, float | None]:
        kube = Recorder(create_status=403)
        sc = controller(kube)
        await sc.reconcile(("ns", "nightly"))
        return kube, sc, sc.queue.pending_delay(("ns", "nightly"))

    kube, sc, delay = asyncio.run(go())
    (status,) = kube.of("PATCH", "/status")
    cond = status["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", "RunRefused")
    assert "spec.agent.image not allowed" in cond["message"]
    assert "lastScheduleTime" not in status["status"]  # the time stays unmet
    assert [e["reason"] for e in kube.of("POST", "/events")] == ["RunRefused"]
    assert delay is not None and delay > 0  # the queue's backoff, not a hot loop

    async def again() -> Recorder:
        kube2 = Recorder(create_status=403)
        sc.kube = kube2  # type: ignore[assignment]
        await sc.reconcile(("ns", "nightly"))
        return kube2

    kube2 = asyncio.run(again())
    assert [e["reason"] for e in kube2.of("POST", "/events")] == [] and kube2.of("PATCH", "/status") == []  # said once


def test_run_changes_queue_their_schedule_and_nothing_else():
    runs: dict[tuple[str, str], dict[str, Any]] = {
        ("ns", "nightly-1"): {"metadata": {"labels": {LABEL_SCHEDULE: "nightly"}}},
        ("ns", "other"): {"metadata": {}},
    }

    async def go() -> list[Any]:
        sc = controller(Recorder(), runs)
        while len(sc.queue):
            key = await sc.queue.get()
            sc.queue.done(key)  # type: ignore[arg-type]
        sc.run_changed(("ns", "other"))
        assert len(sc.queue) == 0
        sc.run_changed(("ns", "nightly-1"))
        del runs[("ns", "nightly-1")]
        got = [await sc.queue.get()]
        sc.queue.done(("ns", "nightly"))
        sc.run_deleted(("ns", "nightly-1"))
        got.append(await sc.queue.get())
        return got

    assert asyncio.run(go()) == [("ns", "nightly"), ("ns", "nightly")]


def test_the_test_clock_is_off_without_its_variable(monkeypatch):
    from agentrun.schedule.shell import default_clock
    from agentrun.testfault.clock import ENV, file_clock

    monkeypatch.delenv(ENV, raising=False)
    assert default_clock()[1] is False
    assert file_clock({}) is None
    assert file_clock({ENV: "/nonexistent"}) is not None
