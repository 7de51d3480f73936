"""The MCP variant through a real MCP client session: the SDK's client over streamable HTTP
against examples/mcp_tool_server.py in its own process; the ledger's own record counts executions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from toolkit_servers import example_server, record  # noqa: E402

from agentrun.api.contract import MCP_IDEMPOTENCY_META_KEY  # noqa: E402

KEY = "r_8f2a1c0d4b7e4f109a512c3d4e5f6a7b:4:book_invoice:call_2"


def _result(r: Any) -> tuple[bool, Any]:
    return bool(r.is_error), r.structured_content if not r.is_error else r.content[0].text


def test_twenty_concurrent_mcp_calls_with_one_key_execute_once(tmp_path: Path) -> None:
    async def main(url: str) -> list[Any]:
        out: list[Any] = []
        async with Client(url + "/mcp") as c:
            async def one() -> None:
                out.append(await c.call_tool("book_invoice", {"invoice": "INV-1", "amount_cents": 500},
                                             meta={MCP_IDEMPOTENCY_META_KEY: KEY}))

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(one)
            other = await c.call_tool("book_invoice", {"invoice": "INV-1", "amount_cents": 999},
                                      meta={MCP_IDEMPOTENCY_META_KEY: KEY})
            plain = [await c.call_tool("book_invoice", {"invoice": "INV-2", "amount_cents": 1}) for _ in range(2)]
        return [out, other, plain]

    with example_server("mcp_tool_server.py", tmp_path / "ledger.sqlite3", "--delay", "0.5") as url:
        out, other, plain = anyio.run(main, url)
        rec = record(url)
    assert rec["executions"] == {KEY: 1}, rec
    results = {json.dumps(_result(r), sort_keys=True) for r in out}
    assert len(out) == 20 and len(results) == 1, results
    assert _result(out[0]) == (False, {"booking": 1, "invoice": "INV-1", "amountCents": 500, "status": "booked"})
    # the same key with other arguments: a tool error naming the key, nothing executed
    err, text = _result(other)
    assert err and KEY in text and "different arguments" in text
    # no key (a read-only use, a client that is not the lap): runs every time
    assert rec["withoutKey"] == 2 and all(not r.is_error for r in plain)


def test_the_key_in_the_http_header_alone_is_honoured_and_survives_a_restart(tmp_path: Path) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def call(url: str, meta: dict[str, str] | None) -> Any:
        async with httpx2.AsyncClient(headers={"Idempotency-Key": KEY}, timeout=30) as http:
            async with Client(streamable_http_client(url + "/mcp", http_client=http)) as c:
                return await c.call_tool("book_invoice", {"invoice": "INV-3", "amount_cents": 70}, meta=meta)

    db = tmp_path / "ledger.sqlite3"
    with example_server("mcp_tool_server.py", db) as url:
        a = anyio.run(call, url, None)
        b = anyio.run(call, url, {MCP_IDEMPOTENCY_META_KEY: "another-key"})
    with example_server("mcp_tool_server.py", db) as url:
        c = anyio.run(call, url, {MCP_IDEMPOTENCY_META_KEY: KEY})
        rec = record(url)
    assert _result(a) == _result(c) == (False, {"booking": 1, "invoice": "INV-3", "amountCents": 70,
                                                 "status": "booked"})
    err, text = _result(b)
    assert err and "differ" in text and KEY in text
    assert rec["executions"] == {KEY: 1} and rec["bookings"] == 1


def test_a_duplicate_still_in_progress_is_answered_not_executed_never_a_plain_error(tmp_path: Path) -> None:
    """A second call with the key while the first still runs (past ``wait_seconds``): an isError
    result carrying ``MCP_NOT_EXECUTED_META_KEY`` (the lap then sends the same key again), not a
    plain tool error a model could answer with a new call under a new key."""
    from agentrun.api.contract import MCP_NOT_EXECUTED_META_KEY

    async def main(url: str) -> list[Any]:
        out: list[Any] = []
        async with Client(url + "/mcp") as c:
            async def one(delay: float) -> None:
                await anyio.sleep(delay)
                out.append(await c.call_tool("book_invoice", {"invoice": "INV-9", "amount_cents": 5},
                                             meta={MCP_IDEMPOTENCY_META_KEY: KEY}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0.0)
                tg.start_soon(one, 0.3)
            out.append(await c.call_tool("book_invoice", {"invoice": "INV-9", "amount_cents": 5},
                                         meta={MCP_IDEMPOTENCY_META_KEY: KEY}))
        return out

    with example_server("mcp_tool_server.py", tmp_path / "ledger.sqlite3", "--delay", "2", "--wait-seconds",
                        "0.2") as url:
        second, first, again = anyio.run(main, url)
        rec = record(url)
    assert rec["executions"] == {KEY: 1}, rec
    assert second.is_error and (second.meta or {}).get(MCP_NOT_EXECUTED_META_KEY) == "idempotency-key-in-progress"
    assert KEY in second.content[0].text
    assert not first.is_error and _result(again) == _result(first)
    assert not (first.meta or {}).get(MCP_NOT_EXECUTED_META_KEY)
