"""The API-server client: raw JSON requests and watches on one aiohttp session, on the event loop.

The ``kubernetes`` client is kept for what it does well, its configuration: the in-cluster token,
a kubeconfig's exec plugins and client certificates (:func:`load_api_client`). :class:`Client` takes
the URL and the headers of every request from that client's own ``param_serialize`` (its default
headers and ``update_params_for_auth``: the token refresh), reused for :data:`HEADERS_REUSE_SECONDS`
and made again at once after a 401, builds TLS from its configuration (CA, client certificate,
``verify_ssl``, ``tls_server_name``, an HTTP proxy), and sends the request itself: no model classes,
the JSON body decoded by :func:`loads`. Every request is counted (``count(verb, resource, code)``,
labels from :func:`request_labels`); a non-2xx answer raises the ``kubernetes`` client's
``ApiException`` (status, reason, body), which the callers already read.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

Count = Callable[[str, str, "int | str"], None]
Timeout = float | tuple[float, float] | None
#: Headers of one request beside the client's own, as (name, value) pairs: a name may repeat
#: (``Impersonate-Group``), and none may replace the client's credentials.
Headers = Sequence[tuple[str, str]]
#: What a request's own headers may not set: the client's credentials and what it sets itself.
RESERVED_HEADERS = frozenset({"authorization", "host", "content-type", "accept", "content-length"})

#: (group/version prefix, plural) of the built-in resources the operator reads and writes.
JOBS = ("/apis/batch/v1", "jobs")
PODS = ("/api/v1", "pods")
EVENTS = ("/api/v1", "events")
LEASES = ("/apis/coordination.k8s.io/v1", "leases")

#: How long the API server's URL and the headers every request carries (the client's default headers
#: and its credentials) are reused before the client makes them again (running its token refresh:
#: an in-cluster token file re-read, a kubeconfig's auth reloaded); a 401 drops them at once.
HEADERS_REUSE_SECONDS = 10.0


def path(kind: tuple[str, str], namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    """The REST path of a collection (``name`` None) or an object, namespaced or cluster-wide."""
    prefix, plural = kind
    p = prefix + (f"/namespaces/{quote(namespace, safe='')}" if namespace else "") + f"/{plural}"
    if name is not None:
        p += f"/{quote(name, safe='')}"
        if subresource:
            p += f"/{subresource}"
    return p


def request_labels(method: str, url: str) -> tuple[str, str]:
    """(verb, resource) of a request, as the API server's audit names them: GET of a collection is
    ``list`` (``watch`` with ``watch=true``), of an object ``get``; POST ``create``, PUT ``update``,
    PATCH ``patch``, DELETE ``delete``. The resource is the plural, with its subresource
    (``agentruns/status``). ``url`` is a URL or its path and query. (String operations, not
    ``urllib.parse``: this runs for every request.)"""
    if "://" in url:
        at = url.find("/", url.index("://") + 3)
        url = url[at:] if at >= 0 else "/"
    path_, _, query = url.partition("?")
    segs = [s for s in path_.split("/") if s]
    if segs[:1] == ["api"]:
        segs = segs[2:]
    elif segs[:1] == ["apis"]:
        segs = segs[3:]
    else:
        segs = []
    if len(segs) >= 3 and segs[0] == "namespaces":
        segs = segs[2:]
    resource = segs[0] if segs else "other"
    named = len(segs) >= 2
    if len(segs) >= 3:
        resource = f"{resource}/{segs[2]}"
    method = method.upper()
    if method == "GET":
        if "watch=true" in query.split("&") or "watch=1" in query.split("&"):
            verb = "watch"
        else:
            verb = "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
    return verb, resource


def loads(data: bytes | str) -> Any:
    """A JSON document from the API server: orjson (less CPU than ``json.loads``: every watch event is one), and
    ``json`` for what orjson refuses (a lone surrogate escape); what neither reads raises
    ``json``'s error. (orjson reads an integer beyond 64 bits as a float: the API server never
    sends one, it decodes such a number as a float itself.)"""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(doc: Any) -> bytes:
    """A request body's JSON: orjson, and ``json`` for what orjson refuses (a dict key that is not a
    string, an integer beyond 64 bits, a lone surrogate), so every body ``json`` could send goes out."""
    try:
        return orjson.dumps(doc)
    except TypeError:
        return json.dumps(doc).encode()


class JsonLines:
    """A watch's body cut into its JSON documents, one per line, as the chunks arrive."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the chunks of a line not ended yet (joined once it ends)

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The documents completed by ``chunk`` (a line split across chunks waits for its end)."""
        self._parts.append(chunk)
        if b"\n" not in chunk:
            return []
        *done, tail = b"".join(self._parts).split(b"\n")
        self._parts = [tail] if tail else []
        return [loads(line) for line in done if line.strip()]

    def end(self) -> list[dict[str, Any]]:
        """The last document, when the body did not end with a newline."""
        buf, self._parts = b"".join(self._parts), []
        return [loads(buf)] if buf.strip() else []


def api_exception(status: int, reason: str | None, body: str) -> Exception:
    """The ``kubernetes`` client's ``ApiException``: what every caller reads a refusal from."""
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=status, reason=reason, body=body)


def check_supported(conf: Any) -> None:
    """Raise ValueError naming what of the ``kubernetes`` client configuration ``conf`` this client
    does not reproduce (a SOCKS proxy, a host name assertion of its own, socket options: none is
    set from a kubeconfig or in a pod)."""
    host = str(getattr(conf, "host", "") or "")
    if not host.startswith(("https://", "http://")):
        raise ValueError(f"the API server URL {host!r} is not http(s)")
    proxy = str(getattr(conf, "proxy", None) or "")
    if proxy and not proxy.startswith(("http://", "https://")):
        raise ValueError(f"proxy-url {proxy!r}: only an http(s) proxy is supported")
    if getattr(conf, "assert_hostname", None) is not None:
        raise ValueError("a host name assertion (assert_hostname) is not supported")
    if getattr(conf, "socket_options", None):
        raise ValueError("socket options are not supported")


def ssl_context(conf: Any) -> ssl.SSLContext:
    """TLS as the ``kubernetes`` client makes it: its CA (file or data), a client certificate and
    key, or no verification when ``verify_ssl`` is off."""
    ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert or None, cadata=getattr(conf, "ca_cert_data", None) or None)
    if conf.cert_file:
        ctx.load_cert_chain(conf.cert_file, conf.key_file or None)
    if not conf.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Client:
    """Raw-JSON requests and watches on one aiohttp session (made on first use, on the running
    loop), with the auth of ``api_client`` (a ``kubernetes.client.ApiClient``). At most
    ``pool_size`` connections: one per request in flight, one per watch."""

    def __init__(self, api_client: Any, pool_size: int = 16, count: Count | None = None) -> None:
        conf = api_client.configuration
        check_supported(conf)
        self.api_client, self.pool_size, self.count = api_client, pool_size, count
        self._prepared: tuple[float, str, dict[str, str]] | None = None  # (made at, base URL, headers)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeouts: dict[Timeout, aiohttp.ClientTimeout] = {}
        self._extra: dict[str, Any] = {}  # per-request options from the configuration
        if getattr(conf, "proxy", None):
            from kubernetes.client.rest import should_bypass_proxies

            if not should_bypass_proxies(conf.host, getattr(conf, "no_proxy", None) or ""):
                self._extra["proxy"] = conf.proxy
                if getattr(conf, "proxy_headers", None):
                    self._extra["proxy_headers"] = conf.proxy_headers
        if getattr(conf, "tls_server_name", None):
            self._extra["server_hostname"] = conf.tls_server_name

    # ---------------------------------------------------------------- auth

    def fresh_base(self) -> tuple[str, dict[str, str]] | None:
        """:meth:`base` when it need not be made again (no blocking call), else None."""
        prepared = self._prepared
        if prepared is not None and time.monotonic() - prepared[0] < HEADERS_REUSE_SECONDS:
            return prepared[1], prepared[2]
        return None

    def base(self) -> tuple[str, dict[str, str]]:
        """The API server's URL and the headers of every request, from the ``kubernetes`` client's
        ``param_serialize``, reused for :data:`HEADERS_REUSE_SECONDS` (made per request, they would
        be a large part of each request's CPU). Blocking: a refresh may read a file or run a credential plugin."""
        fresh = self.fresh_base()
        if fresh is not None:
            return fresh
        _, url, headers, _, _ = self.api_client.param_serialize(
            method="GET", resource_path="", header_params={}, auth_settings=["BearerToken"])
        self._prepared = (time.monotonic(), url, dict(headers))
        return url, dict(headers)

    def unauthorized(self) -> None:
        """A request was answered 401: the credentials rotated, the next request makes them again."""
        self._prepared = None

    async def _prepare(self, path_: str, query: dict[str, Any] | None, body: Any, content_type: str | None,
                       extra: Headers | None) -> tuple[str, dict[str, str] | list[tuple[str, str]]]:
        fresh = self.fresh_base()
        base, common = fresh if fresh is not None else await asyncio.to_thread(self.base)
        own = {**common, "Accept": "application/json"}
        if body is not None:
            own["Content-Type"] = content_type or "application/json"
        headers: dict[str, str] | list[tuple[str, str]] = own
        if extra:
            for name, _ in extra:
                if name.lower() in RESERVED_HEADERS:
                    raise ValueError(f"a request's own headers may not set {name}")
            headers = [*own.items(), *extra]
        url = base + path_
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return url, headers

    # ---------------------------------------------------------------- transport

    def _open(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            conf = self.api_client.configuration
            connector = aiohttp.TCPConnector(limit=self.pool_size, keepalive_timeout=60, ssl=(
                ssl_context(conf) if conf.host.startswith("https://") else False))
            # no cookies (the API server sets none): the jar's per-request work is skipped
            self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",),
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    def _timeout(self, timeout: Timeout) -> aiohttp.ClientTimeout:
        made = self._timeouts.get(timeout)
        if made is None:
            if timeout is None:
                made = aiohttp.ClientTimeout(total=None)
            elif isinstance(timeout, tuple):
                made = aiohttp.ClientTimeout(sock_connect=timeout[0], sock_read=timeout[1])
            else:
                made = aiohttp.ClientTimeout(total=timeout)
            self._timeouts[timeout] = made
        return made

    def _counted(self, verb: str, resource: str, code: int | str) -> None:
        if self.count is not None:
            self.count(verb, resource, code)

    async def _send(self, method: str, path_: str, query: dict[str, Any] | None, body: Any,
                    content_type: str | None, timeout: Timeout, what: str,
                    headers_: Headers | None = None) -> aiohttp.ClientResponse:
        url, headers = await self._prepare(path_, query, body, content_type, headers_)
        verb, resource = request_labels(method, url)
        try:
            resp = await self._open().request(
                method, URL(url, encoded=True), headers=headers, data=None if body is None else dumps(body),
                timeout=self._timeout(timeout), allow_redirects=False, **self._extra)
        except Exception as exc:
            self._counted(verb, resource, "<error>")
            if isinstance(exc, TimeoutError):  # aiohttp's carries no message: say what timed out
                raise TimeoutError(f"{what} {path_}: no answer from the API server within {timeout}s") from exc
            raise
        self._counted(verb, resource, resp.status)
        if resp.status == 401:
            self.unauthorized()
        return resp

    async def request(self, method: str, path_: str, *, query: dict[str, Any] | None = None, body: Any = None,
                      content_type: str | None = None, timeout: Timeout = 30.0, headers: Headers | None = None) -> Any:
        """The response's JSON document; an ``ApiException`` (status, reason, body) on a non-2xx.
        ``headers`` are sent beside the client's own (``Impersonate-User``: the request is then
        authorized and admitted as that user)."""
        resp = await self._send(method, path_, query, body, content_type, timeout, method, headers)
        async with resp:
            try:
                raw = await resp.read()
            except TimeoutError as exc:
                raise TimeoutError(f"{method} {path_}: the API server's answer did not end within {timeout}s") from exc
        if not 200 <= resp.status <= 299:
            raise api_exception(resp.status, resp.reason, raw.decode("utf-8", "replace"))
        return loads(raw) if raw else None

    async def stream(self, path_: str, query: dict[str, Any], timeout: tuple[float, float],
                     headers: Headers | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a watch (``watch=true`` is added), one JSON document per line; the watch is
        counted when its response begins. Close it (``contextlib.aclosing``) to end the watch
        before the server does. ``headers`` as for :meth:`request`."""
        resp = await self._send("GET", path_, {**query, "watch": "true"}, None, None, timeout, "watch", headers)
        async with resp:
            if not 200 <= resp.status <= 299:
                raise api_exception(resp.status, resp.reason, (await resp.read()).decode("utf-8", "replace"))
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
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def load_api_client(config_file: str | None = None, context: str | None = None) -> Any:
    """The ``kubernetes`` client of this process's credentials: the in-cluster config (the
    ServiceAccount token, refreshed), else the kubeconfig (exec plugins, client certificates).
    A ``config_file`` or ``context`` given names the kubeconfig to use instead."""
    from kubernetes import client
    from kubernetes import config as kconfig

    if config_file is None and context is None:
        try:
            kconfig.load_incluster_config()
        except kconfig.ConfigException:
            kconfig.load_kube_config()
        return client.ApiClient(client.Configuration.get_default_copy())
    conf = client.Configuration()
    kconfig.load_kube_config(config_file=config_file, context=context, client_configuration=conf)
    return client.ApiClient(conf)
