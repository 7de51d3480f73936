"""The controller shell's pure parts: the work queue (dedup, one worker per key, per-key backoff),
the watch cache (own writes and stale events skipped, Jobs and pods enqueue only on a state change),
and the request counter's labels. No cluster, no sleeps."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agentrun.controller.cache import Cache
from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID

# ----------------------------------------------------------------------------------------- queue
from agentrun.controller.decide.queue import NO_GROUP
from agentrun.kube.client import request_labels
from agentrun.kube.queue import RateLimiter, WorkQueue


def NOG(run):  # noqa: N802 - no per-group limit: every run in no group
    return NO_GROUP


def test_queue_dedups_a_key_until_it_is_taken():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        for k in ("a", "b", "a", "a", "b"):
            q.add(k)
        assert len(q) == 2
        assert await q.get() == "a"
        assert await q.get() == "b"
        assert len(q) == 0

    asyncio.run(main())


def test_queue_metrics_count_adds_retries_and_the_wait_as_client_go_does():
    """agentrun_workqueue_*: a deduplicated add is not counted, a rate-limited re-add is a retry,
    the wait in the queue is observed when a worker takes the key, depth and delayed are read at
    scrape time."""
    from agentrun.metrics.workqueue import WorkQueueMetrics

    reg = CollectorRegistry()
    m = WorkQueueMetrics(reg)

    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(observer=m)
        m.watch(lambda: q.depth, lambda: q.delayed)
        q.add("a")
        q.add("a")  # deduplicated
        q.add("b")
        assert reg.get_sample_value("agentrun_workqueue_depth") == 2
        assert await q.get() == "a"
        q.add_rate_limited("a")  # the reconcile of "a" failed
        assert reg.get_sample_value("agentrun_workqueue_delayed") == 1
        assert reg.get_sample_value("agentrun_workqueue_depth") == 1
        q.done("a")
        assert await q.get() == "b"

    asyncio.run(main())
    assert reg.get_sample_value("agentrun_workqueue_adds_total") == 2
    assert reg.get_sample_value("agentrun_workqueue_retries_total") == 1
    assert reg.get_sample_value("agentrun_workqueue_queue_duration_seconds_count") == 2


def test_queue_never_hands_a_key_to_two_workers_and_loses_no_add():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("b")
        first = await q.get()
        assert first == "a"
        q.add("a")  # an event while "a" is reconciled
        q.add("a")
        assert len(q) == 1  # only "b": "a" waits for its worker to finish
        assert await q.get() == "b"
        assert len(q) == 0
        q.done("a")  # the worker finished: "a" is queued again, once
        assert len(q) == 1
        assert await q.get() == "a"
        q.done("a")
        q.done("b")
        assert len(q) == 0

    asyncio.run(main())


def test_queue_workers_run_different_keys_concurrently_but_one_key_serially():
    async def main() -> list[tuple[str, str]]:
        q: WorkQueue[str] = WorkQueue()
        log: list[tuple[str, str]] = []
        running: set[str] = set()
        release = {k: asyncio.Event() for k in ("a1", "a2", "b")}
        seen: dict[str, int] = {}

        async def worker() -> None:
            while (key := await q.get()) is not None:
                assert key not in running, f"{key} processed twice at once"
                running.add(key)
                n = seen[key] = seen.get(key, 0) + 1
                log.append(("start", f"{key}{n if key == 'a' else ''}"))
                await release[f"{key}{n}" if key == "a" else key].wait()
                running.discard(key)
                log.append(("end", key))
                q.done(key)

        workers = [asyncio.create_task(worker()) for _ in range(3)]
        q.add("a")
        q.add("b")
        for _ in range(5):
            await asyncio.sleep(0)  # let the workers take the keys (no time passes)
        q.add("a")  # while a is processed
        for _ in range(5):
            await asyncio.sleep(0)
        assert running == {"a", "b"} and seen == {"a": 1, "b": 1}
        release["a1"].set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert seen["a"] == 2  # re-queued after its first reconcile ended, not before
        release["a2"].set()
        release["b"].set()
        for _ in range(10):
            await asyncio.sleep(0)
        q.shut_down()
        await asyncio.gather(*workers)
        return log

    log = asyncio.run(main())
    a_events = [e for e in log if e[1].startswith("a")]
    assert a_events == [("start", "a1"), ("end", "a"), ("start", "a2"), ("end", "a")]


def test_rate_limiter_backs_off_per_key_exponentially_and_forget_resets():
    rl: RateLimiter[str] = RateLimiter(base=0.5, cap=300.0)
    assert [rl.when("x") for _ in range(12)] == [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert rl.when("y") == 0.5 and rl.num_requeues("x") == 12
    rl.forget("x")
    assert rl.num_requeues("x") == 0 and rl.when("x") == 0.5


def test_queue_delayed_adds_keep_the_earliest_and_rate_limited_adds_use_the_backoff():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(RateLimiter(base=1.0, cap=8.0))
        q.add_after("a", 100)
        q.add_after("a", 300)  # later: ignored
        assert 99 < (q.pending_delay("a") or 0) <= 100
        q.add_after("a", 10)  # earlier: replaces
        assert 9 < (q.pending_delay("a") or 0) <= 10
        assert len(q) == 0
        assert [q.add_rate_limited("b") for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
        assert 0 < (q.pending_delay("b") or 0) <= 1.0  # the earliest pending one stays
        q.forget("b")
        assert q.num_requeues("b") == 0
        q.add_after("c", 0)  # no delay: queued now
        assert len(q) == 1
        q.discard("a")
        assert q.pending_delay("a") is None
        q.shut_down()
        assert q.pending_delay("b") is None

    asyncio.run(main())


def test_a_delayed_add_fires_into_the_queue():
    async def main() -> str | None:
        q: WorkQueue[str] = WorkQueue()
        q.add_after("a", 0.001)
        return await asyncio.wait_for(q.get(), 10)  # waits for the timer, not a fixed time

    assert asyncio.run(main()) == "a"


# ----------------------------------------------------------------------------------------- cache

UID = "0123456789abcdef"


def run_obj(rv: int, **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "r", "uid": UID, "resourceVersion": str(rv)},
            "spec": {}, "status": status}


def job_obj(rv: int, name: str = "r-job", *, conditions: list[dict[str, str]] | None = None,
            active: int = 1, ready: int = 0) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv),
                         "labels": {LABEL_RUN_UID: UID, LABEL_LAP: "1", LABEL_ATTEMPT: "1"}},
            "status": {"active": active, "ready": ready, "conditions": conditions or []}}


def pod_obj(rv: int, *, waiting: tuple[str, str] | None = None, exit_code: int | None = None,
            job: str = "r-job") -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    phase = "Running"
    if waiting:
        state, phase = {"waiting": {"reason": waiting[0], "message": waiting[1]}}, "Pending"
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": "Completed"}}
        phase = "Succeeded" if exit_code == 0 else "Failed"
    return {"metadata": {"namespace": "ns", "name": f"{job}-p", "resourceVersion": str(rv),
                         "labels": {LABEL_RUN_UID: UID, "job-name": job}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "lap", "image": "x", "env": [{"name": "A", "value": "b"}]}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "lap", "state": state}]}}


@pytest.fixture
def cache() -> tuple[Cache, list[tuple[str, str]], list[tuple[str, str]]]:
    changed: list[tuple[str, str]] = []
    deleted: list[tuple[str, str]] = []
    return Cache(on_change=changed.append, on_deleted=deleted.append), changed, deleted


def test_the_event_of_the_operators_own_write_is_skipped(cache):
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(5))
    assert changed == [("ns", "r")]
    c.put("runs", run_obj(7, phase="Running"))  # the response of our status patch
    assert changed == [("ns", "r")] and c.run(("ns", "r"))["status"] == {"phase": "Running"}
    c.event("runs", "MODIFIED", run_obj(6))  # an older event still in flight: stale
    c.event("runs", "MODIFIED", run_obj(7, phase="Running"))  # the echo of our own write
    assert changed == [("ns", "r")]
    assert c.run(("ns", "r"))["metadata"]["resourceVersion"] == "7"
    c.event("runs", "MODIFIED", run_obj(8, phase="Running"))  # someone else's write
    assert changed == [("ns", "r")] * 2
    assert c.skipped == 2


def test_a_job_enqueues_its_run_only_when_its_state_changes(cache):
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(1))
    changed.clear()
    c.put("jobs", job_obj(10))  # created by the operator
    c.event("jobs", "ADDED", job_obj(10))  # its echo
    c.event("jobs", "MODIFIED", job_obj(11, active=1))  # startTime, uncountedTerminatedPods, ...
    c.event("jobs", "MODIFIED", job_obj(12, ready=1))  # its pod is ready
    assert changed == []
    c.event("jobs", "MODIFIED", job_obj(13, active=0, ready=0,
                                        conditions=[{"type": "Complete", "status": "True"}]))
    assert changed == [("ns", "r")]
    assert [j["metadata"]["name"] for j in c.jobs_of("ns", UID)] == ["r-job"]
    c.event("jobs", "DELETED", job_obj(14, active=0, conditions=[{"type": "Complete", "status": "True"}]))
    assert changed == [("ns", "r")] * 2 and c.jobs_of("ns", UID) == []


def test_a_lap_pods_exit_0_enqueues_its_run_once_and_the_jobs_complete_after_it_nothing(cache):
    """The pod watch (exited pods only): a pod's exit 0 while its Job is active ends the lap; the
    Job controller's Complete a second later is not a second reconcile, nor are the pod's later
    updates (its finalizer removed). A Job marked first enqueues once, its pod's exit then nothing."""
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(1))
    c.event("jobs", "ADDED", job_obj(10))
    changed.clear()
    c.event("pods", "ADDED", pod_obj(20, exit_code=0))
    assert changed == [("ns", "r")] and c.causes["pod exited"] == 1
    assert c.pods[("ns", "r-job-p")].get("spec") is None  # kept slimmed: status and metadata only
    c.event("pods", "MODIFIED", pod_obj(21, exit_code=0))
    c.event("jobs", "MODIFIED", job_obj(11, active=0, conditions=[{"type": "Complete", "status": "True"}]))
    assert changed == [("ns", "r")]
    # another Job: the Job controller is first this time
    c.event("jobs", "ADDED", job_obj(30, "r-job2"))
    changed.clear()
    c.event("jobs", "MODIFIED", job_obj(31, "r-job2", active=0, conditions=[{"type": "Complete", "status": "True"}]))
    c.event("pods", "ADDED", pod_obj(32, exit_code=0, job="r-job2"))
    assert changed == [("ns", "r")]
    # a relist of the exited pods drops the ones gone, not the pods the reconciler read
    c.put_pods("ns", "r-job3", [pod_obj(40, exit_code=75, job="r-job3")])
    c.replace("pods", "ns", [pod_obj(32, exit_code=0, job="r-job2")])
    assert set(c.pods) == {("ns", "r-job2-p"), ("ns", "r-job3-p")}


def test_pods_read_replace_the_jobs_and_go_with_it(cache):
    """Pods that have not exited come only from the reconciler's reads (Cache.put_pods): a read
    replaces the Job's cached pods (one gone since is dropped), enqueues nothing, and the Job's
    deletion drops them."""
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(1))
    c.event("jobs", "ADDED", job_obj(10))
    changed.clear()
    first, second = pod_obj(20, waiting=("ContainerCreating", "")), pod_obj(21)
    second["metadata"]["name"] = "r-job-q"
    c.put_pods("ns", "r-job", [first, second])
    assert [p["metadata"]["name"] for p in c.pods_of("ns", "r-job")] == ["r-job-p", "r-job-q"]
    c.put_pods("ns", "r-job", [pod_obj(22, exit_code=75)])  # r-job-q was deleted meanwhile
    assert [p["metadata"]["resourceVersion"] for p in c.pods_of("ns", "r-job")] == ["22"]
    assert changed == [] and c.events == {"runs": 1, "jobs": 1}
    c.put_pods("ns", "other-job", [pod_obj(23, job="other-job")])
    c.event("jobs", "DELETED", job_obj(11))
    assert c.pods_of("ns", "r-job") == [] and set(c.pods) == {("ns", "other-job-p")}
    assert changed == [("ns", "r")]  # the Job's deletion


def test_a_job_whose_pods_were_checked_enqueues_its_run_when_it_becomes_ready(cache):
    """Readiness is a state change only for a Job the reconciler saw not starting (its pods read
    while not ready): a missing Secret created, the pod starts, the run says so at once."""
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(1))
    c.event("jobs", "ADDED", job_obj(10, ready=0))
    c.event("jobs", "ADDED", job_obj(20, "r-job2", ready=0))
    changed.clear()
    c.pod_checked.add(("ns", "r-job"))
    c.event("jobs", "MODIFIED", job_obj(21, "r-job2", ready=1))  # not checked: its pod being ready is noise
    assert changed == []
    c.event("jobs", "MODIFIED", job_obj(11, ready=0))  # checked, still not ready
    assert changed == []
    c.event("jobs", "MODIFIED", job_obj(12, ready=1))
    assert changed == [("ns", "r")]
    c.event("jobs", "DELETED", job_obj(13, ready=1))
    assert ("ns", "r-job") not in c.pod_checked


def test_a_relist_reconciles_every_run_and_reports_the_ones_deleted_meanwhile(cache):
    c, changed, deleted = cache
    c.replace("runs", "ns", [run_obj(1)])
    other = run_obj(2)
    other["metadata"].update(name="gone", uid="u2")
    c.event("runs", "ADDED", other)
    changed.clear()
    c.replace("runs", "ns", [run_obj(1)])  # after a 410: "gone" was deleted while not watched
    assert deleted == [("ns", "gone")] and changed == [("ns", "r")]
    assert set(c.runs) == {("ns", "r")}


def test_a_job_that_leaves_the_cache_is_dropped_from_the_controllers_job_memo():
    """The controller's JobMemo holds the cached Job dicts: a Job deleted (a watch event) or not
    listed again (a relist after a 410) is forgotten, not kept for the life of the process."""
    from agentrun.controller.memos import JobMemo

    memo = JobMemo()
    c = Cache(on_change=lambda key: None, on_job_gone=memo.forget)
    done = [{"type": "Complete", "status": "True"}]
    c.event("jobs", "ADDED", job_obj(10, active=0, conditions=done))
    assert memo.observed(c.jobs[("ns", "r-job")]) is not None and len(memo) == 1
    c.event("jobs", "DELETED", job_obj(11, active=0, conditions=done))
    assert len(memo) == 0
    c.event("jobs", "ADDED", job_obj(12, active=0, conditions=done))
    memo.observed(c.jobs[("ns", "r-job")])
    c.replace("jobs", "ns", [])  # a relist that no longer has it
    assert len(memo) == 0 and c.jobs == {}


# ------------------------------------------------------------------------------- request counter


@pytest.mark.parametrize("method,url,labels", [
    ("GET", "https://h:6443/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r", ("get", "agentruns")),
    ("GET", "https://h/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns?labelSelector=x", ("list", "agentruns")),
    ("GET", "https://h/apis/agentrun.dev/v1alpha1/agentruns?watch=true&resourceVersion=5", ("watch", "agentruns")),
    ("PATCH", "https://h/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r/status", ("patch", "agentruns/status")),
    ("POST", "https://h/apis/batch/v1/namespaces/ns/jobs", ("create", "jobs")),
    ("DELETE", "https://h/apis/batch/v1/namespaces/ns/jobs/j", ("delete", "jobs")),
    ("GET", "https://h/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dj", ("list", "pods")),
    ("GET", "https://h/api/v1/pods?watch=true", ("watch", "pods")),
    ("POST", "https://h/api/v1/namespaces/ns/events", ("create", "events")),
    ("GET", "https://h/apis/coordination.k8s.io/v1/namespaces/sys/leases/op", ("get", "leases")),
    ("PUT", "https://h/apis/coordination.k8s.io/v1/namespaces/sys/leases/op", ("update", "leases")),
    ("GET", "https://h/api/v1/namespaces/ns", ("get", "namespaces")),
])
def test_request_labels(method, url, labels):
    assert request_labels(method, url) == labels


def test_the_operator_registry_exports_the_request_counter():
    from agentrun import metrics

    metrics.kube_request("patch", "agentruns/status", 200)
    assert metrics.REGISTRY.get_sample_value(
        "agentrun_kube_requests_total", {"verb": "patch", "resource": "agentruns/status", "code": "200"}) >= 1
    metrics.kube_request("frob", "secrets", 200)  # outside the bounded sets: "other"
    assert metrics.REGISTRY.get_sample_value(
        "agentrun_kube_requests_total", {"verb": "other", "resource": "other", "code": "200"}) >= 1


def test_the_echo_of_an_own_write_arriving_before_its_response_is_skipped(cache):
    c, changed, _ = cache
    c.event("runs", "ADDED", run_obj(5))
    changed.clear()
    key = ("ns", "r")
    # the status patch: its watch event comes back before the HTTP response
    c.begin_write("runs", key)
    c.event("runs", "MODIFIED", run_obj(6, phase="Running"))
    assert changed == [] and c.run(key)["metadata"]["resourceVersion"] == "6"
    c.end_write("runs", key, run_obj(6, phase="Running"))
    assert changed == []
    # the Job create: same, for a Job the cache did not hold
    c.begin_write("jobs", ("ns", "r-job"))
    c.event("jobs", "ADDED", job_obj(7))
    c.end_write("jobs", ("ns", "r-job"), job_obj(7))
    assert changed == [] and [j["metadata"]["name"] for j in c.jobs_of("ns", UID)] == ["r-job"]
    # someone else's write lands while ours is in flight: it enqueues, once ours ended
    c.begin_write("runs", key)
    c.event("runs", "MODIFIED", run_obj(8, phase="Running"))  # our echo
    c.event("runs", "MODIFIED", run_obj(9, phase="Running"))  # theirs, after ours
    assert changed == []
    c.end_write("runs", key, run_obj(8, phase="Running"))
    assert changed == [key] and c.run(key)["metadata"]["resourceVersion"] == "9"
    # a failed write: every held event notifies
    changed.clear()
    c.begin_write("runs", key)
    c.event("runs", "MODIFIED", run_obj(10))
    c.end_write("runs", key, None)
    assert changed == [key]


# -------------------------------------------------------------------------------------- informer


class _FakeKube:
    """Lists and watch streams scripted per call (an exception in either is raised); records the
    queries. The client's calls, on the loop."""

    def __init__(self, lists: list[Any], streams: list[Any]) -> None:
        self.lists, self.streams, self.queries = lists, streams, []

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        self.queries.append(("list", kw.get("query", {}).get("resourceVersion")))
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def stream(self, path_: str, query: dict[str, Any], timeout: Any) -> Any:
        self.queries.append(("watch", query.get("resourceVersion")))
        item = self.streams.pop(0) if self.streams else None
        if item is None:
            await asyncio.Event().wait()  # the last watch: idle until the informer's task is cancelled
        if isinstance(item, Exception):
            raise item
        for ev in item:
            yield ev


_ScriptedKube = _FakeKube


def test_the_informer_lists_watches_resumes_and_relists_after_410():
    from agentrun.controller.cache import RUNS
    from agentrun.kube.informer import Informer

    def listed(rv: int, *objs: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": str(rv)}, "items": list(objs)}

    other = run_obj(3)
    other["metadata"].update(name="other", uid="u2")
    kube = _FakeKube(
        lists=[listed(5, run_obj(4), other), listed(20, run_obj(12, phase="Running"))],
        streams=[
            [{"type": "MODIFIED", "object": run_obj(6)}, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
            OSError("connection reset"),  # resumes from the last version seen (the bookmark's)
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],  # expired: list again
        ],
    )

    async def main() -> tuple[Cache, list[tuple[str, str]], list[tuple[str, str]]]:
        changed: list[tuple[str, str]] = []
        deleted: list[tuple[str, str]] = []
        c = Cache(on_change=changed.append, on_deleted=deleted.append)
        inf = Informer(kube, "runs", "ns", None, c, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=RUNS)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        # wait for the conditions asserted below (the second list applied, and the watch after it
        # begun: CI once stopped the informer in between), not for a time
        for _ in range(3000):
            if deleted and len(kube.queries) >= 6:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        await inf.stopped()
        return c, changed, deleted

    c, changed, deleted = asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("watch", "9"), ("watch", "9"), ("list", None),
                            ("watch", "20")]
    assert deleted == [("ns", "other")]  # gone while the watch was expired
    assert c.run(("ns", "r"))["status"] == {"phase": "Running"}
    assert changed.count(("ns", "r")) == 3  # listed, modified, listed again with a change


def test_an_optional_informer_refused_by_rbac_tells_its_sink_and_counts_as_synced():
    from kubernetes.client.rest import ApiException

    from agentrun.controller.tenancy import BINDINGS, PolicyStore
    from agentrun.kube.informer import Informer

    class Refusing(_FakeKube):
        async def request(self, method: str, path_: str, **kw: Any) -> Any:
            self.queries.append(("list", path_))
            raise ApiException(status=403, reason="Forbidden")

    kube = Refusing([], [])

    async def main() -> PolicyStore:
        store = PolicyStore()
        inf = Informer(kube, "bindings", None, None, store, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=BINDINGS, optional=True)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # the refusal is delivered with (not after) the synced flag: wait for it
            if store.refusals:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        return store

    store = asyncio.run(main())
    assert store.refusals == {"bindings": 403}
    assert kube.queries == [("list", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings")]
    assert store.check("ns", {}) is None


# ------------------------------------------------------------------------- approvals (the notifier's feed)


def awaiting(rv: int, call: str = "c1", state: str = "Pending") -> dict[str, Any]:
    return run_obj(rv, phase="AwaitingApproval", approval={"state": state, "callId": call})


def test_the_cache_keeps_the_runs_waiting_on_an_approval_and_wakes_on_each_new_one():
    woken: list[tuple[str, str]] = []
    c = Cache(on_change=lambda k: None, on_awaiting=woken.append)
    key = ("ns", "r")
    c.event("runs", "ADDED", run_obj(1, phase="Running"))
    assert c.notifiable_runs() == [] and woken == []
    c.put("runs", awaiting(2))  # the operator's own status write moves it to AwaitingApproval
    assert woken == [key] and [r["metadata"]["resourceVersion"] for r in c.notifiable_runs()] == ["2"]
    c.event("runs", "MODIFIED", awaiting(3))  # the same approval again (e.g. notified recorded): no wake-up
    assert woken == [key]
    c.event("runs", "MODIFIED", awaiting(4, call="c2"))  # the next call's approval
    assert woken == [key, key]
    c.event("runs", "MODIFIED", awaiting(5, call="c2", state="Approved"))
    assert c.notifiable_runs() == [] and c.awaiting == {}
    c.event("runs", "MODIFIED", awaiting(6, call="c3"))
    c.event("runs", "DELETED", awaiting(6, call="c3"))
    assert c.awaiting == {} and len(woken) == 3


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


def test_an_optional_informer_that_listed_keeps_its_state_when_a_later_watch_is_refused():
    from kubernetes.client.rest import ApiException

    from agentrun.controller.tenancy import POLICIES, PolicyStore
    from agentrun.kube.informer import Informer

    pol = {"metadata": {"name": "p", "resourceVersion": "4"}, "spec": {}}
    kube = _ScriptedKube(lists=[{"metadata": {"resourceVersion": "5"}, "items": [pol]},
                                ApiException(status=403, reason="Forbidden")],
                         streams=[ApiException(status=403, reason="Forbidden")])

    async def main() -> PolicyStore:
        store = PolicyStore()
        inf = Informer(kube, "policies", None, None, store, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=POLICIES, optional=True)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # until it tried to list again after the refused watch (backoff 1 s)
            if len(kube.queries) >= 3:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        return store

    store = asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("list", None)]  # refused after it listed: list again
    assert store.refusals == {} and list(store.policies) == ["p"]


def test_the_cache_keeps_of_a_job_what_observe_reads():
    """slim_job: a Job as the API server returns it (pod template, managedFields) is kept as its
    read metadata, status and container environment; observe sees the same Job from it."""
    import copy

    from controller_world import UID as RUN_UID
    from controller_world import make_spec

    from agentrun.controller.cache import slim_job
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.decide.jobs import RunIdentity, build_job
    from agentrun.controller.decide.observe import observed_job

    cfg = OperatorConfig(checkpoint_uri="s3://bucket/prefix", s3_endpoint="http://127.0.0.1:9000")
    job = build_job(RunIdentity("ns", "run", RUN_UID), make_spec(), 2, 1, "v7", cfg)
    job["metadata"].update(namespace="ns", uid="j1", resourceVersion="41", creationTimestamp="2030-01-01T00:00:00Z",
                           managedFields=[{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}}])
    job["status"] = {"active": 1, "ready": 1, "startTime": "2030-01-01T00:00:01Z"}
    full = copy.deepcopy(job)
    slim = slim_job(job)
    assert job == full  # the original is not changed
    assert "managedFields" not in slim["metadata"] and len(json.dumps(slim)) < 0.6 * len(json.dumps(full))
    assert observed_job(slim, []) == observed_job(full, []) is not None
    assert observed_job(slim, []).store is not None  # type: ignore[union-attr]
    # a Job for Kueue: suspended with the queue label, as observe sees it from the cache too
    held = build_job(RunIdentity("ns", "run", RUN_UID), make_spec(), 2, 1, "v7", cfg, queue_name="lq")
    held["metadata"].update(namespace="ns", uid="j2", resourceVersion="42")
    seen = observed_job(slim_job(held), [])
    assert seen == observed_job(held, []) and seen is not None and seen.suspended and seen.queue_name == "lq"
    c = Cache(on_change=lambda k: None)
    c.put("jobs", full)
    assert c.jobs[("ns", job["metadata"]["name"])] == slim
    assert [j["metadata"]["name"] for j in c.jobs_of("ns", RUN_UID)] == [job["metadata"]["name"]]


def test_an_informer_refused_after_it_listed_says_since_when_and_lists_again():
    """RBAC taken away after the cache listed: a 403 on the watch marks the informer refused (the
    controller steps down after REFUSED_STEP_DOWN_SECONDS) and it lists again, and only a list
    that goes through clears the mark (a watch could resume on a stale version)."""
    from kubernetes.client.rest import ApiException

    from agentrun.controller.cache import RUNS
    from agentrun.kube.informer import Informer

    listed = {"metadata": {"resourceVersion": "5"}, "items": [run_obj(4)]}
    relisted = {**listed, "metadata": {"resourceVersion": "7"}}
    kube = _ScriptedKube(lists=[listed, ApiException(status=403, reason="Forbidden"), relisted],
                         streams=[ApiException(status=403, reason="Forbidden")])
    marks: list[float | None] = []

    async def main() -> None:
        c = Cache(on_change=lambda k: None)
        inf = Informer(kube, "runs", "ns", None, c, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=RUNS)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # until the refused watch marked it
            if inf.refused_since is not None:
                break
            await asyncio.sleep(0.01)
        marks.append(inf.refused_since)
        for _ in range(3000):  # until it listed again and watches from the new version
            if ("watch", "7") in kube.queries:
                break
            await asyncio.sleep(0.01)
        marks.append(inf.refused_since)
        inf.stop()
        await inf.stopped()

    asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("list", None), ("list", None), ("watch", "7")]
    assert marks[0] is not None and marks[1] is None


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


def test_a_slot_freed_wakes_the_waiting_runs_of_its_namespace_even_on_an_own_write(cache):
    """decide/queue.py: the cache keeps, per namespace, the runs holding a slot and the waiting ones;
    a run that finishes (here through the operator's own write, which enqueues nothing else) enqueues
    the waiting runs of its namespace, not of others."""
    c, changed, _ = cache
    c.limited = lambda namespace: namespace == "ns"

    def obj(ns: str, name: str, rv: int, **status: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name, "uid": f"{ns}-{name}", "resourceVersion": str(rv)},
                "spec": {}, "status": status}

    c.event("runs", "ADDED", obj("ns", "active", 1, phase="Running", activeJob={"name": "j"}))
    c.event("runs", "ADDED", obj("ns", "w1", 2, phase="Queued"))
    c.event("runs", "ADDED", obj("ns", "w2", 3))
    c.event("runs", "ADDED", obj("other", "w3", 4, phase="Queued"))
    assert len(c.holding_groups("ns", NOG)) == 1 and sorted(o[2] for o, _ in c.waiting_groups("ns", NOG)) == ["w1", "w2"]
    changed.clear()
    c.put("runs", obj("ns", "active", 5, phase="Succeeded", lap=2))
    assert sorted(changed) == [("ns", "w1"), ("ns", "w2")] and len(c.holding_groups("ns", NOG)) == 0
    changed.clear()
    c.event("runs", "MODIFIED", obj("ns", "w1", 6, phase="Running", activeJob={"name": "j1"}))
    # w1 admitted: w2, behind it, moves up a place (its status.queue changes)
    assert sorted(changed) == [("ns", "w1"), ("ns", "w2")] and len(c.holding_groups("ns", NOG)) == 1
    assert len(c.waiting_groups("ns", NOG)) == 1
    changed.clear()
    c.event("runs", "ADDED", obj("ns", "w0", 8, phase="Queued") | {"spec": {"priority": 5}})
    assert sorted(changed) == [("ns", "w0"), ("ns", "w2")]  # w2 moves back behind the new w0
    changed.clear()
    c.event("runs", "ADDED", obj("other", "w9", 9))  # no limit there: only itself
    assert changed == [("other", "w9")]
    changed.clear()
    c.event("runs", "DELETED", obj("ns", "w1", 7, phase="Running", activeJob={"name": "j1"}))
    assert sorted(changed) == [("ns", "w0"), ("ns", "w2")] and len(c.holding_groups("ns", NOG)) == 0


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
