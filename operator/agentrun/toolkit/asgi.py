"""ASGI middleware: one execution per ``Idempotency-Key`` for any ASGI app (Starlette, FastAPI, ...).

    from agentrun.toolkit import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, "sqlite:///ledger-keys.sqlite3")      # or app.add_middleware(...)

A request WITHOUT the header passes through unchanged (the lap sends none to tools declared
``sideEffects: false``). A request with it is answered by :mod:`agentrun.toolkit.core`'s rule:
the first executes; a repeat gets the stored status, body and content type back with
``Idempotent-Replayed: true``; the same key with other arguments gets 409. The arguments are the
method, the path, the query string (sorted) and the body (canonical JSON when it is JSON, else the
bytes). The whole response is buffered and stored BEFORE it is sent, so a client that saw an
answer will see the same answer again. Meant for request/response tools, not streaming.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio

from agentrun.toolkit.core import (
    HEADER,
    IdempotencyError,
    KeyInProgress,
    Policy,
    begin_async,
    canonical_json,
    check_key,
    fingerprint,
    off_loop,
    storable,
)
from agentrun.toolkit.store import Store, StoredResponse, open_store

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REPLAYED_HEADER = "Idempotent-Replayed"


class _Disconnected(Exception):
    pass


DEFAULT_MAX_REQUEST_BYTES = 1 << 20


def _json_response(status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> list[Message]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return [{"type": "http.response.start", "status": status, "headers": headers + (extra or [])},
            {"type": "http.response.body", "body": body}]


def request_fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    """What "the same arguments" means for an HTTP request."""
    q = urlencode(sorted(parse_qsl(query.decode("latin-1"), keep_blank_values=True))).encode()
    try:
        canon = canonical_json(json.loads(body)) if body else b""
    except ValueError:
        canon = body
    return fingerprint(method.upper().encode(), path.encode(), q, canon)


class IdempotencyMiddleware:
    """Wraps an ASGI app. ``store``: a Store, a path or URL (``open_store``), default a SQLite file
    ``agentrun-idempotency.sqlite3`` in the working directory."""

    def __init__(self, app: ASGIApp, store: Store | str | Path | None = None, *, wait_seconds: float = 10.0,
                 lease_seconds: float | None = 300.0, max_body_bytes: int = Policy.max_body_bytes,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.store = open_store(store)
        self.policy = Policy(wait_seconds=wait_seconds, lease_seconds=lease_seconds, max_body_bytes=max_body_bytes)
        self.max_request_bytes = max_request_bytes
        self._header = HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope.get("headers", []) if k == self._header), None)
        if raw is None:
            await self.app(scope, receive, send)
            return
        key = raw.decode("latin-1")
        try:
            check_key(key)
        except IdempotencyError as e:
            return await self._send_all(send, _json_response(e.status, e.body()))
        try:
            body = await self._read_body(receive)
        except _Disconnected:
            return  # the client went away before its request was read: nothing was claimed
        if body is None:
            msg = (f'{{"error":{{"code":"request-too-large","message":"request body over the idempotency '
                   f'middleware\'s limit of {self.max_request_bytes} bytes (max_request_bytes)"}}}}').encode()
            return await self._send_all(send, _json_response(413, msg))
        fp = request_fingerprint(scope.get("method", "GET"), scope.get("path", ""), scope.get("query_string", b""),
                                 body)
        try:
            token, stored = await begin_async(self.store, key, fp, self.policy, off_loop)
        except KeyInProgress as e:
            return await self._send_all(send, _json_response(e.status, e.body(), [(b"retry-after", b"1")]))
        except IdempotencyError as e:
            return await self._send_all(send, _json_response(e.status, e.body()))
        if token is None:
            assert stored is not None
            return await self._send_all(send, self._replay(stored))
        await self._execute(scope, receive, send, key, token, body)

    async def _read_body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # http.disconnect before the body was read
                raise _Disconnected
            part = msg.get("body", b"")
            size += len(part)
            if size > self.max_request_bytes:
                return None
            chunks.append(part)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    def _replay(self, r: StoredResponse) -> list[Message]:
        headers = [(b"content-type", r.content_type.encode("latin-1")), (b"content-length", str(len(r.body)).encode()),
                   (REPLAYED_HEADER.lower().encode(), b"true")]
        if r.size > len(r.body):
            headers.append((b"idempotent-stored-truncated", f"kept {len(r.body)} of {r.size} bytes".encode()))
        return [{"type": "http.response.start", "status": r.status, "headers": headers},
                {"type": "http.response.body", "body": r.body}]

    async def _execute(self, scope: Scope, receive: Receive, send: Send, key: str, token: str, body: bytes) -> None:
        given = False

        async def replay_receive() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        start: Message | None = None
        parts: list[bytes] = []

        async def capture(msg: Message) -> None:
            nonlocal start
            if msg["type"] == "http.response.start":
                start = msg
            elif msg["type"] == "http.response.body":
                parts.append(msg.get("body", b""))

        try:
            await self.app(scope, replay_receive, capture)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await off_loop(self.store.release, key, token)
            raise
        if start is None:
            with anyio.CancelScope(shield=True):
                await off_loop(self.store.release, key, token)
            raise RuntimeError("the app returned without sending a response")
        out = b"".join(parts)
        status = int(start["status"])
        if storable(status):
            ctype = next((v.decode("latin-1") for k, v in start.get("headers", []) if k.lower() == b"content-type"),
                         "application/octet-stream")
            resp = StoredResponse(status, ctype, out[: self.policy.max_body_bytes], len(out))
            with anyio.CancelScope(shield=True):
                await off_loop(self.store.complete, key, token, resp, time.time())
        else:
            with anyio.CancelScope(shield=True):
                await off_loop(self.store.release, key, token)
        await self._send_all(send, [start, {"type": "http.response.body", "body": out}])

    @staticmethod
    async def _send_all(send: Send, messages: list[Message]) -> None:
        for m in messages:
            await send(m)
