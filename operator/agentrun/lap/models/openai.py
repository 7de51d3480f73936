"""OpenAI-compatible chat completions with tool calling, over httpx (OpenAI, vLLM, Ollama, LiteLLM).

``POST {baseURL}/chat/completions`` with the window and ``tools``; parses
``choices[0].message.tool_calls`` (arguments: a JSON string) and ``usage``. The API key (env
``AGENTRUN_MODEL_API_KEY``) goes as ``Authorization: Bearer`` and nowhere else.

Errors (docs/lap-runner.md, "Model endpoint failures"); every message names the endpoint without
credentials or query string, never the API key:

* retryable (exit 75): a timeout (``spec.agent.model.requestTimeout`` bounds the whole call, body
  included), a connection error or a connection cut mid-body, HTTP 408/409/425/429 and 5xx, a body
  that is not JSON (e.g. truncated), JSON without ``choices[0].message`` (some gateways answer a
  transient error with 200);
* permanent (exit 2): HTTP 401/403 (the API key is refused: the message names the Secret, never its
  value), other 4xx, an HTML page where JSON was expected (``baseURL`` points at a web page, not the
  API root), and a body over :data:`MAX_RESPONSE_BYTES` (the model cannot be allowed to fill the
  pod's memory; retrying asks for the same).

Arguments that are not a JSON object are NOT an error of the lap: the call is kept with
``argument_error`` and the model gets an invalid-arguments answer.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from agentrun.api.addresses import AddressRules
from agentrun.api.spec import ModelSpec
from agentrun.api.types import parse_duration, redact_url
from agentrun.checkpoint.schema import Message, Usage
from agentrun.lap.errors import ConfigError, PermanentLapError, RetryableLapError
from agentrun.lap.httpx_lite import httpx
from agentrun.lap.interfaces import ModelCall, ModelRequest, ModelResponse, OfferedTool
from agentrun.lap.keys import normalize_call_ids
from agentrun.lap.netguard import AddressRefused, TraceHeaders, guarded_client

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
ERROR_BODY_CHARS = 300
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""Hard cap of one model response body; a larger body fails the lap permanently, unread past it."""


def _excerpt(data: bytes) -> str:
    return " ".join(data[:ERROR_BODY_CHARS].decode("utf-8", errors="replace").split())


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


def wire_tool(t: OfferedTool) -> dict[str, Any]:
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


def _shape_problem(body: Any) -> str | None:
    """What is missing from a chat-completions body, or None if it has the expected shape."""
    if not isinstance(body, dict):
        return f"a JSON {type(body).__name__}, not an object"
    if isinstance(body.get("error"), dict | str):
        err = body["error"]
        text = err.get("message") if isinstance(err, dict) else err
        return f"an error object: {' '.join(str(text)[:ERROR_BODY_CHARS].split())}"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices[0]"
    if not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        return "no choices[0].message object"
    calls = choices[0]["message"].get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        return "choices[0].message.tool_calls is not a list of objects"
    return None


def parse_response(body: Any, endpoint: str = "the model endpoint") -> ModelResponse:
    """The ModelResponse of a chat-completions body; RetryableLapError if it is malformed."""
    problem = _shape_problem(body)
    if problem:
        raise RetryableLapError(f"model endpoint {endpoint} returned JSON that is not a chat completion: {problem}")
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
        raise RetryableLapError(
            f"model endpoint {endpoint} returned a malformed response ({type(e).__name__}: {e})"
        ) from None


def http_client_for(url: str, rules: AddressRules | None = None, trace: TraceHeaders | None = None) -> httpx.Client:
    """The HTTP client of the model endpoint ``url``. ``httpx.Client()`` loads the CA bundle into a
    TLS context (~20 ms of CPU at every lap start) even when it will never speak TLS. For an
    ``http://`` endpoint with no proxy in the environment it never does (one fixed URL, redirects
    not followed), so that client gets a TLS context with no CA at all, which would refuse every
    certificate (it still requires one and checks the host name): nothing is trusted that was
    trusted before. Any other endpoint, or any proxy variable set, gets ``httpx.Client()``. Either
    checks the address of every connection against ``rules`` (``lap/netguard.py``) and sends the
    trace context with every request (``trace``)."""
    rules = rules or AddressRules()
    if urlsplit(url).scheme == "http" and not urllib.request.getproxies():
        return guarded_client(rules, trace, verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    return guarded_client(rules, trace)


class OpenAIModel:
    """An OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self, spec: ModelSpec, api_key: str | None, client: httpx.Client | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES, rules: AddressRules | None = None,
        trace: TraceHeaders | None = None,
    ) -> None:
        if not spec.base_url:
            raise ConfigError("spec.agent.model.baseURL is required for provider openai")
        self._spec = spec
        self._url = spec.base_url.rstrip("/") + "/chat/completions"
        self.endpoint = redact_url(self._url)
        self._max_bytes = max_response_bytes
        self._api_key = api_key
        self._timeout = parse_duration(spec.request_timeout)
        self._client = client or http_client_for(self._url, rules, trace)

    @classmethod
    def from_spec(
        cls, spec: ModelSpec, api_key: str | None, rules: AddressRules | None = None, trace: TraceHeaders | None = None,
    ) -> OpenAIModel:
        return cls(spec, api_key, rules=rules, trace=trace)

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self._spec.name, "messages": [wire_message(m) for m in request.messages]}
        if request.tools:
            out["tools"] = [wire_tool(t) for t in request.tools]
        if self._spec.temperature is not None:
            out["temperature"] = float(self._spec.temperature)
        if self._spec.max_output_tokens is not None:
            out["max_tokens"] = self._spec.max_output_tokens
        return out

    def _key_hint(self) -> str:
        ref = self._spec.api_key_secret_ref
        if ref is None:
            if self._api_key:
                return "check the API key (AGENTRUN_MODEL_API_KEY)"
            return "no API key is configured (set spec.agent.model.apiKeySecretRef)"
        if not self._api_key:
            return f"the API key from Secret {ref.name!r} key {ref.key!r} is empty"
        return f"check the API key in Secret {ref.name!r} key {ref.key!r}"

    def _read(self, response: httpx.Response, deadline: float) -> bytes:
        """The body, at most ``max_response_bytes`` (PermanentLapError past it), within the deadline."""
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self._max_bytes:
            raise PermanentLapError(
                f"model endpoint {self.endpoint} sent a {int(declared)}-byte response, over the "
                f"{self._max_bytes}-byte limit of one model response"
            )
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self._max_bytes:
                raise PermanentLapError(
                    f"model endpoint {self.endpoint} sent a response over the {self._max_bytes}-byte limit "
                    "of one model response (not read further)"
                )
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("request timeout passed while reading the body")
            chunks.append(chunk)
        return b"".join(chunks)

    def complete(self, request: ModelRequest) -> ModelResponse:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        ep = self.endpoint
        deadline = time.monotonic() + self._timeout
        try:
            with self._client.stream(
                "POST", self._url, json=self.payload(request), headers=headers, timeout=self._timeout
            ) as r:
                status, content_type = r.status_code, r.headers.get("Content-Type", "")
                data = self._read(r, deadline)
        except AddressRefused as e:
            raise AddressRefused(f"model endpoint {ep}: {e}") from None
        except httpx.TimeoutException:
            raise RetryableLapError(
                f"model call to {ep} timed out after {self._spec.request_timeout} (spec.agent.model.requestTimeout)"
            ) from None
        except httpx.TransportError as e:
            raise RetryableLapError(
                f"model endpoint {ep} unreachable or the connection broke mid-response ({type(e).__name__})"
            ) from None
        if status in RETRYABLE_STATUS or status >= 500:
            raise RetryableLapError(f"model endpoint {ep} returned HTTP {status}")
        if status in (401, 403):  # no body excerpt: providers echo (parts of) the refused key
            raise PermanentLapError(f"model endpoint {ep} refused the request with HTTP {status}: {self._key_hint()}")
        if status >= 400:
            raise PermanentLapError(f"model endpoint {ep} returned HTTP {status}: {_excerpt(data)}")
        if "html" in content_type.lower() or data.lstrip()[:1] == b"<":
            raise PermanentLapError(
                f"model endpoint {ep} returned an HTML page (HTTP {status}), not a chat-completions JSON body: "
                "spec.agent.model.baseURL must be the API root, e.g. https://api.openai.com/v1"
            )
        try:
            body = json.loads(data)
        except ValueError as e:
            where = f"{e.msg} at byte {e.pos}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
            raise RetryableLapError(
                f"model endpoint {ep} returned a body that is not JSON ({len(data)} bytes, {where}; "
                f"truncated?): {_excerpt(data)}"
            ) from None
        return parse_response(body, ep)
