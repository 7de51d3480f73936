"""The operator's API-server client: raw JSON over the ``kubernetes`` client's one pooled connection.

The generated ``kubernetes`` API classes validate and deserialize every response into models (about
half of a reconcile's CPU before); the controller needs plain dicts. :class:`Kube` sends requests
through the same ``ApiClient`` (its auth, TLS and urllib3 pool) but builds the URL itself and parses
the JSON body with :func:`loads` (orjson, a third of ``json.loads``'s CPU on a Job): no per-call
model validation.

:func:`instrument` wraps the ``ApiClient``'s REST client so that EVERY request of the process
(these, the Lease elector's, any other) is counted in ``agentrun_kube_requests_total{verb,
resource,code}``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import orjson

log = logging.getLogger("agentrun.controller")

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"

#: (group/version prefix, plural) of the resources the controller reads and writes.
RUNS = (f"/apis/{GROUP}/{VERSION}", PLURAL)
JOBS = ("/apis/batch/v1", "jobs")
PODS = ("/api/v1", "pods")
EVENTS = ("/api/v1", "events")
LEASES = ("/apis/coordination.k8s.io/v1", "leases")


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
    (``agentruns/status``)."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
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
        query = parse_qs(parts.query)
        if query.get("watch", [""])[0] in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
    return verb, resource


def instrument(api_client: Any, count: Callable[[str, str, int | str], None]) -> None:
    """Count every request made through ``api_client`` (idempotent)."""
    rest = api_client.rest_client
    if getattr(rest, "_agentrun_counted", False):
        return
    inner = rest.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb, resource = request_labels(method, url)
        try:
            resp = inner(method, url, *args, **kwargs)
        except Exception as exc:
            code = getattr(exc, "status", None)
            count(verb, resource, code if isinstance(code, int) and code > 0 else "<error>")
            raise
        count(verb, resource, resp.status)
        return resp

    rest.request = request
    rest._agentrun_counted = True


#: How long the API server's URL and the headers every request carries (the client's default headers
#: and its credentials) are reused before the client makes them again (running its token refresh:
#: an in-cluster token file re-read, a kubeconfig's auth reloaded); a 401 drops them at once.
HEADERS_REUSE_SECONDS = 10.0


def prepare(base: str, common: dict[str, str], path_: str, query: dict[str, Any] | None, body: Any,
            content_type: str | None) -> tuple[str, dict[str, str]]:
    """The URL and headers of one request (``common``: the headers every request carries, from
    :meth:`Kube.base`); query parameters that are None are left out. Shared by :class:`Kube` and
    :class:`~agentrun.controller.akube.AsyncKube`, so both send the same request."""
    headers = {**common, "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type or "application/json"
    url = base + path_
    if query:
        url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
    return url, headers


def loads(data: bytes | str) -> Any:
    """A JSON document from the API server. orjson decodes a Job's watch event in about a third of
    ``json.loads``'s CPU (watch events were a seventh of the operator's CPU per lap); what orjson
    refuses and ``json`` reads (a lone surrogate escape) is read by ``json``, and what neither reads
    raises ``json``'s error. (orjson reads an integer beyond 64 bits as a float: the API server
    never sends one, it decodes such a number as a float itself.)"""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(doc: Any) -> bytes:
    """A request body's JSON: orjson (compact, UTF-8; about a tenth of ``json.dumps``'s CPU on a
    status patch), and ``json`` for what orjson refuses (a dict key that is not a string, an
    integer beyond 64 bits, a lone surrogate), so every body ``json`` could send still goes out."""
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


class Kube:
    """Raw-JSON requests on one ``ApiClient`` (one urllib3 pool). Blocking: call in a thread."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self._prepared: tuple[float, str, dict[str, str]] | None = None  # (made at, base URL, headers)

    def fresh_base(self) -> tuple[str, dict[str, str]] | None:
        """:meth:`base` when it need not be made again (no blocking call), else None."""
        prepared = self._prepared
        if prepared is not None and time.monotonic() - prepared[0] < HEADERS_REUSE_SECONDS:
            return prepared[1], prepared[2]
        return None

    def base(self) -> tuple[str, dict[str, str]]:
        """The API server's URL and the headers of every request, from the client's own
        ``param_serialize`` (its default headers and ``update_params_for_auth``), reused for
        :data:`HEADERS_REUSE_SECONDS`: made per request they cost a tenth of a reconcile's CPU (a
        kubeconfig's auth is loaded again on every call). Blocking: a refresh may read a file or run
        a credential plugin."""
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

    def _send(self, method: str, path_: str, query: dict[str, Any] | None, body: Any,
              content_type: str | None, timeout: float | tuple[float, float] | None) -> Any:
        url, headers = prepare(*self.base(), path_, query, body, content_type)
        resp = self.api_client.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
        if resp.status == 401:
            self.unauthorized()
        return resp

    def request(self, method: str, path_: str, *, query: dict[str, Any] | None = None, body: Any = None,
                content_type: str | None = None, timeout: float | tuple[float, float] | None = 30.0) -> Any:
        """The response's JSON document; an ``ApiException`` (status, reason, body) on a non-2xx."""
        from kubernetes.client.exceptions import ApiException

        resp = self._send(method, path_, query, body, content_type, timeout)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
            raise ApiException(status=resp.status, reason=resp.reason, body=text)
        return loads(data) if data else None

    def stream(self, path_: str, query: dict[str, Any], timeout: tuple[float, float]) -> Iterator[dict[str, Any]]:
        """The events of a watch (``watch=true`` is added), one JSON document per line."""
        from kubernetes.client.exceptions import ApiException

        resp = self._send("GET", path_, {**query, "watch": "true"}, None, None, timeout)
        raw = resp.response
        try:
            if not 200 <= resp.status <= 299:
                data = raw.read()
                raise ApiException(status=resp.status, reason=resp.reason,
                                   body=data.decode("utf-8", "replace") if data else "")
            lines = JsonLines()
            for chunk in raw.stream(65536, decode_content=True):
                yield from lines.feed(chunk)
            yield from lines.end()
        finally:
            raw.release_conn()


def new_api_client(pool_size: int) -> Any:
    """One ``ApiClient`` for the process, from the in-cluster config or the kubeconfig, with a
    pool of ``pool_size`` connections; also the default of every ``kubernetes`` API object."""
    from kubernetes import client
    from kubernetes import config as kconfig

    try:
        kconfig.load_incluster_config()
    except kconfig.ConfigException:
        kconfig.load_kube_config()
    conf = client.Configuration.get_default_copy()
    conf.connection_pool_maxsize = pool_size
    api_client = client.ApiClient(conf)
    client.ApiClient.set_default(api_client)
    return api_client
