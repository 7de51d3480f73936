"""Kueue (decide/kueue.py, decide/jobs.py, controller/kueueview.py): lap Jobs created suspended in a
LocalQueue, the run Queued while Kueue holds them with the Workload in status, the lap's time counted
from admission, and the Workload read bounded."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from controller_world import T0, UID, World, make_spec

from agentrun.api.kueue import JOB_UID_LABEL, QUEUE_NAME_LABEL
from agentrun.api.reasons import Reason
from agentrun.api.spec import CancelSpec
from agentrun.controller import decide as d
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import RunIdentity, build_job
from agentrun.controller.decide.kueue import HELD_RECHECK_SECONDS, WORKLOAD_MISSING_RECHECK_SECONDS
from agentrun.controller.decide.observe import pod_check_due
from agentrun.controller.kueueview import WorkloadView, failure, wait_reason, workload_of


def requeues(dec: d.Decision) -> list[float]:
    return [a.seconds for a in dec.of(d.RequeueAfter)]


def test_a_run_with_a_queue_name_submits_each_lap_job_suspended_and_waits_queued() -> None:
    w = World(make_spec(queueName="lq"))
    dec = w.reconcile()
    [create] = dec.of(d.CreateJob)
    assert create.queue_name == "lq"
    assert w.status.phase == "Queued" and w.status.kueue is not None
    assert (w.status.kueue.local_queue, w.status.kueue.job, w.status.kueue.workload) == ("lq", create.name, None)
    progressing = next(c for c in w.status.conditions if c.type == "Progressing")
    assert progressing.reason == Reason.KUEUE_QUEUED and "LocalQueue lq" in (w.status.message or "")
    assert WORKLOAD_MISSING_RECHECK_SECONDS in requeues(dec)
    assert w.events == []  # a hold per lap is in the status, not an Event per lap
    # the Workload found: named in status with Kueue's reason, bounded to one line
    w.workload = d.WorkloadRead(job=create.name, kind="ok", name="job-x-1a2b3",
                                message="couldn't assign flavors to pod set main: insufficient unused quota\n" + "x" * 900)
    dec = w.reconcile()
    assert w.status.kueue is not None and w.status.kueue.workload == "job-x-1a2b3"
    assert "insufficient unused quota" in (w.status.message or "") and "\n" not in (w.status.message or "")
    assert len(w.status.message or "") < 600
    assert requeues(dec) == [HELD_RECHECK_SECONDS] and not dec.of(d.CreateJob)
    # unchanged: nothing to write
    again = w.reconcile()
    assert again.of(d.PatchStatus) == [] and again.of(d.CreateJob) == []


def test_admission_starts_the_lap_clock_and_clears_the_hold() -> None:
    w = World(make_spec(queueName="lq"))
    w.reconcile()
    w.now = T0 + timedelta(minutes=30)  # 30 minutes in Kueue's queue
    w.kueue_admits(at=w.now)
    w.reconcile()
    assert w.status.phase == "Running" and w.status.kueue is None
    assert w.status.active_job is not None and w.status.active_job.started_at == w.now
    w.now += timedelta(seconds=5)
    w.fail_job(75)  # a failed attempt's duration is counted by the operator: from admission
    dec = w.reconcile()
    [lap_done] = [a for a in dec.actions if isinstance(a, d.LapFinished)]
    assert lap_done.duration_seconds == 5.0
    w.now += timedelta(seconds=10)  # the backoff
    w.reconcile()
    w.kueue_admits()
    w.reconcile()
    w.finish_job("continue")
    dec = w.reconcile()
    [create] = dec.of(d.CreateJob)
    assert (create.lap, create.queue_name) == (2, "lq") and w.status.phase == "Queued"


def test_an_evicted_job_is_queued_again_and_the_same_attempt_goes_on() -> None:
    w = World(make_spec(queueName="lq"))
    w.reconcile()
    w.kueue_admits()
    w.reconcile()
    name = w.active().name
    w.kueue_evicts()
    dec = w.reconcile()
    assert w.status.phase == "Queued" and w.status.kueue is not None and w.status.kueue.job == name
    assert not dec.of(d.CreateJob) and not dec.of(d.DeleteJob) and w.created == [(1, 1)]


def test_the_policy_default_applies_only_without_spec_queue_name() -> None:
    w = World(make_spec(), default_queue_name="team-q")
    [create] = w.reconcile().of(d.CreateJob)
    assert create.queue_name == "team-q"
    w = World(make_spec(queueName="mine"), default_queue_name="team-q")
    [create] = w.reconcile().of(d.CreateJob)
    assert create.queue_name == "mine"
    w = World(make_spec())
    [create] = w.reconcile().of(d.CreateJob)
    assert create.queue_name is None and w.status.phase == "Running" and w.status.kueue is None


def test_a_held_run_can_be_cancelled_and_the_hold_goes_with_it() -> None:
    w = World(make_spec(queueName="lq"))
    w.reconcile()
    name = w.active().name
    w.spec = w.spec.model_copy(update={"cancel": CancelSpec(reason="not needed")})
    dec = w.reconcile()
    assert w.status.phase == "Cancelled" and w.status.kueue is None
    assert name in [a.name for a in dec.of(d.DeleteJob)]


def test_kueue_not_installed_or_not_readable_says_so_and_looks_less_often() -> None:
    w = World(make_spec(queueName="lq"))
    [create] = w.reconcile().of(d.CreateJob)
    w.workload = failure(create.name, 404)
    dec = w.reconcile()
    assert "is Kueue installed?" in (w.status.message or "") and requeues(dec) == [HELD_RECHECK_SECONDS]
    # never made after a minute: looked at every minute, not every few seconds
    w.workload = d.WorkloadRead(job=create.name, kind="missing")
    w.now = T0 + timedelta(minutes=2)
    dec = w.reconcile()
    assert requeues(dec) == [HELD_RECHECK_SECONDS] and w.status.phase == "Queued"


def test_the_job_is_suspended_with_the_queue_label_only_with_a_queue() -> None:
    run, spec, cfg = RunIdentity("ns", "run", UID), make_spec(), OperatorConfig(checkpoint_uri="s3://bucket/runs")
    job = build_job(run, spec, 1, 1, "v1", cfg, queue_name="lq")
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_NAME_LABEL] == "lq"
    assert QUEUE_NAME_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    plain = build_job(run, spec, 1, 1, "v1", cfg)
    assert "suspend" not in plain["spec"] and QUEUE_NAME_LABEL not in plain["metadata"]["labels"]
    # a suspended Job has no pod to check; an admitted one is checked from its start, not its creation
    now = T0 + timedelta(hours=1)
    created = {"metadata": {"creationTimestamp": T0.isoformat()}, "spec": {"suspend": True}, "status": {}}
    assert pod_check_due(created, now, 30.0) is None
    admitted = {"metadata": {"creationTimestamp": T0.isoformat()}, "spec": {"suspend": False},
                "status": {"startTime": (now - timedelta(seconds=10)).isoformat()}}
    assert pod_check_due(admitted, now, 30.0) == 20.0


def workload(name: str, created: str, **conds: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "status": {"conditions": [{"type": t, "status": s, "message": m} for t, (s, m) in conds.items()]}}


def test_the_workload_and_kueues_reason_from_a_list() -> None:
    assert workload_of("j", {"items": []}) == d.WorkloadRead(job="j", kind="missing")
    doc = {"items": [workload("old", "2030-01-01T00:00:00Z"),
                     workload("new", "2030-01-01T00:00:05Z", QuotaReserved=("False", "insufficient quota"))]}
    got = workload_of("j", doc)
    assert (got.kind, got.name, got.message) == ("ok", "new", "insufficient quota")
    assert wait_reason(workload("w", "t", QuotaReserved=("True", "ok"), Admitted=("False", "checks pending"))) \
        == "checks pending"
    assert wait_reason(workload("w", "t", QuotaReserved=("True", "ok"), Admitted=("True", "ok"))) is None
    assert failure("j", 403).kind == "unavailable" and "list on workloads" in (failure("j", 403).message or "")


def test_the_view_lists_by_the_job_uid_and_reads_again_only_when_old() -> None:
    calls: list[tuple[str, dict[str, str]]] = []
    clock = [100.0]

    async def list_(path: str, query: dict[str, str]) -> Any:
        calls.append((path, query))
        return {"items": [workload("wl", "t")]} if len(calls) > 1 else {"items": []}

    view = WorkloadView(list_, lambda: clock[0], refresh=55.0, missing_refresh=4.0)

    async def go() -> list[d.WorkloadRead]:
        out = [await view.read("ns", "job-a", "u1")]   # missing (Kueue has not made it)
        out.append(await view.read("ns", "job-a", "u1"))  # memo: no request
        clock[0] += 5
        out.append(await view.read("ns", "job-a", "u1"))  # missing is read again after 4 s: found
        clock[0] += 30
        out.append(await view.read("ns", "job-a", "u1"))  # found: not read again before 55 s
        return out

    reads = asyncio.run(go())
    assert [r.kind for r in reads] == ["missing", "missing", "ok", "ok"]
    assert len(calls) == 2 and view.requests == 2
    assert calls[0] == ("/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads", {"labelSelector": f"{JOB_UID_LABEL}=u1"})


def test_a_job_suspended_without_a_queue_label_is_held_too() -> None:
    """Kueue with manageJobsWithoutQueueName suspends every Job at creation: the run says it is held
    and starts no second Job, even though agentrun gave it no LocalQueue."""
    w = World(make_spec())
    w.reconcile()
    j = w.active()
    w.jobs[j.name] = dataclasses.replace(j, suspended=True)
    dec = w.reconcile()
    assert w.status.phase == "Queued" and w.status.kueue is not None and w.status.kueue.local_queue is None
    assert "no queue label" in (w.status.message or "") and not dec.of(d.CreateJob)
    w.kueue_admits()
    w.reconcile()
    assert w.status.phase == "Running" and w.status.kueue is None


def test_a_run_kueue_holds_is_not_admitted_by_the_concurrency_queue() -> None:
    """A Kueue hold is phase Queued without status.queue: the concurrency queue's admission (an
    Admitted Event, phase Pending) is not for it."""
    w = World(make_spec(queueName="lq"))
    w.reconcile()
    for _ in range(3):
        w.now += timedelta(seconds=5)
        dec = w.reconcile()
        assert dec.of(d.PatchStatus) == [] and w.status.phase == "Queued"
    assert Reason.ADMITTED not in w.reasons()
