"""Pod reads of several Jobs of one namespace, gathered into one LIST.

Of the pods only those that exited 0 are watched (``cache``): the pod checks of active Jobs that
stay not ready read their pods on timers. With many runs those timers come due together (the reconciler puts them on a
5-second grid), and each read was one request. :class:`PodReads` sends the reads asked for
within ``window`` seconds in one namespace as one request with a set-based label selector
(``job-name in (a,b,...)``, at most ``max_jobs`` names), then hands each caller its Job's pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: The label the Job controller puts on a Job's pods (and the legacy one, set alongside it).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
Pods = list[dict[str, Any]]


def selector(jobs: list[str]) -> str:
    """The label selector of the pods of ``jobs``."""
    return f"job-name in ({','.join(sorted(jobs))})" if len(jobs) > 1 else f"job-name={jobs[0]}"


def by_job(pods: Pods, jobs: list[str]) -> dict[str, Pods]:
    """``pods`` per Job of ``jobs`` (every one of them, [] when it has none)."""
    out: dict[str, Pods] = {job: [] for job in jobs}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k) in out), None)
        if job is not None:
            out[job].append(pod)
    return out


@dataclass
class _Batch:
    done: asyncio.Future[dict[str, Pods]]
    jobs: list[str] = field(default_factory=list)
    sent: bool = False


class PodReads:
    """Gathers pod reads per namespace (see the module docstring). ``fetch(namespace, selector)``
    lists the pods; an error of it is every caller's of that batch."""

    def __init__(self, fetch: Callable[[str, str], Awaitable[Pods]], window: float = 0.2, max_jobs: int = 50) -> None:
        self.fetch, self.window, self.max_jobs = fetch, window, max_jobs
        self._open: dict[str, _Batch] = {}
        self.requests = 0  # LISTs sent (for tests and logs)

    async def read(self, namespace: str, job: str) -> Pods:
        """The pods of Job ``job`` in ``namespace``, read in the batch open for that namespace."""
        loop = asyncio.get_running_loop()
        batch = self._open.get(namespace)
        if batch is None:
            done = loop.create_future()
            # its error is its callers'; when they all went (cancelled), it is not logged as lost
            done.add_done_callback(lambda f: None if f.cancelled() else f.exception())
            batch = self._open[namespace] = _Batch(done)
            loop.call_later(self.window, self._send, namespace, batch)
        if job not in batch.jobs:
            batch.jobs.append(job)
        if len(batch.jobs) >= self.max_jobs:
            self._send(namespace, batch)
        return (await asyncio.shield(batch.done)).get(job, [])

    def _send(self, namespace: str, batch: _Batch) -> None:
        if self._open.get(namespace) is batch:
            del self._open[namespace]
        if batch.sent:
            return
        batch.sent = True
        asyncio.ensure_future(self._list(namespace, batch))

    async def _list(self, namespace: str, batch: _Batch) -> None:
        self.requests += 1
        try:
            pods = await self.fetch(namespace, selector(batch.jobs))
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it
            if not batch.done.done():
                batch.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not batch.done.done():
            batch.done.set_result(by_job(pods, batch.jobs))
