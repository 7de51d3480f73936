"""The lap's tracer on the OpenTelemetry SDK: spans exported by OTLP over HTTP/protobuf.

Imported only when tracing is on (``agentrun.lap.tracing.tracer_from_env``): the SDK, the exporter
and protobuf cost a lap start tens of milliseconds that a lap without tracing does not pay
(bench/bench_cold_start.py measures both).

* The run's trace: every span is in the trace :func:`~agentrun.api.contract.run_trace_id` of the
  run's uid; the lap's span is a child of the run's root span (:func:`~agentrun.api.contract.run_span_id`),
  so every lap, retry and restart of the run lands in one trace.
* The lap's span id is :func:`~agentrun.api.contract.lap_span_id` of the run, lap and attempt (not
  random): an attempt killed before it exports its span (SIGKILL, OOM) still exported its model and
  tool spans, and the operator sends the attempt's ``lap`` span with that id
  (``agentrun.controller.tracing``), so they have their parent in the trace.
* Export: a batch processor (``OTEL_BSP_*`` apply; the delay defaults to one second here) sends
  ended spans in the background; :meth:`OtelTracer.close` sends the rest at exit, waiting at most
  :data:`FLUSH_SECONDS`: an unreachable collector never delays a lap's exit by more, nor fails it.
  The SDK's own warnings (a failed export) become at most a few lines of the lap's log.
* Secrets: every string attribute and status message is redacted with the lap's secrets (the
  model's API key, the tools' header values), as its log lines are.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentrun.api.contract import run_span_id, run_trace_id
from agentrun.lap.interfaces import AttributeValue, TraceSpan
from agentrun.lap.logs import redact
from agentrun.lap.tracing.semconv import ERROR_TYPE, LAP_SPAN

SERVICE_NAME = "agentrun-lap"
FLUSH_SECONDS = 2.0
"""At most this long at exit to send the spans not sent yet (then the lap exits all the same)."""
SCHEDULE_DELAY_MS = 1000
MAX_SDK_LOG_LINES = 3
_PROPAGATOR = TraceContextTextMapPropagator()
_fixed_span_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("agentrun_lap_span_id", default=None)
"""The id of the span being started, when it is not random (the lap's span: ``lap_span_id``)."""


class _Ids(RandomIdGenerator):
    """Random span ids, except the lap span's (:data:`_fixed_span_id` while it is started)."""

    def generate_span_id(self) -> int:
        fixed = _fixed_span_id.get()
        return fixed if fixed is not None else super().generate_span_id()


class _SdkLogHandler(logging.Handler):
    """The SDK's warnings (``Failed to export span batch ...``) as the lap's own log lines, a few at most."""

    def __init__(self, log: Callable[..., None]) -> None:
        super().__init__(logging.WARNING)
        self._log, self._left = log, MAX_SDK_LOG_LINES

    def emit(self, record: logging.LogRecord) -> None:
        if self._left <= 0:
            return
        self._left -= 1
        try:
            self._log("tracing: " + record.getMessage()[:300], level="warning")
        except Exception:  # never let the exporter's thread die of a log line
            pass


class _Span:
    def __init__(self, span: trace.Span, clean: Callable[[Mapping[str, AttributeValue]], dict[str, AttributeValue]]) -> None:
        self._span, self._clean = span, clean

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self._span.set_attributes(self._clean(attributes))

    def set_error(self, message: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, message[:1000]))


class OtelTracer:
    """:class:`~agentrun.lap.interfaces.Tracer` on the OpenTelemetry SDK, for one lap process."""

    def __init__(
        self, uid: str, endpoint: str, secrets: list[str], capture_content: bool, log: Callable[..., None],
        resource: Mapping[str, str] | None = None, exporter: Any = None, schedule_delay_ms: float = SCHEDULE_DELAY_MS,
        lap_span_id: str | None = None,
    ) -> None:
        """``lap_span_id``: the id of the lap's span (``api.contract.lap_span_id``; None: random)."""
        self.capture_content = capture_content
        self._lap_span_id = int(lap_span_id, 16) if lap_span_id else None
        self._secrets = secrets  # the lap logger's list: secrets found later (tool headers) apply too
        attrs: dict[str, str] = {"service.name": SERVICE_NAME, **(resource or {})}
        provider = TracerProvider(resource=Resource(attrs).merge(OTELResourceDetector().detect()),
                                  id_generator=_Ids(), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint),
                                                       schedule_delay_millis=schedule_delay_ms))
        self._provider = provider
        self._tracer = provider.get_tracer("agentrun.lap")
        parent = SpanContext(int(run_trace_id(uid), 16), int(run_span_id(uid), 16), is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
        self._run_context = trace.set_span_in_context(NonRecordingSpan(parent))
        sdk_log = logging.getLogger("opentelemetry")
        sdk_log.addHandler(_SdkLogHandler(log))
        sdk_log.propagate = False
        self._closed = False

    def _clean(self, attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
        return {k: redact(v, self._secrets) if isinstance(v, str) else v for k, v in attributes.items()}

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue]) -> Iterator[TraceSpan]:
        inside = trace.get_current_span().get_span_context().is_valid
        fixed = self._lap_span_id if not inside and name == LAP_SPAN else None
        token = _fixed_span_id.set(fixed)
        try:
            span = self._tracer.start_span(name, context=None if inside else self._run_context,
                                           attributes=self._clean(attributes), record_exception=False,
                                           set_status_on_exception=False)
        finally:
            _fixed_span_id.reset(token)
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                yield _Span(span, self._clean)
            except BaseException as e:
                span.set_attribute(ERROR_TYPE, type(e).__name__)
                span.set_status(Status(StatusCode.ERROR, redact(str(e), self._secrets)[:1000]))
                raise

    def record(self, name: str, attributes: Mapping[str, AttributeValue], start: datetime, end: datetime) -> None:
        span = self._tracer.start_span(name, context=self._run_context, attributes=self._clean(attributes),
                                       start_time=_nanos(start))
        span.end(end_time=max(_nanos(end), _nanos(start)))

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier

    def close(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Send the spans not sent yet, waiting at most ``timeout`` seconds; True if done in time."""
        if self._closed:
            return True
        self._closed = True
        done = threading.Thread(target=self._provider.shutdown, name="otel-flush", daemon=True)
        done.start()
        done.join(timeout)
        return not done.is_alive()


def _nanos(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)
