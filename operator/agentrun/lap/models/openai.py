"""OpenAI-compatible chat completions with tool calling, over httpx (OpenAI, vLLM, Ollama, LiteLLM).

``POST {baseURL}/chat/completions`` with the window and ``tools``; parses
``choices[0].message.tool_calls`` (arguments: a JSON string) and ``usage``. The API key (env
``AGENTRUN_MODEL_API_KEY``) goes as ``Authorization: Bearer`` and nowhere else.

Errors: timeout, connection error, 408/409/425/429, 5xx and a malformed body are retryable
(exit 75); other 4xx are permanent (exit 2). Arguments that are not a JSON object are NOT an error
of the lap: the call is kept with ``argument_error`` and the model gets an invalid-arguments answer.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentrun.api.spec import ModelSpec, ToolSpec
from agentrun.api.types import parse_duration
from agentrun.checkpoint.schema import Message, Usage
from agentrun.lap.errors import ConfigError, PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ModelCall, ModelRequest, ModelResponse
from agentrun.lap.keys import normalize_call_ids

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
ERROR_BODY_CHARS = 300


def wire_message(m: Message) -> dict[str, Any]:
    """A stored message in the chat-completions wire form."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, separators=(",", ":"))},
            }
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        out["content"] = m.content or ""
    return out


def wire_tool(t: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Arguments and an error text if they are not a JSON object (string or already-decoded)."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        return {}, f"arguments are not valid JSON ({e.msg} at char {e.pos}): {raw[:200]}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def parse_response(body: Any) -> ModelResponse:
    """The ModelResponse of a chat-completions body; RetryableLapError if it is malformed."""
    try:
        message = body["choices"][0]["message"]
        raw_calls = message.get("tool_calls") or []
        usage = body.get("usage") or {}
        ids = normalize_call_ids([c.get("id") for c in raw_calls])
        calls = []
        for cid, c in zip(ids, raw_calls):
            fn = c.get("function") or {}
            args, err = parse_arguments(fn.get("arguments"))
            calls.append(ModelCall(id=cid, name=str(fn.get("name") or ""), arguments=args, argument_error=err))
        return ModelResponse(
            content=message.get("content"),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            ),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise RetryableLapError(f"model provider returned a malformed response ({type(e).__name__}: {e})") from None


class OpenAIModel:
    """An OpenAI-compatible chat-completions endpoint."""

    def __init__(self, spec: ModelSpec, api_key: str | None, client: httpx.Client | None = None) -> None:
        if not spec.base_url:
            raise ConfigError("spec.agent.model.baseURL is required for provider openai")
        self._spec = spec
        self._url = spec.base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._timeout = parse_duration(spec.request_timeout)
        self._client = client or httpx.Client()

    @classmethod
    def from_spec(cls, spec: ModelSpec, api_key: str | None) -> OpenAIModel:
        return cls(spec, api_key)

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self._spec.name, "messages": [wire_message(m) for m in request.messages]}
        if request.tools:
            out["tools"] = [wire_tool(t) for t in request.tools]
        if self._spec.temperature is not None:
            out["temperature"] = float(self._spec.temperature)
        if self._spec.max_output_tokens is not None:
            out["max_tokens"] = self._spec.max_output_tokens
        return out

    def complete(self, request: ModelRequest) -> ModelResponse:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            r = self._client.post(self._url, json=self.payload(request), headers=headers, timeout=self._timeout)
        except httpx.TimeoutException:
            raise RetryableLapError(f"model call timed out after {self._spec.request_timeout}") from None
        except httpx.TransportError as e:
            raise RetryableLapError(f"model provider unreachable ({type(e).__name__})") from None
        if r.status_code in RETRYABLE_STATUS or r.status_code >= 500:
            raise RetryableLapError(f"model provider returned HTTP {r.status_code}")
        if r.status_code >= 400:
            excerpt = " ".join(r.text[:ERROR_BODY_CHARS].split())
            raise PermanentLapError(f"model provider returned HTTP {r.status_code}: {excerpt}")
        try:
            body = r.json()
        except ValueError:
            raise RetryableLapError("model provider returned a body that is not JSON") from None
        return parse_response(body)
