"""A tiny recording HTTP tool server for the examples and the e2e tests.

Every request is answered with a JSON echo and recorded (one JSON line per *executed* call) in
``--record`` (default: stdout only). ``GET /_inflight`` lists the arguments of the calls being
answered right now (a test can kill a lap while its call is in flight). Requests that carry an ``Idempotency-Key`` header already
seen are answered with the original response and NOT executed again, the way a payment provider
does. ``GET /_calls`` lists the executed calls. An argument ``sleepSeconds`` delays the answer (a slow
tool, to kill a lap mid-call in tests).

    python examples/tool_server.py --port 8765 --record /tmp/tool-calls.jsonl
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_lock = threading.Lock()
_responses: dict[str, bytes] = {}
_calls: list[dict[str, Any]] = []
_inflight: list[Any] = []


def make_handler(record: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            if self.path in ("/_calls", "/_inflight"):
                with _lock:
                    body = json.dumps(_calls if self.path == "/_calls" else _inflight).encode()
                return self._send(200, body)
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
                    return self._send(200, _responses[key], replay=True)
                call = {"method": self.command, "path": self.path, "arguments": args,
                        "idempotencyKey": key, "at": time.time()}
                _calls.append(call)
                body = json.dumps({"ok": True, "path": self.path, "echo": args, "call": len(_calls)}).encode()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--record", default=None, help="append executed calls as JSON lines to this file")
    a = parser.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), make_handler(a.record))
    print(f"tool server on http://{a.host}:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
