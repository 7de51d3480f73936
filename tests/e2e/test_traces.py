"""OpenTelemetry traces end to end (issue 35, items 1 and 2) on the local control plane, with a real
OTLP receiver: Jaeger all-in-one built from its Go module (e2e/jaeger/build.sh), started by the
``jaeger`` fixture. The operator gets ``OTEL_EXPORTER_OTLP_ENDPOINT`` (as the chart's
``tracing.otlpEndpoint`` sets it) and passes it to every lap Job.

A multi-lap run with a tool call per lap gives ONE trace in Jaeger, read through Jaeger's own query
API: its id is the run's uid, with a span per lap (children of the run's root span), a model span
per lap with the GenAI attributes, a tool span per call (name, call id, idempotency key, from the
journal or not) whose context the tool server received as ``traceparent``, and no message content.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from test_operator_e2e import Env, _diagnostics_on_failure, _one_job_per_attempt, _wait, running_env  # noqa: F401

from agentrun.api.contract import run_span_id, run_trace_id

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
LAPS_WITH_CALLS = 3


class TracedEnv(Env):
    """The operator of this module sends its laps' spans to Jaeger."""

    def __init__(self, cluster: Any, s3: Any, tmp: Any, otlp_endpoint: str) -> None:
        super().__init__(cluster, s3, tmp)
        self.otlp_endpoint = otlp_endpoint

    def operator_env(self, **extra: str) -> dict[str, str]:
        return super().operator_env(OTEL_EXPORTER_OTLP_ENDPOINT=self.otlp_endpoint, **extra)


@pytest.fixture(scope="module")
def env(cluster, s3, jaeger, tmp_path_factory):
    yield from running_env(TracedEnv(cluster, s3, tmp_path_factory.mktemp("traces"), jaeger.otlp_endpoint))


class HeaderRecorder:
    """An HTTP tool that answers ``{"ok": true}`` and records each request's path and headers."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder() -> Iterator[HeaderRecorder]:
    r = HeaderRecorder()
    yield r
    r.close()


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _parent(span: dict[str, Any]) -> str | None:
    refs = [r for r in span.get("references", []) if r.get("refType") == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


@pytest.mark.timeout(300)
def test_a_multi_lap_run_is_one_trace_in_jaeger(env, jaeger, recorder):
    script = [{"content": f"noting {i}", "toolCalls": [{"name": "note", "arguments": {"text": f"private note {i}"}}],
               "usage": {"inputTokens": 100 + i, "outputTokens": 10}} for i in range(1, LAPS_WITH_CALLS + 1)]
    script.append({"content": "done", "usage": {"inputTokens": 100, "outputTokens": 5}})
    doc = env.run_doc("traced", script)
    doc["spec"]["agent"]["tools"][0]["http"]["url"] = recorder.url + "/note"
    doc["spec"]["agent"]["tools"][0]["sideEffects"] = True
    env.apply(doc)
    st = env.wait_phase("traced", "Succeeded", "Failed", "BudgetExceeded", timeout=180)
    assert st["phase"] == "Succeeded", st
    laps = LAPS_WITH_CALLS + 1
    assert st["lap"] == laps
    _one_job_per_attempt(env.jobs("traced"))
    uid = env.get("traced")["metadata"]["uid"]
    trace_id = run_trace_id(uid)

    def complete() -> dict[str, Any] | None:
        t = jaeger.trace(trace_id)
        spans = t["spans"] if t else []
        return t if sum(1 for s in spans if s["operationName"] == "lap") == laps else None

    trace = _wait(f"{laps} lap spans in Jaeger's trace {trace_id}", complete, timeout=60)
    spans = trace["spans"]
    assert {s["traceID"] for s in spans} == {trace_id}, "one trace: the run's"
    by_op: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_op.setdefault(s["operationName"], []).append(s)
    lap_spans = sorted(by_op["lap"], key=lambda s: _tags(s)["agentrun.lap"])
    assert [_tags(s)["agentrun.lap"] for s in lap_spans] == list(range(1, laps + 1))
    assert {_parent(s) for s in lap_spans} == {run_span_id(uid)}, "laps are children of the run's root span"
    assert [_tags(s)["agentrun.lap.outcome"] for s in lap_spans] == ["continue"] * LAPS_WITH_CALLS + ["done"]
    assert _tags(lap_spans[0])["gen_ai.usage.input_tokens"] == 101 and _tags(lap_spans[0])["agentrun.run.uid"] == uid
    process = trace["processes"][lap_spans[0]["processID"]]
    assert process["serviceName"] == "agentrun-lap"
    # a model span per lap, with the GenAI attributes, under its lap
    chats = [s for op, ss in by_op.items() if op.startswith("chat ") for s in ss]
    assert len(chats) == laps and {_parent(s) for s in chats} == {s["spanID"] for s in lap_spans}
    c = _tags(chats[0])
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.provider.name"] == "scripted"
    assert "gen_ai.request.model" in c and "gen_ai.usage.output_tokens" in c and c["agentrun.from_journal"] is False
    # a tool span per call, under its lap; the tool got that span's context as traceparent
    tools = by_op["execute_tool note"]
    assert len(tools) == LAPS_WITH_CALLS
    received = {r["headers"]["traceparent"] for r in recorder.requests}
    assert len(recorder.requests) == LAPS_WITH_CALLS
    for s in tools:
        t = _tags(s)
        assert t["gen_ai.tool.name"] == "note" and t["gen_ai.tool.call.id"] and t["agentrun.from_journal"] is False
        assert t["agentrun.tool.idempotency_key"] in {r["headers"]["idempotency-key"] for r in recorder.requests}
        assert f"00-{trace_id}-{s['spanID']}-01" in received
    # no message content by default
    dump = json.dumps(trace)
    assert "private note" not in dump and "gen_ai.input.messages" not in dump and "gen_ai.tool.call.result" not in dump
