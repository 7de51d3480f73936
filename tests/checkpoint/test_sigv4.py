"""``sigv4.sign_get`` signs a GET exactly as botocore's ``S3SigV4Auth`` does: the same headers and
the same signature for any key, endpoint, region, credentials and instant (botocore is the
reference here; the real S3 servers of test_s3get.py check that the signature is accepted, and
that a wrong secret is refused)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.checkpoint.s3get import path_style_url
from agentrun.checkpoint.sigv4 import canonical_host, sign_get

ENDPOINTS = ["http://127.0.0.1:9000", "http://localhost:80", "https://s3.example.com",
             "https://S3.Example.com:443", "https://minio.internal:9443", "http://[::1]:8333",
             "http://[fd00::1]:80"]


def botocore_headers(url: str, region: str, access: str, secret: str, token: str | None,
                     now: datetime) -> dict[str, str]:
    from botocore import auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="GET", url=url, data=b"")
    naive = now.astimezone(UTC).replace(tzinfo=None)
    with mock.patch.object(auth, "get_current_datetime", return_value=naive):  # botocore's clock
        auth.S3SigV4Auth(Credentials(access, secret, token).get_frozen_credentials(), "s3", region).add_auth(request)
    return dict(request.headers.items())


@settings(max_examples=150, deadline=None)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    key=st.text(min_size=1, max_size=60),
    region=st.sampled_from(["us-east-1", "eu-west-3", "garage", "local"]),
    access=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters=",/"),
                   min_size=1, max_size=24),
    secret=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=40),
    token=st.none() | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=40),
    seconds=st.integers(min_value=0, max_value=20 * 365 * 86400),
)
def test_the_headers_and_signature_are_botocores(endpoint: str, key: str, region: str, access: str,
                                                 secret: str, token: str | None, seconds: int) -> None:
    now = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    url = path_style_url(endpoint, "bucket", key)
    theirs = botocore_headers(url, region, access, secret, token, now)
    assert theirs["X-Amz-Date"] == now.strftime("%Y%m%dT%H%M%SZ")  # the reference signed at `now`
    assert sign_get(url, canonical_host(url), region, access, secret, token, now) == theirs


def test_a_token_is_sent_and_signed_and_no_token_no_header() -> None:
    now = datetime(2026, 12, 3, 4, 5, 6, tzinfo=UTC)
    url = path_style_url("http://127.0.0.1:9000", "b", "runs/a/laps/00000001.json")
    with_token = sign_get(url, canonical_host(url), "us-east-1", "AK", "SK", "TOKEN", now)
    without = sign_get(url, canonical_host(url), "us-east-1", "AK", "SK", None, now)
    assert with_token["X-Amz-Security-Token"] == "TOKEN"
    assert "x-amz-security-token" in with_token["Authorization"]
    assert "X-Amz-Security-Token" not in without and "x-amz-security-token" not in without["Authorization"]
    assert with_token["Authorization"] != without["Authorization"]


def test_the_signature_changes_with_the_secret_the_day_and_the_key() -> None:
    now = datetime(2026, 12, 3, 23, 59, 59, tzinfo=UTC)
    url = path_style_url("http://127.0.0.1:9000", "b", "runs/a/laps/00000001.json")
    host = canonical_host(url)
    base = sign_get(url, host, "us-east-1", "AK", "SK", None, now)["Authorization"]
    assert sign_get(url, host, "us-east-1", "AK", "SK2", None, now)["Authorization"] != base
    assert sign_get(url, host, "us-east-1", "AK", "SK", None, now + timedelta(seconds=1))["Authorization"] != base
    other = path_style_url("http://127.0.0.1:9000", "b", "runs/a/laps/00000002.json")
    assert sign_get(other, host, "us-east-1", "AK", "SK", None, now)["Authorization"] != base


def test_the_host_is_botocores() -> None:
    assert canonical_host("http://127.0.0.1:9000/b/k") == "127.0.0.1:9000"
    assert canonical_host("https://S3.Example.com:443/b/k") == "s3.example.com"
    assert canonical_host("http://h:80/b") == "h"
    assert canonical_host("https://h:80/b") == "h:80"
    assert canonical_host("http://[::1]:8333/b") == "[::1]:8333"
