"""The controller (``agentrun.controller.reconciler.Controller``) with no cluster: which replica may
lead (an informer that never synced or was refused), the per-run backoff of failed or unconverged
reconciles, the resync's period, the keys taken while not acting, the pod checks of a lap Job that is
not ready (pods are not watched: read after ``pod_config_grace_seconds``, gathered into one LIST), and
the ports the cache gives the notifier and the tenancy re-check. The API server answers from memory;
the timers are looked at, not waited for."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from cache_objects import awaiting, run_obj
from controller_world import UID, World, make_spec
from fake_kube import BODY, KEY, FakeKube, executor
from pod_check_objects import GRACE, JOB, job_doc, stuck_pod

from agentrun import metrics
from agentrun.controller import decide as d
from agentrun.controller import reconciler
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import LABEL_RUN_UID, job_name
from agentrun.controller.execute import Executor, Outcome
from agentrun.controller.reconciler import POD_CHECK_GRID_SECONDS, POD_CHECK_MAX_SECONDS, Controller


def test_exact_namespaces():
    from agentrun.controller.reconciler import exact_namespaces

    assert exact_namespaces(("team-a",)) and exact_namespaces(["a", "b"])
    assert not exact_namespaces(())
    assert not exact_namespaces(("team-*",)) and not exact_namespaces(("a", "!b")) and not exact_namespaces(("a?",))


# -------------------------------------------------- leading: the watch cache synced and not refused


class FakeInformer:
    def __init__(self, kind: str, error: str | None = None) -> None:
        self.path = f"/api/v1/{kind}"
        self.namespace = None
        self.synced = asyncio.Event()
        self.last_error = error


def test_a_replica_whose_cache_never_syncs_does_not_campaign_for_the_lease(monkeypatch, caplog):
    """An informer whose list is refused (RBAC without watch on pods) keeps the replica out of the
    Lease (so a standby can act), not ready, with a warning naming the resource and the error and
    agentrun_informer_synced{resource} 0, until it lists."""
    monkeypatch.setattr(reconciler, "UNSYNCED_WARNING_SECONDS", 0.01)
    c = Controller(OperatorConfig())
    ran: list[bool] = []

    class Elector:
        is_leader = False

        async def run(self) -> None:
            ran.append(True)

    async def main() -> None:
        runs, pods = FakeInformer("agentruns"), FakeInformer("pods", "403 Forbidden")
        runs.synced.set()
        c.informers = [runs, pods]  # type: ignore[list-item]
        c.elector = Elector()  # type: ignore[assignment]
        tasks = [asyncio.create_task(c._wait_synced()), asyncio.create_task(c._elect())]
        while not any("pods in all namespaces (403 Forbidden)" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
        assert not ran and not c.synced
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "pods"}) == 0.0
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "agentruns"}) == 1.0
        pods.synced.set()  # RBAC fixed: the list passed
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert ran == [True] and c.synced
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "pods"}) == 1.0

    with caplog.at_level(logging.WARNING, "agentrun.controller"):
        asyncio.run(main())


def test_a_replica_whose_cache_is_refused_for_long_must_not_lead():
    """Controller.cannot_lead (the elector's question, and /readyz's): only an informer of runs or
    Jobs refused for REFUSED_STEP_DOWN_SECONDS; an optional one (the tenancy re-check's) never."""
    import time
    from types import SimpleNamespace

    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.reconciler import REFUSED_STEP_DOWN_SECONDS, Controller

    c = Controller(OperatorConfig())
    from agentrun import metrics

    listed = asyncio.Event()
    listed.set()
    runs = SimpleNamespace(optional=False, refused_since=None, namespace="team-a", last_error="403 Forbidden",
                           path="/apis/agentrun.dev/v1alpha1/namespaces/team-a/agentruns", synced=listed)
    policies = SimpleNamespace(optional=True, refused_since=time.monotonic() - 10 * REFUSED_STEP_DOWN_SECONDS,
                               namespace=None, last_error="403 Forbidden", synced=listed,
                               path="/apis/agentrun.dev/v1alpha1/agentrunpolicies")
    c.informers = [runs, policies]  # type: ignore[list-item]
    assert c.cannot_lead() is None and c._eligible() is None
    assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "agentruns"}) == 1.0
    runs.refused_since = time.monotonic() - REFUSED_STEP_DOWN_SECONDS / 2
    assert c.cannot_lead() is None
    runs.refused_since = time.monotonic() - REFUSED_STEP_DOWN_SECONDS - 1
    why = c._eligible() or ""  # the elector's question: the gauge says 0 for the refused watch
    assert "agentruns in team-a" in why and "403 Forbidden" in why and "RBAC" in why
    assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "agentruns"}) == 0.0
    runs.refused_since = None  # it listed again
    assert c._eligible() is None
    assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "agentruns"}) == 1.0


# --------------------------------------------------- processing a key: backoff, convergence, resync


def test_failed_reconciles_back_off_exponentially_per_run(monkeypatch):
    """A refused status write or an error: the run is queued again after its own exponential
    backoff (0.5 s doubling, capped at 5 min); a success resets it; other runs are not affected."""
    import asyncio
    from types import SimpleNamespace

    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import StatusRefused
    from agentrun.controller.reconciler import Controller

    c = Controller(OperatorConfig())
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]
    delays: list[tuple[str, float]] = []
    limited = c.queue.add_rate_limited

    def spy(key):
        delays.append((key[1], limited(key)))
        return delays[-1][1]

    monkeypatch.setattr(c.queue, "add_rate_limited", spy)

    async def refused(key):
        raise StatusRefused("status.approval.decidedBy: Too long")

    async def main(reconcile, keys):
        monkeypatch.setattr(c, "reconcile", reconcile)
        for key in keys:
            await c.process(key)

    asyncio.run(main(refused, [("ns", "r")] * 12 + [("ns", "other")]))
    assert delays == [("r", dl) for dl in (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300)] + [("other", 0.5)]

    async def ok(key):
        return None

    asyncio.run(main(ok, [("ns", "r")]))
    assert c.queue.num_requeues(("ns", "r")) == 0
    asyncio.run(main(refused, [("ns", "r")]))
    assert delays[-1] == ("r", 0.5)  # a success resets the backoff


def leader(c: Controller) -> None:
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]


def test_a_decision_that_never_converges_backs_off(monkeypatch, caplog):
    """Still writing after MAX_PASSES: the run is queued again with its growing backoff (and a log
    line), not at once with the backoff reset."""
    c = Controller(OperatorConfig())
    leader(c)
    c.kube = FakeKube()  # type: ignore[assignment]
    c.executor = executor(c.kube)  # type: ignore[arg-type]
    c.cache.put("runs", {**BODY, "spec": make_spec().model_dump(by_alias=True, mode="json")})
    monkeypatch.setattr(d, "decide", lambda o: d.Decision())
    passes = []

    async def always_writes(*a: Any) -> Any:
        passes.append(1)
        return Outcome(requeue=None, wrote=True)

    monkeypatch.setattr(c.executor, "execute", always_writes)

    async def main() -> list[float | None]:
        delays = []
        for _ in range(3):
            await c.process(KEY)
            delays.append(c.queue.pending_delay(KEY))
            assert len(c.queue) == 0, "queued again at once"
        c.queue.shut_down()
        return delays

    with caplog.at_level(logging.WARNING, "agentrun.controller"):
        delays = asyncio.run(main())
    assert len(passes) == 3 * reconciler.MAX_PASSES
    assert c.queue.num_requeues(KEY) == 3
    assert all(x is not None and x > 0 for x in delays)
    assert any(f"{reconciler.MAX_PASSES} passes" in r.getMessage() for r in caplog.records)


def test_the_resync_reconciles_every_run_within_its_period_and_spares_recent_ones(monkeypatch):
    """AGENTRUN_RESYNC_SECONDS promises "at least this often": an idle run (nothing but the resync
    reconciles it) is reconciled within every period, once per period; a run reconciled often by
    its own events is never queued by the resync."""
    period = 300.0
    c = Controller(OperatorConfig(resync_seconds=period))
    leader(c)
    slept: list[float] = []

    class Stop(Exception):
        pass

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        raise Stop

    monkeypatch.setattr(reconciler.asyncio, "sleep", fake_sleep)
    with pytest.raises(Stop):
        asyncio.run(c._resync_loop())
    monkeypatch.undo()
    tick = slept[0]

    now = [0.0]
    monkeypatch.setattr(reconciler, "time", SimpleNamespace(monotonic=lambda: now[0]))
    idle, busy = ("ns", "idle"), ("ns", "busy")
    for key in (idle, busy):
        c.cache.runs[key] = {}
        c._reconciled_at[key] = 0.0
    queued: list[tuple[str, str]] = []
    monkeypatch.setattr(c.cache, "enqueue", lambda key, cause: queued.append(key))
    reconciled = {idle: [0.0], busy: [0.0]}
    t, horizon = 0.0, 20 * period
    next_tick, next_event = tick, period / 4
    while t < horizon:
        t = min(next_tick, next_event)
        now[0] = t
        if t == next_event:  # the busy run's own events
            c._reconciled_at[busy] = t
            reconciled[busy].append(t)
            next_event += period / 4
            continue
        next_tick += tick
        asyncio.run(c.resync(full=False))
        for key in queued:  # a worker takes it a moment later
            c._reconciled_at[key] = t + 0.5
            reconciled[key].append(t + 0.5)
        queued.clear()
    gaps = [b - a for a, b in zip(reconciled[idle], reconciled[idle][1:], strict=False)]
    assert max(gaps) <= period + 1.0
    assert len(reconciled[idle]) <= horizon / period + 2  # about one per period: not more
    assert len(reconciled[busy]) == len(set(reconciled[busy])) == int(horizon / (period / 4)) + 1  # none added


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


# --------------------------------------------------------------------------------------- pod checks


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


# -------------------------------------------------- the notifier's and the tenancy re-check's ports


def test_the_operators_notifier_reads_the_cache_and_its_status_write_queues_no_reconcile():
    """Controller._notifier_runs/_notifier_patch, called from another thread as the notifier's
    thread does: the runs waiting on an approval come from the cache (no request); the record is
    one PATCH whose watch echo (arriving before the response) is skipped, not a reconcile."""
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor
    from agentrun.controller.reconciler import Controller

    c = Controller(OperatorConfig(namespaces=("ns",)))

    class Kube:
        def __init__(self) -> None:
            self.requests: list[tuple[str, str, Any]] = []

        async def request(self, method: str, path_: str, **kw: Any) -> Any:
            self.requests.append((method, path_, kw.get("body")))
            stored = awaiting(8)
            stored["status"]["approval"]["notified"] = kw["body"]["status"]["approval"]["notified"]
            # the watch echo of this write lands on the loop before the response does
            c.cache.event("runs", "MODIFIED", stored)
            await asyncio.sleep(0)
            return stored

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nonlocal loop
        loop = asyncio.get_running_loop()
        c._loop, c.kube = loop, Kube()  # type: ignore[assignment]
        c.executor = Executor(c.config, c.kube, c.cache)  # its writes go through the executor
        c.cache.event("runs", "ADDED", run_obj(5, phase="Running"))
        c.cache.event("runs", "ADDED", {**awaiting(6), "metadata": {**awaiting(6)["metadata"], "name": "w"}})
        c.cache.put("runs", awaiting(7))
        c.queue.shut_down()
        before = dict(c.cache.causes)
        seen = await asyncio.to_thread(c._notifier_runs)
        patch = {"status": {"approval": {"notified": {"callId": "c1", "requestedAt": "2026-12-01T12:00:00Z"}}}}
        await asyncio.to_thread(c._notifier_patch, "ns", "r", patch)
        after = await asyncio.to_thread(c._notifier_runs)
        assert c.cache.causes == before, "the echo of the notifier's write queued a reconcile"
        return seen, after

    loop: asyncio.AbstractEventLoop
    seen, after = asyncio.run(main())
    assert [r["metadata"]["name"] for r in seen] == ["r", "w"]
    assert [m for m, *_ in c.kube.requests] == ["PATCH"]  # type: ignore[union-attr]
    assert c.kube.requests[0][1] == "/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r/status"  # type: ignore[union-attr]
    assert after[0]["status"]["approval"]["notified"]["callId"] == "c1"
    assert c.cache.skipped >= 1


def test_a_policy_change_queues_the_live_runs_of_the_namespaces_it_applies_to():
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.reconciler import Controller

    c = Controller(OperatorConfig())
    for ns, name, phase in (("a", "live", "Running"), ("a", "done", "Succeeded"), ("b", "live", "AwaitingApproval")):
        obj = run_obj(1, phase=phase)
        obj["metadata"].update(namespace=ns, name=name, uid=f"{ns}-{name}")
        c.cache.put("runs", obj)
    c._policies_changed({"a"})
    assert c.cache.causes == {"policy changed": 1} and list(c.queue._queue) == [("a", "live")]  # type: ignore[attr-defined]
    c._policies_changed(None)  # a binding changed: every live run
    assert c.cache.causes == {"policy changed": 3}


def test_the_outcomes_a_namespaces_policies_choose_index_its_finished_runs_and_a_change_reindexes():
    """Controller._notify_outcomes (the cache's index) and _notifier_outcomes (the notifier's port,
    from its thread): a run without spec.notify announces what its namespace's AgentRunPolicies
    choose (notifications.outcomes), else the chart's; a policy's change indexes that namespace's
    finished runs again and wakes the notifier for a newly due one."""
    from agentrun.api.tenancy import NAMESPACE_LABEL, VAP_NAME
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.reconciler import Controller
    from agentrun.controller.tenancy import PolicyStore
    from agentrun.notify.sender import from_env

    c = Controller(OperatorConfig())
    woken: list[tuple[str, str]] = []
    c.cache.on_awaiting = woken.append
    c.notifier = from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "http://x/"}, runs=tuple,
                          patch_status=lambda *a: None, outcomes=c._notifier_outcomes)  # chart default: none
    c.notifier._http.close()
    c.policies = store = PolicyStore(on_change=c._tenancy_changed)
    c.cache.notify_outcomes = c._notify_outcomes

    def pol(name: str, rv: int, outcomes: list[str] | None) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": str(rv)},
                "spec": {} if outcomes is None else {"notifications": {"outcomes": outcomes}}}

    def bind(name: str, policy: str, selector: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": "1"},
                "spec": {"policyName": VAP_NAME, "paramRef": {"name": policy}, "validationActions": ["Deny"],
                         "matchResources": {"namespaceSelector": selector}}}

    store.replace("namespaces", None, [{"metadata": {"name": "a", "resourceVersion": "1", "labels": {}}},
                                       {"metadata": {"name": "b", "resourceVersion": "2",
                                                     "labels": {NAMESPACE_LABEL: "team"}}}])
    store.replace("bindings", None, [
        bind("agentrun-tenancy", "default", {"matchExpressions": [
            {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": ["team"]}]}),
        bind("agentrun-tenancy-team", "team", {"matchLabels": {NAMESPACE_LABEL: "team"}})])
    store.replace("policies", None, [pol("default", 3, None), pol("team", 4, ["Failed"])])
    for ns, name, notify in (("a", "plain", None), ("b", "plain", None), ("b", "optout", {"outcomes": []})):
        obj = run_obj(1, phase="Failed")
        obj["metadata"].update(namespace=ns, name=name, uid=f"{ns}-{name}")
        if notify is not None:
            obj["spec"]["notify"] = notify
        c.cache.put("runs", obj)
    assert set(c.cache.outcomes_due) == {("b", "plain")} and woken == [("b", "plain")]

    store.event("policies", "MODIFIED", pol("default", 5, ["Failed", "Succeeded"]))  # the platform team opts in
    assert set(c.cache.outcomes_due) == {("a", "plain"), ("b", "plain")} and woken[-1] == ("a", "plain")
    store.event("policies", "MODIFIED", pol("team", 6, []))  # ... and team b opts out
    assert set(c.cache.outcomes_due) == {("a", "plain")}

    async def from_the_notifiers_thread() -> list[tuple[str, ...]]:
        c._loop = asyncio.get_running_loop()
        return [await asyncio.to_thread(c._notifier_outcomes, ns) for ns in ("a", "b", "c")]

    assert asyncio.run(from_the_notifiers_thread()) == [("Succeeded", "Failed"), (), ("Succeeded", "Failed")]
    store.refused("bindings", 403)  # the policies are not known: the chart's default
    assert c._notify_outcomes("a") == ()
