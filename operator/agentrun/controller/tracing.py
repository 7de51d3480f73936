"""The operator's spans (docs/observability.md#traces): off unless the operator's environment sets an
OTLP endpoint (the chart's ``tracing`` values, which it also passes to lap Jobs), and the
OpenTelemetry SDK imported only then.

Each run is one trace (``agentrun.api.contract.run_trace_id``). The operator adds to it:

* a ``reconcile`` span for each pass that acted (wrote the run's status, created or deleted a Job),
  a child of the run's root span, with the phase before and after and what it did;
* the ``lap`` span of an attempt that failed without sending its own (killed by SIGKILL or OOM, its
  pod evicted or gone, ``decide.retries.lap_span_lost``): with the attempt's span id
  (``agentrun.api.contract.lap_span_id``), so the model and tool spans the attempt did send have
  their parent in the trace; from the attempt's start to when the operator saw it fail, status error,
  the retry's reason;
* the run's **root span** itself (``agentrun.run``, span id ``run_span_id``: the parent of every lap
  span), from the run's creation to its end, sent when the run reaches a terminal phase (again
  after a retry in place: a backend keeps the last).

Spans are sent in the background by a batch processor; :meth:`OperatorSpans.close` sends the rest at
shutdown, waiting at most a few seconds. An unreachable collector costs a warning in the log, never a
reconcile.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agentrun.api.contract import LAP_SPAN_NAME, lap_span_id, run_span_id, run_trace_id, traces_endpoint

from .decide.actions import LostLapSpan

log = logging.getLogger("agentrun.controller")

SERVICE_NAME = "agentrun-operator"
FLUSH_SECONDS = 3.0
Attributes = Mapping[str, str | int | float | bool | list[str]]

#: (trace id, span id) of the span being started when its ids are not random: the run's root span
#: (the ids the run's laps already use), a lost lap span (the span id the attempt's spans name as parent).
_root_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("agentrun_root_ids", default=None)


class OperatorSpans:
    """The operator's spans on the OpenTelemetry SDK (see the module docstring)."""

    def __init__(self, endpoint: str, exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class _Ids(RandomIdGenerator):
            """Random ids, except the root span's: the one the run's laps name as their parent."""

            def generate_span_id(self) -> int:
                fixed = _root_ids.get()
                return fixed[1] if fixed is not None else super().generate_span_id()

            def generate_trace_id(self) -> int:
                fixed = _root_ids.get()
                return fixed[0] if fixed is not None else super().generate_trace_id()

        self._trace = trace
        provider = TracerProvider(resource=Resource({"service.name": SERVICE_NAME}).merge(OTELResourceDetector().detect()),
                                  id_generator=_Ids(), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint)))
        self._provider = provider
        self._tracer = provider.get_tracer("agentrun.controller")
        self._closed = False

    def _under_root(self, uid: str) -> Any:
        """The context of a span under the run's root span."""
        trace = self._trace
        ctx = trace.SpanContext(int(run_trace_id(uid), 16), int(run_span_id(uid), 16), is_remote=True,
                                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
        return trace.set_span_in_context(trace.NonRecordingSpan(ctx))

    def reconcile(self, uid: str, start: datetime, end: datetime, attributes: Attributes) -> None:
        """A pass that acted, under the run's root span."""
        span = self._tracer.start_span("reconcile", context=self._under_root(uid),
                                       attributes=dict(attributes), start_time=_nanos(start))
        span.end(end_time=max(_nanos(end), _nanos(start)))

    def lost_lap(self, uid: str, namespace: str, name: str, lap: int, kind: str, lost: LostLapSpan) -> None:
        """The ``lap`` span of attempt ``lost.attempt`` of ``lap`` (a ``decide.LostLapSpan``), which the
        attempt did not send: its span id is the attempt's, its parent the run's root span."""
        token = _root_ids.set((int(run_trace_id(uid), 16), int(lap_span_id(uid, lap, lost.attempt), 16)))
        try:
            span = self._tracer.start_span(LAP_SPAN_NAME, context=self._under_root(uid), attributes={
                "agentrun.run.namespace": namespace, "agentrun.run.name": name, "agentrun.run.uid": uid,
                "agentrun.lap": lap, "agentrun.attempt": lost.attempt, "agentrun.retry.reason": kind,
                "error.type": kind, "agentrun.lap.span_sent_by": "operator",
            }, start_time=_nanos(lost.started_at))
        finally:
            _root_ids.reset(token)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, lost.message[:1000]))
        span.end(end_time=max(_nanos(lost.ended_at), _nanos(lost.started_at)))

    def run(self, uid: str, name: str, start: datetime, end: datetime, attributes: Attributes) -> None:
        """The run's root span (its id: ``run_span_id``), from ``start`` to ``end``."""
        token = _root_ids.set((int(run_trace_id(uid), 16), int(run_span_id(uid), 16)))
        try:  # a root (no parent): the id generator gives it the run's trace id and root span id
            span = self._tracer.start_span(f"agentrun.run {name}", context=self._trace.set_span_in_context(
                self._trace.INVALID_SPAN), attributes=dict(attributes), start_time=_nanos(start))
        finally:
            _root_ids.reset(token)
        span.end(end_time=max(_nanos(end), _nanos(start)))

    def close(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Send the spans not sent yet, waiting at most ``timeout`` seconds; True if done in time."""
        if self._closed:
            return True
        self._closed = True
        done = threading.Thread(target=self._provider.shutdown, name="otel-flush", daemon=True)
        done.start()
        done.join(timeout)
        return not done.is_alive()


def pass_attributes(o: Any, decision: Any) -> dict[str, str | int | float | bool | list[str]]:
    """The attributes of the ``reconcile`` span of a pass that acted: the run, the phase before and
    after, the kinds of what it did, the lap attempt it started and the reasons of its Events."""
    before = o.status.phase
    after = decision.status.phase if decision.status is not None else before
    out: dict[str, str | int | float | bool | list[str]] = {
        "agentrun.run.namespace": o.namespace, "agentrun.run.name": o.name, "agentrun.run.uid": o.uid,
        "agentrun.phase.before": before, "agentrun.phase": after,
        "agentrun.actions": sorted({type(a).__name__ for a in decision.actions} - {"RequeueAfter"}),
    }
    for a in decision.actions:
        if type(a).__name__ == "CreateJob":
            out["agentrun.lap"], out["agentrun.attempt"] = a.lap, a.attempt
    reasons = sorted({a.reason for a in decision.actions if type(a).__name__ == "Event"})
    if reasons:
        out["agentrun.event.reasons"] = reasons
    return out


def spans_from_env(env: Mapping[str, str]) -> OperatorSpans | None:
    """The operator's spans when ``env`` sets an OTLP endpoint (None: off, or the SDK missing). The
    reconciler makes them and hands them to the executor: one exporter per operator process."""
    endpoint = traces_endpoint(env)
    if endpoint is None:
        return None
    try:
        return OperatorSpans(endpoint)
    except ImportError as exc:
        log.warning("tracing: OTLP endpoint set but the OpenTelemetry SDK is not installed (%s): "
                    "install agentrun[otel]; the operator sends no spans", exc)
        return None


def _nanos(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)
