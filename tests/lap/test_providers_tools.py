"""The OpenAI-compatible provider against a real local chat server, the scripted provider, and
HTTP tools against a real recording tool server that dedupes on Idempotency-Key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lap_helpers import ChatServer, RecordingToolServer, chat_reply, spec_doc, spec_of, tool

from agentrun.api.spec import ModelPricing
from agentrun.checkpoint.schema import Message, ToolCall, Usage
from agentrun.lap.errors import ConfigError, PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ModelRequest
from agentrun.lap.models import lap_cost_usd, make_model
from agentrun.lap.models.openai import OpenAIModel
from agentrun.lap.models.scripted import EXHAUSTED, ScriptedModel
from agentrun.lap.tools.http import HTTPToolRunner, tool_headers_from_env

API_KEY = "sk-test-SECRET-0123456789"


def _openai_spec(base_url: str, tools: list[dict] | None = None):
    return spec_of(spec_doc(tools or [tool("extract_invoice", "http://127.0.0.1:9")], [], model={
        "provider": "openai", "name": "gpt-test", "baseURL": base_url, "requestTimeout": "5s", "temperature": "0.2",
        "pricing": {"inputPerMillionTokensUSD": "2.50", "outputPerMillionTokensUSD": "10.00"}}))


def _request(spec) -> ModelRequest:
    msgs = (
        Message(role="system", content="sys", lap=0),
        Message(role="user", content="task", lap=0),
        Message(role="assistant", content=None, tool_calls=[ToolCall(id="c0", name="extract_invoice", arguments={"doc": "a"})], lap=1),
        Message(role="tool", content="{}", tool_call_id="c0", lap=1),
    )
    return ModelRequest(lap=2, messages=msgs, tools=tuple(spec.agent.tools))


def test_openai_provider_parses_tool_calls_usage_and_cost() -> None:
    with ChatServer() as srv:
        srv.replies.append((200, chat_reply("looking", [("call_A", "extract_invoice", '{"doc": "doc_4410"}')], prompt=1200, completion=300)))
        spec = _openai_spec(srv.base_url)
        model = OpenAIModel.from_spec(spec.agent.model, API_KEY)
        resp = model.complete(_request(spec))
        headers, body = srv.requests[0]
    assert resp.tool_calls[0].id == "call_A" and resp.tool_calls[0].arguments == {"doc": "doc_4410"}
    assert resp.usage == Usage(input_tokens=1200, output_tokens=300)
    assert lap_cost_usd(resp.usage, spec.agent.model.pricing) == "0.006"
    assert headers["Authorization"] == f"Bearer {API_KEY}"
    assert body["model"] == "gpt-test" and body["temperature"] == 0.2
    assert body["tools"][0] == {"type": "function", "function": {"name": "extract_invoice", "description": "extract_invoice tool",
                                "parameters": spec.agent.tools[0].parameters}}
    assistant = body["messages"][2]
    assert assistant["tool_calls"][0]["function"] == {"name": "extract_invoice", "arguments": '{"doc":"a"}'}
    assert body["messages"][3] == {"role": "tool", "content": "{}", "tool_call_id": "c0"}


def test_openai_malformed_arguments_become_an_argument_error_not_a_crash() -> None:
    with ChatServer() as srv:
        srv.replies.append((200, chat_reply(None, [("c1", "extract_invoice", '{"doc": '), ("c1", "extract_invoice", "[1]")])))
        spec = _openai_spec(srv.base_url)
        resp = OpenAIModel.from_spec(spec.agent.model, None).complete(_request(spec))
    assert resp.tool_calls[0].argument_error and "not valid JSON" in resp.tool_calls[0].argument_error
    assert resp.tool_calls[1].id == "call_2", "duplicate ids are made unique"
    assert "must be a JSON object, got list" in (resp.tool_calls[1].argument_error or "")


@pytest.mark.parametrize("status,error", [(429, RetryableLapError), (503, RetryableLapError), (500, RetryableLapError),
                                          (401, PermanentLapError), (400, PermanentLapError)])
def test_openai_http_errors_are_classified(status: int, error: type) -> None:
    with ChatServer() as srv:
        srv.replies.append((status, {"error": {"message": f"status {status}"}}))
        spec = _openai_spec(srv.base_url)
        with pytest.raises(error, match=f"HTTP {status}"):
            OpenAIModel.from_spec(spec.agent.model, API_KEY).complete(_request(spec))


def test_openai_malformed_body_and_unreachable_are_retryable() -> None:
    with ChatServer() as srv:
        srv.replies.append((200, "not json"))
        srv.replies.append((200, {"choices": []}))
        spec = _openai_spec(srv.base_url)
        model = OpenAIModel.from_spec(spec.agent.model, None)
        with pytest.raises(RetryableLapError, match="not JSON"):
            model.complete(_request(spec))
        with pytest.raises(RetryableLapError, match="not a chat completion: no choices"):
            model.complete(_request(spec))
    with pytest.raises(RetryableLapError, match="unreachable"):
        model.complete(_request(spec))


def test_openai_requires_base_url() -> None:
    spec = spec_of(spec_doc([], [], model={"provider": "openai"}))
    with pytest.raises(ConfigError, match="baseURL is required"):
        make_model(spec, {})


def test_cost_is_exact_decimal() -> None:
    pricing = ModelPricing.model_validate({"inputPerMillionTokensUSD": "0.15", "outputPerMillionTokensUSD": "0.60"})
    assert lap_cost_usd(Usage(input_tokens=1, output_tokens=1), pricing) == "0.000001"
    assert lap_cost_usd(Usage(input_tokens=1_000_000, output_tokens=500_000), pricing) == "0.45"


def test_scripted_provider_script_and_file(tmp_path: Path) -> None:
    spec = spec_of(spec_doc([], [{"content": "one", "toolCalls": [{"name": "t", "arguments": {"a": 1}}], "usage": {"inputTokens": 7}}]))
    model = make_model(spec, {})
    r1 = model.complete(ModelRequest(lap=1, messages=(), tools=()))
    assert r1.tool_calls[0].id == "call_1" and r1.usage.input_tokens == 7
    r2 = model.complete(ModelRequest(lap=2, messages=(), tools=()))
    assert r2.content == EXHAUSTED and not r2.tool_calls
    f = tmp_path / "script.yaml"
    f.write_text("script:\n  - content: from file\n")
    assert make_model(spec, {"AGENTRUN_SCRIPT_FILE": str(f)}).complete(ModelRequest(lap=1, messages=(), tools=())).content == "from file"
    f.write_text("- toolCalls: [{nme: x}]\n")
    with pytest.raises(ConfigError, match=r"script\.0\.toolCalls\.0"):
        ScriptedModel.from_spec(spec.agent.model, str(f))


def test_http_tool_sends_key_headers_and_dedupes() -> None:
    with RecordingToolServer() as srv:
        spec = spec_of(spec_doc([tool("pay", srv.url), tool("lookup", srv.url, sideEffects=False, http={"method": "GET"})], []))
        headers = tool_headers_from_env(spec.agent.tools, {"AGENTRUN_TOOL_HEADERS_PAY": json.dumps({"Authorization": "Bearer tool-secret"})})
        runner = HTTPToolRunner(headers)
        pay, lookup = spec.agent.tools
        a = runner.call(pay, {"doc": "inv_1"}, "r_1:1:pay:c1")
        b = runner.call(pay, {"doc": "inv_1"}, "r_1:1:pay:c1")
        c = runner.call(lookup, {"doc": "inv_1"}, "r_1:1:lookup:c2")
    assert a == b and a.status == "ok" and a.http_status == 200
    assert srv.executions["r_1:1:pay:c1"] == 1
    assert srv.requests[0]["headers"]["Authorization"] == "Bearer tool-secret"
    assert srv.requests[2]["key"] is None and srv.requests[2]["method"] == "GET" and srv.requests[2]["args"] == {"doc": "inv_1"}
    assert json.loads(c.result)["echo"] == {"doc": "inv_1"}
    assert runner.secrets() == ["Bearer tool-secret"]


def test_http_tool_4xx_is_an_error_result_and_5xx_retries_with_the_same_key() -> None:
    with RecordingToolServer() as srv:
        spec = spec_of(spec_doc([tool("pay", srv.url)], []))
        pay = spec.agent.tools[0]
        runner = HTTPToolRunner(tries=3, backoff_seconds=0.0)
        srv.status_for["/pay"] = 422
        out = runner.call(pay, {"doc": "x"}, "k1")
        assert out.status == "error" and out.http_status == 422 and out.result.startswith("HTTP 422")
        srv.status_for.clear()
        srv.fail_next["/pay"] = [503, 502]
        ok = runner.call(pay, {"doc": "x"}, "k2")
        assert ok.status == "ok" and [r["key"] for r in srv.requests[-3:]] == ["k2", "k2", "k2"]
        srv.fail_next["/pay"] = [503, 503, 503]
        with pytest.raises(RetryableLapError, match="returned HTTP 503 .3 tries with key k3"):
            runner.call(pay, {"doc": "x"}, "k3")
        assert srv.executions["k2"] == 1 and "k3" not in srv.executions


def test_tool_headers_env_errors_name_the_variable_not_the_value() -> None:
    spec = spec_of(spec_doc([tool("send-mail", "http://127.0.0.1:9")], []))
    with pytest.raises(ConfigError) as e:
        tool_headers_from_env(spec.agent.tools, {"AGENTRUN_TOOL_HEADERS_SEND_MAIL": "Bearer s3cr3t-value"})
    assert "AGENTRUN_TOOL_HEADERS_SEND_MAIL" in str(e.value) and "s3cr3t" not in str(e.value)
