"""MCP tools: the lap's client of ``spec.agent.mcpServers`` (the official ``mcp`` SDK, streamable HTTP).

``mcp`` (and its HTTP client, ``httpx2``) is imported on first use only: a lap whose run declares no
MCP server never loads it (bench/bench_lap_startup.py measures what it adds when one does).

What the lap sends (docs/tools.md, "MCP tools"):

* ``tools/list`` at the start of every lap (the step journals the listing, so a replay of the lap
  uses the same one); each tool's name, description (at most :data:`MAX_DESCRIPTION_CHARS`) and
  input schema (at most :data:`MAX_SCHEMA_BYTES` of JSON) are kept, at most :data:`MAX_TOOLS` tools
  per server;
* ``tools/call`` with the call's idempotency key, for a tool with side effects (``sideEffects``
  patterns), BOTH as the ``Idempotency-Key`` HTTP header of the request and as
  ``_meta["agentrun.dev/idempotency-key"]`` (``agentrun.api.contract.MCP_IDEMPOTENCY_META_KEY``);
* extra headers from ``AGENTRUN_MCP_HEADERS_<SERVER>`` (the server's ``headersSecretRef``) with every
  request; never logged or stored.

Failure policy, as HTTP tools: a result with ``isError`` is an ``error`` result the model sees; a
JSON-RPC error other than an internal error or a timeout is an ``error`` result too (the server
answered and did not run the tool). A transport failure (connection refused or reset, timeout,
HTTP 5xx, the session closed, a JSON-RPC internal error) means the call may or may not have run:
it is retried inside the lap with the SAME key, then the lap fails retryably (exit 75) with nothing
journaled, and the replay sends the same key again. A connection to an address the run's policies
deny fails the lap permanently (``lap/netguard.py``), no request sent.

Result size: the result text is cut at ``maxResultBytes`` (UTF-8) and ends with the truncation
marker of HTTP tools.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentrun.api.addresses import AddressRules
from agentrun.api.contract import (
    IDEMPOTENCY_KEY_HEADER,
    MCP_IDEMPOTENCY_META_KEY,
    MCP_NOT_EXECUTED_META_KEY,
    mcp_headers_env,
)
from agentrun.api.mcp import McpToolRef
from agentrun.api.spec import McpServer
from agentrun.api.text import escape_controls, truncate
from agentrun.api.types import parse_duration, redact_url
from agentrun.checkpoint.schema import McpServerTools, McpToolInfo
from agentrun.lap.errors import ConfigError, PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ToolOutcome
from agentrun.lap.netguard import AddressRefused, TraceHeaders, check_host, resolve, rules_from_env
from agentrun.lap.tools.http import headers_from_env, truncation_marker

if TYPE_CHECKING:
    import httpx2

MAX_TOOLS = 256
"""Most tools kept of one server's listing (a longer listing fails the lap, naming the server)."""
MAX_PAGES = 16
"""Most pages of ``tools/list`` followed (``nextCursor``)."""
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_BYTES = 65536
MAX_INFO_CHARS = 128
MAX_ERROR_CHARS = 2048


def preload() -> None:
    """Import the SDK's client (and httpx2) now: called in the lap's setup thread."""
    import mcp.client.streamable_http  # noqa: F401
    from mcp import Client  # noqa: F401


def mcp_headers_from_env(servers: list[McpServer], env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Extra headers per server. A malformed value is a ConfigError naming the variable, not the value."""
    return headers_from_env([(s.name, mcp_headers_env(s.name)) for s in servers], env)


def bounded_listing(server: McpServer, tools: Iterable[Any], info: Any) -> McpServerTools:
    """The recorded form of a server's listing (SDK ``Tool`` objects), bounded. A tool whose name
    the lap cannot offer (see ``MCP_TOOL_NAME_PATTERN``) or whose schema is too large is kept with an
    empty schema and a description saying why: the allow-list check and the model see it as is."""
    kept: list[McpToolInfo] = []
    for t in tools:
        if len(kept) >= MAX_TOOLS:
            raise PermanentLapError(f"MCP server '{server.name}' ({redact_url(server.url)}) lists more than "
                                    f"{MAX_TOOLS} tools; use spec.agent.mcpServers[].tools to pick some")
        name = truncate(escape_controls(str(t.name))[0], 128)
        schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"}
        description = truncate(escape_controls(str(t.description or ""))[0], MAX_DESCRIPTION_CHARS)
        if len(json.dumps(schema, separators=(",", ":")).encode()) > MAX_SCHEMA_BYTES:
            raise PermanentLapError(f"MCP server '{server.name}' ({redact_url(server.url)}): the input schema of "
                                    f"tool '{name}' is larger than {MAX_SCHEMA_BYTES} bytes")
        kept.append(McpToolInfo(name=name, description=description, input_schema=schema))
    server_info: dict[str, str] = {}
    for field in ("name", "version"):
        value = getattr(info, field, None) if info is not None else None
        if value:
            server_info[field] = truncate(escape_controls(str(value))[0], MAX_INFO_CHARS)
    return McpServerTools(server=server.name, url=server.url, server_info=server_info, tools=kept)


def result_text(result: Any, limit: int) -> tuple[str, bool]:
    """(the text of a ``CallToolResult``, bounded at ``limit`` UTF-8 bytes plus the marker; isError).
    Text blocks are joined; structured content is given as JSON when there is no text; other blocks
    are named, not inlined."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(block.text))
        else:
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{kind or 'unknown'} content{' ' + str(mime) if mime else ''} omitted]")
    if not any(p for p in parts) and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)]
    raw = "\n".join(parts).encode("utf-8")
    if len(raw) > limit:
        text = raw[:limit].decode("utf-8", errors="ignore") + truncation_marker(limit, len(raw), limit)
    else:
        text = raw.decode("utf-8")
    return text, bool(result.is_error)


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or the exception itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


class _Answered(Exception):
    """The server answered a call with a JSON-RPC error that is not transient: an error result."""


class NotExecuted(Exception):
    """The server answered that it did not execute the call and the same key may be sent again
    (an ``isError`` result with ``MCP_NOT_EXECUTED_META_KEY`` in its ``_meta``: a concurrent
    duplicate still in progress). Transient: retried with the same key, never shown to the model."""


def not_executed(result: Any) -> str | None:
    """Why the server says ``result`` (a ``CallToolResult``) was not executed, or None."""
    if not getattr(result, "is_error", False):
        return None
    why = (getattr(result, "meta", None) or {}).get(MCP_NOT_EXECUTED_META_KEY)
    return truncate(escape_controls(str(why))[0], 80) if why else None


def classify(error: BaseException) -> tuple[Literal["refused", "answered", "transient"], BaseException]:
    """How a failure of an MCP request counts: an address the policies deny (permanent), a JSON-RPC
    error the server answered with (an error result), or a transport failure (retried)."""
    from mcp import types
    from mcp.shared.exceptions import MCPError

    leaves = _leaves(error)
    for e in leaves:
        if isinstance(e, AddressRefused):
            return "refused", e
    for e in leaves:
        if isinstance(e, MCPError) and e.code not in (types.INTERNAL_ERROR, types.CONNECTION_CLOSED,
                                                      types.REQUEST_TIMEOUT):
            return "answered", e
    return "transient", leaves[0]


def _describe(error: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    if isinstance(error, MCPError):
        return f"JSON-RPC error {error.code}: {truncate(escape_controls(error.message)[0], 200)}"
    if isinstance(error, NotExecuted):
        return f"not executed by the server ({error})"
    if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__:
        return "timed out"
    return f"connection failed ({type(error).__name__})"


class AsyncGuardedBackend:
    """The async twin of ``netguard.GuardedBackend`` for httpx2's connection pool: every TCP
    connection's resolved addresses are checked against the run's address rules before it opens."""

    def __init__(self, rules: AddressRules, inner: Any) -> None:
        self.rules, self.inner = rules, inner

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> Any:
        import anyio
        import httpcore2

        try:
            addresses = await anyio.to_thread.run_sync(resolve, host, port)
        except OSError as e:
            raise httpcore2.ConnectError(str(e)) from e
        check_host(host, addresses, self.rules)
        last: Exception | None = None
        for a in addresses:
            try:
                return await self.inner.connect_tcp(str(a), port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as e:
                last = e
        raise last if last is not None else httpcore2.ConnectError(f"no address for {host}")

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> Any:
        return await self.inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_async_client(rules: AddressRules, trace: TraceHeaders | None = None, **kwargs: Any) -> httpx2.AsyncClient:
    """``httpx2.AsyncClient(**kwargs)`` whose every connection is checked; refused (ConfigError) when
    its pool is not where httpx2 keeps it, never used unguarded. With ``trace``, every request carries
    the trace context of the span it is sent in (as ``netguard.guarded_client``)."""
    import httpx2

    if trace is not None:
        async def add_trace(request: httpx2.Request) -> None:
            request.headers.update(trace())

        kwargs["event_hooks"] = {"request": [add_trace]}
    client = httpx2.AsyncClient(**kwargs)
    for transport in [client._transport, *(t for t in client._mounts.values() if t is not None)]:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise ConfigError(f"cannot check connection addresses with this httpx2 ({type(transport).__name__} "
                              "has no connection pool where httpx2 keeps it)")
        pool._network_backend = AsyncGuardedBackend(rules, pool._network_backend)
    return client


class McpToolRunner:
    """Lists and calls the tools of MCP servers (one short session per request, so no connection
    outlives the request it served). Retries transport failures with the same key."""

    def __init__(
        self,
        headers: dict[str, dict[str, str]] | None = None,
        *,
        rules: AddressRules | None = None,
        tries: int = 3,
        backoff_seconds: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        trace: TraceHeaders | None = None,
    ) -> None:
        self._headers = headers or {}
        self._trace = trace
        self._rules = rules or AddressRules()
        self._tries = max(1, tries)
        self._backoff = backoff_seconds
        self._sleep = sleep

    def secrets(self) -> list[str]:
        """Header values, for redaction of log lines and failure messages."""
        return [v for h in self._headers.values() for v in h.values() if v]

    async def _session(self, server: McpServer, extra: dict[str, str], op: Callable[[Any], Any]) -> Any:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        timeout = parse_duration(server.timeout)
        headers = {**self._headers.get(server.name, {}), **extra}
        async with guarded_async_client(self._rules, self._trace, headers=headers, timeout=timeout) as http:
            async with Client(streamable_http_client(server.url, http_client=http), read_timeout_seconds=timeout,
                              cache=None) as client:
                return await op(client)

    def _run(self, what: str, server: McpServer, extra: dict[str, str], op: Callable[[Any], Any]) -> Any:
        """Run ``op(client)`` in a session, retrying transient failures; JSON-RPC answers raise ``_Answered``."""
        import anyio

        last = ""
        for attempt in range(1, self._tries + 1):
            if attempt > 1:
                self._sleep(self._backoff * 2 ** (attempt - 2))
            try:
                return anyio.run(self._session, server, extra, op)
            except Exception as e:  # classified below; nothing is swallowed
                kind, leaf = classify(e)
                if kind == "refused":
                    raise AddressRefused(f"MCP server '{server.name}': {leaf}") from None
                if kind == "answered":
                    raise _Answered(_describe(leaf)) from None
                last = _describe(leaf)
        raise RetryableLapError(f"{what} on MCP server '{server.name}' ({redact_url(server.url)}) {last} "
                                f"({self._tries} tries); the lap is retried")

    def list_tools(self, server: McpServer) -> McpServerTools:
        """The server's tools (every page, bounded) and its name and version."""

        async def op(client: Any) -> McpServerTools:
            tools: list[Any] = []
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor or len(tools) > MAX_TOOLS:
                    break
            return bounded_listing(server, tools, client.server_info)

        try:
            listing: McpServerTools = self._run("tools/list", server, {}, op)
        except _Answered as e:
            raise RetryableLapError(f"tools/list on MCP server '{server.name}' ({redact_url(server.url)}) "
                                    f"failed: {e}; the lap is retried") from None
        return listing

    def call(self, tool: McpToolRef, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome:
        """``tools/call`` of ``tool`` with the key in the header and ``_meta`` (side-effecting tools)."""
        keyed = tool.side_effects
        extra = {IDEMPOTENCY_KEY_HEADER: idempotency_key} if keyed else {}
        meta = {MCP_IDEMPOTENCY_META_KEY: idempotency_key} if keyed else None

        async def op(client: Any) -> Any:
            result = await client.call_tool(tool.tool, arguments, meta=meta)
            why = not_executed(result)
            if why is not None:
                raise NotExecuted(why)
            return result

        try:
            result = self._run(f"tool '{tool.name}'", tool.server, extra, op)
        except _Answered as e:
            return ToolOutcome(status="error", result=truncate(f"MCP error: {e}", MAX_ERROR_CHARS))
        except RetryableLapError as e:
            raise RetryableLapError(f"{e} (key {idempotency_key})") from None
        text, is_error = result_text(result, tool.server.max_result_bytes)
        if is_error:
            return ToolOutcome(status="error", result=f"MCP tool error: {text}")
        return ToolOutcome(status="ok", result=text)

    @classmethod
    def from_env(
        cls, servers: list[McpServer], env: Mapping[str, str] = os.environ, trace: TraceHeaders | None = None,
    ) -> McpToolRunner:
        return cls(mcp_headers_from_env(servers, env), rules=rules_from_env(env), trace=trace)
