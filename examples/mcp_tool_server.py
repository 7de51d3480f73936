"""An MCP tool server written with agentrun.toolkit: a small ledger an agent books invoices into.

    pip install 'agentrun[toolkit]'
    python examples/mcp_tool_server.py --port 8766 --db /tmp/ledger.sqlite3
    # MCP endpoint (streamable HTTP): http://127.0.0.1:8766/mcp ; its record: GET /_record

Tools:

- ``book_invoice(invoice, amount_cents)``: side-effecting. Decorated with the toolkit's
  ``idempotent_tool``: a call carrying an idempotency key (``_meta["agentrun.dev/idempotency-key"]``
  or the ``Idempotency-Key`` header, both sent by the lap) executes once; a repeat gets the stored
  result, the same key with another invoice or amount is refused.
- ``lookup_invoice(invoice)``: read-only, not keyed.

Every *execution* of ``book_invoice`` is written to the ledger table of ``--db`` (the same SQLite
file holds the toolkit's keys, in their own table), so the record survives a restart: ``GET
/_record`` answers ``{"executions": {KEY: n}, "bookings": n, "withoutKey": n}``, what a test or a
person checks "every side effect happened once" against. ``--delay`` makes each booking take that
long (to let concurrent duplicates overlap in tests).
"""

from __future__ import annotations

import argparse
import sqlite3
import threading
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse

from agentrun.toolkit import SQLiteStore
from agentrun.toolkit.mcp import idempotent_tool, key_from_context


class Ledger:
    """The side effect: one row per booking, in a SQLite table."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY, invoice TEXT NOT NULL,"
                         " amount_cents INTEGER NOT NULL, idempotency_key TEXT, booked_at REAL NOT NULL)")
        self._lock = threading.Lock()

    def book(self, invoice: str, amount_cents: int, key: str | None) -> int:
        with self._lock:
            cur = self._db.execute("INSERT INTO ledger (invoice, amount_cents, idempotency_key, booked_at)"
                                   " VALUES (?, ?, ?, ?)", (invoice, amount_cents, key, time.time()))
            return int(cur.lastrowid or 0)

    def find(self, invoice: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT id, amount_cents FROM ledger WHERE invoice = ? ORDER BY id",
                                    (invoice,)).fetchall()
        return [{"booking": r[0], "amountCents": r[1]} for r in rows]

    def record(self) -> dict[str, Any]:
        with self._lock:
            rows = self._db.execute("SELECT idempotency_key, count(*) FROM ledger GROUP BY idempotency_key").fetchall()
            total = self._db.execute("SELECT count(*) FROM ledger").fetchone()[0]
        return {"executions": {k: n for k, n in rows if k is not None},
                "withoutKey": sum(n for k, n in rows if k is None), "bookings": total}


def build(db: str, delay: float = 0.0, wait_seconds: float = 10.0) -> MCPServer:
    ledger = Ledger(db)
    server = MCPServer("agentrun-example-ledger")

    @server.tool()
    @idempotent_tool(SQLiteStore(db), wait_seconds=wait_seconds)
    async def book_invoice(invoice: str, amount_cents: int, ctx: Context) -> dict[str, Any]:
        """Book an invoice into the ledger (a side effect: runs once per idempotency key)."""
        if delay:
            import anyio

            await anyio.sleep(delay)
        booking = ledger.book(invoice, amount_cents, key_from_context(ctx))
        return {"booking": booking, "invoice": invoice, "amountCents": amount_cents, "status": "booked"}

    @server.tool()
    def lookup_invoice(invoice: str) -> dict[str, Any]:
        """The bookings of an invoice (read-only)."""
        return {"invoice": invoice, "bookings": ledger.find(invoice)}

    @server.custom_route("/_record", methods=["GET"])
    async def record(_: Request) -> JSONResponse:
        return JSONResponse(ledger.record())

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="ledger.sqlite3", help="SQLite file of the ledger and of the toolkit's keys")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each booking takes (tests)")
    parser.add_argument("--wait-seconds", type=float, default=10.0,
                        help="how long a duplicate of a key in progress waits for its result before it is "
                             "answered 'not executed, send the same key again'")
    args = parser.parse_args(argv)
    build(args.db, args.delay, args.wait_seconds).run("streamable-http", host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
