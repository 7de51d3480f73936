"""OpenTelemetry traces end to end (issue 35, items 1 and 2) on the local control plane, with a real
OTLP receiver: Jaeger all-in-one built from its Go module (e2e/jaeger/build.sh), started by the
``jaeger`` fixture. The operator gets ``OTEL_EXPORTER_OTLP_ENDPOINT`` (as the chart's
``tracing.otlpEndpoint`` sets it) and passes it to every lap Job.

A 5-lap run with a tool call per lap and one approval gives ONE trace in Jaeger, read through
Jaeger's own query API: its id is the run's uid, with a span per lap (children of the run's root
span), a model span per lap with the GenAI attributes, a tool span per call (name, call id,
idempotency key, from the journal or not) whose context the tool server received as
``traceparent``, the approval wait from the request to the decision naming the decider, and no
message content. A lap pod killed mid-call shows its killed attempt (the operator's span, with the
attempt's span id: the parent of the model span it sent) and its retried attempt answering from the
journal.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from test_operator_e2e import Env, _diagnostics_on_failure, _one_job_per_attempt, _wait, running_env  # noqa: F401

from agentrun.api.contract import lap_span_id, run_span_id, run_trace_id

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
def test_a_five_lap_run_with_an_approval_is_one_trace_in_jaeger(env, jaeger, recorder):
    script = [{"content": f"noting {i}", "toolCalls": [{"name": "note", "arguments": {"text": f"private note {i}"}}],
               "usage": {"inputTokens": 100 + i, "outputTokens": 10}} for i in range(1, LAPS_WITH_CALLS + 1)]
    script += [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": "traced"}}]},
               {"content": "done", "usage": {"inputTokens": 100, "outputTokens": 5}}]
    doc = env.run_doc("traced", script)
    doc["spec"]["agent"]["tools"][0]["http"]["url"] = recorder.url + "/note"
    doc["spec"]["agent"]["tools"][0]["sideEffects"] = True
    env.apply(doc)
    st = env.wait_phase("traced", "AwaitingApproval", "Succeeded", "Failed", timeout=180)
    assert st["phase"] == "AwaitingApproval", st
    env.kubectl("annotate", "agentrun", "traced", "-n", env.ns, "approved=true")
    st = env.wait_phase("traced", "Succeeded", "Failed", "BudgetExceeded", timeout=180)
    assert st["phase"] == "Succeeded", st
    laps = LAPS_WITH_CALLS + 2
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
    assert [_tags(s)["agentrun.lap.outcome"] for s in lap_spans] == (
        ["continue"] * LAPS_WITH_CALLS + ["awaiting-approval", "done"])
    assert _tags(lap_spans[-1])["agentrun.approval.decision"] == "approved"
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
    [refund] = by_op["execute_tool refund"]
    assert _parent(refund) == lap_spans[-1]["spanID"], "the approved call ran in the lap after the decision"
    # the wait for the approval: from the request in lap 4 to lap 5, naming the decider
    [wait] = by_op["approval refund"]
    w = _tags(wait)
    assert _parent(wait) == run_span_id(uid) and w["agentrun.approval.decision"] == "approved"
    assert w["agentrun.approval.lap"] == LAPS_WITH_CALLS + 1 and w["agentrun.approval.decided_by"]
    assert w["agentrun.approval.decided_by"] == st["approval"].get("decidedBy", w["agentrun.approval.decided_by"])
    assert wait["duration"] > 0
    # ... to the decision (status.approval.decidedAt, passed to lap 5), not to the start of lap 5
    decided = datetime.fromisoformat(st["approval"]["decidedAt"].replace("Z", "+00:00")).timestamp() * 1e6
    wait_end = wait["startTime"] + wait["duration"]
    assert abs(wait_end - decided) < 1_000_000, (wait_end, decided)
    assert wait_end <= lap_spans[-1]["startTime"], "the decision was taken before the lap that applies it"
    tools = by_op["execute_tool note"]
    assert len(tools) == LAPS_WITH_CALLS
    received = {r["headers"]["traceparent"] for r in recorder.requests}
    assert len(recorder.requests) == LAPS_WITH_CALLS
    for s in tools:
        t = _tags(s)
        assert t["gen_ai.tool.name"] == "note" and t["gen_ai.tool.call.id"] and t["agentrun.from_journal"] is False
        assert t["agentrun.tool.idempotency_key"] in {r["headers"]["idempotency-key"] for r in recorder.requests}
        assert f"00-{trace_id}-{s['spanID']}-01" in received
    # the operator: the trace id in status, a reconcile span per pass that acted (one started each lap
    # attempt), and the run's root span, with the id every lap names as its parent, once it finished
    assert st.get("traceId") == trace_id, st.get("traceId")

    def with_root() -> dict[str, Any] | None:
        t = jaeger.trace(trace_id)
        return t if t and any(s["spanID"] == run_span_id(uid) for s in t["spans"]) else None

    trace = _wait("the run's root span from the operator", with_root, timeout=60)
    [root] = [s for s in trace["spans"] if s["spanID"] == run_span_id(uid)]
    assert root["operationName"] == "agentrun.run traced" and not root.get("references"), root
    assert trace["processes"][root["processID"]]["serviceName"] == "agentrun-operator"
    assert _tags(root)["agentrun.phase"] == "Succeeded" and _tags(root)["agentrun.lap"] == laps
    reconciles = [s for s in trace["spans"] if s["operationName"] == "reconcile"]
    assert reconciles and {_parent(s) for s in reconciles} == {run_span_id(uid)}
    started = sorted(_tags(s)["agentrun.lap"] for s in reconciles if "agentrun.lap" in _tags(s))
    assert started == list(range(1, laps + 1)), started
    # no message content by default
    dump = json.dumps(trace)
    assert "private note" not in dump and "gen_ai.input.messages" not in dump and "gen_ai.tool.call.result" not in dump


def _pods(env: Env, run: str) -> list[dict]:
    out = env.kubectl("get", "pods", "-n", env.ns, "-l", f"agentrun.dev/run={run}", "-o", "json").stdout
    return json.loads(out)["items"]


@pytest.mark.timeout(300)
def test_a_lap_pod_killed_mid_call_shows_its_retry_and_the_journaled_answer_in_the_trace(env, jaeger):
    """The lap pod is killed (grace period 1 s: SIGKILL, as its call is in flight) while its tool call
    is held at a gate: the killed attempt's ``lap`` span, which it never sent, is sent by the operator
    with the attempt's span id, so the model span the attempt did send has its parent in the trace;
    the retried attempt is in the same trace, answers the model turn from the journal and sends the
    call again with the same key."""
    from e2e_support import ToolGate

    gate = ToolGate(env.tool_url)
    try:
        script = [{"content": "noting", "toolCalls": [{"name": "note", "arguments": {"text": "once"}}]}, {"content": "done"}]
        doc = env.run_doc("traced-kill", script)
        note = doc["spec"]["agent"]["tools"][0]
        note["http"].update(url=gate.url + "/note", timeout="10m")
        note["sideEffects"] = True
        doc["spec"]["lapTimeout"] = "15m"
        env.apply(doc)
        _wait("the lap's tool call held at the gate", lambda: gate.held() >= 1, timeout=120)
        uid = env.get("traced-kill")["metadata"]["uid"]
        trace_id = run_trace_id(uid)
        # the model span of attempt 1 ended before its call: exported by the batch processor (1 s)
        _wait("attempt 1's model span in Jaeger", lambda: jaeger.trace(trace_id), timeout=30)
        pod = next(p for p in _pods(env, "traced-kill") if p["metadata"]["labels"].get("agentrun.dev/attempt") == "1")
        env.kubectl("delete", "pod", pod["metadata"]["name"], "-n", env.ns, "--grace-period=1", "--wait=true")
        gate.open()
        st = env.wait_phase("traced-kill", "Succeeded", "Failed", timeout=180)
        assert st["phase"] == "Succeeded" and st["totalRetries"] >= 1, st
    finally:
        gate.open()
        gate.close()

    def settled() -> dict[str, Any] | None:
        t = jaeger.trace(trace_id)
        laps = [s for s in (t["spans"] if t else []) if s["operationName"] == "lap"]
        return t if {(_tags(s)["agentrun.lap"], _tags(s)["agentrun.attempt"]) for s in laps} >= {
            (1, 1), (1, 2), (2, 1)} else None

    trace = _wait("the killed attempt, the retried lap and the next in Jaeger's trace", settled, timeout=60)
    spans = trace["spans"]
    laps_seen = [(_tags(s)["agentrun.lap"], _tags(s)["agentrun.attempt"]) for s in spans if s["operationName"] == "lap"]
    assert sorted(laps_seen) == [(1, 1), (1, 2), (2, 1)], "one span per attempt, none twice"
    laps = {(_tags(s)["agentrun.lap"], _tags(s)["agentrun.attempt"]): s for s in spans if s["operationName"] == "lap"}
    killed = laps[(1, 1)]  # sent by the operator when it saw the attempt fail
    k = _tags(killed)
    assert killed["spanID"] == lap_span_id(uid, 1, 1) and _parent(killed) == run_span_id(uid)
    assert trace["processes"][killed["processID"]]["serviceName"] == "agentrun-operator"
    assert k["otel.status_code"] == "ERROR" and k["agentrun.retry.reason"], k
    assert k["agentrun.lap.span_sent_by"] == "operator", k
    assert killed["duration"] > 0 and killed["startTime"] < laps[(1, 2)]["startTime"]
    retried = laps[(1, 2)]
    assert _tags(retried)["agentrun.lap.outcome"] == "continue" and _parent(retried) == run_span_id(uid)
    chats = [s for s in spans if s["operationName"].startswith("chat ") and _tags(s).get("agentrun.lap") == 1]
    first = [s for s in chats if _tags(s)["agentrun.from_journal"] is False]
    again = [s for s in chats if _parent(s) == retried["spanID"]]
    assert len(first) == 1 and _parent(first[0]) == killed["spanID"], "attempt 1's model call, under its lap span"
    assert len(again) == 1 and _tags(again[0])["agentrun.from_journal"] is True, "the retry's answer is the journal's"
    assert "gen_ai.usage.input_tokens" not in _tags(again[0])
    [call] = [s for s in spans if s["operationName"] == "execute_tool note" and _parent(s) == retried["spanID"]]
    keys = {a["idempotencyKey"] for a in gate.arrivals}
    assert len(keys) == 1 and _tags(call)["agentrun.tool.idempotency_key"] in keys, "sent again with the same key"
    assert len(gate.arrivals) == 2
