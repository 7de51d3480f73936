"""The operator's HTTP/1.1 client (``agentrun.controller.http1``): how a response is framed (pure, fed
in any split), and the client against a server on a local socket that answers with raw bytes: reuse
of a kept connection, none of one the server closes, bounds, timeouts and header injection refused.
Against the real kube-apiserver (TLS, a token, a client certificate) it is exercised by
tests/e2e/test_akube.py and every operator e2e test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.controller.http1 import MAX_HEAD, Http1Client, HttpError, _Reader


def framed(raw: bytes, cuts: list[int], max_body: int = 1 << 20, head_only: bool = False) -> _Reader:
    r = _Reader(max_body, head_only)
    at = 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(raw))) + [len(raw)]:
        r.feed(raw[at:cut])
        at = cut
    return r


def chunked(body: bytes, sizes: list[int], trailer: bytes = b"") -> bytes:
    out, at = b"", 0
    for n in sizes + [len(body)]:
        piece = body[at:at + max(n, 1)]
        if not piece:
            break
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
        at += len(piece)
    return out + b"0\r\n" + trailer + b"\r\n"


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=3000), sizes=st.lists(st.integers(1, 700), max_size=8),
       cuts=st.lists(st.integers(0, 4000), max_size=12), trailer=st.sampled_from([b"", b"X-T: 1\r\n"]))
def test_a_chunked_body_is_the_same_bytes_in_any_split(body: bytes, sizes: list[int], cuts: list[int],
                                                      trailer: bytes) -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n" + \
        chunked(body, sizes, trailer)
    r = framed(raw, cuts)
    assert r.done and r.body() == body and r.status == 200 and r.keep_alive and not r.buf
    assert r.headers["content-type"] == "application/json"


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_a_content_length_body_in_any_split(body: bytes, cuts: list[int]) -> None:
    raw = b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\nX-A: 1\r\nx-a: 2\r\n\r\n" % len(body) + body
    r = framed(raw, cuts)
    assert r.done and r.body() == body and (r.status, r.reason) == (201, "Created") and r.headers["x-a"] == "1, 2"


def test_framing_by_the_end_of_the_connection_and_what_cannot_be_kept() -> None:
    r = framed(b"HTTP/1.1 200 OK\r\n\r\nsome", [])
    assert not r.done and not r.keep_alive
    r.eof()
    assert r.done and r.body() == b"some"
    close = framed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", [])
    assert close.done and not close.keep_alive
    old = framed(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", [])
    assert old.done and not old.keep_alive
    assert framed(b"HTTP/1.1 204 No Content\r\n\r\n", []).done
    head = framed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", [], head_only=True)
    assert head.done and head.body() == b""
    extra = framed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", [])
    assert extra.done and extra.body() == b"ok" and extra.buf == b"EXTRA"  # the client does not reuse it


@pytest.mark.parametrize(("raw", "message"), [
    (b"SMTP 220 hi\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 2x0 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 100 Continue\r\n\r\n", "informational"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed content-length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "unsupported transfer-encoding"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n", "not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", "over 10 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n", None),  # waits: not an error yet
])
def test_malformed_or_oversized_responses_are_refused(raw: bytes, message: str | None) -> None:
    if message is None:
        assert not framed(raw, [], max_body=10).done
        return
    with pytest.raises(HttpError, match=message):
        framed(raw, [], max_body=10)


def test_a_head_longer_than_its_bound_is_refused() -> None:
    with pytest.raises(HttpError, match="response head over"):
        framed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD, [])
    r = framed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", [])
    with pytest.raises(HttpError, match="ended before"):
        r.eof()


# ---------------------------------------------------------------- the client over a local socket

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler, tls: Any = None) -> tuple[asyncio.Server, str, list[int]]:
    """A server on 127.0.0.1 running ``handler`` per connection (over TLS with the server context
    ``tls``); the list counts connections."""
    accepted: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    return server, f"{'https' if tls else 'http'}://127.0.0.1:{port}", accepted


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def test_requests_reuse_a_kept_connection_and_send_what_they_were_given() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            seen.append((head, body))
            out = b'{"n":%d}' % len(seen)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(out), out))
            await writer.drain()

    async def go() -> None:
        server, url, accepted = await serve(keep)
        client = Http1Client(url, None, limit=2)
        try:
            for i in range(3):
                resp = await client.request("PATCH", f"/a/b?x={i}", {"Content-Type": "application/json"}, b'{"a":1}')
                assert (resp.status, resp.body) == (200, b'{"n":%d}' % (i + 1))
            assert len(accepted) == 1 and client.opened == 1  # one connection, kept
            resp = await client.request("GET", "/c", {})
            assert resp.status == 200 and len(accepted) == 1
        finally:
            await client.close()
            server.close()

    asyncio.run(go())
    head, body = seen[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "PATCH /a/b?x=0 HTTP/1.1" and lines[1].startswith("Host: 127.0.0.1:")
    assert "Content-Type: application/json" in lines and "Content-Length: 7" in lines and body == b'{"a":1}'
    assert not any(line.lower().startswith("accept-encoding") for line in lines)  # the body comes as it is
    assert "Content-Length" not in seen[3][0].decode()  # a GET without a body says no length


def test_a_connection_the_server_closes_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async def until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()

    async def go(handler: Handler, body: bytes) -> None:
        server, url, accepted = await serve(handler)
        client = Http1Client(url, None)
        try:
            for _ in range(2):
                assert (await client.request("GET", "/", {})).body == body
            assert len(accepted) == 2 and client.opened == 2
        finally:
            await client.close()
            server.close()

    asyncio.run(go(once, b"ok"))
    asyncio.run(go(until_eof, b"all of it"))


def test_an_idle_connection_closed_by_the_server_is_replaced() -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # keep-alive promised, then closed
        await writer.drain()

    async def go() -> None:
        server, url, accepted = await serve(one_then_close)
        client = Http1Client(url, None)
        try:
            assert (await client.request("GET", "/", {})).body == b"ok"
            await asyncio.sleep(0.1)  # the server's close reaches the idle connection
            assert (await client.request("GET", "/", {})).body == b"ok"
            assert len(accepted) == 2
        finally:
            await client.close()
            server.close()

    asyncio.run(go())


def test_a_timeout_and_an_early_end_are_errors_and_the_connection_is_dropped() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
        await writer.drain()

    async def go() -> None:
        server, url, _ = await serve(silent)
        client = Http1Client(url, None)
        try:
            with pytest.raises(TimeoutError):
                await client.request("GET", "/", {}, timeout=0.2)
            with pytest.raises(TimeoutError):
                await client.request("GET", "/", {}, timeout=(5.0, 0.2))
            assert not client._idle  # neither connection is kept
        finally:
            await client.close()
            server.close()
        server, url, _ = await serve(cut)
        client = Http1Client(url, None)
        try:
            with pytest.raises(HttpError, match="ended before the response did"):
                await client.request("GET", "/", {})
        finally:
            await client.close()
            server.close()

    asyncio.run(go())


def test_a_header_cannot_be_injected_and_origins_are_checked() -> None:
    async def go() -> None:
        client = Http1Client("http://127.0.0.1:9", None)
        with pytest.raises(ValueError, match="CR or LF"):
            await client.request("GET", "/", {"Authorization": "Bearer x\r\nX-Evil: 1"})
        with pytest.raises(ValueError, match="CR or LF"):
            await client.request("GET", "/ HTTP/1.1\r\nX: y", {})

    asyncio.run(go())
    with pytest.raises(ValueError, match="not an http"):
        Http1Client("ftp://host", None)
    with pytest.raises(ValueError, match="needs an SSL context"):
        Http1Client("https://host", None)
    assert Http1Client("https://[::1]:6443", __import__("ssl").create_default_context()).host_header == "[::1]:6443"
    assert Http1Client("http://h:80", None).host_header == "h"


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_over_tls_on_the_operators_loops_it_verifies_the_server_and_keeps_the_connection(
        tmp_path: Any, loop_kind: str) -> None:
    """On uvloop (the operator's default loop, whose TLS transport is not an ``asyncio.Transport``)
    and on asyncio's: TLS with the server verified against the given CA, one kept connection for
    several requests; a CA that does not vouch for the server is refused."""
    import ssl
    import subprocess

    def self_signed(name: str) -> tuple[str, str]:
        cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                        str(cert)], check=True, capture_output=True)
        return str(cert), str(key)

    cert, key = self_signed("server")
    other, _ = self_signed("other")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def go() -> None:
        server, url, accepted = await serve(keep, server_ctx)
        client = Http1Client(url, ssl.create_default_context(cafile=cert))
        wrong = Http1Client(url, ssl.create_default_context(cafile=other))
        try:
            for _ in range(3):
                assert (await client.request("GET", "/", {})).body == b"ok"
            assert client.opened == 1 and len(accepted) == 1
            with pytest.raises(ssl.SSLCertVerificationError):
                await wrong.request("GET", "/", {})
        finally:
            await client.close()
            await wrong.close()
            server.close()

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(go())
    else:
        asyncio.run(go())
