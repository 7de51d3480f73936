"""The operator's requests to the API server on the event loop: raw JSON, the requests over the
small HTTP/1.1 client of ``http1.py``, the watches over aiohttp.

:class:`Kube` is blocking: each call is handed to a worker thread (``asyncio.to_thread``) and goes
through the ``kubernetes`` client's REST layer, urllib3 and ``http.client``, whose response headers
are parsed by the ``email`` package; a watch holds a thread that hands every batch of events to the
loop. On the loop a request costs about half that CPU with aiohttp, and less again with
:class:`~agentrun.controller.http1.Http1Client` (one pooled keep-alive connection per request in
flight, the request in one write, the response framed in one buffer: bench/analysis.md has the
figures); a watch event wakes only the loop. So :class:`AsyncKube` sends the lap's writes (the Job
create, the status patch, the Event, the deletes), the Lease's requests, the controller's rare reads
and the watch cache's lists over ``Http1Client``, and the watches over aiohttp
(:meth:`AsyncKube.stream`: a long-lived streamed body, which aiohttp's reader serves).

It keeps :class:`Kube`'s contract: the same URL and headers (:func:`~agentrun.controller.kube.prepare`
over :meth:`Kube.base`: the ``kubernetes`` client's own ``param_serialize`` with its token refresh,
every ``HEADERS_REUSE_SECONDS``, at once after a 401; made in a thread, since a refresh may read a
file or run a credential plugin), the JSON document back, an ``ApiException`` with status, reason and
body on a non-2xx, and every request counted in ``agentrun_kube_requests_total``. TLS is built from
the client's configuration (the CA, a client certificate, ``verify_ssl``). A configuration it does
not reproduce (an HTTP(S) or SOCKS proxy, a TLS server name or host name assertion of its own,
socket options) keeps every request on :class:`Kube`: :func:`unsupported` says why, and the operator
logs it once at start.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .http1 import Http1Client
from .kube import JsonLines, Kube, dumps, loads, prepare, request_labels

Count = Callable[[str, str, "int | str"], None]


def unsupported(conf: Any) -> str | None:
    """Why the ``kubernetes`` client configuration ``conf`` needs the blocking client, else None."""
    from kubernetes.client.rest import should_bypass_proxies

    if conf is None:
        return "the client has no configuration"
    host = str(getattr(conf, "host", "") or "")
    if not host.startswith(("https://", "http://")):
        return f"API server URL {host!r} is not http(s)"
    if getattr(conf, "proxy", None) and not should_bypass_proxies(host, getattr(conf, "no_proxy", None) or ""):
        return "a proxy is configured"
    if getattr(conf, "tls_server_name", None):
        return "a TLS server name is configured"
    if getattr(conf, "assert_hostname", None) is not None:
        return "a host name assertion is configured"
    if getattr(conf, "socket_options", None):
        return "socket options are configured"
    return None


def ssl_context(conf: Any) -> ssl.SSLContext:
    """TLS as the ``kubernetes`` client's urllib3 pool makes it: its CA (file or data), a client
    certificate and key, or no verification when ``verify_ssl`` is off."""
    ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert or None, cadata=getattr(conf, "ca_cert_data", None) or None)
    if conf.cert_file:
        ctx.load_cert_chain(conf.cert_file, conf.key_file or None)
    if not conf.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _timeout(timeout: float | tuple[float, float] | None) -> aiohttp.ClientTimeout:
    if timeout is None:
        return aiohttp.ClientTimeout(total=None)
    if isinstance(timeout, tuple):
        return aiohttp.ClientTimeout(sock_connect=timeout[0], sock_read=timeout[1])
    return aiohttp.ClientTimeout(total=timeout)


class AsyncKube:
    """Raw-JSON requests on one aiohttp session (made on first use, on the running loop)."""

    def __init__(self, kube: Kube, pool_size: int, count: Count | None = None) -> None:
        self.kube = kube
        self.pool_size = pool_size
        self.count = count
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: dict[str, Http1Client] = {}  # origin -> the requests' pool (made on the running loop)
        self._clients_loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            conf = self.kube.api_client.configuration
            connector = aiohttp.TCPConnector(limit=self.pool_size, ssl=ssl_context(conf) if conf.host.startswith(
                "https://") else False, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
            self._loop = loop
        return self._session

    def _client(self, url: str) -> tuple[Http1Client, str]:
        """The pool of ``url``'s origin and the request target (path and query) in ``url``."""
        loop = asyncio.get_running_loop()
        if self._clients_loop is not loop:
            self._clients, self._clients_loop = {}, loop
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        client = self._clients.get(origin)
        if client is None:
            conf = self.kube.api_client.configuration
            client = self._clients[origin] = Http1Client(
                origin, ssl_context(conf) if parts.scheme == "https" else None, limit=self.pool_size, keepalive=60.0)
        return client, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    @property
    def opened(self) -> int:
        """Connections the requests opened since the start (the watches' are aiohttp's): tests."""
        return sum(c.opened for c in self._clients.values())

    async def _base(self) -> tuple[str, dict[str, str]]:
        fresh = self.kube.fresh_base()
        return fresh if fresh is not None else await asyncio.to_thread(self.kube.base)

    def _counted(self, verb: str, resource: str, code: int | str) -> None:
        if self.count is not None:
            self.count(verb, resource, code)

    async def request(self, method: str, path_: str, *, query: dict[str, Any] | None = None, body: Any = None,
                      content_type: str | None = None, timeout: float | tuple[float, float] | None = 30.0) -> Any:
        """The response's JSON document; an ``ApiException`` (status, reason, body) on a non-2xx."""
        from kubernetes.client.exceptions import ApiException

        url, headers = prepare(*await self._base(), path_, query, body, content_type)
        verb, resource = request_labels(method, url)
        try:
            client, target = self._client(url)
            resp = await client.request(method, target, headers, None if body is None else dumps(body), timeout)
            raw, status, reason = resp.body, resp.status, resp.reason
        except Exception as exc:
            self._counted(verb, resource, "<error>")
            if isinstance(exc, TimeoutError):  # aiohttp's carries no message: say what timed out
                raise TimeoutError(f"{method} {path_}: no answer from the API server within {timeout}s") from exc
            raise
        self._counted(verb, resource, status)
        if status == 401:
            self.kube.unauthorized()
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=reason, body=raw.decode("utf-8", "replace"))
        return loads(raw) if raw else None

    async def stream(self, path_: str, query: dict[str, Any], timeout: tuple[float, float]) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a watch (``watch=true`` is added), one JSON document per line, as
        :meth:`Kube.stream` yields them; the watch is counted when its response begins. Close it
        (``contextlib.aclosing``) to end the watch before the server does."""
        from kubernetes.client.exceptions import ApiException

        url, headers = prepare(*await self._base(), path_, {**query, "watch": "true"}, None, None)
        verb, resource = request_labels("GET", url)
        try:
            resp = await self._open().get(url, headers=headers, timeout=_timeout(timeout))
        except Exception as exc:
            self._counted(verb, resource, "<error>")
            if isinstance(exc, TimeoutError):
                raise TimeoutError(f"watch {path_}: no answer from the API server within {timeout[0]}s") from exc
            raise
        async with resp:
            self._counted(verb, resource, resp.status)
            if resp.status == 401:
                self.kube.unauthorized()
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=resp.reason,
                                   body=(await resp.read()).decode("utf-8", "replace"))
            lines = JsonLines()
            try:
                async for chunk in resp.content.iter_any():
                    for doc in lines.feed(chunk):
                        yield doc
            except TimeoutError as exc:  # the read timeout: a silent connection
                raise TimeoutError(f"watch {path_}: nothing from the API server for {timeout[1]}s") from exc
            for doc in lines.end():
                yield doc

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients = {}
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
