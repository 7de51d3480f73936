"""The OpenAI-compatible model's HTTP client (models/openai.py ``http_client_for``): an ``http://``
endpoint reached without a proxy gets a TLS context that trusts no CA (it never speaks TLS; loading
the CA bundle costs ~20 ms of a lap's start), everything else the default verifying client. The
TLS context is read from httpx's transport (private attributes: a narrow unit test)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from agentrun.lap.models.openai import http_client_for

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "no_proxy", "NO_PROXY")


def _tls(client: Any) -> ssl.SSLContext:
    ctx = client._transport._pool._ssl_context
    assert isinstance(ctx, ssl.SSLContext)
    return ctx


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_http_endpoint_without_proxy_gets_a_context_that_trusts_nothing(no_proxy_env: pytest.MonkeyPatch) -> None:
    ctx = _tls(http_client_for("http://vllm.models.svc:8000/v1/chat/completions"))
    assert ctx.get_ca_certs() == []
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


@pytest.mark.parametrize("url", ["https://api.openai.com/v1/chat/completions", "HTTPS://gw.example/v1/chat/completions"])
def test_an_https_endpoint_verifies_with_the_ca_bundle(no_proxy_env: pytest.MonkeyPatch, url: str) -> None:
    ctx = _tls(http_client_for(url))
    assert ctx.get_ca_certs() != []
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


@pytest.mark.parametrize("var", ["HTTP_PROXY", "https_proxy", "ALL_PROXY"])
def test_any_proxy_in_the_environment_keeps_the_default_client(no_proxy_env: pytest.MonkeyPatch, var: str) -> None:
    no_proxy_env.setenv(var, "https://proxy.example:3128")
    ctx = _tls(http_client_for("http://vllm.models.svc:8000/v1/chat/completions"))
    assert ctx.get_ca_certs() != []
