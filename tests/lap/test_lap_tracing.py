"""Traces of the lap (lap/tracing, docs/observability.md#traces): the real ``agentrun lap`` process
with an OTLP endpoint set, against a real S3 store, an OpenAI-compatible server and an HTTP tool
server, exporting to a local OTLP/HTTP receiver (tests/lap/otlp_sink.py): one trace per run (the
run's uid), a lap span, GenAI model spans, tool spans, ``traceparent`` sent to the model and the
tools, content only when opted in, secrets never, and a bounded flush at exit (an unreachable
collector, SIGTERM)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lap_helpers import (
    RUN,
    ChatServer,
    RecordingToolServer,
    chat_reply,
    lap_env,
    log_lines,
    run_lap_process,
    spec_doc,
    tool,
)
from otlp_sink import OtlpSink

from agentrun.api.contract import Env, ExitCode, lap_span_id, run_span_id, run_trace_id
from agentrun.lap.interfaces import NoTracer
from agentrun.lap.tracing import capture_content, tracer_from_env, traces_endpoint

KEY, HEADER = "sk-live-TOPSECRET-987654321", "Bearer tool-TOPSECRET-123"


def _spec(chat: ChatServer, srv: RecordingToolServer, **kw: Any) -> dict[str, Any]:
    return spec_doc([tool("pay", srv.url, sideEffects=True)], [],
                    model={"provider": "openai", "name": "gpt-x", "baseURL": chat.base_url}, **kw)


def _traced_env(s3_env: dict[str, str], spec: dict[str, Any], lap: int, endpoint: str, **extra: str) -> dict[str, str]:
    return lap_env(s3_env, spec, lap, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, AGENTRUN_MODEL_API_KEY=KEY,
                   AGENTRUN_TOOL_HEADERS_PAY=json.dumps({"Authorization": HEADER}), **extra)


def test_the_run_trace_is_the_uid_and_the_root_span_is_derived_from_it() -> None:
    assert run_trace_id(RUN.uid) == RUN.uid.replace("-", "") and len(run_span_id(RUN.uid)) == 16
    assert run_span_id(RUN.uid) == run_span_id(RUN.uid) != run_span_id("another-uid")
    assert len(run_trace_id("not-a-uuid")) == 32 and run_trace_id("not-a-uuid") == run_trace_id("not-a-uuid")


def test_tracing_is_off_without_an_endpoint_and_on_by_the_standard_variables() -> None:
    assert traces_endpoint({}) is None
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}) == "http://t:1/x"
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) is None
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}) is None
    assert not capture_content({}) and capture_content({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "True"})
    lines: list[str] = []
    off = tracer_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [],
                          lambda msg, **kw: lines.append(msg))
    assert isinstance(off, NoTracer) and "not supported" in lines[0]


def test_without_an_endpoint_the_lap_imports_no_opentelemetry_sdk() -> None:
    code = ("import sys; from agentrun.lap import process; from agentrun.lap.tracing import tracer_from_env; "
            "tracer_from_env({}, [], print); print([m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
            "'opentelemetry.exporter', 'google.protobuf'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_a_missing_sdk_is_one_warning_and_the_lap_runs_untraced() -> None:
    code = ("import sys; sys.modules['opentelemetry.sdk'] = None; from agentrun.lap.tracing import tracer_from_env; "
            "t = tracer_from_env({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://c:4318'}, [], lambda m, **kw: print(m)); "
            "print(type(t).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "agentrun[otel]" in out.stdout and out.stdout.strip().endswith("_Off")


def test_a_lap_exports_its_spans_in_the_run_trace_and_sends_traceparent(s3_env: dict[str, str]) -> None:
    with OtlpSink() as sink, ChatServer() as chat, RecordingToolServer() as srv:
        chat.replies += [(200, chat_reply("paying", [("call_x1", "pay", '{"doc": "inv_1"}')], prompt=2000, completion=50)),
                         (200, chat_reply("done"))]
        spec = _spec(chat, srv, task=f"Pay invoice inv_1 (the key {KEY} must never be seen)")
        first = run_lap_process(_traced_env(s3_env, spec, 1, sink.endpoint))
        second = run_lap_process(_traced_env(s3_env, spec, 2, sink.endpoint))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    trace_id = RUN.uid.replace("-", "")
    assert {s["trace_id"] for s in sink.spans} == {trace_id}, "every span of every lap is in the run's trace"
    laps = sorted(sink.named("lap"), key=lambda s: s["attrs"]["agentrun.lap"])
    assert [s["attrs"]["agentrun.lap"] for s in laps] == [1, 2]
    assert {s["parent"] for s in laps} == {run_span_id(RUN.uid)}, "a lap span is a child of the run's root span"
    # the lap span's id is the run's, lap's and attempt's (the operator sends it for an attempt killed before it could)
    assert [s["span_id"] for s in laps] == [lap_span_id(RUN.uid, 1, 1), lap_span_id(RUN.uid, 2, 1)]
    assert laps[0]["attrs"]["agentrun.lap.outcome"] == "continue" and laps[1]["attrs"]["agentrun.lap.outcome"] == "done"
    assert laps[0]["attrs"]["gen_ai.usage.input_tokens"] == 2000 and laps[0]["attrs"]["agentrun.lap.cost_usd"] > 0
    assert laps[0]["attrs"]["gen_ai.conversation.id"] == RUN.uid and laps[0]["resource"]["service.name"] == "agentrun-lap"
    chats = sink.named("chat ")
    assert len(chats) == 2 and {c["parent"] for c in chats} == {s["span_id"] for s in laps}
    c = chats[0]["attrs"]
    assert (c["gen_ai.operation.name"], c["gen_ai.request.model"], c["gen_ai.provider.name"]) == ("chat", "gpt-x", "openai")
    assert c["gen_ai.usage.input_tokens"] in (2000, 10) and c["agentrun.from_journal"] is False
    [call] = sink.named("execute_tool ")
    a = call["attrs"]
    assert call["name"] == "execute_tool pay" and call["parent"] == laps[0]["span_id"]
    assert (a["gen_ai.tool.name"], a["gen_ai.tool.call.id"], a["agentrun.from_journal"]) == ("pay", "call_x1", False)
    assert a["agentrun.tool.idempotency_key"] == srv.requests[0]["key"] and a["http.response.status_code"] == 200
    # traceparent: the tool got its own span's context, the model the chat span's
    tp = srv.requests[0]["headers"]["traceparent"]
    assert tp == f"00-{trace_id}-{call['span_id']}-01"
    assert chat.requests[0][0]["traceparent"].split("-")[1] == trace_id
    # privacy: no content by default, secrets nowhere
    dump = json.dumps(sink.spans)
    for attr in ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"):
        assert attr not in dump
    assert "TOPSECRET" not in dump and "inv_1" not in dump


def test_content_is_recorded_only_when_opted_in_and_redacted(s3_env: dict[str, str]) -> None:
    with OtlpSink() as sink, ChatServer() as chat, RecordingToolServer() as srv:
        chat.replies += [(200, chat_reply("paying", [("call_x1", "pay", '{"doc": "inv_1"}')]))]
        spec = _spec(chat, srv, task=f"Pay invoice inv_1 (the key {KEY} must never be seen)")
        done = run_lap_process(_traced_env(s3_env, spec, 1, sink.endpoint,
                                           OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true"))
    assert done.returncode == 0, done.stderr
    [chat_span] = sink.named("chat ")
    [tool_span] = sink.named("execute_tool ")
    assert "Pay invoice inv_1" in chat_span["attrs"]["gen_ai.input.messages"]
    assert "call_x1" in chat_span["attrs"]["gen_ai.output.messages"]
    assert json.loads(tool_span["attrs"]["gen_ai.tool.call.arguments"]) == {"doc": "inv_1"}
    assert '"tool": "pay"' in tool_span["attrs"]["gen_ai.tool.call.result"]
    dump = json.dumps(sink.spans)
    assert "TOPSECRET" not in dump and "[REDACTED]" in chat_span["attrs"]["gen_ai.input.messages"]


def _blackhole() -> socket.socket:
    """A TCP listener that accepts connections and never answers (a collector that hangs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_an_unreachable_collector_delays_the_lap_exit_by_the_flush_bound_at_most(s3_env: dict[str, str]) -> None:
    hole = _blackhole()
    try:
        with ChatServer() as chat, RecordingToolServer() as srv:
            chat.replies += [(200, chat_reply("done"))]
            spec = _spec(chat, srv)
            t0 = time.monotonic()
            done = run_lap_process(_traced_env(s3_env, spec, 1, f"http://127.0.0.1:{hole.getsockname()[1]}",
                                               OTEL_EXPORTER_OTLP_TIMEOUT="60"))
            elapsed = time.monotonic() - t0
    finally:
        hole.close()
    assert done.returncode == 0, done.stderr
    assert "spans not sent in time" in done.stderr
    assert elapsed < 15, f"the lap waited {elapsed:.1f}s for a collector that never answers (export timeout 60 s)"


def test_sigterm_during_a_tool_call_still_exports_the_lap_and_tool_spans(s3_env: dict[str, str]) -> None:
    with OtlpSink() as sink, ChatServer() as chat, RecordingToolServer() as srv:
        chat.replies += [(200, chat_reply("paying", [("call_x1", "pay", '{"doc": "inv_1"}')]))]
        original, arrived = srv.handle, threading.Event()

        def slow(method: str, path: str, args: Any, key: str | None, headers: dict[str, str]) -> tuple[int, bytes]:
            arrived.set()  # the call is in flight: the test sends SIGTERM now
            time.sleep(1.5)
            return original(method, path, args, key, headers)

        srv.handle = slow  # type: ignore[method-assign]
        spec = _spec(chat, srv)
        proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "lap"],
                                env=_traced_env(s3_env, spec, 1, sink.endpoint), stderr=subprocess.PIPE, text=True)
        assert arrived.wait(30), "the tool call never arrived"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == ExitCode.TERMINATED, err
    assert any(line.get("msg") == "lap failed" for line in log_lines(err))
    [lap] = sink.named("lap")
    assert lap["attrs"]["agentrun.lap.exit_code"] == 143 and lap["status"] == 2  # STATUS_CODE_ERROR
    [call] = sink.named("execute_tool ")
    assert call["parent"] == lap["span_id"] and call["attrs"]["gen_ai.tool.call.id"] == "call_x1"
    assert call["attrs"]["error.type"] == "LapTerminated", "the call's result was journaled, then the lap stopped"


def test_the_wait_for_an_approval_is_a_span_of_the_run_naming_the_decider(s3_env: dict[str, str]) -> None:
    with OtlpSink() as sink, ChatServer() as chat, RecordingToolServer() as srv:
        chat.replies += [(200, chat_reply("paying", [("call_x1", "pay", '{"doc": "inv_1"}')])), (200, chat_reply("done"))]
        spec = spec_doc([tool("pay", srv.url, sideEffects=True, requiresApproval=True)], [],
                        model={"provider": "openai", "name": "gpt-x", "baseURL": chat.base_url})
        asked = run_lap_process(_traced_env(s3_env, spec, 1, sink.endpoint))
        decided_at = datetime.now(UTC)  # the operator's status.approval.decidedAt, before the next lap starts
        time.sleep(0.3)
        decided = {"AGENTRUN_APPROVAL_DECISION": "approved", "AGENTRUN_APPROVAL_CALL_ID": "call_x1",
                   "AGENTRUN_APPROVAL_BY": "alice@example.com", Env.APPROVAL_DECIDED_AT: decided_at.isoformat()}
        resumed = run_lap_process(_traced_env(s3_env, spec, 2, sink.endpoint, **decided))
    assert asked.returncode == 0 and resumed.returncode == 0, asked.stderr + resumed.stderr
    [wait] = sink.named("approval ")
    assert wait["name"] == "approval pay" and wait["parent"] == run_span_id(RUN.uid)
    # from the request to the decision (not to the start of the lap that applies it)
    assert wait["end"] == int(decided_at.timestamp() * 1_000_000_000) and wait["start"] < wait["end"]
    [_, resumed_lap] = sorted(sink.named("lap"), key=lambda s: s["attrs"]["agentrun.lap"])
    assert resumed_lap["start"] > wait["end"]
    assert wait["trace_id"] == RUN.uid.replace("-", "")
    a = wait["attrs"]
    assert (a["agentrun.approval.decision"], a["agentrun.approval.decided_by"], a["agentrun.approval.lap"]) == (
        "approved", "alice@example.com", 1)
    assert a["gen_ai.tool.call.id"] == "call_x1"
    [executed] = sink.named("execute_tool ")
    assert executed["attrs"]["gen_ai.tool.call.id"] == "call_x1" and len(srv.requests) == 1


def test_mcp_requests_carry_the_trace_context_of_the_span_they_are_sent_in() -> None:
    """The MCP client (httpx2) adds ``traceparent`` to every request, as the HTTP client does: here
    to the ``initialize`` of a server that answers 503 (the request is all this test needs)."""
    from agentrun.api.spec import McpServer
    from agentrun.lap.errors import RetryableLapError
    from agentrun.lap.tools.mcp import McpToolRunner

    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    parent = f"00-{RUN.uid.replace('-', '')}-{run_span_id(RUN.uid)}-01"
    try:
        runner = McpToolRunner(tries=1, trace=lambda: {"traceparent": parent})
        server = McpServer.model_validate({"name": "ledger", "url": f"http://127.0.0.1:{httpd.server_address[1]}/mcp"})
        try:
            runner.list_tools(server)
        except RetryableLapError:
            pass
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert seen and all(h.get("traceparent") == parent for h in seen), seen
