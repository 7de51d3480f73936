"""The API-server client (``agentrun.kube.client.Client``) against a real HTTP server on loopback:
the URL and the headers come from the kubernetes client's own ``param_serialize`` (default headers,
credentials, token refresh), made again every ``HEADERS_REUSE_SECONDS`` and at once after a 401;
every request is counted; a non-2xx is the kubernetes client's ApiException; a watch's body is cut
into its documents."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from aiohttp import web

from agentrun.kube import client as client_mod
from agentrun.kube.client import Client, request_labels


class ApiClient:
    """``param_serialize`` hands out a new token each time (as a refreshed credential would)."""

    def __init__(self, host: str) -> None:
        from kubernetes.client import Configuration

        self.configuration = Configuration()
        self.configuration.host = host
        self.made = 0

    def param_serialize(self, method: str, resource_path: str, header_params: dict[str, str],
                        auth_settings: list[str]) -> tuple[Any, ...]:
        assert auth_settings == ["BearerToken"]
        self.made += 1
        headers = {**header_params, "User-Agent": "agentrun-test", "authorization": f"Bearer t{self.made}"}
        return method, self.configuration.host + resource_path, headers, None, None


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_requests_carry_the_clients_url_and_headers_and_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    now = [100.0]
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: now[0])
    seen: list[tuple[str, str, dict[str, str], bytes]] = []
    counted: list[tuple[str, str, int | str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append((request.method, str(request.rel_url), request.headers.copy(), body))  # type: ignore[arg-type]
        if request.headers["authorization"] == "Bearer t2":
            return web.Response(status=401, text='{"kind": "Status", "code": 401}')
        if request.path.endswith("/missing"):
            return web.Response(status=404, reason="Not Found", text='{"reason": "NotFound"}')
        return web.Response(body=b'{"ok": true}', content_type="application/json")

    async def go() -> None:
        runner, url = await _serve(handler)
        api = ApiClient(url)
        k = Client(api, 2, lambda v, r, c: counted.append((v, r, c)))
        try:
            assert await k.request("GET", "/api/v1/namespaces/ns/pods",
                                   query={"labelSelector": "job-name=j", "x": None}) == {"ok": True}
            await k.request("PATCH", "/apis/g/v1/namespaces/ns/things/a/status", body=[{"op": "add"}],
                            content_type="application/json-patch+json")
            assert api.made == 1
            (m1, u1, h1, b1), (m2, u2, h2, b2) = seen
            assert (m1, u1, b1) == ("GET", "/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dj", b"")
            assert h1["User-Agent"] == "agentrun-test" and h1["authorization"] == "Bearer t1"
            assert h1["Accept"] == "application/json"
            assert (m2, u2, json.loads(b2)) == ("PATCH", "/apis/g/v1/namespaces/ns/things/a/status", [{"op": "add"}])
            assert h2["Content-Type"] == "application/json-patch+json" and h2["authorization"] == "Bearer t1"
            with pytest.raises(ApiException) as e:
                await k.request("GET", "/api/v1/namespaces/ns/pods/missing")
            assert e.value.status == 404 and e.value.reason == "Not Found" and "NotFound" in e.value.body
            now[0] += client_mod.HEADERS_REUSE_SECONDS  # the period is over: the client makes them again
            with pytest.raises(ApiException) as e:  # ... and this token is refused: made again at once
                await k.request("GET", "/api/v1/namespaces/ns/pods")
            assert e.value.status == 401 and api.made == 2 and k.fresh_base() is None
            await k.request("GET", "/api/v1/namespaces/ns/pods")
            assert api.made == 3 and seen[-1][2]["authorization"] == "Bearer t3"
        finally:
            await k.close()
            await runner.cleanup()
        # nothing listens any more: the connection error propagates, counted as <error>
        with pytest.raises(OSError):
            await k.request("DELETE", "/api/v1/namespaces/ns/pods/p", timeout=5)
        await k.close()

    asyncio.run(go())
    assert counted == [("list", "pods", 200), ("patch", "things/status", 200), ("get", "pods", 404),
                       ("list", "pods", 401), ("list", "pods", 200), ("delete", "pods", "<error>")]


def test_a_watch_yields_each_document_as_it_arrives_and_raises_a_refusal() -> None:
    from kubernetes.client.exceptions import ApiException

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.Response(status=400)
        if request.query.get("resourceVersion") == "0":
            return web.Response(status=410, reason="Gone", text="too old")
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type": "ADDED", "object": {"n": 1}}\n{"type": "MOD')
        await asyncio.sleep(0.05)
        await resp.write(b'IFIED", "object": {"n": 2}}\n')
        await resp.write_eof()
        return resp

    async def go() -> list[dict[str, Any]]:
        runner, url = await _serve(handler)
        k = Client(ApiClient(url), 2)
        try:
            with pytest.raises(ApiException) as e:
                async for _ in k.stream("/api/v1/pods", {"resourceVersion": "0"}, (5.0, 5.0)):
                    pass
            assert e.value.status == 410
            return [doc async for doc in k.stream("/api/v1/pods", {"resourceVersion": "5"}, (5.0, 5.0))]
        finally:
            await k.close()
            await runner.cleanup()

    assert asyncio.run(go()) == [{"type": "ADDED", "object": {"n": 1}}, {"type": "MODIFIED", "object": {"n": 2}}]


def test_configurations_it_does_not_reproduce_are_refused_by_name() -> None:
    from kubernetes.client import Configuration

    from agentrun.kube.client import check_supported

    def conf(**kw: Any) -> Configuration:
        c = Configuration()
        c.host = "https://10.0.0.1:6443"
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    check_supported(conf())
    check_supported(conf(proxy="http://proxy:3128"))  # an http(s) proxy and a TLS server name: supported
    check_supported(conf(tls_server_name="kubernetes"))
    for kw, what in (({"proxy": "socks5://proxy:1080"}, "proxy-url"), ({"assert_hostname": False}, "assert_hostname"),
                     ({"socket_options": [(6, 1, 1)]}, "socket options"), ({"host": "unix:///run/k.sock"}, r"not http\(s\)")):
        with pytest.raises(ValueError, match=what):
            check_supported(conf(**kw))


def test_a_watch_body_is_cut_into_documents_however_its_chunks_fall() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from agentrun.kube.client import JsonLines

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

    from agentrun.kube.client import loads

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


def test_a_requests_own_headers_go_beside_the_clients_and_may_repeat_but_never_replace_its_credentials() -> None:
    seen: list[tuple[str, list[str], list[str]]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append((request.headers["authorization"], request.headers.getall("Impersonate-User", []),
                     request.headers.getall("Impersonate-Group", [])))
        if request.query.get("watch") == "true":
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b'{"type": "ADDED", "object": {}}\n')
            return resp
        return web.Response(body=b"{}", content_type="application/json")

    async def go() -> None:
        runner, url = await _serve(handler)
        k = Client(ApiClient(url))
        person = [("Impersonate-User", "alice"), ("Impersonate-Group", "a"), ("Impersonate-Group", "b")]
        try:
            await k.request("GET", "/api/v1/namespaces", headers=person)
            async with contextlib.aclosing(k.stream("/api/v1/namespaces", {}, (5.0, 5.0), headers=person)) as events:
                assert [ev async for ev in events] == [{"type": "ADDED", "object": {}}]
            await k.request("GET", "/api/v1/namespaces")  # without: as the client itself
            for name in ("Authorization", "authorization", "Host", "Content-Type"):
                with pytest.raises(ValueError, match=name):
                    await k.request("GET", "/api/v1/namespaces", headers=[(name, "x")])
        finally:
            await k.close()
            await runner.cleanup()

    asyncio.run(go())
    assert seen == [("Bearer t1", ["alice"], ["a", "b"])] * 2 + [("Bearer t1", [], [])]


# ---------------------------------------------------------------------------------- request counter


@pytest.mark.parametrize("method,url,labels", [
    ("GET", "https://h:6443/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r", ("get", "agentruns")),
    ("GET", "https://h/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns?labelSelector=x", ("list", "agentruns")),
    ("GET", "https://h/apis/agentrun.dev/v1alpha1/agentruns?watch=true&resourceVersion=5", ("watch", "agentruns")),
    ("PATCH", "https://h/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r/status", ("patch", "agentruns/status")),
    ("POST", "https://h/apis/batch/v1/namespaces/ns/jobs", ("create", "jobs")),
    ("DELETE", "https://h/apis/batch/v1/namespaces/ns/jobs/j", ("delete", "jobs")),
    ("GET", "https://h/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dj", ("list", "pods")),
    ("GET", "https://h/api/v1/pods?watch=true", ("watch", "pods")),
    ("POST", "https://h/api/v1/namespaces/ns/events", ("create", "events")),
    ("GET", "https://h/apis/coordination.k8s.io/v1/namespaces/sys/leases/op", ("get", "leases")),
    ("PUT", "https://h/apis/coordination.k8s.io/v1/namespaces/sys/leases/op", ("update", "leases")),
    ("GET", "https://h/api/v1/namespaces/ns", ("get", "namespaces")),
])
def test_request_labels(method, url, labels):
    assert request_labels(method, url) == labels


def test_the_operator_registry_exports_the_request_counter():
    from agentrun import metrics

    metrics.kube_request("patch", "agentruns/status", 200)
    assert metrics.REGISTRY.get_sample_value(
        "agentrun_kube_requests_total", {"verb": "patch", "resource": "agentruns/status", "code": "200"}) >= 1
    metrics.kube_request("frob", "secrets", 200)  # outside the bounded sets: "other"
    assert metrics.REGISTRY.get_sample_value(
        "agentrun_kube_requests_total", {"verb": "other", "resource": "other", "code": "200"}) >= 1
