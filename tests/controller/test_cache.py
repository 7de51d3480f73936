"""The run cache (``agentrun.controller.cache``): own writes and stale events skipped, Jobs and pods
enqueue their run only on a state change, relists, the Job slimmed to what observe reads, the runs
waiting on an approval (the notifier's feed) and on a slot (decide/queue.py). No cluster, no sleeps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cache_objects import UID, awaiting, job_obj, pod_obj, run_obj

from agentrun.controller.cache import Cache
from agentrun.controller.decide.queue import NO_GROUP


def NOG(run):  # noqa: N802 - no per-group limit: every run in no group
    return NO_GROUP


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
