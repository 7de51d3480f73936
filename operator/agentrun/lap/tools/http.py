"""HTTP tools: the call's arguments go as the JSON body (GET: query parameters).

Side-effecting tools carry ``Idempotency-Key: <run>:<lap>:<tool>:<callId>``. Extra headers come
from ``AGENTRUN_TOOL_HEADERS_<TOOL>`` (a JSON object) and are never logged or stored.

Failure policy (see docs/lap-runner.md): a 2xx is ``ok``; another 4xx (except 408, 409, 429) is an
``error`` result given back to the model; a timeout, connection error, 408, 409, 429 or 5xx means
the call may or may not have happened, so it is retried inside the lap with the SAME key and, if
it still fails, the lap fails retryably (exit 75) with nothing journaled: the replay sends the same
key again and the provider dedupes. Giving a 5xx to the model instead would invite it to retry
under a new call id, hence a new key, and a possible double side effect.

Result size: at most ``spec.agent.tools[].http.maxResultBytes`` (default 16 KiB) of the body are
read; the rest is not downloaded (the connection is closed) and the result ends with a marker
``[agentrun: result truncated: ...]`` that the model sees and the lap record keeps. So one huge
answer cannot blow up the pod's memory, the checkpoint or the context window.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentrun.api.addresses import AddressRules
from agentrun.api.contract import TOOL_HEADERS_PREFIX, tool_headers_env
from agentrun.api.spec import ToolSpec
from agentrun.api.types import parse_duration
from agentrun.lap.errors import ConfigError, RetryableLapError
from agentrun.lap.interfaces import ToolOutcome
from agentrun.lap.netguard import AddressRefused, TraceHeaders, guarded_client, rules_from_env

if TYPE_CHECKING:
    import httpx

HEADERS_ENV_PREFIX = TOOL_HEADERS_PREFIX
DEFAULT_RESULT_MAX_BYTES = 16384
TRUNCATION_MARKER = "[agentrun: result truncated"
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


def headers_env_name(tool: str) -> str:
    """``AGENTRUN_TOOL_HEADERS_<TOOL>``: upper-cased, ``-`` -> ``_``."""
    return tool_headers_env(tool)


def tool_headers_from_env(tools: list[ToolSpec], env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Extra headers per tool. A malformed value is a ConfigError naming the variable, not the value."""
    return headers_from_env([(t.name, headers_env_name(t.name)) for t in tools], env)


def headers_from_env(named: list[tuple[str, str]], env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Extra headers per name (an HTTP tool's, an MCP server's) from the variable given for it: a JSON
    object of header names to values. A malformed value is a ConfigError naming the variable, not the value."""
    out: dict[str, dict[str, str]] = {}
    for name, var in named:
        raw = env.get(var)
        if not raw:
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(f"{var} is not a JSON object of header names to values") from None
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"{var} must be a JSON object of string header names to string values")
        out[name] = value
    return out


def _query(arguments: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for k, v in arguments.items()}


def truncation_marker(kept: int, total: int | None, limit: int) -> str:
    size = f"{total} bytes" if total is not None else "more than that (not read further)"
    return f"\n{TRUNCATION_MARKER}: kept the first {kept} bytes of {size}; limit maxResultBytes={limit}]"


def read_capped(response: httpx.Response, limit: int) -> tuple[str, bool, int | None]:
    """At most ``limit`` bytes of a streamed body, decoded (a cut UTF-8 sequence is dropped).

    Returns (text, truncated, total size if known from Content-Length)."""
    declared = response.headers.get("Content-Length")
    total = int(declared) if declared and declared.isdigit() else None
    buf = bytearray()
    truncated = False
    for chunk in response.iter_bytes():
        room = limit - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            truncated = True
            break
        buf += chunk
    text = bytes(buf).decode(response.encoding or "utf-8", errors="ignore" if truncated else "replace")
    return text, truncated, total


class HTTPToolRunner:
    """Runs ``http`` tools with httpx; retries transient failures with the same key.

    httpx is imported and the client (its TLS context) created on the first call, not at
    construction: a lap whose response asks for no tool call never pays for them. The client
    checks the address of every connection against ``rules`` (``lap/netguard.py``): a refused
    address fails the lap permanently, naming the tool, the host, the address and the rule, with
    no request sent."""

    def __init__(
        self,
        headers: dict[str, dict[str, str]] | None = None,
        *,
        tries: int = 3,
        backoff_seconds: float = 0.5,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rules: AddressRules | None = None,
        trace: TraceHeaders | None = None,
    ) -> None:
        self._headers = headers or {}
        self._trace = trace
        self._rules = rules or AddressRules()
        self._tries = max(1, tries)
        self._backoff = backoff_seconds
        self._client = client
        self._sleep = sleep

    def secrets(self) -> list[str]:
        """Header values, for redaction of log lines and failure messages."""
        return [v for h in self._headers.values() for v in h.values() if v]

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = guarded_client(self._rules, self._trace, follow_redirects=False)
        return self._client

    def call(self, tool: ToolSpec, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome:
        from agentrun.lap.httpx_lite import httpx

        last = ""
        for attempt in range(1, self._tries + 1):
            if attempt > 1:
                self._sleep(self._backoff * 2 ** (attempt - 2))
            try:
                status_code, body, truncated, total = self._send(tool, arguments, idempotency_key)
            except AddressRefused as e:
                raise AddressRefused(f"tool '{tool.name}': {e}") from None
            except httpx.TimeoutException:
                last = f"timed out after {tool.http.timeout}"
                continue
            except httpx.TransportError as e:
                last = f"connection failed ({type(e).__name__})"
                continue
            if status_code in RETRYABLE_STATUS or status_code >= 500:
                last = f"returned HTTP {status_code}"
                continue
            status: Literal["ok", "error"] = "ok" if 200 <= status_code < 300 else "error"
            text = body if status == "ok" else f"HTTP {status_code}: {body}"
            if truncated:
                limit = tool.http.max_result_bytes
                text += truncation_marker(limit, total, limit)
            return ToolOutcome(status=status, result=text, http_status=status_code)
        raise RetryableLapError(
            f"tool '{tool.name}' {last} ({self._tries} tries with key {idempotency_key}); "
            "the lap is retried with the same key"
        )

    def _send(self, tool: ToolSpec, arguments: dict[str, Any], key: str) -> tuple[int, str, bool, int | None]:
        """(HTTP status, body text capped at maxResultBytes, truncated?, declared size)."""
        headers = {"Accept": "application/json", **self._headers.get(tool.name, {})}
        if tool.side_effects:
            headers["Idempotency-Key"] = key
        timeout = parse_duration(tool.http.timeout)
        if tool.http.method == "GET":
            kw: dict[str, Any] = {"params": _query(arguments)}
        else:
            kw = {"json": arguments}
        with self._http().stream(tool.http.method, tool.http.url, headers=headers, timeout=timeout, **kw) as r:
            text, truncated, total = read_capped(r, tool.http.max_result_bytes)
            return r.status_code, text, truncated, total

    @classmethod
    def from_env(
        cls, tools: list[ToolSpec], env: Mapping[str, str] = os.environ, trace: TraceHeaders | None = None,
    ) -> HTTPToolRunner:
        return cls(tool_headers_from_env(tools, env), rules=rules_from_env(env), trace=trace)
