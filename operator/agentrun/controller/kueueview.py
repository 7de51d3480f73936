"""The Workload Kueue made of a held lap Job, read for ``status.kueue`` (``decide/kueue.py``).

Workloads are not watched: only a run whose Job Kueue holds needs one, and only its name and
Kueue's reason for the wait. The Workload is found by the label Kueue puts on it (the Job's uid:
``agentrun.api.kueue.JOB_UID_LABEL``), one LIST per held Job, repeated at most every
``refresh`` seconds (``missing_refresh`` while Kueue has not made it yet) however often the run is
reconciled. A cluster without Kueue answers 404, an operator without the RBAC 403: the run says
so, and nothing else changes (the Job stays suspended until someone admits it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentrun.api.kueue import ADMITTED_CONDITION, JOB_UID_LABEL, QUOTA_RESERVED_CONDITION, workloads_path

from .decide import WorkloadRead
from .memos import put_bounded

List = Callable[[str, dict[str, str]], Awaitable[Any]]
MAX_MEMO = 10_000


def wait_reason(workload: Mapping[str, Any]) -> str | None:
    """Kueue's reason for holding ``workload``: the message of its QuotaReserved condition while
    that is not True, else of its Admitted condition (admission checks pending)."""
    conditions = {c.get("type"): c for c in ((workload.get("status") or {}).get("conditions") or [])
                  if isinstance(c, dict)}
    for kind in (QUOTA_RESERVED_CONDITION, ADMITTED_CONDITION):
        cond = conditions.get(kind)
        if cond is not None and cond.get("status") != "True":
            return str(cond.get("message") or cond.get("reason") or "") or None
    return None


def workload_of(job: str, doc: Any) -> WorkloadRead:
    """The Workload in ``doc`` (a WorkloadList) for ``job``, or ``missing``."""
    items = [i for i in ((doc or {}).get("items") or []) if isinstance(i, dict)]
    if not items:
        return WorkloadRead(job=job, kind="missing")
    items.sort(key=lambda i: str((i.get("metadata") or {}).get("creationTimestamp") or ""))
    wl = items[-1]
    return WorkloadRead(job=job, kind="ok", name=str((wl.get("metadata") or {}).get("name") or ""),
                        message=wait_reason(wl))


def failure(job: str, status: int | None) -> WorkloadRead:
    """The read failed with HTTP ``status``."""
    if status == 404:
        why = "the API server does not serve kueue.x-k8s.io Workloads (is Kueue installed?)"
    elif status == 403:
        why = "the operator may not list Workloads (its ClusterRole needs list on workloads.kueue.x-k8s.io)"
    else:
        why = f"the API server answered {status}"
    return WorkloadRead(job=job, kind="unavailable", message=why)


class WorkloadView:
    """Reads and remembers the Workload of each held Job (see the module docstring)."""

    def __init__(self, list_: List, clock: Callable[[], float], refresh: float = 55.0,
                 missing_refresh: float = 4.0) -> None:
        self.list, self.clock = list_, clock
        self.refresh, self.missing_refresh = refresh, missing_refresh
        self._memo: dict[tuple[str, str], tuple[float, WorkloadRead]] = {}
        self.requests = 0

    async def read(self, namespace: str, job: str, job_uid: str) -> WorkloadRead:
        """The Workload of Job ``job`` (uid ``job_uid``), read again once the last read is old."""
        from kubernetes.client.exceptions import ApiException

        key = (namespace, job_uid)
        now = self.clock()
        hit = self._memo.get(key)
        if hit is not None:
            at, got = hit
            if now - at < (self.refresh if got.kind != "missing" else self.missing_refresh):
                return got
        self.requests += 1
        try:
            got = workload_of(job, await self.list(workloads_path(namespace),
                                                   {"labelSelector": f"{JOB_UID_LABEL}={job_uid}"}))
        except ApiException as exc:
            got = failure(job, exc.status)
        put_bounded(self._memo, key, (now, got), MAX_MEMO)
        return got

    def forget(self, namespace: str, job_uid: str) -> None:
        """The Job is no longer held: its Workload is not needed any more."""
        self._memo.pop((namespace, job_uid), None)
