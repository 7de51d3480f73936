"""The inbox's HTTP layer over a real socket (agentrun.inbox.server), with an API server port that
fails the test if called: what must be refused before anything reaches the API server is."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from agentrun.inbox import identity
from agentrun.inbox.kube import User
from agentrun.inbox.server import Inbox, Settings, make_server

KEY = b"s" * 32


class NoApi:
    """Stands in for kube.Kube where no API call may happen."""

    def __getattr__(self, name):
        raise AssertionError(f"the API server was called ({name}) for a request that must be refused first")


@pytest.fixture(scope="module")
def url():
    srv = make_server(Inbox(NoApi(), Settings(key=KEY, secure_cookies=False)), "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def session_cookie(user="alice"):
    s = identity.new_session(User(user), time.time(), 600)
    return s, {identity.COOKIE: identity.encode_session(s, KEY)}


def test_pages_need_a_session_and_carry_security_headers(url):
    r = httpx.get(f"{url}/")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert "script-src 'self'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
    assert httpx.get(f"{url}/fragment").status_code == 401
    assert httpx.get(f"{url}/events").status_code == 401
    login = httpx.get(f"{url}/login")
    assert login.status_code == 200 and 'type="password"' in login.text
    assert httpx.get(f"{url}/static/app.js").headers["content-type"].startswith("text/javascript")


def test_a_decision_without_the_csrf_token_or_from_another_site_is_refused(url):
    s, cookies = session_cookie()
    form = {"namespace": "a", "name": "b", "callId": "call_1", "sha256": "0" * 64, "decision": "approve"}
    r = httpx.post(f"{url}/decide", data=form, cookies=cookies, headers={"Accept": "application/json"})
    assert r.status_code == 403 and "CSRF" in r.json()["message"]
    r = httpx.post(f"{url}/decide", data={**form, "csrf": s.csrf(KEY)}, cookies=cookies,
                   headers={"Origin": "https://evil.example", "Accept": "application/json"})
    assert r.status_code == 403 and "cross-site" in r.json()["message"]
    r = httpx.post(f"{url}/decide", data={**form, "csrf": "x" * 64}, cookies=cookies)
    assert r.status_code == 403


@pytest.mark.parametrize("change, status, text", [
    ({"namespace": "Team_A"}, 400, "Kubernetes names"),
    ({"decision": "maybe"}, 400, "approve or reject"),
    ({"callId": ""}, 400, "callId"),
    ({"sha256": "abc"}, 400, "sha256"),
    ({"decision": "reject", "reason": "   "}, 400, "reason is required"),
    ({"reason": "x" * 1025}, 400, "longer than 1024"),
])
def test_bad_decisions_are_refused_before_the_api_server(url, change, status, text):
    s, cookies = session_cookie()
    form = {"namespace": "a", "name": "b", "callId": "call_1", "sha256": "0" * 64, "decision": "approve",
            "csrf": s.csrf(KEY), **change}
    r = httpx.post(f"{url}/decide", data=form, cookies=cookies, headers={"Accept": "application/json"})
    assert r.status_code == status and text in r.json()["message"], r.text


def test_a_forged_session_is_not_signed_in(url):
    _, cookies = session_cookie()
    cookies[identity.COOKIE] = cookies[identity.COOKIE][:-4] + "AAAA"
    assert httpx.get(f"{url}/fragment", cookies=cookies).status_code == 401


def test_logout_clears_the_cookie(url):
    s, cookies = session_cookie()
    r = httpx.post(f"{url}/logout", data={"csrf": s.csrf(KEY)}, cookies=cookies)
    assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]


class ScopedApi:
    """A person who may not list agentruns cluster-wide; ``namespaces``: what listing namespaces
    answers (None: forbidden too)."""

    def __init__(self, namespaces):
        self.namespaces = namespaces

    def request(self, method, path, user, **kw):
        from agentrun.inbox.kube import ApiError

        raise ApiError(403, '{"message": "forbidden"}', "list agentruns")

    def list_namespaces(self, user):
        from agentrun.inbox.kube import ApiError

        if self.namespaces is None:
            raise ApiError(403, '{"message": "forbidden"}', "list namespaces")
        return self.namespaces


def test_where_the_inbox_looks_for_runs():
    alice = User("alice")
    assert Inbox(NoApi(), Settings(namespaces=("team-a",))).scopes(alice) == (["team-a"], [])
    assert Inbox(ScopedApi(["a", "b"]), Settings()).scopes(alice) == (["a", "b"], [])
    scopes, notices = Inbox(ScopedApi(None), Settings()).scopes(alice)
    assert scopes == [] and "inbox.namespaces" in notices[0]


# --- proxy mode: system: identities are never taken from headers (docs/inbox.md "Trust") ---

PROXY_SECRET = b"the-proxy-secret-0123456789abcdef"
FROM_PROXY = {"X-Agentrun-Proxy-Secret": PROXY_SECRET.decode()}


def serve(app):
    srv = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture(scope="module")
def proxy_url():
    srv, url = serve(Inbox(NoApi(), Settings(auth="proxy", key=KEY, secure_cookies=False, proxy_secret=PROXY_SECRET)))
    yield url
    srv.shutdown()
    srv.server_close()


class ProxyClient:
    """httpx as the auth proxy: every request carries the proxy's secret header."""

    def __init__(self, url):
        self.url = url

    def get(self, path, headers=(), **kw):
        return httpx.get(f"{self.url}{path}", headers=[*FROM_PROXY.items(), *_pairs(headers)], **kw)

    def post(self, path, headers=(), **kw):
        return httpx.post(f"{self.url}{path}", headers=[*FROM_PROXY.items(), *_pairs(headers)], **kw)


def _pairs(headers):
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


@pytest.mark.parametrize("headers, what", [
    ({"X-Forwarded-User": "mallory", "X-Forwarded-Groups": "finance,system:masters"}, "group system:masters"),
    ({"X-Forwarded-User": "mallory", "X-Forwarded-Groups": "ops, system:nodes"}, "group system:nodes"),
    ({"X-Forwarded-User": "system:serviceaccount:kube-system:clusterrole-aggregation-controller"},
     "user system:serviceaccount:kube-system:clusterrole-aggregation-controller"),
    ({"X-Forwarded-User": "system:admin"}, "user system:admin"),
])
def test_system_users_and_groups_from_proxy_headers_are_refused_before_the_api_server(proxy_url, headers, what, caplog):
    caplog.set_level("WARNING", logger="agentrun.inbox")
    proxy = ProxyClient(proxy_url)
    for path in ("/", "/fragment", "/events"):
        r = proxy.get(path, headers=headers)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert what in r.text and "system:" in r.text and "set-cookie" not in r.headers
    r = proxy.post("/decide", headers={**headers, "Accept": "application/json"},
                   data={"namespace": "a", "name": "b", "decision": "approve"})
    assert r.status_code == 403 and what in r.json()["message"]
    assert any(what in m and "refused" in m for m in caplog.messages), caplog.messages


def test_a_refused_proxy_identity_is_bounded_in_the_answer_and_the_log(proxy_url, caplog):
    caplog.set_level("WARNING", logger="agentrun.inbox")
    r = ProxyClient(proxy_url).get("/fragment", headers={"X-Forwarded-User": "u",
                                                         "X-Forwarded-Groups": "system:" + "x" * 240})
    assert r.status_code == 403 and "x" * 100 not in r.text
    assert all("x" * 100 not in m for m in caplog.messages)


def test_a_repeated_identity_header_is_refused(proxy_url):
    # a proxy that appends its header after the client's: which one is the proxy's cannot be told
    proxy = ProxyClient(proxy_url)
    r = proxy.get("/fragment", headers=[("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "carol")])
    assert r.status_code == 400 and "more than once" in r.text
    r = proxy.get("/fragment", headers=[("X-Forwarded-User", "carol"), ("X-Forwarded-Groups", "a"),
                                        ("X-Forwarded-Groups", "b")])
    assert r.status_code == 400 and "X-Forwarded-Groups" in r.text


# --- the watches behind /events: bounded, never stuck ---

class WatchApi:
    """A narrow stand-in of kube.Kube for where to watch: ``list_runs`` answers per scope (403 for
    ``forbidden``), ``list_namespaces`` the namespaces; a watch is never started."""

    def __init__(self, namespaces=(), forbidden=()):
        self.namespaces, self.forbidden = list(namespaces), set(forbidden)
        self.calls: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def _call(self, what, scope):
        with self._lock:
            self.calls.append((what, scope))

    def request(self, method, path, user, **kw):
        from agentrun.inbox.kube import ApiError

        raise ApiError(403, '{"message": "forbidden"}', "list agentruns")

    def list_namespaces(self, user):
        return self.namespaces

    def list_runs(self, user, scope):
        from agentrun.inbox.kube import ApiError

        self._call("list", scope)
        if scope in self.forbidden:
            raise ApiError(403, '{"message": "forbidden"}', f"list agentruns in {scope}")
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch_runs(self, user, scope, sink, watch_seconds):
        self._call("watch", scope)
        raise AssertionError("a watch was started")


class FakeApiServer(BaseHTTPRequestHandler):
    """An API server's agentruns list and watch over HTTP (loopback): ``lists`` and ``watches``
    script the answers per call (a status code, or a list of watch events; a watch whose script is
    used up stays open and silent); ``seen`` records each request's method, path, query and the
    identity it was sent with."""

    lists: list = []
    watches: list = []
    seen: list = []

    def do_GET(self):
        u = urlsplit(self.path)
        q = parse_qs(u.query)
        cls = type(self)
        cls.seen.append(("watch" if q.get("watch") == ["true"] else "list", u.path, q,
                         self.headers.get("Authorization"), self.headers.get("Impersonate-User"),
                         self.headers.get_all("Impersonate-Group") or []))
        script = (cls.watches if q.get("watch") == ["true"] else cls.lists)
        item = script.pop(0) if script else None
        if isinstance(item, int):
            body = json.dumps({"kind": "Status", "code": item, "message": "scripted"}).encode()
            self.send_response(item)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if q.get("watch") != ["true"]:
            body = json.dumps({"metadata": {"resourceVersion": "5"}, "items": []}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.end_headers()  # HTTP/1.0: the body ends when the connection does
        for ev in item or []:
            self.wfile.write(json.dumps(ev).encode() + b"\n")
            self.wfile.flush()
        if item is None:
            time.sleep(30)  # open and silent until the client goes

    def log_message(self, *a):
        pass


@pytest.fixture
def api():
    """(the fake API server's handler class, an inbox Kube that reaches it as ``inbox-sa-token``)."""
    from tests.inbox.test_hardening import inbox_kube

    handler = type("Api", (FakeApiServer,), {"lists": [], "watches": [], "seen": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    kube = inbox_kube(f"http://127.0.0.1:{srv.server_address[1]}")
    yield handler, kube
    kube.close()
    srv.shutdown()
    srv.server_close()


def _until(check, seconds=20.0):
    """Wait (a bound, not a measurement) until ``check()`` is true."""
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "not within the bound"
        time.sleep(0.02)


def _run(name, rv):
    return {"metadata": {"namespace": "a", "name": name, "resourceVersion": str(rv)}}


def test_the_watch_lists_and_watches_as_the_person_and_each_change_reaches_the_stream(api):
    import queue

    handler, kube = api
    handler.watches = [[{"type": "MODIFIED", "object": _run("r", 6)},
                        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
                        {"type": "DELETED", "object": _run("s", 8)}]]
    out: queue.Queue = queue.Queue(maxsize=10)
    app = Inbox(kube, Settings())
    w = app.watch(User("alice", ("team-a", "approvers")), "a", out)
    _until(lambda: out.qsize() == 2)
    assert [out.get_nowait(), out.get_nowait()] == [{"type": "MODIFIED", "key": "a/r"}, {"type": "DELETED", "key": "a/s"}]
    _until(lambda: len(handler.seen) >= 3)  # the list, the watch, the watch again from the last version seen
    (l_verb, l_path, _, l_auth, l_user, l_groups), (w_verb, _, w_query, w_auth, w_user, w_groups) = handler.seen[:2]
    assert (l_verb, l_path) == ("list", "/apis/agentrun.dev/v1alpha1/namespaces/a/agentruns")
    assert w_verb == "watch" and w_query["resourceVersion"] == ["5"] and handler.seen[2][2]["resourceVersion"] == ["8"]
    # every request carries the inbox's own credentials AND the person: the API server authorizes the person
    assert l_auth == w_auth == "Bearer inbox-sa-token"
    assert l_user == w_user == "alice" and l_groups == w_groups == ["team-a", "approvers"]
    app.unwatch(w)
    _until(lambda: w._task is not None and w._task.done())


def test_a_forbidden_scope_is_not_watched_again_and_sends_nothing(api):
    import queue

    handler, kube = api
    handler.lists = [403]
    out: queue.Queue = queue.Queue(maxsize=10)
    w = Inbox(kube, Settings()).watch(User("alice"), "secret-ns", out)
    _until(lambda: w._task is not None and w._task.done())  # ended by itself, not retrying
    assert out.empty() and [c[0] for c in handler.seen] == ["list"]


def test_a_refusal_inside_the_watch_stream_ends_it_too_and_a_410_asks_for_one_resync(api):
    import queue

    handler, kube = api
    out: queue.Queue = queue.Queue(maxsize=10)
    handler.watches = [[{"type": "ERROR", "object": {"kind": "Status", "code": 403, "message": "forbidden"}}]]
    w = Inbox(kube, Settings()).watch(User("alice"), "a", out)
    _until(lambda: w._task is not None and w._task.done())
    assert out.empty() and [c[0] for c in handler.seen] == ["list", "watch"]

    # the first watch is too old (410): list again, one RESYNC; the second is refused (403): the end
    handler.seen.clear()
    handler.watches = [[{"type": "ERROR", "object": {"kind": "Status", "code": 410}}],
                       [{"type": "ERROR", "object": {"kind": "Status", "code": 403}}]]
    w = Inbox(kube, Settings()).watch(User("alice"), "a", out)
    _until(lambda: w._task is not None and w._task.done())
    assert [c[0] for c in handler.seen] == ["list", "watch", "list", "watch"]
    assert out.get_nowait() == {"type": "RESYNC", "key": ""} and out.empty()


def test_a_full_queue_never_blocks_the_watch_and_unwatch_ends_it(api):
    import queue

    handler, kube = api
    handler.watches = [[{"type": "MODIFIED", "object": _run("r", 10 + i)} for i in range(50)]]
    out: queue.Queue = queue.Queue(maxsize=3)  # nobody reads it: the stream's consumer is gone
    app = Inbox(kube, Settings())
    w = app.watch(User("alice"), "a", out)
    _until(lambda: len(handler.seen) >= 3)  # all 50 went through (dropped beyond 3), and it watches on from rv 59
    assert out.qsize() == 3 and handler.seen[2][2]["resourceVersion"] == ["59"]
    app.unwatch(w)
    _until(lambda: w._task is not None and w._task.done())


def test_watches_only_where_the_page_could_list_runs():
    alice = User("alice")
    api = WatchApi(namespaces=["a", "b", "c", "d"], forbidden={"b", "d"})
    app = Inbox(api, Settings())
    assert app.watch_scopes(alice) == ["a", "b", "c", "d"]  # nothing known yet
    app.runs(alice)  # the page load: b and d refuse the list
    assert app.watch_scopes(alice) == ["a", "c"]
    assert app.watch_scopes(User("bob")) == ["a", "b", "c", "d"]  # per person


def test_a_stream_over_too_many_namespaces_polls_instead_of_starting_a_watch_each():
    api = WatchApi(namespaces=[f"ns-{i}" for i in range(300)])
    app = Inbox(api, Settings(key=KEY, secure_cookies=False, max_watches_per_stream=20, poll_seconds=1))
    srv = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _, cookies = session_cookie()
        with httpx.stream("GET", f"http://127.0.0.1:{srv.server_address[1]}/events", cookies=cookies,
                          timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while "POLL" not in next(lines):  # a change arrives without any watch
                pass
        assert not [c for c in api.calls if c[0] == "watch"]
        assert app.watches._value == app.settings.max_watches  # every permit back
    finally:
        srv.shutdown()
        srv.server_close()


def test_watch_permits_are_shared_by_all_streams_and_returned():
    api = WatchApi(namespaces=["a", "b", "c"])
    app = Inbox(api, Settings(key=KEY, secure_cookies=False, max_watches=2, poll_seconds=1, watch_seconds=1))
    srv = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _, cookies = session_cookie()
        with httpx.stream("GET", f"http://127.0.0.1:{srv.server_address[1]}/events", cookies=cookies,
                          timeout=30) as r:
            lines = r.iter_lines()
            while "POLL" not in next(lines):  # 3 scopes > 2 permits in all: polls, holds none
                pass
        assert app.watches._value == 2
    finally:
        srv.shutdown()
        srv.server_close()
