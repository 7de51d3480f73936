"""The MCP variant: one execution per idempotency key for tools of an ``mcp`` SDK server.

    from mcp.server.mcpserver import Context, MCPServer
    from agentrun.toolkit.mcp import idempotent_tool

    server = MCPServer("ledger")

    @server.tool()
    @idempotent_tool("sqlite:///ledger-keys.sqlite3")
    async def book(invoice: str, amount: int, ctx: Context) -> dict: ...

The key is read from the ``tools/call`` request's ``_meta["agentrun.dev/idempotency-key"]``
(``agentrun.api.contract.MCP_IDEMPOTENCY_META_KEY``) and from the ``Idempotency-Key`` header of the
streamable HTTP request that carried it; the lap sends both. Both present and different: refused.
Neither: the tool runs plainly (a read-only tool, or a client that is not the lap).

The tool function must take a ``Context`` parameter (any name): that is how the SDK hands it the
request. The fingerprint is the tool function's qualified name and its arguments (canonical JSON,
the context left out). The result is stored as JSON (``pydantic_core.to_jsonable_python``: dicts,
lists, strings, numbers, pydantic models); a repeat returns the stored JSON value, which the SDK
turns into the same tool result. A refusal (same key with other arguments, a result over
``max_body_bytes`` not stored) raises the SDK's ``ToolError`` with the toolkit's message: the caller
gets an ``isError`` result naming the key. A key still in progress after ``wait_seconds`` (a
concurrent duplicate) is answered with an ``isError`` result whose ``_meta`` carries
``agentrun.api.contract.MCP_NOT_EXECUTED_META_KEY``: the lap sends the same key again later, never
a new call. An exception from the
tool is not stored: the key is released and the next call with it executes again.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp_types import CallToolResult, TextContent
from pydantic_core import to_jsonable_python

from agentrun.api.contract import MCP_IDEMPOTENCY_META_KEY, MCP_NOT_EXECUTED_META_KEY
from agentrun.toolkit.core import (
    HEADER,
    IdempotencyError,
    KeyInProgress,
    KeyInvalid,
    Policy,
    begin_async,
    canonical_json,
    check_key,
    execute_async,
    fingerprint,
    off_loop,
)
from agentrun.toolkit.functions import decode_result, encode_result
from agentrun.toolkit.store import Store, open_store

__all__ = ["MCP_IDEMPOTENCY_META_KEY", "idempotent_tool", "key_from_context"]

F = TypeVar("F", bound=Callable[..., Any])


def key_from_context(ctx: Any) -> str | None:
    """The call's key from ``_meta`` and/or the HTTP header; None when neither carries one."""
    rc = ctx.request_context
    meta = rc.meta if isinstance(rc.meta, Mapping) else {}
    from_meta = meta.get(MCP_IDEMPOTENCY_META_KEY)
    headers = getattr(rc.request, "headers", None)
    from_header = headers.get(HEADER) if headers is not None else None
    if from_meta is not None and not isinstance(from_meta, str):
        raise KeyInvalid(repr(from_meta))
    if from_meta is not None and from_header is not None and from_meta != from_header:
        raise ToolError(f"the idempotency key in _meta[{MCP_IDEMPOTENCY_META_KEY!r}] ({from_meta!r}) and the "
                        f"{HEADER} header ({from_header!r}) differ; send one key per call")
    key = from_meta if from_meta is not None else from_header
    return None if key is None else str(key)


def idempotent_tool(store: Store | str | Path | None = None, *, wait_seconds: float = 10.0,
                    lease_seconds: float | None = 300.0,
                    max_body_bytes: int = Policy.max_body_bytes) -> Callable[[F], F]:
    """Make an MCP tool function run once per idempotency key (see the module's text). Put it
    under ``@server.tool()``."""
    st = open_store(store)
    policy = Policy(wait_seconds=wait_seconds, lease_seconds=lease_seconds, max_body_bytes=max_body_bytes)

    def deco(fn: F) -> F:
        ctx_name = find_context_parameter(fn)
        if ctx_name is None:
            raise TypeError(f"@idempotent_tool: {fn.__qualname__} must take a Context parameter "
                            "(`ctx: Context`): the idempotency key arrives in the request it carries")
        name = f"{fn.__module__}.{fn.__qualname__}".encode()
        is_async = inspect.iscoroutinefunction(fn)

        async def run(kwargs: dict[str, Any]) -> Any:
            if is_async:
                return await fn(**kwargs)
            return await anyio.to_thread.run_sync(functools.partial(fn, **kwargs))

        @functools.wraps(fn)
        async def wrapper(**kwargs: Any) -> Any:
            try:
                key = key_from_context(kwargs[ctx_name])
                if key is None:
                    return await run(kwargs)
                check_key(key)
                args = {k: v for k, v in kwargs.items() if k != ctx_name}
                fp = fingerprint(name, canonical_json(to_jsonable_python(args, fallback=repr)))
                token, stored = await begin_async(st, key, fp, policy, off_loop)
                if token is None:
                    assert stored is not None
                    return decode_result(key, stored, policy.max_body_bytes)
            except KeyInProgress as e:
                # not executed by this request: the caller must send the same key again, not a new call
                return CallToolResult(content=[TextContent(type="text", text=e.message)], is_error=True,
                                      _meta={MCP_NOT_EXECUTED_META_KEY: e.code})
            except IdempotencyError as e:
                raise ToolError(e.message) from None
            return await execute_async(st, key, token, lambda: run(kwargs),
                                       lambda value: encode_result(to_jsonable_python(value), policy.max_body_bytes))

        wrapper.store = st  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco
