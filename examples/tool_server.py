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

The record file (``--record``, JSON lines, one line per *execution*) survives a restart of the
server: it is read back at start, so a key executed before the restart is still refused.

The server counts every request and every execution per key, and never refuses silently: a body
that is not JSON (400) and a known key sent with different arguments (422, the way payment
providers answer a reused key) are answered with an error AND counted. ``GET /_record`` serves the
full record (the chaos invariants read it)::

    {"keys": {KEY: {"requests", "executions", "replays", "conflicts", "firstRequestAt",
                    "lastRequestAt", "executedAt": [...]}},
     "withoutKey": {"requests", "executions"},
     "totals": {"requests", "executions", "replays", "conflicts", "badRequests"}}

Request counts cover this process's life (executions loaded from ``--record`` count as one request
and one execution each). Other endpoints for tests: ``GET /_calls`` (the executed calls, a list),
``GET /_inflight`` (the calls being answered right now: a test can kill a lap while its call is in
flight). An argument ``sleepSeconds`` delays the answer (a slow tool); the request is counted when
it arrives, the execution when the answer is decided.
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


class Recorder:
    """The record of one server: executed calls (with their responses, for replays), per-key request
    and execution counts, requests without a key, refusals. Thread-safe through ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.responses: dict[str, bytes] = {}
        self.arguments: dict[str, Any] = {}  # key -> arguments of its execution
        self.calls: list[dict[str, Any]] = []
        self.keys: dict[str, dict[str, Any]] = {}
        self.without_key = {"requests": 0, "executions": 0}
        self.bad_requests = 0
        self.inflight: list[Any] = []

    def _key(self, key: str) -> dict[str, Any]:
        k = self.keys.get(key)
        if k is None:
            k = self.keys[key] = {"requests": 0, "executions": 0, "replays": 0, "conflicts": 0,
                                  "firstRequestAt": None, "lastRequestAt": None, "executedAt": []}
        return k

    def request(self, key: str | None, at: float) -> None:
        with self.lock:
            if not key:
                self.without_key["requests"] += 1
                return
            k = self._key(key)
            k["requests"] += 1
            k["firstRequestAt"] = k["firstRequestAt"] or at
            k["lastRequestAt"] = at

    def executed(self, call: dict[str, Any], body: bytes) -> None:
        """Under ``lock``: count and keep one execution."""
        key = call.get("idempotencyKey")
        self.calls.append(call)
        if key:
            self.responses[key] = body
            self.arguments[key] = call.get("arguments")
            self._key(key)["executions"] += 1
            self._key(key)["executedAt"].append(call.get("at"))
        else:
            self.without_key["executions"] += 1

    def record(self) -> dict[str, Any]:
        with self.lock:
            keys = {k: {**v, "executedAt": list(v["executedAt"])} for k, v in self.keys.items()}
            tot = {f: sum(v[f] for v in keys.values()) for f in ("requests", "executions", "replays", "conflicts")}
            tot["requests"] += self.without_key["requests"]
            tot["executions"] += self.without_key["executions"]
            tot["badRequests"] = self.bad_requests
            return {"keys": keys, "withoutKey": dict(self.without_key), "totals": tot}

    def admit(self, key: str | None, args: Any) -> None:
        """Called for every request while it is listed in flight, before its answer is decided. The
        server's own recorder does nothing here; a test's recorder may hold a request (the chaos
        suite keeps a lap in flight this way until its fault has landed)."""

    def calls_view(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{**c, "repeatsRefused": self.keys.get(c.get("idempotencyKey") or "", {}).get("replays", 0)}
                    for c in self.calls]


RECORDER = Recorder()  # the module's default (serve() without a recorder, the CLI)
_lock = RECORDER.lock  # kept for callers of the first version
_calls = RECORDER.calls


def load_record(record: str | None, recorder: Recorder = RECORDER) -> int:
    """Read an existing record back (executed calls and their responses); return how many."""
    if not record or not os.path.exists(record):
        return 0
    n = 0
    with open(record, encoding="utf-8") as fh:
        lines = fh.readlines()
    for line in lines:
        try:
            call = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line after a crash of this server
        recorder.request(call.get("idempotencyKey"), call.get("at") or 0.0)
        with recorder.lock:
            resp = call.get("response")
            recorder.executed(call, json.dumps(resp).encode() if resp is not None else b"{}")
        n += 1
    return n


def calls_view() -> list[dict[str, Any]]:
    return RECORDER.calls_view()


def make_handler(record: str | None, recorder: Recorder = RECORDER) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            rec = getattr(self.server, "recorder", None) or recorder  # serve() lets a caller swap it
            if self.path in ("/_calls", "/_inflight"):
                with rec.lock:
                    body = json.dumps(rec.calls if self.path == "/_calls" else rec.inflight).encode()
                return self._send(200, body)
            if self.path == "/_record" and self.command == "GET":
                return self._send(200, json.dumps(rec.record()).encode())
            if self.path == "/calls" and self.command == "GET":
                return self._send(200, json.dumps(rec.calls_view(), indent=1).encode())
            key = self.headers.get("Idempotency-Key")
            rec.request(key, time.time())
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                args = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                with rec.lock:
                    rec.bad_requests += 1
                return self._send(400, b'{"error": "body is not JSON"}')
            entry = {"path": self.path, "arguments": args, "idempotencyKey": key}
            with rec.lock:
                rec.inflight.append(entry)
            try:
                rec.admit(key, args)
                if isinstance(args, dict) and isinstance(args.get("sleepSeconds"), (int, float)):
                    time.sleep(min(float(args["sleepSeconds"]), 60.0))  # a slow tool, for kill-mid-lap tests
            finally:
                with rec.lock:
                    rec.inflight.remove(entry)
            with rec.lock:  # decide under the lock, answer outside it
                if key and key in rec.responses:
                    if rec.arguments.get(key) != args:  # a reused key with other arguments: refuse, loudly
                        rec.keys[key]["conflicts"] += 1
                        answer = (422, json.dumps({"error": f"Idempotency-Key {key} was used with "
                                                            "other arguments"}).encode(), False)
                    else:
                        rec.keys[key]["replays"] += 1
                        answer = (200, rec.responses[key], True)
                else:
                    response = {"ok": True, "path": self.path, "echo": args, "call": len(rec.calls) + 1}
                    call = {"method": self.command, "path": self.path, "arguments": args,
                            "idempotencyKey": key, "at": time.time(), "response": response}
                    body = json.dumps(response).encode()
                    rec.executed(call, body)
                    if record:
                        with open(record, "a", encoding="utf-8") as fh:
                            fh.write(json.dumps(call) + "\n")
                    answer = (200, body, False)
            self._send(*answer)

        def _send(self, code: int, body: bytes, replay: bool = False) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if replay:
                    self.send_header("Idempotent-Replayed", "true")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the caller is gone (a killed lap): what was decided is recorded all the same

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

    return Handler


def serve(port: int, record: str | None = None, host: str = "127.0.0.1",
          recorder: Recorder | None = None) -> ThreadingHTTPServer:
    """Start the server in a thread and return it (``.shutdown()`` to stop; ``.recorder`` is its
    record: pass a new ``Recorder()`` for a server of its own, default the module's)."""
    rec = recorder or RECORDER
    server = ThreadingHTTPServer((host, port), make_handler(record, rec))
    server.recorder = rec  # type: ignore[attr-defined]
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
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/_record", timeout=5) as r:
            rec = json.load(r)
        t, nk = rec["totals"], rec["withoutKey"]
        print(f"{t['requests']} request(s) in all, {nk['requests']} without an Idempotency-Key "
              f"({nk['executions']} executed), {t['conflicts']} key(s) reused with other arguments (refused), "
              f"{t['badRequests']} bad request(s)", file=out)
    except (OSError, KeyError, ValueError):
        pass  # an older server without /_record
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
