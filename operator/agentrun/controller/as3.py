"""The checkpoint store's lean GET on the operator's event loop, over ``http1.Http1Client``.

After every lap the operator reads the lap record the lap pod wrote (the status says only what the
store holds). ``CheckpointStore.get_lap`` is blocking: in a worker thread, its lean GET
(``checkpoint/s3get.py``) goes through urllib3 and ``http.client``, and the thread's wake-up, its
hand-off of the GIL and the loop's wake-up after it cost more than the request on a busy box. This
makes the same GET on the loop: the URL and headers signed by :meth:`LeanGet.signed` (SigV4 as
botocore signs, the client's refreshable credentials), the answer read by the same
:meth:`LeanGet.on_status` / :meth:`~LeanGet.on_404` / :meth:`~LeanGet.on_body` as the blocking
sender, with its connect timeout (and its read timeout for the whole answer), no redirects, no
retries, the stored bytes as they are (no content decoding; a body over the record's bound is not
read: the connection is dropped), one kept connection per GET in flight (an S3 service keeps them
open) and, for https, the CA bundle botocore verifies the endpoint with. The record
is then verified, decoded and validated by ``get_lap(fetched=...)``, which makes no request.

Anything it does not answer (no credentials, an error status, a timeout, a refused connection, a
body over the limit) returns None, and the caller reads through ``get_lap(lean=False)`` in a worker
thread: botocore's ``get_object``, its retries and its error messages, as before.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from agentrun.checkpoint.s3get import ERROR_PEEK, Got, LeanGet

from .http1 import Http1Client


class AsyncS3Get:
    """Lean GETs of any store's objects, one pool of kept connections per endpoint (made on first
    use, on the running loop; one TLS context per CA bundle)."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, int], Http1Client] = {}  # (origin, max bytes) -> its pool
        self._loop: asyncio.AbstractEventLoop | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}

    def _ssl(self, lean: LeanGet) -> ssl.SSLContext | None:
        if lean.ca_certs is None:
            return None  # http: no TLS (an https endpoint always has a bundle)
        ctx = self._contexts.get(lean.ca_certs)
        if ctx is None:
            ctx = self._contexts[lean.ca_certs] = ssl.create_default_context(cafile=lean.ca_certs)
        return ctx

    def _client(self, lean: LeanGet, url: str) -> tuple[Http1Client, str]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._clients, self._loop = {}, loop
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        client = self._clients.get((origin, lean.max_bytes))
        if client is None:  # per endpoint as many connections as the store's client pool
            client = self._clients[(origin, lean.max_bytes)] = Http1Client(
                origin, self._ssl(lean), limit=lean.max_connections, keepalive=30.0, max_body=lean.max_bytes)
        return client, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    async def get(self, lean: LeanGet, key: str) -> Got | str | None:
        """``Got`` (200), ``NOT_FOUND`` (404 NoSuchKey) or None (let botocore make the request)."""
        signed = lean.signed(key)
        if signed is None:
            return None
        url, headers = signed
        try:
            client, target = self._client(lean, url)
            resp = await client.request("GET", target, headers, None, timeout=(lean.connect_timeout, lean.read_timeout))
            length = resp.headers.get("content-length")
            what = lean.on_status(resp.status, length)
            if what == "peek":
                return lean.on_404(resp.body[:ERROR_PEEK + 1])
            if what is None:
                return None
            return lean.on_body(resp.body, length, lambda n: resp.headers.get(n.lower()), list(resp.names))
        except Exception:  # noqa: BLE001 - any failure of the lean path (a body over the bound too): botocore's GET
            lean.fallback()
            return None

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients = {}
