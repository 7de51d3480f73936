"""A tiny recording HTTP tool server for the examples, `make dev` and the e2e tests.

It plays the side-effecting service an agent calls (a ledger, a payment provider, a mailer): every
request is answered with a JSON echo of its arguments, and every *executed* call is recorded with
its ``Idempotency-Key``. A request whose key was already executed is NOT executed again: it gets
the first response back (header ``Idempotent-Replayed: true``) and only a "repeat refused" counter
moves, the way a payment provider behaves. So after a crash and a replayed lap you can check that
no side effect happened twice:

    python examples/tool_server.py --port 8765 --record /tmp/tool-calls.jsonl   # serve
    python examples/tool_server.py --show            # the record of a running server, as a table
    curl -s http://127.0.0.1:8765/calls              # the same as JSON

``--show`` asks the server at ``--url`` (default: ``$AGENTRUN_TOOL_SERVER``, set by
``.localkube/dev.env``, else http://127.0.0.1:8765).

The record file (``--record``, JSON lines) survives a restart of the server: it is read back at
start, so a key executed before the restart is still refused. Endpoints for tests:
``GET /_calls`` (the executed calls, a list), ``GET /_inflight`` (the calls being answered right
now: a test can kill a lap while its call is in flight). An argument ``sleepSeconds`` delays the
answer (a slow tool).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_lock = threading.Lock()
_responses: dict[str, bytes] = {}
_calls: list[dict[str, Any]] = []
_refused: dict[str, int] = {}  # idempotency key -> repeats answered from the record
_inflight: list[Any] = []


def load_record(record: str | None) -> int:
    """Read an existing record back (executed calls and their responses); return how many."""
    if not record or not os.path.exists(record):
        return 0
    n = 0
    with _lock, open(record, encoding="utf-8") as fh:
        for line in fh:
            try:
                call = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line after a crash of this server
            _calls.append(call)
            key, resp = call.get("idempotencyKey"), call.get("response")
            if key and resp is not None:
                _responses[key] = json.dumps(resp).encode()
            n += 1
    return n


def calls_view() -> list[dict[str, Any]]:
    with _lock:
        return [{**c, "repeatsRefused": _refused.get(c.get("idempotencyKey") or "", 0)} for c in _calls]


def make_handler(record: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            if self.path in ("/_calls", "/_inflight"):
                with _lock:
                    body = json.dumps(_calls if self.path == "/_calls" else _inflight).encode()
                return self._send(200, body)
            if self.path == "/calls" and self.command == "GET":
                return self._send(200, json.dumps(calls_view(), indent=1).encode())
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                args = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                return self._send(400, b'{"error": "body is not JSON"}')
            key = self.headers.get("Idempotency-Key")
            entry = {"path": self.path, "arguments": args, "idempotencyKey": key}
            with _lock:
                _inflight.append(entry)
            try:
                if isinstance(args, dict) and isinstance(args.get("sleepSeconds"), (int, float)):
                    time.sleep(min(float(args["sleepSeconds"]), 60.0))  # a slow tool, for kill-mid-lap tests
            finally:
                with _lock:
                    _inflight.remove(entry)
            with _lock:
                if key and key in _responses:
                    _refused[key] = _refused.get(key, 0) + 1
                    return self._send(200, _responses[key], replay=True)
                response = {"ok": True, "path": self.path, "echo": args, "call": len(_calls) + 1}
                call = {"method": self.command, "path": self.path, "arguments": args,
                        "idempotencyKey": key, "at": time.time(), "response": response}
                _calls.append(call)
                body = json.dumps(response).encode()
                if key:
                    _responses[key] = body
                if record:
                    with open(record, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(call) + "\n")
            self._send(200, body)

        def _send(self, code: int, body: bytes, replay: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if replay:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

    return Handler


def serve(port: int, record: str | None = None, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Start the server in a thread and return it (``.shutdown()`` to stop)."""
    server = ThreadingHTTPServer((host, port), make_handler(record))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def show(url: str, out: Any = sys.stdout) -> int:
    """Print the executed calls of the server at url: one line each, with its key and repeats refused."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/calls", timeout=5) as r:
            calls = json.load(r)
    except OSError as exc:
        print(f"tool_server: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{'#':>3}  {'TIME':8}  {'PATH':22}  {'IDEMPOTENCY-KEY':60}  {'REPEATS-REFUSED':>15}  ARGUMENTS", file=out)
    for i, c in enumerate(calls, 1):
        at = time.strftime("%H:%M:%S", time.localtime(c.get("at") or 0))
        args = json.dumps(c.get("arguments"), separators=(",", ":"))
        print(f"{i:>3}  {at:8}  {c.get('path', ''):22}  {c.get('idempotencyKey') or '-':60}  "
              f"{c.get('repeatsRefused', 0):>15}  {args[:80]}", file=out)
    keys = [c["idempotencyKey"] for c in calls if c.get("idempotencyKey")]
    dup = len(keys) - len(set(keys))
    print(f"{len(calls)} call(s) executed, {sum(c.get('repeatsRefused', 0) for c in calls)} repeat(s) refused, "
          f"{dup} key(s) executed twice", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765, help="port to serve on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--record", default=None, help="append executed calls as JSON lines to this file "
                                                       "(read back at start)")
    parser.add_argument("--port-file", default=None, help="write the port actually bound to this file")
    parser.add_argument("--show", action="store_true", help="print the record of the server at --url and exit")
    parser.add_argument("--url", default=os.environ.get("AGENTRUN_TOOL_SERVER", "http://127.0.0.1:8765"),
                        help="server for --show (default: $AGENTRUN_TOOL_SERVER or http://127.0.0.1:8765)")
    a = parser.parse_args(argv)
    if a.show:
        return show(a.url)
    loaded = load_record(a.record)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(a.record))
    port = server.server_address[1]
    if a.port_file:
        with open(a.port_file, "w", encoding="utf-8") as fh:
            fh.write(f"{port}\n")
    print(f"tool server on http://{a.host}:{port} ({loaded} recorded call(s) loaded)", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
