"""Helpers of the lap runner tests: real local HTTP servers (a recording idempotent tool server and
an OpenAI-compatible chat server), spec builders, in-memory fakes for pure-logic unit tests, and a
subprocess runner for ``agentrun lap``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from agentrun.api.spec import AgentRunSpec, ToolSpec
from agentrun.checkpoint.schema import LapRecord, RunRef
from agentrun.lap.interfaces import ModelRequest, ModelResponse, ToolOutcome

RUN = RunRef(namespace="default", name="invoices", uid="8f2a1c0d-1111-2222-3333-444455556666")


# ------------------------------------------------------------------------ recording tool server


class RecordingToolServer:
    """An HTTP tool server that honours ``Idempotency-Key`` like payment APIs: the first request
    with a key executes and stores its response; a repeat returns the stored response without
    executing. ``executions[key]`` counts real executions; ``requests`` logs every request.

    ``fail_next[path] = [503, 503]`` makes the next requests to that path fail (before executing).
    ``fail_after_execute[path] = n``: execute, store, but answer 503 (the "response lost" case).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: dict[str, int] = defaultdict(int)
        self.stored: dict[str, tuple[int, bytes]] = {}
        self.requests: list[dict[str, Any]] = []
        self.fail_next: dict[str, list[int]] = defaultdict(list)
        self.status_for: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                args = json.loads(raw) if raw else dict(parse_qsl(parts.query))
                key = self.headers.get("Idempotency-Key")
                status, body = server.handle(self.command, parts.path, args, key, dict(self.headers))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def handle(self, method: str, path: str, args: Any, key: str | None, headers: dict[str, str]) -> tuple[int, bytes]:
        with self.lock:
            self.requests.append({"method": method, "path": path, "args": args, "key": key, "headers": headers})
            if self.fail_next[path]:
                return self.fail_next[path].pop(0), b'{"error":"unavailable"}'
            if key is not None and key in self.stored:
                return self.stored[key]
            self.executions[key or f"(no key) {path}"] += 1
            status = self.status_for.get(path, 200)
            body = json.dumps({"tool": path.strip("/"), "echo": args}, sort_keys=True).encode()
            if key is not None:
                self.stored[key] = (status, body)
            return status, body

    def __enter__(self) -> RecordingToolServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------------ OpenAI-compatible server


class ChatServer:
    """A small OpenAI-compatible ``/chat/completions`` server. Each request pops the next reply
    from ``replies`` (status, body dict or raw str); ``requests`` records (headers, body)."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any]] = []
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                server.requests.append((dict(self.headers), body))
                if self.path != "/v1/chat/completions":
                    status, reply = 404, {"error": {"message": f"no route {self.path}"}}
                else:
                    status, reply = server.replies.pop(0) if server.replies else (500, {"error": "no reply"})
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------------ counting TCP listener


class Listener:
    """A TCP listener on ``host`` (an IPv4 or IPv6 address, port chosen free) that accepts, counts
    (``accepted``) and answers every connection with a 200 JSON body ``{}``: "no request was sent"
    to an address is observed, not assumed (Linux routes all of 127.0.0.0/8 to lo). Used by
    tests/lap/test_netguard.py and tests/e2e/test_tenancy_hardening.py."""

    def __init__(self, host: str = "127.0.0.2") -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\n{}")

    def close(self) -> None:
        self.sock.close()


def chat_reply(content: str | None, calls: list[tuple[str, str, str]] = (), prompt: int = 10, completion: int = 5) -> dict[str, Any]:
    """A chat-completions body; calls are (id, name, arguments JSON string)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


# ------------------------------------------------------------------------ specs


def tool(name: str, url: str, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} tool",
        "parameters": kw.pop("parameters", {"type": "object", "properties": {"doc": {"type": "string"}}, "required": ["doc"]}),
        "http": {"url": f"{url}/{name}", "timeout": kw.pop("timeout", "5s"), **kw.pop("http", {})},
        **kw,
    }


def spec_doc(tools: list[dict[str, Any]], script: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    model = {"provider": "scripted", "script": script, "pricing": {"inputPerMillionTokensUSD": "2.50", "outputPerMillionTokensUSD": "10"}}
    model.update(kw.pop("model", {}))
    return {
        "task": kw.pop("task", "Extract every invoice and pay the approved ones."),
        "agent": {"version": kw.pop("version", "v1"), "model": model, "tools": tools, "window": kw.pop("window", {"maxTokens": 4000, "systemPrompt": "You are careful."})},
        "approval": kw.pop("approval", {"owner": "finance", "onTimeout": "reject"}),
        **kw,
    }


def spec_of(doc: dict[str, Any]) -> AgentRunSpec:
    return AgentRunSpec.model_validate(doc)


# ------------------------------------------------------------------------ in-memory fakes (unit tests only)


class FakeModel:
    def __init__(self, responses: list[ModelResponse]) -> None:
        self.responses = responses
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return self.responses[request.lap - 1]


class FakeTools:
    def __init__(self, fail: Callable[[str], Exception | None] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.fail = fail

    def call(self, tool: ToolSpec, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome:
        if self.fail and (e := self.fail(tool.name)):
            raise e
        self.calls.append((tool.name, arguments, idempotency_key))
        return ToolOutcome(status="ok", result=json.dumps({"tool": tool.name, "echo": arguments}, sort_keys=True), http_status=200)


class MemoryJournal:
    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def get(self, name: str) -> dict[str, Any] | None:
        return self.entries.get(name)

    def put(self, name: str, body: dict[str, Any]) -> bool:
        if name in self.entries:
            return False
        self.entries[name] = json.loads(json.dumps(body, default=str))
        return True


class Crash(BaseException):
    """Raised by the in-memory crash hook (unit tests); real crash tests SIGKILL a subprocess."""


# ------------------------------------------------------------------------ comparing records


VOLATILE = {"timings", "attempt", "startedAt", "finishedAt", "replayed", "requestedAt", "prevSha256",
            "storage"}  # storage: sizes of gzip objects holding timestamps


def comparable(record: LapRecord | dict[str, Any]) -> Any:
    """A record without timings, attempt, replayed flags and the hash chain link."""
    doc = record.to_api() if isinstance(record, LapRecord) else record

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(doc)


# ------------------------------------------------------------------------ subprocess


def lap_env(store_env: dict[str, str], spec: dict[str, Any], lap: int, attempt: int = 1, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(store_env)
    env.update({
        "AGENTRUN_NAMESPACE": RUN.namespace, "AGENTRUN_NAME": RUN.name, "AGENTRUN_UID": RUN.uid,
        "AGENTRUN_LAP": str(lap), "AGENTRUN_ATTEMPT": str(attempt), "AGENTRUN_SPEC": json.dumps(spec),
        "AGENTRUN_AGENT_VERSION": spec["agent"]["version"], "AGENTRUN_LOG_FORMAT": "json",
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    })
    env.update(extra)
    return env


def run_lap_process(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrun.cli.main", "lap"], env=env, capture_output=True, text=True, timeout=timeout
    )


def log_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@contextmanager
def servers() -> Iterator[RecordingToolServer]:
    with RecordingToolServer() as s:
        yield s
