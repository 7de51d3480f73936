"""Signature Version 4 of an S3 GET with no body and no query, as botocore's ``S3SigV4Auth`` signs
it (the same canonical request, headers and signature; tests/checkpoint/test_sigv4.py compares the
two): for the operator's and the lap's lean GETs, in ~15 µs instead of botocore's ~130 µs (its
``AWSRequest`` and header objects). The signing key is derived once per day, region and secret."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_DEFAULT_PORTS = {"http": 80, "https": 443}


def canonical_host(url: str) -> str:
    """The ``host`` header botocore signs: the URL's host (brackets kept for IPv6), its port only
    where it is not the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


@lru_cache(maxsize=16)
def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign_get(url: str, host: str, region: str, access_key: str, secret_key: str, token: str | None,
             now: datetime | None = None, service: str = "s3") -> dict[str, str]:
    """The headers of a signed GET of ``url`` (its path already percent-encoded as S3 keys are,
    no query), ``host`` as :func:`canonical_host` gives it."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    headers = {"host": host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    signed = ";".join(names)
    canonical = "\n".join((
        "GET", urlsplit(url).path or "/", "",
        "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in names),
        signed, EMPTY_SHA256))
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = hmac.new(_signing_key(secret_key, day, region, service), to_sign.encode(), hashlib.sha256).hexdigest()
    out = {"X-Amz-Date": stamp, "X-Amz-Content-SHA256": EMPTY_SHA256}
    if token:
        out["X-Amz-Security-Token"] = token
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, "
                            f"Signature={signature}")
    return out
