"""The objects the run cache (``agentrun.controller.cache``) holds, as the API server hands them over:
a run, its lap Job, a pod of it, a run waiting on an approval. Shared by test_cache.py,
test_reconciler.py and tests/kube/test_informer.py (tests/kube/conftest.py puts this folder on the path)."""

from __future__ import annotations

from typing import Any

from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID

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


def awaiting(rv: int, call: str = "c1", state: str = "Pending") -> dict[str, Any]:
    return run_obj(rv, phase="AwaitingApproval", approval={"state": state, "callId": call})
