"""Traces of the lap (docs/observability.md#traces): off unless the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the operator
passes them from the chart's ``tracing`` values, ``agentrun.api.contract.LAP_OTEL_ENV``).

:func:`tracer_from_env` returns :data:`~agentrun.lap.interfaces.NO_TRACER` when tracing is off, and
imports the OpenTelemetry SDK (``agentrun[otel]``, in the image) only when it is on. Tracing never
fails a lap: an SDK that is missing or refuses its configuration is one warning line, and the lap
runs untraced. Only OTLP over HTTP/protobuf is sent (``OTEL_EXPORTER_OTLP_PROTOCOL`` unset or
``http/protobuf``): no gRPC stack in the lap's start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from agentrun.api.contract import Env, OtelEnv, lap_span_id, traces_endpoint
from agentrun.api.contract import otel_true as _true
from agentrun.lap.interfaces import NoTracer, Tracer

HTTP_PROTOBUF = "http/protobuf"


class ClosingTracer(Tracer, Protocol):
    def close(self) -> bool:
        """Send what is left, bounded in time (``otel.FLUSH_SECONDS``); True if all was sent."""
        ...


class _Off(NoTracer):
    """Tracing off: spans that record nothing, no headers, a ``close`` that does nothing."""

    def close(self) -> bool:
        return True


OFF: ClosingTracer = _Off()


def capture_content(env: Mapping[str, str]) -> bool:
    """``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``: spans carry message content."""
    return _true(env.get(OtelEnv.CAPTURE_MESSAGE_CONTENT))


def tracer_from_env(env: Mapping[str, str], secrets: list[str], log: Callable[..., None]) -> ClosingTracer:
    """The lap's tracer: :data:`OFF`, or an :class:`~agentrun.lap.tracing.otel.OtelTracer` of the run
    ``AGENTRUN_UID``. ``secrets`` (the lap logger's list, which grows) are redacted from every attribute."""
    endpoint = traces_endpoint(env)
    if endpoint is None:
        return OFF
    protocol = (env.get(OtelEnv.TRACES_PROTOCOL) or env.get(OtelEnv.PROTOCOL) or HTTP_PROTOBUF).strip()
    if protocol != HTTP_PROTOBUF:
        log(f"tracing off: {OtelEnv.PROTOCOL} {protocol[:40]!r} is not supported (only {HTTP_PROTOBUF})",
            level="warning")
        return OFF
    try:
        from agentrun.lap.tracing.otel import OtelTracer
    except ImportError as e:
        log(f"tracing off: the OpenTelemetry SDK is not installed (pip install 'agentrun[otel]'): {e}"[:300],
            level="warning")
        return OFF
    resource = {"k8s.namespace.name": env.get(Env.NAMESPACE, "")[:63]}
    pod = env.get("HOSTNAME", "")
    if pod:
        resource["k8s.pod.name"] = pod[:253]
    uid, lap, attempt = env.get(Env.UID, ""), env.get(Env.LAP, ""), env.get(Env.ATTEMPT, "1")
    span_id = lap_span_id(uid, int(lap), int(attempt)) if lap.isdigit() and attempt.isdigit() else None
    try:
        return OtelTracer(uid, endpoint, secrets, capture_content(env), log, resource=resource, lap_span_id=span_id)
    except Exception as e:  # a configuration the SDK refuses: the lap runs untraced
        log(f"tracing off: {type(e).__name__}: {e}"[:300], level="warning")
        return OFF
