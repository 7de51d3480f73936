"""A small HTTP/1.1 client on the event loop for the operator's requests to the API server.

aiohttp's request path (its session, request and response objects, the timeout handles, the header
multidicts, the cookie jar, the tracing hooks) is a few hundred microseconds of Python per request on
a busy 2-core box, several times the work of the request itself; the operator makes 3-4 per lap. This
client does only what those requests need: one origin (the API server), keep-alive connections in a
pool, a request written in one ``write``, a response read into one buffer and framed by its
``Content-Length`` or chunked transfer coding (or, with neither, by the end of the connection), no
content coding (``Accept-Encoding`` is never sent, so the server sends the body as it is), no
redirects, no retries: a failure is the caller's to retry (a reconcile's backoff).

Bounds: a response head of at most :data:`MAX_HEAD` bytes and a body of at most ``max_body`` bytes,
else :class:`HttpError`. A request's header names and values may hold no CR or LF (no header can be
injected through a value). A connection whose response was not read to its end (a timeout, a
cancellation, an error) is closed, never reused. Watches stay on aiohttp (``akube.AsyncKube.stream``).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

#: Longest response head (status line and headers) read before the response is refused.
MAX_HEAD = 64 * 1024
#: Longest response body by default (a LIST page of 500 runs is a few MB).
MAX_BODY = 256 * 1024 * 1024


class HttpError(Exception):
    """A response this client cannot read (malformed, over a bound) or a connection that ended early."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    names: tuple[str, ...] = ()  # the header names as sent, each once, in their order


class _Reader:
    """Frames one HTTP/1.1 response out of the bytes of a connection (pure: fed bytes, says when done)."""

    def __init__(self, max_body: int, head_only: bool) -> None:
        self.max_body, self.head_only = max_body, head_only
        self.buf = bytearray()
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.names: dict[str, None] = {}  # as sent, in order
        self.keep_alive = False
        self._length: int | None = None  # Content-Length framing
        self._chunked = False
        self._until_eof = False
        self._head_done = False
        self._body = bytearray()
        self._pos = 0  # chunked: where the next chunk's size line starts in buf
        self.done = False

    def feed(self, data: bytes) -> None:
        self.buf += data
        self._advance()

    def eof(self) -> None:
        """The peer closed its side: the end of a body framed by the connection's end, else an error."""
        if self.done:
            return
        if self._head_done and self._until_eof:
            self._body += self.buf
            self.buf.clear()
            self._check_size(len(self._body))
            self.done = True
            return
        raise HttpError("the connection ended before the response did")

    def body(self) -> bytes:
        return bytes(self._body)

    def _check_size(self, n: int) -> None:
        if n > self.max_body:
            raise HttpError(f"response body over {self.max_body} bytes")

    def _advance(self) -> None:
        if not self._head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    raise HttpError(f"response head over {MAX_HEAD} bytes")
                return
            if end > MAX_HEAD:
                raise HttpError(f"response head over {MAX_HEAD} bytes")
            self._head(bytes(self.buf[:end]))
            del self.buf[:end + 4]
            self._head_done = True
        if self.done:
            return
        if self._length is not None:
            if len(self.buf) >= self._length:
                self._body += self.buf[:self._length]
                del self.buf[:self._length]
                self.done = True
        elif self._chunked:
            self._chunks()
        else:  # until EOF
            self._check_size(len(self._body) + len(self.buf))

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise HttpError(f"malformed status line {lines[0][:80]!r}")
        version, self.status, self.reason = parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""
        if 100 <= self.status < 200:
            raise HttpError(f"unexpected informational response {self.status}")  # no Expect is ever sent
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpError(f"malformed header line {line[:80]!r}")
            key, value = name.lower(), value.strip()
            self.names[name] = None
            self.headers[key] = f"{self.headers[key]}, {value}" if key in self.headers else value
        conn = self.headers.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and "close" not in conn or "keep-alive" in conn
        te = self.headers.get("transfer-encoding", "").lower()
        if self.head_only or self.status in (204, 304):
            self._length = 0
        elif te:
            if te.replace(" ", "") != "chunked":
                raise HttpError(f"unsupported transfer-encoding {te[:40]!r}")
            self._chunked = True
        elif "content-length" in self.headers:
            text = self.headers["content-length"]
            if not text.isdigit():
                raise HttpError(f"malformed content-length {text[:40]!r}")
            self._length = int(text)
            self._check_size(self._length)
        else:
            self._until_eof = True
            self.keep_alive = False

    def _chunks(self) -> None:
        buf = self.buf
        while True:
            eol = buf.find(b"\r\n", self._pos)
            if eol < 0:
                if len(buf) - self._pos > 1024:
                    raise HttpError("malformed chunk size line")
                break
            size_text = bytes(buf[self._pos:eol]).split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or size_text.strip(b"0123456789abcdefABCDEF"):
                raise HttpError(f"malformed chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:  # the last chunk: trailers (ignored) up to an empty line
                end = buf.find(b"\r\n\r\n", eol)  # at eol itself when there is no trailer
                if end < 0:
                    break
                del buf[:end + 4]
                self._pos = 0
                self.done = True
                return
            start, stop = eol + 2, eol + 2 + size
            if len(buf) < stop + 2:
                break
            if buf[stop:stop + 2] != b"\r\n":
                raise HttpError("chunk not followed by CRLF")
            self._body += buf[start:stop]
            self._check_size(len(self._body))
            self._pos = stop + 2
        if self._pos:
            del buf[:self._pos]
            self._pos = 0


class _Conn(asyncio.Protocol):
    """One connection: at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: _Reader | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:  # bytes while idle: nothing was asked; the connection is not usable
            self.close()
            return
        try:
            reader.feed(data)
        except HttpError as exc:
            self._finish(exc)
            return
        if reader.done:
            self._finish(None)

    def eof_received(self) -> bool | None:
        reader = self.reader
        if reader is not None:
            try:
                reader.eof()
            except HttpError as exc:
                self._finish(exc)
                return None
            self._finish(None)
        self.closed = True
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reader is not None and not self.reader.done:
            self._finish(HttpError(f"the connection was lost: {exc}" if exc else "the connection was closed"))

    def _finish(self, exc: Exception | None) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
        if exc is not None:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _check_header(text: str) -> str:
    if "\r" in text or "\n" in text:
        raise ValueError(f"a header may not hold CR or LF: {text[:40]!r}")
    return text


class Http1Client:
    """Requests to one origin (``base_url``: ``http(s)://host[:port]``) over a pool of at most ``limit``
    keep-alive connections, each kept idle at most ``keepalive`` seconds."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None, limit: int = 10,
                 keepalive: float = 60.0, max_body: int = MAX_BODY) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {base_url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.ssl = ssl_context if self.https else None
        if self.https and self.ssl is None:
            raise ValueError("https needs an SSL context")
        default = 443 if self.https else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default else f"{host}:{self.port}"
        self.limit, self.keepalive, self.max_body = limit, keepalive, max_body
        self._idle: collections.deque[_Conn] = collections.deque()
        self._slots = asyncio.Semaphore(limit)
        self.opened = 0  # connections opened since the start (tests, benchmarks)

    async def _connect(self, timeout: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            _, conn = await loop.create_connection(
                _Conn, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None)
        self.opened += 1
        return conn

    def _reuse(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used first
            if not conn.closed and now - conn.idle_since < self.keepalive and not (
                    conn.transport is not None and conn.transport.is_closing()):
                return conn
            conn.close()
        return None

    async def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None = None,
                      timeout: float | tuple[float, float] | None = 30.0) -> Response:
        """Send ``method target`` (``target``: the path and query) and read the whole response.
        ``timeout``: the whole request, or (connect, response) for a new connection's connect and the
        response's wait."""
        connect_timeout: float | None = None
        read_timeout: float | None = None
        total: float | None = None
        if isinstance(timeout, tuple):
            connect_timeout, read_timeout = timeout
        else:
            total = timeout
        lines = [f"{_check_header(method)} {_check_header(target)} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{_check_header(k)}: {_check_header(v)}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        async with asyncio.timeout(total), self._slots:
            conn = self._reuse() or await self._connect(connect_timeout)
            reader = conn.reader = _Reader(self.max_body, head_only=method == "HEAD")
            conn.waiter = asyncio.get_running_loop().create_future()
            ok = False
            try:
                assert conn.transport is not None
                conn.transport.write(payload)
                async with asyncio.timeout(read_timeout):
                    await conn.waiter
                ok = True
            finally:
                conn.reader, conn.waiter = None, None
                if ok and reader.keep_alive and not reader.buf and not conn.closed:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
            return Response(reader.status, reader.reason, reader.headers, reader.body(), tuple(reader.names))

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
