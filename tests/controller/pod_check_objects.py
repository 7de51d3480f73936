"""A lap Job that is not ready and a pod stuck on its configuration, made ``age`` seconds ago: the
objects of the pod checks (``pod_check_due`` in decide/observe.py, the reconciler's timers). Shared by
test_decide_observe.py and test_reconciler.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller_world import UID

from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID, job_name

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
