"""An HTTP tool server written with agentrun.toolkit: the ledger of mcp_tool_server.py as a plain
HTTP tool (``spec.agent.tools[].http``), idempotent through the toolkit's ASGI middleware.

    pip install 'agentrun[toolkit]'
    python examples/kit_tool_server.py --port 8767 --db /tmp/ledger.sqlite3

Routes:

- ``POST /book``: ``{"invoice": str, "amountCents": int}`` -> the booking (a side effect). With an
  ``Idempotency-Key`` header (the lap sends one to tools with ``sideEffects: true``) it executes once
  per key; a repeat gets the stored answer with ``Idempotent-Replayed: true``; the same key with
  another body gets 409.
- ``GET /_record``: ``{"executions": {KEY: n}, "withoutKey": n, "bookings": n}`` from the ledger table.

The whole server is the Starlette app plus one line: ``IdempotencyMiddleware(app, store)``.
(examples/tool_server.py, which `make dev` and the e2e tests use, is a stdlib server that keeps its
own record and does the same by hand.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrun.toolkit import IdempotencyMiddleware, SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_tool_server import Ledger  # noqa: E402


def build(db: str, delay: float = 0.0) -> Any:
    ledger = Ledger(db)

    async def book(request: Request) -> JSONResponse:
        try:
            args = await request.json()
            invoice, amount = args["invoice"], args["amountCents"]
            if not isinstance(invoice, str) or not isinstance(amount, int):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'body must be {"invoice": string, "amountCents": integer}'}, status_code=400)
        if delay:
            import anyio

            await anyio.sleep(delay)
        booking = ledger.book(invoice, amount, request.headers.get("Idempotency-Key"))
        return JSONResponse({"booking": booking, "invoice": invoice, "amountCents": amount, "status": "booked"})

    async def record(_: Request) -> JSONResponse:
        return JSONResponse(ledger.record())

    app = Starlette(routes=[Route("/book", book, methods=["POST"]), Route("/_record", record, methods=["GET"])])
    return IdempotencyMiddleware(app, SQLiteStore(db))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="ledger.sqlite3", help="SQLite file of the ledger and of the toolkit's keys")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each booking takes (tests)")
    args = parser.parse_args(argv)
    uvicorn.run(build(args.db, args.delay), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
