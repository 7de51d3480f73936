"""The operator's writes to the API server on the event loop: raw JSON over one aiohttp session.

:class:`Kube` is blocking: each call is handed to a worker thread (``asyncio.to_thread``) and goes
through the ``kubernetes`` client's REST layer, urllib3 and ``http.client``, whose response headers
are parsed by the ``email`` package. Per request that is about a third more CPU than aiohttp on the
loop, whose HTTP parser is C (llhttp), and the hand-off to a thread and back costs more again on a
busy box (bench/analysis.md, 2026-12-01 23:20: 747 µs of CPU per GET through ``to_thread`` against
437 µs). A lap's writes (the Job create, the status patch, the Event) are most of the operator's
requests, so :class:`AsyncKube` sends them.

It keeps :class:`Kube`'s contract: the same URL and headers (made by the ``kubernetes`` client's own
``param_serialize``, with its token refresh, every ``HEADERS_REUSE_SECONDS``, at once after a 401;
made in a thread, since a refresh may read a file or run a credential plugin), the JSON document
back, an ``ApiException`` with status, reason and body on a non-2xx, and every request counted in
``agentrun_kube_requests_total``. TLS is built from the client's configuration (the CA, a client
certificate, ``verify_ssl``). A configuration it does not reproduce (an HTTP(S) or SOCKS proxy, a
TLS server name or host name assertion of its own, socket options) keeps every request on
:class:`Kube`: :func:`unsupported` says why, and the operator logs it once at start.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import aiohttp

from .kube import HEADERS_REUSE_SECONDS, Kube, request_labels

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

    async def _base(self) -> tuple[str, dict[str, str]]:
        prepared = self.kube._prepared
        if prepared is not None and time.monotonic() - prepared[0] < HEADERS_REUSE_SECONDS:
            return prepared[1], prepared[2]
        return await asyncio.to_thread(self.kube._base)

    async def request(self, method: str, path_: str, *, query: dict[str, Any] | None = None, body: Any = None,
                      content_type: str | None = None, timeout: float | tuple[float, float] | None = 30.0) -> Any:
        """The response's JSON document; an ``ApiException`` (status, reason, body) on a non-2xx."""
        from kubernetes.client.exceptions import ApiException

        base, common = await self._base()
        headers = {**common, "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = json.dumps(body).encode()
        url = base + path_
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        verb, resource = request_labels(method, url)
        try:
            async with self._open().request(method, url, data=data, headers=headers,
                                            timeout=_timeout(timeout)) as resp:
                raw = await resp.read()
                status, reason = resp.status, resp.reason
        except Exception as exc:
            if self.count is not None:
                self.count(verb, resource, "<error>")
            if isinstance(exc, TimeoutError):  # aiohttp's carries no message: say what timed out
                raise TimeoutError(f"{method} {path_}: no answer from the API server within {timeout}s") from exc
            raise
        if self.count is not None:
            self.count(verb, resource, status)
        if status == 401:
            self.kube._unauthorized()
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=reason, body=raw.decode("utf-8", "replace"))
        return json.loads(raw) if raw else None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
