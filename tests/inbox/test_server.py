"""The inbox's HTTP layer over a real socket (agentrun.inbox.server), with an API server port that
fails the test if called: what must be refused before anything reaches the API server is."""
from __future__ import annotations

import threading
import time

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
