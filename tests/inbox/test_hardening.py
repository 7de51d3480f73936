"""The inbox's defences of issue 29 over real sockets (agentrun.inbox.server): half-sent requests
hold a bounded number of threads and a real request still gets in; proxy mode answers only its
proxy (shared secret header, client certificate) and impersonates only the groups it lists; a
token session is checked again (TokenReview) and ends when the token is revoked; the sign-in form
needs its own CSRF token; the TokenReview answer's audiences are checked.

The API server is a narrow stand-in where the test is about what the inbox does with its answer
(TokenReview of the real API server: tests/e2e/test_inbox_browser.py)."""
from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agentrun.inbox import identity
from agentrun.inbox.kube import AudienceRefused, Kube, User
from agentrun.inbox.server import Inbox, Settings, make_server

KEY = b"h" * 32
SECRET = b"proxy-shared-secret-0123456789ab"


class NoApi:
    def __getattr__(self, name):
        raise AssertionError(f"the API server was called ({name}) for a request that must be refused first")


class Recorder:
    """A person who may list agentruns everywhere (no runs): records who the inbox acted as."""

    def __init__(self):
        self.users: list[User] = []

    def request(self, method, path, user, **kw):
        self.users.append(user)
        return {"items": []}

    def list_runs(self, user, scope):
        self.users.append(user)
        return {"metadata": {"resourceVersion": "1"}, "items": []}


class Tokens:
    """TokenReview stand-in: the tokens it accepts (token -> User); ``reviews`` counts calls."""

    def __init__(self, accepted):
        self.accepted, self.reviews = dict(accepted), 0

    def token_review(self, token, audiences=None):
        self.reviews += 1
        return self.accepted.get(token)

    def request(self, method, path, user, **kw):
        return {"items": []}

    def list_runs(self, user, scope):
        return {"metadata": {"resourceVersion": "1"}, "items": []}


def serve(app, tls=None):
    srv = make_server(app, "127.0.0.1", 0, tls=tls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def stop(srv):
    srv.shutdown()
    srv.server_close()


def url(srv, scheme="http"):
    return f"{scheme}://127.0.0.1:{srv.server_address[1]}"


def connection_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


# --- half-sent requests ----------------------------------------------------------------------

def test_half_sent_requests_hold_a_bounded_number_of_threads_and_a_real_request_gets_in():
    """300 connections that never finish their headers (today: 300 threads held for ever)."""
    srv = serve(Inbox(NoApi(), Settings(key=KEY, secure_cookies=False, max_pending=16, request_timeout=4)))
    socks = []
    try:
        base = connection_threads()
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", srv.server_address[1]))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never the blank line
            socks.append(s)
        time.sleep(0.5)
        held = connection_threads() - base
        assert held <= 16 + 2, f"{held} threads held by 300 half-sent requests"
        assert srv.pending() <= 16
        t0 = time.monotonic()
        r = httpx.get(f"{url(srv)}/healthz", timeout=5)
        assert r.status_code == 200 and r.text == "ok" and time.monotonic() - t0 < 2
        # and the ones still held are closed at the request deadline
        time.sleep(5)
        assert srv.pending() == 0 and connection_threads() - base <= 1
        socks[-1].settimeout(2)
        assert socks[-1].recv(100) == b""
    finally:
        for s in socks:
            s.close()
        stop(srv)


def test_a_body_that_never_arrives_is_cut_at_the_deadline_and_a_large_one_is_refused():
    srv = serve(Inbox(NoApi(), Settings(key=KEY, secure_cookies=False, request_timeout=2)))
    try:
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]))
        s.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\ntoken=abc")
        s.settimeout(6)
        t0 = time.monotonic()
        while s.recv(4096):  # whatever comes, the connection ends
            pass
        assert time.monotonic() - t0 < 5
        s.close()
        r = httpx.post(f"{url(srv)}/login", content=b"token=" + b"x" * (70 * 1024),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413 and r.headers.get("connection") == "close"
    finally:
        stop(srv)


# --- proxy mode: only the proxy, only the listed groups ----------------------------------------

def test_proxy_mode_refuses_a_request_without_the_proxys_secret():
    srv = serve(Inbox(NoApi(), Settings(auth="proxy", key=KEY, secure_cookies=False, proxy_secret=SECRET)))
    try:
        who = {"X-Forwarded-User": "carol", "X-Forwarded-Groups": "finance"}
        for headers in (who, {**who, "X-Agentrun-Proxy-Secret": "wrong"},
                        [*who.items(), ("X-Agentrun-Proxy-Secret", SECRET.decode()), ("X-Agentrun-Proxy-Secret", "x")]):
            for path in ("/", "/fragment", "/events", "/login"):
                r = httpx.get(f"{url(srv)}{path}", headers=headers)
                assert r.status_code == 401, (path, r.status_code)
                assert "only its auth proxy" in r.text and "X-Agentrun-Proxy-Secret" in r.text
                assert SECRET.decode() not in r.text and "set-cookie" not in r.headers
            r = httpx.post(f"{url(srv)}/decide", headers=headers, data={"namespace": "a", "decision": "approve"})
            assert r.status_code == 401 and "only its auth proxy" in r.json()["message"]
        assert httpx.get(f"{url(srv)}/healthz").status_code == 200  # probes carry no secret
    finally:
        stop(srv)
    with pytest.raises(ValueError, match="proxy"):
        Inbox(NoApi(), Settings(auth="proxy", key=KEY))  # proxy mode without a way for the proxy to prove itself


def test_proxy_mode_impersonates_only_the_listed_groups():
    api = Recorder()
    srv = serve(Inbox(api, Settings(auth="proxy", key=KEY, secure_cookies=False, proxy_secret=SECRET,
                                    proxy_groups=("finance",))))
    try:
        r = httpx.get(f"{url(srv)}/fragment", headers={"X-Agentrun-Proxy-Secret": SECRET.decode(),
                                                       "X-Forwarded-User": "carol",
                                                       "X-Forwarded-Groups": "finance,kubeadm:cluster-admins,ops"})
        assert r.status_code == 200, r.text
        assert api.users and {u for u in api.users} == {User("carol", ("finance",))}
    finally:
        stop(srv)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server and a proxy client certificate, and a client certificate of another CA."""
    d = tmp_path_factory.mktemp("pki")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
            "-days", "1", "-subj", f"/CN={ca}")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca in (("server", "ca"), ("proxy", "ca"), ("stranger", "other")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", *(["-extfile", "san.cnf"] if name == "server" else []))
    return d


def test_proxy_mode_with_mtls_needs_a_client_certificate_of_the_proxy_ca(pki):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    ctx.load_verify_locations(cafile=str(pki / "ca.crt"))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    api = Recorder()
    srv = serve(Inbox(api, Settings(auth="proxy", key=KEY, proxy_mtls=True)), tls=ctx)
    who = {"X-Forwarded-User": "carol"}

    def client(cert):
        c = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        if cert:
            c.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
        return httpx.Client(verify=c, timeout=10)

    try:
        with client(None) as c:
            r = c.get(f"{url(srv, 'https')}/fragment", headers=who)
            assert r.status_code == 401 and "client certificate" in r.json()["message"]
        with client("stranger") as c, pytest.raises(httpx.HTTPError):
            c.get(f"{url(srv, 'https')}/fragment", headers=who)  # another CA: the handshake fails
        assert not api.users
        with client("proxy") as c:
            r = c.get(f"{url(srv, 'https')}/fragment", headers=who)
            assert r.status_code == 200 and api.users[-1] == User("carol")
    finally:
        stop(srv)


# --- token mode: re-checked, ended by revocation, bounded by exp; login CSRF ---------------------

def _jwt(exp: int) -> str:
    import base64

    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{b64({'alg': 'RS256'})}.{b64({'sub': 'alice', 'exp': exp})}.c2ln"


def sign_in(base: str, token: str) -> httpx.Client:
    c = httpx.Client(base_url=base, timeout=10)
    form = c.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)[1]
    r = c.post("/login", data={"token": token, "csrf": csrf})
    assert r.status_code == 303, r.text
    return c


def test_a_revoked_token_ends_the_session_at_the_next_check():
    token = _jwt(int(time.time()) + 3600)
    api = Tokens({token: User("alice", ("finance",))})
    srv = serve(Inbox(api, Settings(key=KEY, secure_cookies=False, session_recheck=1)))
    try:
        c = sign_in(url(srv), token)
        assert api.reviews == 1 and token not in c.cookies[identity.COOKIE]
        assert c.get("/fragment").status_code == 200
        time.sleep(1.2)
        assert c.get("/fragment").status_code == 200 and api.reviews == 2  # checked again, still valid
        del api.accepted[token]  # revoked (its ServiceAccount deleted, say)
        time.sleep(1.2)
        r = c.get("/fragment")
        assert r.status_code == 401 and "session ended" in r.json()["message"] and api.reviews == 3
        assert "Max-Age=0" in r.headers["set-cookie"]
        r = c.get("/")
        assert r.status_code in (303, 401)  # signed out for good
    finally:
        stop(srv)


def test_a_session_ends_no_later_than_the_token():
    token = _jwt(int(time.time()) + 600)
    srv = serve(Inbox(Tokens({token: User("alice")}), Settings(key=KEY, secure_cookies=False)))
    try:
        c = httpx.Client(base_url=url(srv))
        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text)[1]
        r = c.post("/login", data={"token": token, "csrf": csrf})
        max_age = int(re.search(r"agentrun_inbox=[^;]*; Path=/; Max-Age=(\d+)", r.headers["set-cookie"])[1])
        assert 590 <= max_age <= 600, r.headers["set-cookie"]  # not the 8 h session ttl
        s = identity.decode_session(c.cookies[identity.COOKIE], KEY, time.time())
        assert s is not None and s.expires <= int(time.time()) + 600
    finally:
        stop(srv)


def test_sign_in_needs_the_forms_csrf_token_and_its_cookie():
    """Login CSRF: another site's form (or a script) posting a token to /login signs nobody in."""
    srv = serve(Inbox(NoApi(), Settings(key=KEY, secure_cookies=False)))
    try:
        form = httpx.get(f"{url(srv)}/login")
        cookie = next(v for k, v in form.headers.multi_items() if k == "set-cookie" and "agentrun_inbox_login=" in v)
        assert "Path=/login" in cookie and "SameSite=Strict" in cookie and "HttpOnly" in cookie
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)[1]
        nonce = re.search(r"agentrun_inbox_login=([^;]+)", cookie)[1]
        for data, cookies in (({"token": "t"}, {}),  # neither
                              ({"token": "t", "csrf": csrf}, {}),  # the form's token without its cookie
                              ({"token": "t"}, {identity.LOGIN_COOKIE: nonce}),  # the cookie without the token
                              ({"token": "t", "csrf": identity.login_csrf(KEY, "other")},
                               {identity.LOGIN_COOKIE: nonce})):
            r = httpx.post(f"{url(srv)}/login", data=data, cookies=cookies)
            assert r.status_code == 403 and "sign-in form" in r.text, r.text  # NoApi: no TokenReview sent
    finally:
        stop(srv)


# --- audiences ------------------------------------------------------------------------------

class FakeTokenReviewer(BaseHTTPRequestHandler):
    """An API server's TokenReview endpoint (plain HTTP) that authenticates every token and answers
    the audiences in ``answer`` (an authenticator that ignores the requested audiences answers none)."""

    answer: list[str] = []
    seen: list[tuple[str | None, str | None]] = []  # (Authorization, Impersonate-User) of each request

    def do_POST(self):
        type(self).seen.append((self.headers.get("Authorization"), self.headers.get("Impersonate-User")))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        doc = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"],
               "status": {"authenticated": True, "user": {"username": "alice", "groups": ["g"]},
                          "audiences": type(self).answer}}
        data = json.dumps(doc).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("answered, ok", [([], False), (["kubernetes"], False), (["inbox"], True),
                                          (["other", "inbox"], True)])
def test_the_audiences_of_the_tokenreview_answer_are_checked(answered, ok):
    handler = type("H", (FakeTokenReviewer,), {"answer": answered, "seen": []})
    api = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        kube = inbox_kube(f"http://127.0.0.1:{api.server_address[1]}")
        if ok:
            assert kube.token_review("t", ["inbox"]) == User("alice", ("g",))
        else:
            with pytest.raises(AudienceRefused, match="inbox"):
                kube.token_review("t", ["inbox"])
        assert kube.token_review("t") == User("alice", ("g",))  # no audience required: not checked
        assert handler.seen == [("Bearer inbox-sa-token", None)] * 2  # as the inbox itself, not impersonated
    finally:
        kube.close()
        api.shutdown()
        api.server_close()


def inbox_kube(host: str) -> Kube:
    """The inbox's client of the API server at ``host`` with the bearer token ``inbox-sa-token``."""
    from kubernetes import client

    from agentrun.kube.client import Client

    conf = client.Configuration(host=host, api_key={"BearerToken": "inbox-sa-token"},
                                api_key_prefix={"BearerToken": "Bearer"})
    return Kube(Client(client.ApiClient(conf)))


@pytest.mark.parametrize("args, text", [
    (["--auth", "proxy"], "--auth proxy needs --proxy-secret-file and/or --proxy-client-ca"),
    (["--auth", "proxy", "--proxy-secret-file", "{short}"], "the secret must be at least 16 characters"),
    (["--proxy-groups", "finance,system:masters"], "'system:masters': system: groups are never taken"),
    (["--session-recheck", "10m"], "between 1s and 5m"),
    (["--session-recheck", "0s"], "between 1s and 5m"),
    (["--auth", "proxy", "--proxy-client-ca", "{short}"], "needs --tls-cert and --tls-key"),
])
def test_the_command_refuses_settings_that_would_leave_a_hole(args, text, tmp_path):
    from click.testing import CliRunner

    from agentrun.inbox.command import inbox_command

    short = tmp_path / "secret"
    short.write_text("too-short\n")
    r = CliRunner().invoke(inbox_command, [a.replace("{short}", str(short)) for a in args])
    assert r.exit_code == 2 or r.exit_code == 1, r.output
    assert text in r.output, r.output
