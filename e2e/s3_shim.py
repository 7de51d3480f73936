"""A tiny S3-compatible HTTP server for tests of store behaviours real servers do not show on
demand (tests/checkpoint, tests/e2e/test_lifecycle.py): one that ignores ``If-None-Match: *``
(like older MinIO or some gateways), one that refuses the header (501), and one that answers 409
ConditionalRequestConflict for a while (a concurrent conditional write in flight, as AWS S3 does). Spoken to over HTTP by boto3, like any store.

Path-style only; objects in memory; PUT/GET/HEAD/DELETE of objects, PUT of buckets, and
ListObjectsV2 (one page). Not a general S3 server: only what the store's tests need.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

Mode = Literal["honour", "ignore", "not-implemented"]


@dataclass
class ShimState:
    mode: Mode = "honour"
    conflicts: int = 0
    """Answer the next N conditional PUTs with 409 ConditionalRequestConflict."""
    buckets: set[str] = field(default_factory=set)
    objects: dict[tuple[str, str], tuple[bytes, dict[str, str], float]] = field(default_factory=dict)
    conditional_puts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _decode_aws_chunked(raw: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (botocore's trailing-checksum uploads)."""
    out, pos = b"", 0
    while pos < len(raw):
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0], 16)
        if size == 0:
            break
        out += raw[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = unquote(parts.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, parse_qs(parts.query)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = f"<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
        self._send(status, body.encode(), {"Content-Type": "application/xml"})

    def _body(self) -> bytes:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "aws-chunked" in (self.headers.get("Content-Encoding") or "") or self.headers.get(
                "x-amz-decoded-content-length"):
            return _decode_aws_chunked(raw)
        return raw

    def do_PUT(self) -> None:  # noqa: N802
        st = self.server.state
        bucket, key, _ = self._target()
        body = self._body()
        if not key:
            with st.lock:
                st.buckets.add(bucket)
            return self._send(200)
        if bucket not in st.buckets:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist")
        conditional = self.headers.get("If-None-Match") == "*"
        meta = {k: v for k, v in self.headers.items() if k.lower().startswith("x-amz-meta-")}
        with st.lock:
            exists = (bucket, key) in st.objects
            if conditional:
                st.conditional_puts += 1
                if st.mode == "not-implemented":
                    return self._error(501, "NotImplemented", "If-None-Match is not implemented")
                if st.conflicts > 0:
                    st.conflicts -= 1
                    return self._error(409, "ConditionalRequestConflict",
                                       "A conflicting conditional operation is currently in progress")
                if exists and st.mode == "honour":
                    return self._error(412, "PreconditionFailed", "At least one precondition did not hold")
            st.objects[(bucket, key)] = (body, meta, time.time())
        self._send(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    def _object(self, head: bool) -> None:
        st = self.server.state
        bucket, key, query = self._target()
        if not key and not head:
            return self._list(bucket, query)
        with st.lock:
            found = st.objects.get((bucket, key))
        if found is None:
            if head:
                return self._send(404, head=True)
            return self._error(404, "NoSuchKey", "The specified key does not exist")
        body, meta, at = found
        headers = {**meta, "ETag": f'"{hashlib.md5(body).hexdigest()}"', "Last-Modified": formatdate(at, usegmt=True),
                   "Content-Type": "application/octet-stream"}
        if head:
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return None
        return self._send(200, body, headers)

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        st = self.server.state
        prefix = (query.get("prefix") or [""])[0]
        with st.lock:
            items = sorted((k, v) for (b, k), v in st.objects.items() if b == bucket and k.startswith(prefix))
        contents = "".join(
            f"<Contents><Key>{escape(k)}</Key><Size>{len(v[0])}</Size>"
            f"<LastModified>2030-01-01T00:00:00.000Z</LastModified></Contents>" for k, v in items)
        body = (f"<?xml version=\"1.0\"?><ListBucketResult><Name>{bucket}</Name><Prefix>{escape(prefix)}</Prefix>"
                f"<KeyCount>{len(items)}</KeyCount><IsTruncated>false</IsTruncated>{contents}</ListBucketResult>")
        self._send(200, body.encode(), {"Content-Type": "application/xml"})

    def do_GET(self) -> None:  # noqa: N802
        self._object(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._object(head=True)

    def do_DELETE(self) -> None:  # noqa: N802
        st = self.server.state
        bucket, key, _ = self._target()
        with st.lock:
            st.objects.pop((bucket, key), None)
        self._send(204)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ShimState


class S3Shim:
    """``with S3Shim(mode) as shim:`` a server on a free loopback port; ``shim.endpoint_url``."""

    def __init__(self, mode: Mode = "honour", conflicts: int = 0) -> None:
        self.state = ShimState(mode=mode, conflicts=conflicts)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> S3Shim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
