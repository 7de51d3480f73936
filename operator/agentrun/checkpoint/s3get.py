"""A lean GetObject for the checkpoint store: one SigV4-signed GET over a urllib3 connection pool.

botocore's ``get_object`` spends ~1.2 ms of client CPU per call (parameter validation, the endpoint
rule set, the event hooks, response parsing) on top of the HTTP request; a resume at lap 499 makes
ten of them. ``LeanGet.get`` makes the same request, signed as botocore's ``S3SigV4Auth`` signs it
(``sigv4.sign_get``: the same headers and signature, without botocore's request objects; a test
compares the two) with the credentials of the store's client (fetched per request
with ``get_frozen_credentials()``, so refreshable credentials — web identity, IRSA, SSO — refresh
as they do for the client), and sends it over one thread-safe urllib3 ``PoolManager`` per store
with the client's connect/read timeouts and no retries.

It only answers what it can answer exactly like botocore would (``LeanGet.get``):

- 200: the body's bytes as stored (no content decoding, as botocore), its user metadata (names
  without ``x-amz-meta-``, as botocore's ``Metadata``), ``Last-Modified`` as botocore parses it, its length;
- 404 whose error code is ``NoSuchKey``: ``NOT_FOUND`` (the store raises ``CheckpointNotFound``);
- anything else (403, 404 NoSuchBucket, 3xx, 5xx, throttling, connection errors, timeouts, a body
  over ``max_bytes``, no credentials, an error not expected): ``None``, and the caller makes the
  request again with botocore's ``get_object``, which has the retries and the error translation.

``LeanGet.for_client`` makes one only where the URL is trivially botocore's: an explicit
``http(s)`` endpoint URL with path-style addressing (``endpoint/bucket/key``), no proxy configured
for it in the environment, a region to sign for. Otherwise (AWS's own endpoints, virtual-host
addressing, a proxy) it returns None and every GET is botocore's. ``AGENTRUN_S3_LEAN_GET=false``
turns it off.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import quote, urlsplit

from .sigv4 import canonical_host, sign_get
from .switch import ENV_SWITCH as ENV_SWITCH  # re-exported: the switch of this module
from .switch import enabled

META_PREFIX: Final = "x-amz-meta-"
NOT_FOUND: Final = "NotFound"
ERROR_PEEK = 64 * 1024
"""Bytes of a 404's body read to find its error code (an S3 error document is well under 1 kB)."""


@dataclass(frozen=True)
class Got:
    """A 200 answer: the stored bytes and what botocore's ``get_object`` would say of them."""

    body: bytes
    metadata: dict[str, str]
    last_modified: datetime | None
    content_length: int


def path_style_url(endpoint_url: str, bucket: str, key: str) -> str:
    """``endpoint/bucket/key``, the key percent-encoded as botocore encodes a greedy URI label
    (``percent_encode(key, safe="/~")``: unreserved characters, ``/`` and ``~`` kept)."""
    return f"{endpoint_url.rstrip('/')}/{quote(bucket, safe='')}/{quote(key, safe='/~')}"


def _credentials_of(client: Any) -> Any:
    """The credentials object the client signs with (botocore's ``_get_credentials``, documented
    as private; the same object its request signer holds). None: the client has none."""
    getter = getattr(client, "_get_credentials", None)
    if callable(getter):
        return getter()
    signer = getattr(client, "_request_signer", None)
    return getattr(signer, "_credentials", None)


def _proxied(url: str) -> bool:
    """Whether botocore would send a request for ``url`` through a proxy of the environment
    (``botocore.utils.get_environ_proxies``: ``getproxies()`` unless ``should_bypass_proxies``)."""
    from botocore.utils import should_bypass_proxies

    if should_bypass_proxies(url):
        return False
    proxies = urllib.request.getproxies()
    return bool(proxies.get(urlsplit(url).scheme) or proxies.get("all"))


class LeanGet:
    """GETs of one bucket's objects through one endpoint (see the module docstring). Thread-safe."""

    def __init__(
        self, client: Any, endpoint_url: str, bucket: str, region: str, *,
        connect_timeout: float, read_timeout: float, max_bytes: int, max_connections: int = 10,
    ) -> None:
        import urllib3

        self._client = client
        self._endpoint = endpoint_url
        self._bucket = bucket
        self._region = region
        self._host = canonical_host(endpoint_url)  # the signed host header (the URL's, as botocore's)
        self._max_bytes = max_bytes
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        #: What another sender of the same GETs copies (the operator's, on its event loop).
        self.connect_timeout, self.read_timeout, self.max_connections = connect_timeout, read_timeout, max_connections
        self.ca_certs: str | None = None  # https: the CA bundle botocore verifies the endpoint with
        kwargs: dict[str, Any] = {}
        if urlsplit(endpoint_url).scheme == "https":
            from botocore.httpsession import get_cert_path

            self.ca_certs = os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
            kwargs = {"cert_reqs": "CERT_REQUIRED", "ca_certs": self.ca_certs}
        manager = urllib3.PoolManager(num_pools=1, maxsize=max_connections, block=False, retries=False, **kwargs)
        self._pool = manager.connection_from_url(endpoint_url)  # one host: its pool, without a lookup per GET
        self._lock = threading.Lock()
        self._observers: tuple[Callable[[str], None], ...] = ()
        self.fallbacks = 0
        """GETs answered ``None`` (left to botocore) since the start: for tests and benchmarks."""

    @classmethod
    def for_client(cls, client: Any, endpoint_url: str | None, bucket: str, path_style: bool,
                   max_bytes: int) -> LeanGet | None:
        """A ``LeanGet`` for the store's client, or None where botocore's own URL is not trivially
        ``endpoint/bucket/key`` (see the module docstring) or the switch is off."""
        if not enabled() or not endpoint_url or not path_style:
            return None
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            return None
        if _proxied(endpoint_url):
            return None
        meta = getattr(client, "meta", None)
        region = getattr(meta, "region_name", None)
        config = getattr(meta, "config", None)
        if not region or config is None:
            return None
        connect, read = getattr(config, "connect_timeout", None), getattr(config, "read_timeout", None)
        if not isinstance(connect, int | float) or not isinstance(read, int | float):
            return None  # no timeouts to copy (botocore's are always numbers): botocore's GETs
        return cls(client, endpoint_url, bucket, region, connect_timeout=float(connect), read_timeout=float(read),
                   max_bytes=max_bytes, max_connections=int(getattr(config, "max_pool_connections", None) or 10))

    def observe(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(url)`` before each GET this sends (as botocore's ``before-send`` event
        for its own): tests and benchmarks count the store's reads with both."""
        with self._lock:
            self._observers = (*self._observers, callback)

    def url(self, key: str) -> str:
        return path_style_url(self._endpoint, self._bucket, key)

    def fallback(self) -> None:
        """Count a GET left to botocore (:attr:`fallbacks`)."""
        with self._lock:
            self.fallbacks += 1

    def signed(self, key: str) -> tuple[str, dict[str, str]] | None:
        """The URL and the signed headers of the GET of ``key`` (the observers told), or None: no
        usable credentials (a refresh that fails, too, is left to botocore: its error, its message).
        Shared by :meth:`get` and a sender on an event loop (the operator's)."""
        try:
            credentials = _credentials_of(self._client)
            frozen = credentials.get_frozen_credentials() if credentials is not None else None
            if frozen is None or not frozen.access_key or not frozen.secret_key:
                self.fallback()
                return None
            url = self.url(key)
            headers = sign_get(url, self._host, self._region, frozen.access_key, frozen.secret_key, frozen.token)
        except Exception:  # noqa: BLE001 - any failure of the lean path: botocore makes the request
            self.fallback()
            return None
        for observer in self._observers:
            observer(url)
        # urllib3 (http.client) sends "Accept-Encoding: identity" of its own; another client must too
        headers["Accept-Encoding"] = "identity"
        return url, headers

    def get(self, key: str) -> Got | str | None:
        """``Got`` (200), ``NOT_FOUND`` (404 NoSuchKey) or None (let botocore make the request)."""
        signed = self.signed(key)
        if signed is None:
            return None
        try:
            return self._send(*signed)
        except Exception:  # noqa: BLE001 - any failure of the lean path: botocore makes the request
            self.fallback()
            return None

    # ---------------------------------------------------------------- an answer, as botocore reads it

    def on_status(self, status: int, length_header: str | None) -> str | None:
        """What the answer's status line and length say before its body is read: ``"body"`` (a 200
        to read, at most :attr:`max_bytes`), ``"peek"`` (a 404: read :data:`ERROR_PEEK` bytes for its
        error code, :meth:`on_404`), or None (leave it to botocore; counted)."""
        if status == 404:
            return "peek"
        if status != 200 or (length_header is not None and int(length_header) > self._max_bytes):
            self.fallback()
            return None
        return "body"

    def on_404(self, peek: bytes) -> str | None:
        """``NOT_FOUND`` for a ``NoSuchKey`` error document, else None (left to botocore; counted)."""
        if _error_code(peek) == "NoSuchKey":
            return NOT_FOUND
        self.fallback()
        return None

    def on_body(self, body: bytes, length_header: str | None, header: Callable[[str], str | None],
                names: list[str]) -> Got | None:
        """``Got`` from a 200's body (read up to :attr:`max_bytes` + 1 bytes), or None when it is
        longer or shorter than announced (left to botocore; counted). ``header(name)``: a header's
        value, repeated ones joined; ``names``: the header names as sent."""
        if len(body) > self._max_bytes or (length_header is not None and len(body) != int(length_header)):
            self.fallback()
            return None
        # as botocore's header map: the name after the prefix as sent, repeated headers joined
        metadata = {name[len(META_PREFIX):]: header(name) or "" for name in names if name.lower().startswith(META_PREFIX)}
        last_modified = header("Last-Modified")
        return Got(body, metadata, _timestamp(last_modified) if last_modified else None, len(body))

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def _send(self, url: str, headers: dict[str, str]) -> Got | str | None:
        resp = self._pool.urlopen(
            "GET", urlsplit(url).path, headers=headers, timeout=self._timeout,
            preload_content=False, decode_content=False, redirect=False, retries=False, assert_same_host=False,
        )
        complete = False  # the body was read to its end: the connection can serve the next GET
        try:
            length = resp.headers.get("Content-Length")
            what = self.on_status(resp.status, length)
            if what == "peek":
                peek = resp.read(ERROR_PEEK + 1, decode_content=False)
                complete = len(peek) <= ERROR_PEEK
                return self.on_404(peek)
            if what is None:
                return None
            body = resp.read(self._max_bytes + 1, decode_content=False)
            complete = len(body) <= self._max_bytes
            return self.on_body(body, length, resp.headers.get, list(resp.headers.keys()))
        finally:
            if not complete:
                resp.close()  # unread bytes: drop the connection instead of reading them
            resp.release_conn()


def _error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document, None when there is none."""
    start = body.find(b"<Code>")
    end = body.find(b"</Code>", start)
    if start < 0 or end < 0:
        return None
    return body[start + len(b"<Code>"):end].decode("utf-8", "replace").strip()


def _timestamp(value: str) -> datetime:
    """``Last-Modified`` as botocore's ``parse_timestamp`` gives it (UTC, ``tzutc()``): an RFC 7231
    date (what S3 sends) by the standard library's parser, ~40 times cheaper than dateutil's, and
    anything else by botocore's own parser."""
    from email.utils import parsedate_to_datetime

    from dateutil.tz import tzutc

    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        parsed = None
    if parsed is not None and parsed.tzinfo is not None and not parsed.utcoffset():
        return parsed.replace(tzinfo=tzutc())
    from botocore.utils import parse_timestamp

    slow: datetime = parse_timestamp(value)
    return slow
