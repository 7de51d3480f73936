"""Prometheus metrics of the agentrun operator.

The controller calls these module-level functions; they act on one process-wide
:class:`~agentrun.metrics.core.OperatorMetrics` (``metrics.DEFAULT``) with its own
``CollectorRegistry`` (``metrics.REGISTRY``). Tests build their own ``OperatorMetrics``.

    from agentrun import metrics
    metrics.observe_run(namespace, name, spec, status)   # after every status change (and on resume)
    metrics.forget_run(namespace, name)                  # on delete
    metrics.lap_finished(namespace, name, outcome, duration_seconds)
    metrics.lap_retried(namespace, name, reason)
    metrics.reconcile_finished(result, duration_seconds) # result: success|error|requeue
    metrics.kube_request(verb, resource, code)           # every API server request (metrics/kube.py)
    metrics.informer_synced(resource, synced, informer)  # the watch cache listed (metrics/kube.py)
    metrics.event_suppressed(reason)                     # a routine Event not posted (metrics/kube.py)
    metrics.start_server(port, addr="0.0.0.0")           # /metrics, /readyz

None of them raises on odd input: a metrics problem never breaks a reconcile.
Every metric is described in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import disable_created_metrics

from .core import (
    LAP_OUTCOMES,
    PHASES,
    RECONCILE_RESULTS,
    RETRY_REASONS,
    OperatorMetrics,
    RunStateCollector,
    RunView,
    normalize_label,
)
from .kube import EventMetrics, InformerMetrics, KubeRequestMetrics
from .server import HealthCheck, serve
from .workqueue import WorkQueueMetrics

__all__ = [
    "DEFAULT",
    "LAP_OUTCOMES",
    "PHASES",
    "RECONCILE_RESULTS",
    "REGISTRY",
    "RETRY_REASONS",
    "OperatorMetrics",
    "RunStateCollector",
    "RunView",
    "WORKQUEUE",
    "WorkQueueMetrics",
    "clear_runs",
    "event_suppressed",
    "forget_run",
    "informer_synced",
    "kube_request",
    "lap_finished",
    "lap_retried",
    "normalize_label",
    "observe_run",
    "reconcile_finished",
    "set_readiness_check",
    "start_server",
]

# The ``*_created`` series double the exposition for no use in our dashboards and alerts.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated

DEFAULT = OperatorMetrics()
REGISTRY = DEFAULT.registry
KUBE = KubeRequestMetrics(REGISTRY)
INFORMERS = InformerMetrics(REGISTRY)
EVENTS = EventMetrics(REGISTRY)
WORKQUEUE = WorkQueueMetrics(REGISTRY)
_checks: dict[str, HealthCheck] = {}


def observe_run(namespace: str, name: str, spec: Mapping[str, Any] | None, status: Mapping[str, Any] | None) -> None:
    """Record the latest spec and status (camelCase dicts) of a run. Call after every status
    change, and for every run when the operator starts (resume), terminal ones included."""
    DEFAULT.observe_run(namespace, name, spec, status)


def forget_run(namespace: str, name: str) -> None:
    """The run was deleted: drop its series."""
    DEFAULT.forget_run(namespace, name)


def clear_runs() -> None:
    """Forget every run, e.g. when this replica stops being the active one (peering freeze)."""
    DEFAULT.clear_runs()


def lap_finished(namespace: str, name: str, outcome: str, duration_seconds: float,
                 checkpoint_bytes: int | None = None) -> None:
    """A lap attempt ended. ``outcome``: one of ``LAP_OUTCOMES`` (others count as ``other``);
    ``checkpoint_bytes``: stored bytes the lap added, when known."""
    DEFAULT.lap_finished(namespace, name, outcome, duration_seconds, checkpoint_bytes)


def lap_retried(namespace: str, name: str, reason: str) -> None:
    """A failed lap attempt will be retried. ``reason``: one of ``RETRY_REASONS``."""
    DEFAULT.lap_retried(namespace, name, reason)


def reconcile_finished(result: str, duration_seconds: float) -> None:
    """A reconcile ended. ``result``: ``success``, ``error``, ``requeue`` (or ``requeue_after``)."""
    DEFAULT.reconcile_finished(result, duration_seconds)


def kube_request(verb: str, resource: str, code: int | str) -> None:
    """The operator made one request to the API server (``code``: HTTP status or ``<error>``)."""
    KUBE.observe(verb, resource, code)


def event_suppressed(reason: str) -> None:
    """A routine Event of ``reason`` was not posted (the run's Event budget: controller/events.py)."""
    EVENTS.suppressed_one(reason)


def informer_synced(resource: str, synced: bool, informer: int = 0) -> None:
    """Whether the watch of ``resource`` (its plural; ``informer``: which of its watches) has listed."""
    INFORMERS.set(resource, synced, informer)


def set_readiness_check(check: HealthCheck) -> None:
    """Make ``/readyz`` answer 503 while ``check()`` is false. Without a check it answers 200 while
    the process serves. (Liveness is Kopf's endpoint: controller/process.py.)"""
    _checks["readyz"] = check


def start_server(port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serve ``/metrics`` and ``/readyz`` on ``addr:port`` in a daemon thread."""
    return serve(REGISTRY, port, addr, _checks)
