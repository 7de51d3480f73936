"""The work queue's metrics, as client-go's workqueue exposes them (``workqueue_depth``,
``workqueue_adds_total``, ``workqueue_queue_duration_seconds``, ``workqueue_retries_total``), with
the ``agentrun_`` prefix and no ``name`` label (the operator has one queue). A queue that keeps
growing (depth, and the time a run waits for a worker) is the sign that the operator cannot keep
up with its runs."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Seconds a run waits in the queue before a worker takes it.
QUEUE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkQueueMetrics:
    """Implements the queue's ``QueueObserver``; the gauges read the queue at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge("agentrun_workqueue_depth", "Runs waiting in the work queue for a worker.",
                           registry=registry)
        self.delayed = Gauge("agentrun_workqueue_delayed", "Runs waiting for a requeue delay or an error "
                             "backoff to pass before they enter the work queue.", registry=registry)
        self.adds = Counter("agentrun_workqueue_adds", "Runs added to the work queue (a run already waiting "
                            "is not added twice).", registry=registry)
        self.retries = Counter("agentrun_workqueue_retries", "Runs re-queued after a failed reconcile, "
                               "with their per-run exponential backoff.", registry=registry)
        self.queue_duration = Histogram("agentrun_workqueue_queue_duration_seconds", "How long a run "
                                        "waited in the work queue before a worker took it.",
                                        buckets=QUEUE_SECONDS_BUCKETS, registry=registry)

    def watch(self, depth: Callable[[], float], delayed: Callable[[], float]) -> None:
        """Read these at scrape time (the operator's queue)."""
        self.depth.set_function(depth)
        self.delayed.set_function(delayed)

    def added(self) -> None:
        self.adds.inc()

    def retried(self) -> None:
        self.retries.inc()

    def waited(self, seconds: float) -> None:
        self.queue_duration.observe(seconds)
