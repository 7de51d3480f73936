"""The operator's spans (controller/tracing.py): a pass that acted is a ``reconcile`` span under the
run's root span, the root span is sent with the ids the laps already name as their parent, and
nothing of OpenTelemetry is loaded without an endpoint."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

from controller_world import T0, UID, World, make_spec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrun.api.contract import lap_span_id, run_span_id, run_trace_id
from agentrun.controller.decide.actions import LostLapSpan
from agentrun.controller.tracing import OperatorSpans, pass_attributes, spans_from_env


def test_a_pass_is_a_span_under_the_runs_root_and_the_root_has_the_laps_parent_ids() -> None:
    exporter = InMemorySpanExporter()
    spans = OperatorSpans("http://collector.invalid:4318/v1/traces", exporter=exporter)
    w = World(make_spec())
    observed = w.observed()
    decision = w.reconcile()
    attrs = pass_attributes(observed, decision)
    assert attrs["agentrun.phase.before"] == "Pending" and attrs["agentrun.phase"] == "Running"
    assert "CreateJob" in attrs["agentrun.actions"] and attrs["agentrun.lap"] == 1 and attrs["agentrun.run.uid"] == UID
    spans.reconcile(UID, T0, T0 + timedelta(milliseconds=4), attrs)
    spans.run(UID, "run", T0 - timedelta(minutes=5), T0, {"agentrun.phase": "Succeeded"})
    assert spans.close()
    reconcile, root = exporter.get_finished_spans()
    assert reconcile.name == "reconcile" and root.name == "agentrun.run run"
    assert {f"{s.context.trace_id:032x}" for s in (reconcile, root)} == {run_trace_id(UID)}
    assert f"{root.context.span_id:016x}" == run_span_id(UID) and root.parent is None
    assert reconcile.parent is not None and f"{reconcile.parent.span_id:016x}" == run_span_id(UID)
    assert dict(reconcile.attributes or {})["agentrun.actions"] == tuple(attrs["agentrun.actions"])
    assert root.resource.attributes["service.name"] == "agentrun-operator"


def test_off_without_an_endpoint_and_no_sdk_import() -> None:
    assert spans_from_env({}) is None
    assert spans_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) is None
    code = ("import sys; from agentrun.controller.tracing import spans_from_env; "
            "assert spans_from_env({}) is None; "
            "print(any(m.startswith('opentelemetry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_a_killed_attempts_lap_span_has_the_attempts_id_under_the_runs_root() -> None:
    """The span the lap process would have sent (``lap_span_id``): its model spans' parent."""
    exporter = InMemorySpanExporter()
    spans = OperatorSpans("http://collector.invalid:4318/v1/traces", exporter=exporter)
    lost = LostLapSpan(2, T0, T0 + timedelta(seconds=7), "killed by SIGKILL (exit code 137)")
    spans.lost_lap(UID, "ns", "run", 4, "pod_failed", lost)
    spans.reconcile(UID, T0, T0, {})  # the next span's id is random again
    assert spans.close()
    lap, reconcile = exporter.get_finished_spans()
    assert lap.name == "lap" and f"{lap.context.span_id:016x}" == lap_span_id(UID, 4, 2)
    assert f"{lap.context.trace_id:032x}" == run_trace_id(UID)
    assert lap.parent is not None and f"{lap.parent.span_id:016x}" == run_span_id(UID)
    assert (lap.start_time, lap.end_time) == (int(T0.timestamp() * 1e9), int((T0 + timedelta(seconds=7)).timestamp() * 1e9))
    assert lap.status.status_code.name == "ERROR" and "SIGKILL" in (lap.status.description or "")
    a = dict(lap.attributes or {})
    assert (a["agentrun.lap"], a["agentrun.attempt"], a["agentrun.retry.reason"]) == (4, 2, "pod_failed")
    assert f"{reconcile.context.span_id:016x}" != lap_span_id(UID, 4, 2)


def test_the_executor_sends_through_the_exporter_it_is_given() -> None:
    """One exporter per operator process: the reconciler makes it and hands it to the executor."""
    from agentrun.controller.cache import Cache
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor

    spans = spans_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.invalid:4318"})
    assert spans is not None
    try:
        ex = Executor(OperatorConfig(), None, Cache(on_change=lambda key: None), spans=spans)  # type: ignore[arg-type]
        assert ex.spans is spans
    finally:
        spans.close(timeout=0.5)