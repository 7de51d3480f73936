"""The checkpoint store's lean GET on the operator's event loop, over aiohttp.

After every lap the operator reads the lap record the lap pod wrote (the status says only what the
store holds). ``CheckpointStore.get_lap`` is blocking: in a worker thread, its lean GET
(``checkpoint/s3get.py``) goes through urllib3 and ``http.client``, and the thread's wake-up, its
hand-off of the GIL and the loop's wake-up after it cost more than the request on a busy box. This
makes the same GET on the loop: the URL and headers signed by :meth:`LeanGet.signed` (botocore's
signer, the client's refreshable credentials), the answer read by the same
:meth:`LeanGet.on_status` / :meth:`~LeanGet.on_404` / :meth:`~LeanGet.on_body` as the blocking
sender, with its connect and read timeouts, no redirects, no retries, the stored bytes as they are
(no content decoding) and, for https, the CA bundle botocore verifies the endpoint with. The record
is then verified, decoded and validated by ``get_lap(fetched=...)``, which makes no request.

Anything it does not answer (no credentials, an error status, a timeout, a refused connection, a
body over the limit) returns None, and the caller reads through ``get_lap(lean=False)`` in a worker
thread: botocore's ``get_object``, its retries and its error messages, as before.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

from agentrun.checkpoint.s3get import ERROR_PEEK, Got, LeanGet


class AsyncS3Get:
    """Lean GETs of any store's objects on one aiohttp session (made on first use, on the running
    loop; one TLS context per CA bundle)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}

    def _open(self, lean: LeanGet) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # per host as many connections as the store's client pool; no cookies, no env proxies
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=lean.max_connections, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent", "Accept-Encoding"),
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    def _ssl(self, lean: LeanGet) -> ssl.SSLContext | bool:
        if lean.ca_certs is None:
            return False  # http: no TLS (an https endpoint always has a bundle)
        ctx = self._contexts.get(lean.ca_certs)
        if ctx is None:
            ctx = self._contexts[lean.ca_certs] = ssl.create_default_context(cafile=lean.ca_certs)
        return ctx

    async def get(self, lean: LeanGet, key: str) -> Got | str | None:
        """``Got`` (200), ``NOT_FOUND`` (404 NoSuchKey) or None (let botocore make the request)."""
        signed = lean.signed(key)
        if signed is None:
            return None
        url, headers = signed
        try:
            timeout = aiohttp.ClientTimeout(sock_connect=lean.connect_timeout, sock_read=lean.read_timeout)
            async with self._open(lean).get(url, headers=headers, timeout=timeout, allow_redirects=False,
                                            ssl=self._ssl(lean)) as resp:
                length = resp.headers.get("Content-Length")
                what = lean.on_status(resp.status, length)
                if what == "peek":
                    return lean.on_404(await _read_up_to(resp, ERROR_PEEK + 1))
                if what is None:
                    return None
                body = await _read_up_to(resp, lean.max_bytes + 1)
                names = list(dict.fromkeys(resp.headers.keys()))
                return lean.on_body(body, length, lambda n: ", ".join(resp.headers.getall(n, [])) or None, names)
        except Exception:  # noqa: BLE001 - any failure of the lean path: botocore makes the request
            lean.fallback()
            return None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


async def _read_up_to(resp: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (a longer one is not read to its end: the connection is
    then closed, not reused)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]
