"""The raw-JSON client's request preparation (``agentrun.controller.kube.Kube``): the URL and the
headers come from the kubernetes client's own ``param_serialize`` (default headers, credentials,
token refresh), made again every ``HEADERS_REUSE_SECONDS`` and at once after a 401."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.controller import kube as kube_mod
from agentrun.controller.kube import Kube


class Resp:
    def __init__(self, status: int, data: bytes = b"{}") -> None:
        self.status, self.reason, self.data = status, "x", data

    def read(self) -> bytes:
        return self.data


class ApiClient:
    """``param_serialize`` hands out a new token each time (as a refreshed credential would)."""

    def __init__(self) -> None:
        self.made = 0
        self.sent: list[tuple[str, str, dict[str, str], Any]] = []
        self.status = 200

    def param_serialize(self, method: str, resource_path: str, header_params: dict[str, str],
                        auth_settings: list[str]) -> tuple[Any, ...]:
        assert auth_settings == ["BearerToken"]
        self.made += 1
        headers = {**header_params, "User-Agent": "agentrun-test", "authorization": f"Bearer t{self.made}"}
        return method, "https://api.example:6443" + resource_path, headers, None, None

    def call_api(self, method: str, url: str, header_params: dict[str, str], body: Any,
                 _request_timeout: Any) -> Resp:
        self.sent.append((method, url, header_params, body))
        return Resp(self.status)


def test_requests_carry_the_clients_url_and_headers_made_once_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(kube_mod.time, "monotonic", lambda: now[0])
    api = ApiClient()
    k = Kube(api)
    k.request("GET", "/api/v1/namespaces/ns/pods", query={"labelSelector": "job-name=j", "x": None})
    k.request("PATCH", "/apis/g/v1/namespaces/ns/things/a/status", body=[{"op": "add"}],
              content_type="application/json-patch+json")
    assert api.made == 1
    (m1, u1, h1, b1), (m2, u2, h2, b2) = api.sent
    assert (m1, u1, b1) == ("GET", "https://api.example:6443/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dj", None)
    assert h1 == {"User-Agent": "agentrun-test", "authorization": "Bearer t1", "Accept": "application/json"}
    assert (m2, u2, b2) == ("PATCH", "https://api.example:6443/apis/g/v1/namespaces/ns/things/a/status", [{"op": "add"}])
    assert h2["Content-Type"] == "application/json-patch+json" and h2["authorization"] == "Bearer t1"
    now[0] += kube_mod.HEADERS_REUSE_SECONDS  # the period is over: the client makes them again
    k.request("GET", "/api/v1/namespaces/ns/pods")
    assert api.made == 2 and api.sent[-1][2]["authorization"] == "Bearer t2"


def test_a_401_makes_the_credentials_again_on_the_next_request() -> None:
    from kubernetes.client.exceptions import ApiException

    api = ApiClient()
    k = Kube(api)
    api.status = 401
    with pytest.raises(ApiException) as exc:
        k.request("GET", "/api/v1/namespaces/ns/pods")
    assert exc.value.status == 401
    api.status = 200
    k.request("GET", "/api/v1/namespaces/ns/pods")
    assert api.made == 2 and api.sent[-1][2]["authorization"] == "Bearer t2"


def test_configurations_it_does_not_reproduce_stay_on_the_blocking_client() -> None:
    from kubernetes.client import Configuration

    from agentrun.controller.akube import unsupported

    def conf(**kw: Any) -> Configuration:
        c = Configuration()
        c.host = "https://10.0.0.1:6443"
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    assert unsupported(conf()) is None
    assert unsupported(conf(proxy="http://proxy:3128")) == "a proxy is configured"
    assert unsupported(conf(proxy="http://proxy:3128", no_proxy="10.0.0.1")) is None
    assert unsupported(conf(tls_server_name="kubernetes")) == "a TLS server name is configured"
    assert unsupported(conf(assert_hostname=False)) == "a host name assertion is configured"
    assert unsupported(conf(socket_options=[(6, 1, 1)])) == "socket options are configured"
    assert "not http(s)" in (unsupported(conf(host="unix:///run/k.sock")) or "")


def test_a_watch_body_is_cut_into_documents_however_its_chunks_fall() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from agentrun.controller.kube import JsonLines

    docs = [{"type": "ADDED", "object": {"n": i, "s": "x" * (i * 7)}} for i in range(6)]
    body = b"".join(json.dumps(d).encode() + b"\n" + (b"\n" if i == 2 else b"") for i, d in enumerate(docs))

    @given(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=12))
    def check(cuts: list[int]) -> None:
        lines, got, at = JsonLines(), [], 0
        for cut in sorted(cuts) + [len(body)]:
            got += lines.feed(body[at:cut])
            at = cut
        assert got + lines.end() == docs

    check()
    unterminated = JsonLines()  # the last document without its newline (the server closed the stream)
    assert unterminated.feed(b'{"a": 1}\n{"b"') == [{"a": 1}]
    assert unterminated.feed(b": 2}") == [] and unterminated.end() == [{"b": 2}] and unterminated.end() == []


def test_loads_reads_what_json_reads() -> None:
    """The operator's decoder (orjson, with ``json`` for what orjson refuses) gives what
    ``json.loads`` gives for any document the API server sends, and ``json``'s error for what
    neither reads."""
    import pytest
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agentrun.controller.kube import loads

    scalars = st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) \
        | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                          | st.dictionaries(st.text(), inner, max_size=5), max_leaves=30)

    @settings(max_examples=300)
    @given(values, st.booleans())
    def check(value: object, ascii_only: bool) -> None:
        text = json.dumps(value, ensure_ascii=ascii_only)
        assert loads(text.encode()) == json.loads(text) and loads(text) == json.loads(text)

    check()
    # a lone surrogate escape: orjson refuses it, json reads it
    assert loads(b'{"m": "\\ud800x"}') == {"m": "\ud800x"}
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"a": ')
