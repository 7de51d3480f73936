"""examples/mcp_tool_server.py (the ledger, written with agentrun.toolkit) plus one test route:
``POST /_remove_tool?name=NAME`` removes a tool, so the server lists another set of tools from then
on (the e2e's tool-list change between laps). Same arguments as the example."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from mcp_tool_server import build  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    server = build(args.db, args.delay)

    @server.custom_route("/_remove_tool", methods=["POST"])
    async def remove_tool(request: Request) -> JSONResponse:
        name = request.query_params["name"]
        server.remove_tool(name)
        return JSONResponse({"removed": name})

    server.run("streamable-http", host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
