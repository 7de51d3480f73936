"""Pods are not watched: the reconciler reads the pods of a run's active Job when the Job is still
not ready after ``pod_config_grace_seconds``, so a lap pod stuck on its configuration (a missing
Secret) is still found and named, and a lap that starts within the grace costs no pod read. The
shell (Controller) against an API server that answers from a dict; no cluster, no sleeps: the timers
are looked at, not waited for."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from controller_world import UID, World, make_spec

from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID, job_name
from agentrun.controller.decide.observe import pod_check_due
from agentrun.controller.execute import Executor
from agentrun.controller.reconciler import POD_CHECK_GRID_SECONDS, POD_CHECK_MAX_SECONDS, Controller

KEY = ("ns", "run")
JOB = job_name("run", UID, 1, 1)
GRACE = 30.0


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def job_doc(age: float, *, ready: int = 0, rv: int = 20) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": JOB, "resourceVersion": str(rv),
                         "creationTimestamp": stamp(datetime.now(UTC) - timedelta(seconds=age)),
                         "labels": {LABEL_RUN_UID: UID, LABEL_LAP: "1", LABEL_ATTEMPT: "1"}},
            "status": {"active": 1, "ready": ready}}


def stuck_pod(age: float) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"{JOB}-x", "resourceVersion": "30",
                         "labels": {LABEL_RUN_UID: UID, "job-name": JOB},
                         "creationTimestamp": stamp(datetime.now(UTC) - timedelta(seconds=age))},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "lap", "state": {"waiting": {
                "reason": "CreateContainerConfigError", "message": 'secret "model-key" not found'}}}]}}


def run_doc() -> dict[str, Any]:
    """The run as the operator left it after creating lap 1's Job (decide's own status)."""
    w = World(make_spec())
    w.reconcile()
    assert w.status.active_job is not None and w.status.active_job.name == JOB
    return {"metadata": {"namespace": "ns", "name": "run", "uid": UID, "resourceVersion": "10", "generation": 1,
                         "finalizers": list(w.finalizers), "annotations": dict(w.annotations)},
            "spec": w.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
            "status": w.status.model_dump(by_alias=True, exclude_none=True, mode="json")}


class Kube:
    """An API server holding the run and the pods: answers a pod list, takes status patches."""

    def __init__(self, run: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.run, self.pods = run, pods
        self.requests: list[tuple[str, str]] = []
        self.selectors: list[str] = []
        self.rv = 100

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        self.requests.append((method, path_))
        if method == "GET" and path_ == "/api/v1/namespaces/ns/pods":
            sel = kw["query"]["labelSelector"]
            jobs = sel.split("(", 1)[1].rstrip(")").split(",") if " in (" in sel else [sel.removeprefix("job-name=")]
            self.selectors.append(sel)
            return {"items": [dict(p) for p in self.pods if p["metadata"]["labels"]["job-name"] in jobs]}
        if method == "PATCH" and path_.endswith("/agentruns/run/status"):
            self.rv += 1
            status = next(op["value"] for op in kw["body"] if op["path"] == "/status")
            self.run = {**self.run, "metadata": {**self.run["metadata"], "resourceVersion": str(self.rv)},
                        "status": status}
            return self.run
        if method == "POST" and path_ == "/api/v1/namespaces/ns/events":
            return kw["body"]
        raise AssertionError(f"unexpected request {method} {path_}")


def controller(run: dict[str, Any], job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[Controller, Kube]:
    c = Controller(OperatorConfig(checkpoint_uri="s3://bucket/prefix", s3_endpoint="http://s3:9000",
                                  pod_config_grace_seconds=GRACE))
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]
    kube = Kube(run, pods)
    c.kube = kube  # type: ignore[assignment]
    c.executor = Executor(c.config, c.kube, c.cache)  # type: ignore[arg-type]
    c.cache.event("runs", "ADDED", run)
    c.cache.event("jobs", "ADDED", job)
    return c, kube


def pod_reads(kube: Kube) -> int:
    return sum(1 for m, p in kube.requests if m == "GET" and p.endswith("/pods"))


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


def test_a_lap_that_starts_within_the_grace_costs_no_pod_read_only_a_timer():
    run = run_doc()
    c, kube = controller(run, job_doc(2), [stuck_pod(1)])

    async def main() -> tuple[float | None, float]:
        c._loop = asyncio.get_running_loop()
        requeue = await c.reconcile(KEY)
        check = c._pod_checks[("ns", JOB)]
        assert isinstance(check.pending, asyncio.TimerHandle)
        left = check.pending.when() - c._loop.time()
        check.pending.cancel()
        # the pod starts before the timer fires: the Job is ready, the check reads nothing and ends
        c.cache.event("jobs", "MODIFIED", job_doc(2, ready=1, rv=21))
        c.queue.shut_down()
        await c._check_pods(("ns", JOB))
        assert ("ns", JOB) not in c._pod_checks
        return requeue, left

    requeue, left = asyncio.run(main())
    assert pod_reads(kube) == 0 and kube.requests == [], kube.requests
    assert requeue is None and c.cache.causes == {"run changed": 1, "job added": 1}  # nothing more queued
    # the grace from the Job's creation (2-3 s ago), a second for its pod, on the grid
    assert GRACE - 4 < left <= GRACE + POD_CHECK_GRID_SECONDS


def test_a_pod_stuck_on_a_missing_secret_is_found_without_a_pod_watch():
    run = run_doc()
    c, kube = controller(run, job_doc(40), [stuck_pod(39)])
    jkey = ("ns", JOB)

    async def main() -> tuple[float | None, list[float]]:
        loop = c._loop = asyncio.get_running_loop()
        delays = []
        # the run is reconciled (an operator restart) while its Job is past the grace, not ready
        await c.reconcile(KEY)
        assert pod_reads(kube) == 0 and c._pod_checks[jkey].pending is not None
        c._pod_checks[jkey].pending.cancel()  # type: ignore[union-attr]
        # the check (due now) reads the pods: a configuration problem, the run is queued
        await c._check_pods(jkey)
        assert pod_reads(kube) == 1 and c.queue.depth == 1 and c.cache.causes.get("pod config") == 1
        requeue = await c.reconcile(KEY)
        for _ in range(2):  # the problem stays: the checks go on, every 15 s, and queue nothing more
            timer = c._pod_checks[jkey].pending
            assert isinstance(timer, asyncio.TimerHandle)
            delays.append(timer.when() - loop.time())
            timer.cancel()
            await c._check_pods(jkey)
        assert c.cache.causes.get("pod config") == 1
        # the Secret is created: the pod starts, the Job is ready; its readiness queues the run
        c.cache.event("jobs", "MODIFIED", job_doc(40, ready=1, rv=21))
        assert c.cache.causes.get("job state") == 1
        c._pod_checks[jkey].pending.cancel()  # type: ignore[union-attr]
        await c._check_pods(jkey)  # and the checks end
        assert jkey not in c._pod_checks
        c.queue.shut_down()
        return requeue, delays

    requeue, delays = asyncio.run(main())
    assert pod_reads(kube) == 3
    status = kube.run["status"]
    progressing = {cd["type"]: cd for cd in status["conditions"]}["Progressing"]
    assert status["phase"] == "Pending" and progressing["reason"] == "SecretMissing", status
    assert "Secret 'model-key' does not exist" in progressing["message"]
    assert [p for m, p in kube.requests if m == "POST"] == ["/api/v1/namespaces/ns/events"]  # one Warning
    assert requeue == 15.0  # decide's retry while the pod waits
    assert all(15 <= dl <= 15 + POD_CHECK_GRID_SECONDS for dl in delays), delays  # 15 s, on the grid


def test_a_pod_that_is_slow_to_start_is_read_with_a_doubling_delay_and_queues_nothing():
    run = run_doc()
    slow = stuck_pod(39)
    slow["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    c, kube = controller(run, job_doc(40), [slow])
    jkey = ("ns", JOB)

    async def main() -> list[float]:
        loop = c._loop = asyncio.get_running_loop()
        c._schedule_pod_check(KEY)
        delays = []
        for _ in range(6):
            c._pod_checks[jkey].pending.cancel()  # type: ignore[union-attr]
            await c._check_pods(jkey)
            timer = c._pod_checks[jkey].pending
            assert isinstance(timer, asyncio.TimerHandle)
            delays.append(timer.when() - loop.time())
            assert timer.when() % POD_CHECK_GRID_SECONDS == 0  # on the grid, to meet the others' reads
        timer.cancel()
        # the pod starts at last: it showed nothing, so the Job's readiness queues nothing (200 runs
        # on 2 cores: most lap pods are slower than the grace; each such lap cost one more reconcile)
        c.cache.event("jobs", "MODIFIED", job_doc(40, ready=1, rv=21))
        c.queue.shut_down()
        return delays

    delays = asyncio.run(main())
    assert pod_reads(kube) == 6 and c.cache.causes == {"run changed": 1, "job added": 1}
    expected = [30, 60, 120, 240, POD_CHECK_MAX_SECONDS, POD_CHECK_MAX_SECONDS]
    assert all(e <= d <= e + POD_CHECK_GRID_SECONDS for e, d in zip(expected, delays, strict=True)), delays


def test_a_key_taken_while_the_lease_renewal_was_late_is_reconciled_once_the_replica_acts_again():
    """is_leader expires for a moment when a renewal comes late (a loaded box) without the Lease
    being lost: no new acquire, so no resync. A key the queue handed out meanwhile (a Job's
    completion) was dropped for good, and its run sat until the periodic resync (found by the
    operator benchmark: 4 runs of 50 waited 8 minutes). It is now queued again once the replica acts."""
    c = Controller(OperatorConfig())
    leader = SimpleNamespace(is_leader=False, holds=True)  # took the Lease; a renewal is late
    c.elector = leader  # type: ignore[assignment]
    reconciled: list[tuple[str, str]] = []

    async def reconcile(key):
        reconciled.append(key)

    async def main() -> None:
        c.reconcile = reconcile  # type: ignore[method-assign]
        await c.process(KEY)
        c.requeue_not_leader()  # still not acting: nothing yet
        assert reconciled == [] and c.queue.depth == 0
        leader.is_leader = True
        c.requeue_not_leader()
        assert c.queue.depth == 1 and c.cache.causes == {"leader again": 1}
        key = await c.queue.get()
        assert key is not None
        await c.process(key)
        c.queue.done(key)
        c.requeue_not_leader()
        assert c.queue.depth == 0

    asyncio.run(main())
    assert reconciled == [KEY]


def test_the_dropped_keys_are_rechecked_by_a_timer_only_while_there_are_some(monkeypatch):
    """An idle operator sets no timer for the keys dropped while not acting (it was a loop waking
    every second, a sixth of an idle operator's wake-ups); a dropped key starts one, which queues
    it once the replica acts again and then stops."""
    from agentrun.controller import reconciler

    monkeypatch.setattr(reconciler, "NOT_LEADER_RECHECK_SECONDS", 0.01)
    c = Controller(OperatorConfig())
    leader = SimpleNamespace(is_leader=True, holds=True)
    c.elector = leader  # type: ignore[assignment]

    async def reconcile(key):
        return None

    async def main() -> None:
        c._loop = asyncio.get_running_loop()
        c.reconcile = reconcile  # type: ignore[method-assign]
        await c.process(KEY)  # acting: nothing kept, no timer
        assert c._not_leader_timer is None
        leader.is_leader = False
        await c.process(KEY)
        assert c._not_leader_timer is not None
        for _ in range(5):  # still not acting: the timer keeps looking
            await asyncio.sleep(0.02)
        assert c.queue.depth == 0 and c._not_leader_timer is not None
        leader.is_leader = True
        for _ in range(500):
            if c.queue.depth:
                break
            await asyncio.sleep(0.01)
        assert c.queue.depth == 1 and c.cache.causes == {"leader again": 1}
        assert c._not_leader_timer is None and not c._not_leader
        c.queue.shut_down()

    asyncio.run(main())


def test_a_replica_that_never_led_remembers_nothing_taking_the_lease_queues_every_run():
    """Keys a standby (or a replica before its first Lease) takes from the queue are not kept for
    later: the resync on taking the Lease queues every run, and keeping them too reconciled every
    run twice after a restart (the benchmark's 1,000 runs: 2,000 reconciles)."""
    c = Controller(OperatorConfig())
    c.elector = SimpleNamespace(is_leader=False, holds=False)  # type: ignore[assignment]

    async def main() -> None:
        await c.process(KEY)
        c.elector.is_leader = c.elector.holds = True  # type: ignore[union-attr]
        c.requeue_not_leader()
        assert c.queue.depth == 0

    asyncio.run(main())



def test_pod_checks_due_together_read_their_pods_in_one_request():
    """200 runs on 2 cores: most lap pods are not ready after the grace and their checks come due in
    the same second; their reads go out as one LIST with a set-based selector, not one per Job."""
    from agentrun.controller.reconciler import PodCheck

    run = run_doc()
    other = job_name("run", UID, 1, 2)
    other_pod = stuck_pod(39)
    other_pod["metadata"] = {**other_pod["metadata"], "name": f"{other}-x", "labels": {LABEL_RUN_UID: UID,
                                                                                          "job-name": other}}
    c, kube = controller(run, job_doc(40), [stuck_pod(39), other_pod])
    second = job_doc(40)
    second["metadata"] = {**second["metadata"], "name": other}
    c.cache.event("jobs", "ADDED", second)

    async def main() -> None:
        c._loop = asyncio.get_running_loop()
        for jkey in (("ns", JOB), ("ns", other)):
            c._pod_checks[jkey] = PodCheck(run=KEY)
        await asyncio.gather(c._check_pods(("ns", JOB)), c._check_pods(("ns", other)))
        for check in c._pod_checks.values():
            check.pending.cancel()  # type: ignore[union-attr]
        c.queue.shut_down()

    asyncio.run(main())
    assert kube.selectors == [f"job-name in ({','.join(sorted([JOB, other]))})"]
    assert [p["metadata"]["name"] for p in c.cache.pods_of("ns", JOB)] == [f"{JOB}-x"]
    assert [p["metadata"]["name"] for p in c.cache.pods_of("ns", other)] == [f"{other}-x"]
