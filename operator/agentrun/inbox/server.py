"""The inbox's HTTP server (standard library ``ThreadingHTTPServer``).

Routes: ``GET /`` (the page), ``GET /fragment`` (its live part), ``GET /events`` (server-sent
events: one ``change`` per watch event on the agentruns the person can see), ``POST /decide``,
``GET /runs`` and ``GET /runs/NS/NAME`` (the run explorer, read only; each with ``/fragment``, its
live part, fetched again on every ``change`` of the same event stream),
``GET|POST /login``, ``POST /logout``, ``GET /healthz``, ``GET /static/app.{css,js}``.

Every read and every decision is sent to the API server impersonating the signed-in person
(``inbox.kube.Kube`` over ``agentrun.kube``'s client), so RBAC and the approval admission policies decide; the inbox checks nothing the
API server would not (the Approve button is hidden for someone a SelfSubjectAccessReview says may
not ``approve``, but a forged POST is sent on and refused by the API server itself).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import secrets
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agentrun.api.approval import (
    AWAITING,
    MAX_CALL_ID_CHARS,
    MAX_REASON_CHARS,
    SHA256_HEX_CHARS,
    binding,
    decision_patch,
    queue_rows,
    refusal,
)
from agentrun.api.text import one_line
from agentrun.api.traceid import trace_of
from agentrun.inbox import assets, explorer, identity, view
from agentrun.inbox.kube import ApiError, AudienceRefused, Kube, User, runs_path
from agentrun.inbox.laps import LapReader

log = logging.getLogger("agentrun.inbox")

MAX_BODY = 64 * 1024
MAX_TOKEN = 16 * 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NS = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SHA = re.compile(f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$")
_RUN_PATH = re.compile(r"^/runs/([^/]{1,200})/([^/]{1,800})(/fragment)?$")
_CALL = re.compile(f"^[A-Za-z0-9_.:-]{{1,{MAX_CALL_ID_CHARS}}}$")
SESSION_ENDED = ("Your session ended: the API server no longer accepts the token you signed in with (revoked, or "
                 "expired). Sign in again.")
LOGIN_CSRF_REFUSED = ("The sign-in form expired or was not sent from this inbox's own page: sign in again from the "
                      "form below.")
LISTABLE_TTL = 600.0  # how long the namespaces a page load could list narrow that person's watches

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    # not no-referrer: with it a browser sends "Origin: null" on form posts, and the Origin check needs it
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass
class Settings:
    auth: str = "token"  # "token": sign in with a bearer token (TokenReview); "proxy": trusted headers
    user_header: str = "X-Forwarded-User"
    groups_header: str | None = "X-Forwarded-Groups"
    namespaces: tuple[str, ...] = ()  # empty: every namespace the person can list
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    session_ttl: int = 8 * 3600
    secure_cookies: bool = True
    token_audiences: tuple[str, ...] = ()
    laps: int = 3
    sse_seconds: int = 300  # an event stream is closed after this long; the browser reconnects
    watch_seconds: int = 50
    max_streams: int = 200  # open /events streams, all people together
    max_watches: int = 1000  # API watches (one informer each), all streams together
    max_watches_per_stream: int = 20  # more scopes than this: the stream polls instead of watching
    poll_seconds: int = 30  # a polling stream's "change" interval
    session_recheck: int = 300  # token mode: the token is checked again (TokenReview) this often
    # proxy mode: the groups taken from the proxy's groups header (others are dropped)
    proxy_groups: tuple[str, ...] = ()
    # proxy mode: how the proxy proves it is the proxy (at least one; both when both are set)
    proxy_secret: bytes | None = None  # the value of proxy_secret_header, compared in constant time
    proxy_secret_header: str = "X-Agentrun-Proxy-Secret"
    proxy_mtls: bool = False  # a client certificate verified against the CA of the server's TLS context
    # before a request is in: its request line, headers and body must arrive within request_timeout,
    # and at most max_pending connections wait for theirs (the oldest is closed to make room)
    request_timeout: float = 10.0
    max_pending: int = 64
    io_timeout: float = 30.0  # any one read or write on a connection
    trace_url_template: str | None = None  # the run explorer links a run to its trace: a URL with {trace_id}


class Inbox:
    """The application: state shared by the request threads."""

    def __init__(self, kube: Kube, settings: Settings, reader: LapReader | None = None) -> None:
        if settings.auth == "proxy" and settings.proxy_secret is None and not settings.proxy_mtls:
            raise ValueError("proxy mode needs proxy_secret and/or proxy_mtls: the auth proxy must prove it is the proxy")
        self.kube, self.settings = kube, settings
        self.reader = reader or LapReader()
        self._can: dict[tuple[str, tuple[str, ...], str], tuple[float, bool]] = {}
        self._listable: dict[tuple[str, tuple[str, ...]], tuple[float, frozenset[str]]] = {}
        self._lock = threading.Lock()
        self.streams = threading.BoundedSemaphore(settings.max_streams)
        self.watches = threading.BoundedSemaphore(settings.max_watches)

    # --- what the person may see and do (always as them) -----------------------------------

    def scopes(self, user: User) -> tuple[list[str | None], list[str]]:
        """Where to list agentruns as ``user``: the configured namespaces, else the whole cluster,
        else each namespace they may list. Returns (scopes, notices)."""
        if self.settings.namespaces:
            return list(self.settings.namespaces), []
        try:
            self.kube.request("GET", runs_path(None), user, params={"limit": "1"}, what="list agentruns")
            return [None], []
        except ApiError as e:
            if e.status != 403:
                raise
        try:
            return list(self.kube.list_namespaces(user)), []
        except ApiError as e:
            if e.status != 403:
                raise
        return [], ["You may not list AgentRuns in every namespace, nor list namespaces: ask the inbox's "
                    "operator to set the namespaces it shows (inbox.namespaces in the chart)."]

    def runs(self, user: User) -> tuple[list[dict[str, Any]], list[str]]:
        scopes, notices = self.scopes(user)
        items: list[dict[str, Any]] = []
        listable: list[str] = []
        for ns in scopes:
            try:
                items += self.kube.list_runs(user, ns).get("items") or []
            except ApiError as e:
                if e.status == 403:
                    if self.settings.namespaces:
                        notices.append(f"You may not list AgentRuns in namespace {ns}.")
                    continue
                raise
            if ns is not None:
                listable.append(ns)
        if not self.settings.namespaces and scopes != [None]:
            self._remember_listable(user, listable)
        return items, notices

    def can_approve(self, user: User, namespace: str) -> bool:
        key = (user.name, user.groups, namespace)
        now = time.monotonic()
        with self._lock:
            hit = self._can.get(key)
            if hit and now - hit[0] < 30:
                return hit[1]
        try:
            ok = self.kube.can(user, "approve", namespace)
        except ApiError:
            ok = False
        with self._lock:
            if len(self._can) > 10000:
                self._can.clear()
            self._can[key] = (now, ok)
        return ok

    def main_html(self, user: User, csrf: str) -> str:
        items, notices = self.runs(user)
        now = datetime.now(UTC)
        cards = []
        by_key = {(r["metadata"].get("namespace"), r["metadata"].get("name")): r for r in items}
        for row in queue_rows(items, now):
            run = by_key[(row["namespace"], row["name"])]
            stored, laps, err = self.reader.read(run, self.settings.laps)
            cards.append(view.card(run, now, stored, laps, err, self.can_approve(user, row["namespace"])))
        return view.main_html(cards, view.history_rows(items), csrf, notices)

    # --- the run explorer (read only, as the person) ------------------------------------------

    def runs_list(self, user: User, filters: explorer.Filters) -> tuple[str, list[str]]:
        """The live part of /runs (the runs ``user`` may list, filtered) and the namespaces seen."""
        items, notices = self.runs(user)
        rows, matched = explorer.run_rows(items, explorer.now_utc(), filters)
        namespaces = sorted({str((r.get("metadata") or {}).get("namespace") or "") for r in items} - {""})
        return explorer.runs_html(rows, matched, len(items), notices), namespaces

    def run_page(self, user: User, namespace: str, name: str) -> tuple[int, str]:
        """(HTTP status, the live part of a run's page): the run as ``user`` reads it, its laps from
        the checkpoint store (read only after that read succeeded), its Events as ``user`` lists them."""
        try:
            run = self.kube.get_run(user, namespace, name)
        except ApiError as e:
            if e.status in (403, 404):
                return e.status, (f'<div id="explore"><p class="notice">No run {view.esc(namespace)}/{view.esc(name)} '
                                  "that you may read.</p></div>")
            raise
        pairs, laps_error = self.reader.history(run, explorer.PAGE_LAPS)
        uid = str((run.get("metadata") or {}).get("uid") or "")
        events: list[dict[str, Any]] | None = None
        refused = None
        try:
            events = self.kube.list_events(user, namespace, name, uid or None)
        except ApiError as e:
            if e.status != 403:
                refused = f"Events not listed: {e.message[:300]}"
            else:
                refused = f"You may not list Events in namespace {namespace}."
        trace_id, trace_link = trace_of(run, self.settings.trace_url_template)
        return 200, explorer.run_html(run, [explorer.lap_doc(r, o) for r, o in pairs], laps_error, events, refused,
                                      explorer.now_utc(), trace_link, trace_id)

    def decide(self, user: User, form: dict[str, str]) -> tuple[int, str]:
        """Send one decision as ``user``; (HTTP status, message). The API server has the last word."""
        ns, name = form.get("namespace", ""), form.get("name", "")
        call_id, sha = form.get("callId", ""), form.get("sha256", "")
        decision, reason = form.get("decision", ""), form.get("reason", "").strip()
        if not _NS.match(ns) or not _NAME.match(name):
            return 400, "namespace and name must be Kubernetes names"
        if decision not in ("approve", "reject"):
            return 400, "decision must be approve or reject"
        if not _CALL.match(call_id):
            return 400, "callId is missing or malformed: reload the page"
        if not _SHA.match(sha):
            return 400, "sha256 is missing or malformed: the arguments could not be digested; use agentrun approvals"
        if decision == "reject" and not reason:
            return 400, "A reason is required to reject."
        if len(reason) > MAX_REASON_CHARS:
            return 400, f"The reason is longer than {MAX_REASON_CHARS} characters."
        try:
            run = self.kube.get_run(user, ns, name)
        except ApiError as e:
            return (e.status if e.status in (403, 404) else 502), f"cannot read agentrun {ns}/{name}: {e.message}"
        st = run.get("status") or {}
        ap = st.get("approval") or {}
        if st.get("phase") != AWAITING:
            return 409, f"{ns}/{name} is no longer waiting for approval (phase {st.get('phase') or 'Pending'})."
        if ap.get("callId") != call_id:
            return 409, f"{ns}/{name} now waits on another call ({ap.get('callId')}): look at it again."
        stored, _, _ = self.reader.read(run, 1)
        _, current_sha, _ = binding(run, stored)
        if current_sha != sha:
            return 409, "The arguments of this call are not the ones shown (sha256 differs): look at it again."
        shown_target = form.get("targetSha256", "")
        if shown_target and ap.get("targetSha256") != shown_target:
            return 409, "What this call will run is not what was shown (its target changed): look at it again."
        patch = decision_patch(decision == "approve", reason or None, run["metadata"].get("resourceVersion"),
                               call_id=call_id, sha256=sha, decided_by=user.name,
                               target_sha256=shown_target or None)
        try:
            self.kube.patch_run(user, ns, name, patch)
        except ApiError as e:
            if e.status == 409:
                return 409, f"{ns}/{name} changed while you decided: look at it again."
            why = refusal(e) if e.status in (400, 403, 422) else None
            return (e.status if e.status in (400, 403, 422) else 502), (
                f"The API server refused the decision: {why or e.message}")
        verb = "Approved" if decision == "approve" else "Rejected"
        return 200, f"{verb} call {call_id} of {ns}/{name}; the API server records the decider, the operator resumes the run."

    # --- the watch behind /events ----------------------------------------------------------

    def watch_scopes(self, user: User) -> list[str | None] | None:
        """Where to watch for ``user``'s live updates, or None when there are more than
        ``max_watches_per_stream`` (the stream then polls). Namespaces found by listing namespaces
        are narrowed to those where the person's last page load could list AgentRuns."""
        scopes, _ = self.scopes(user)
        if not self.settings.namespaces and scopes != [None]:
            with self._lock:
                seen = self._listable.get((user.name, user.groups))
            if seen is not None and time.monotonic() - seen[0] < LISTABLE_TTL:
                scopes = [ns for ns in scopes if ns in seen[1]]
        return scopes if len(scopes) <= self.settings.max_watches_per_stream else None

    def _remember_listable(self, user: User, namespaces: list[str]) -> None:
        with self._lock:
            if len(self._listable) > 10000:
                self._listable.clear()
            self._listable[(user.name, user.groups)] = (time.monotonic(), frozenset(namespaces))

    def watch(self, user: User, scope: str | None, out: queue.Queue[dict[str, Any]]) -> Any:
        """Start the watch of ``scope`` as ``user`` (an informer on the API client's loop): one
        ``{"type", "key"}`` per change on ``out``, a ``RESYNC`` when it had to list again (a 410:
        events may have been missed). Returns the informer, for :meth:`unwatch`.

        Never blocks on ``out``: when it is full the event is dropped (the page re-lists everything
        on any change, so the queued ones already cover it). A refusal (403) ends the watch of that
        scope for good, silently (the person may not list AgentRuns there: nothing changed that the
        page should re-list for); other errors are retried by the informer with backoff, without an
        event."""
        return self.kube.watch_runs(user, scope, Changes(out, user, scope), self.settings.watch_seconds)

    def unwatch(self, watch: Any) -> None:
        self.kube.unwatch(watch)


class Changes:
    """The sink of one scope's informer (called on the API client's loop): what changed, as the
    page's event stream says it."""

    def __init__(self, out: queue.Queue[dict[str, Any]], user: User, scope: str | None) -> None:
        self.out, self.who, self.where = out, user.name[:64], scope or "all namespaces"
        self.listed = False

    def replace(self, kind: str, scope: str | None, items: list[dict[str, Any]]) -> None:
        if self.listed:  # listed again (the watch expired): events may have been missed
            _offer(self.out, {"type": "RESYNC", "key": ""})
        self.listed = True

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        _offer(self.out, {"type": type_, "key": f"{meta.get('namespace')}/{meta.get('name')}"})

    def refused(self, kind: str, status: int, scope: str | None) -> None:
        log.info("watch of %s for %s: HTTP %s; not watched", self.where, self.who, status)


def _offer(out: queue.Queue[dict[str, Any]], item: dict[str, Any]) -> None:
    try:
        out.put_nowait(item)
    except queue.Full:
        pass


Headers = dict[str, str] | list[tuple[str, str]]


class Handler(BaseHTTPRequestHandler):
    server_version = "agentrun-inbox"
    sys_version = ""
    app: Inbox  # set on the subclass by make_server
    server: InboxServer
    protocol_version = "HTTP/1.1"
    _user: User | None = None  # the person of this request, for the log line

    # --- plumbing ---------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()  # sets the socket's timeout to ``timeout`` (Settings.io_timeout, set by make_server)
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, in this connection's thread, under the request deadline

    def handle_one_request(self) -> None:
        self.server.waiting(self.connection)  # until the whole request is in (parse_request, do_POST)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok and self.command != "POST":
            self.server.received(self.connection)
        return ok

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # one line per request is logged by _send, without query strings or bodies

    def _send(self, status: int, body: bytes | str, ctype: str = "text/html; charset=utf-8",
              headers: Headers | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        extra = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        for k, v in [*SECURITY_HEADERS.items(), *extra]:
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self._log(status)

    def _log(self, status: int) -> None:
        user = getattr(self, "_user", None)
        who = user.name[:64] if user is not None else "-"
        log.info("%s %s %s %s", self.command, urlsplit(self.path).path[:200], status, who)

    def _json(self, status: int, doc: dict[str, Any], headers: Headers | None = None) -> None:
        self._send(status, json.dumps(doc), "application/json", headers)

    def _redirect(self, where: str, headers: Headers | None = None) -> None:
        extra = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        self._send(303, "", headers=[("Location", where), *extra])

    def _wants_json(self) -> bool:
        return "application/json" in (self.headers.get("Accept") or "")

    def _api_path(self) -> bool:
        path = urlsplit(self.path).path
        return self._wants_json() or path.startswith(("/fragment", "/events", "/decide")) or path.endswith("/fragment")

    def _headers_lower(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _same_origin(self) -> bool:
        """A POST's Origin (sent by every current browser) names this host; absent: allowed (the
        CSRF token still has to match)."""
        origin = self.headers.get("Origin")
        if origin is None:
            return True
        host = self.headers.get("X-Forwarded-Host") if self.app.settings.auth == "proxy" else None
        host = host or self.headers.get("Host") or ""
        return urlsplit(origin).netloc == host and origin != "null"

    def _form(self) -> dict[str, str] | None:
        """The urlencoded body (at most MAX_BODY bytes, read within the request deadline), or None
        (too large, or not a plain Content-Length body: the connection is then closed, so the
        unread rest is never taken for the next request)."""
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY or self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return None
        raw = self.rfile.read(n).decode("utf-8", errors="replace")
        return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}

    # --- who is asking ----------------------------------------------------------------------

    def _proxy_refusal(self) -> str | None:
        """Proxy mode: why this request is not from the auth proxy (None: it is). The proxy proves
        itself with the shared secret header and/or a client certificate (docs/inbox.md "Trust")."""
        s = self.app.settings
        if s.auth != "proxy":
            return None
        if s.proxy_mtls:
            cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            if not cert:
                return ("Refused: the inbox answers only its auth proxy, and this connection has no client "
                        "certificate signed by the proxy CA (--proxy-client-ca).")
        if s.proxy_secret is not None:
            sent = self.headers.get_all(s.proxy_secret_header) or []
            if len(sent) != 1 or not identity.proxy_secret_ok(sent[0], s.proxy_secret):
                return (f"Refused: the inbox answers only its auth proxy, and this request does not carry the "
                        f"proxy's {s.proxy_secret_header} header (or carries a wrong one).")
        return None

    def _refuse_unauthenticated_proxy(self) -> bool:
        why = self._proxy_refusal()
        if why is None:
            return False
        self._user = None
        self.close_connection = True
        log.warning("refused: a request not from the auth proxy (%s)",
                    "no client certificate" if "certificate" in why else f"no or wrong {self.app.settings.proxy_secret_header}")
        if self._api_path() or self.command == "POST":
            self._json(401, {"message": why})
        else:
            self._send(401, view.message_html("Not from the auth proxy", why))
        return True

    def _session(self) -> tuple[identity.Session | None, Headers, tuple[int, str] | None]:
        """The session, Set-Cookie headers to send with the answer, and a refusal (HTTP status,
        message): in proxy mode when the proxy's headers name someone the inbox will not act as,
        in token mode when the re-check of the token (TokenReview) ends the session."""
        s = self.app.settings
        now = time.time()
        cookie = identity.parse_cookies(self.headers.get("Cookie")).get(identity.COOKIE)
        session = identity.decode_session(cookie, s.key, now)
        if s.auth != "proxy":
            if session is None or now - session.checked < s.session_recheck:
                return session, {}, None
            return self._recheck(session, now)
        for name in (s.user_header, s.groups_header):
            # a client's own header next to the proxy's (a proxy that appends instead of replacing):
            # which one is the proxy's cannot be told, so neither is taken
            if name and len(self.headers.get_all(name) or []) > 1:
                log.warning("refused: the request carries %s more than once", name[:64])
                return None, {}, (400, f"The request carries the header {name} more than once: the auth proxy in "
                                       "front of the inbox must replace it, not append to it.")
        try:
            user = identity.proxy_user(self._headers_lower(), s.user_header, s.groups_header,
                                       frozenset(s.proxy_groups))
        except identity.ReservedIdentity as e:
            log.warning("refused: the auth proxy's headers name the %s %s (system: identities are never taken "
                        "from proxy headers)", e.what, one_line(e.value, 80))
            return None, {}, (403, f"Refused: the auth proxy sent the {e.what} {one_line(e.value, 80)}. Users and "
                                   "groups beginning with system: belong to Kubernetes itself and are never accepted "
                                   "from proxy headers.")
        except identity.IdentityError as e:
            log.warning("refused: the auth proxy's headers cannot be impersonated: %s", one_line(str(e), 200))
            return None, {}, (400, f"The auth proxy's headers cannot be used: {e}")
        if user is None:
            return None, {}, None
        if session is not None and session.user == user:
            return session, {}, None
        session = identity.new_session(user, now, s.session_ttl)
        value = identity.encode_session(session, s.key)
        return session, {"Set-Cookie": identity.cookie_header(value, s.session_ttl, s.secure_cookies)}, None

    def _recheck(self, session: identity.Session, now: float) -> tuple[identity.Session | None, Headers,
                                                                         tuple[int, str] | None]:
        """Token mode: TokenReview of the session's token again (every ``session_recheck``). A token
        the API server no longer accepts (revoked: its ServiceAccount or bound object deleted, or a
        webhook's answer) ends the session; an API server that does not answer refuses this request
        and keeps the cookie (the next request tries again)."""
        s = self.app.settings
        ended = {"Set-Cookie": identity.cookie_header("", 0, s.secure_cookies)}
        who = session.user.name[:64]
        token = identity.open_token(session.sealed, s.key)
        if token is None:
            log.info("session of %s ended: it holds no token to check again", who)
            return None, ended, (401, SESSION_ENDED)
        try:
            user = self.app.kube.token_review(token, list(s.token_audiences) or None)
        except AudienceRefused as e:
            log.info("session of %s ended: %s", who, one_line(str(e), 300))
            user = None
        except ApiError as e:
            log.warning("re-check of the session of %s: TokenReview failed: %s", who, one_line(str(e), 300))
            return None, {}, (502, "The API server could not check your sign-in again (TokenReview): try again shortly.")
        finally:
            del token
        if user is None or user.name != session.user.name:
            log.info("session of %s ended: the API server no longer accepts its token", who)
            return None, ended, (401, SESSION_ENDED)
        try:
            fresh = identity.rechecked(session, identity.checked_user(user.name, user.groups), now)
            value = identity.encode_session(fresh, s.key)
        except identity.IdentityError as e:
            return None, ended, (401, f"Your session ended: {e}")
        return fresh, {"Set-Cookie": identity.cookie_header(value, fresh.expires - int(now), s.secure_cookies)}, None

    def _signed_in(self) -> tuple[identity.Session | None, Headers]:
        session, headers, refused = self._session()
        self._user = session.user if session else None
        if refused is not None:
            status, message = refused
            if self._api_path():
                self._json(status, {"message": message}, headers)
            elif self.app.settings.auth == "token" and status == 401:
                self._send_login(message, status, headers)
            else:
                self._send(status, view.message_html("Not signed in", message), headers=headers)
        elif session is None:
            if self.app.settings.auth == "proxy":
                self._send(401, view.message_html("Not signed in", "The auth proxy in front of the inbox sent no "
                                                  "user: the inbox is reachable only through it."))
            elif self._api_path():
                self._json(401, {"message": "not signed in"})
            else:
                self._redirect("/login")
        return session, headers

    # --- routes -----------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/healthz":
                return self._send(200, "ok", "text/plain")
            if self._refuse_unauthenticated_proxy():
                return None
            if path == "/favicon.ico":
                return self._send(204, "", "image/x-icon")
            if path == "/static/app.css":
                return self._send(200, assets.CSS, "text/css; charset=utf-8")
            if path == "/static/app.js":
                return self._send(200, assets.JS, "text/javascript; charset=utf-8")
            if path == "/login":
                return self._send_login(None)
            run_path = _RUN_PATH.match(path)
            if path not in ("/", "/fragment", "/events", "/runs", "/runs/fragment") and run_path is None:
                return self._send(404, view.message_html("Not found", "There is no such page."))
            session, headers = self._signed_in()
            if session is None:
                return None
            csrf = session.csrf(self.app.settings.key)
            if path == "/events":
                return self._events(session, headers)
            if path in ("/runs", "/runs/fragment"):
                return self._runs(session.user, csrf, headers, path.endswith("/fragment"))
            if run_path is not None:
                return self._run(session.user, csrf, headers, unquote(run_path[1]), unquote(run_path[2]),
                                 bool(run_path[3]))
            main = self.app.main_html(session.user, csrf)
            if path == "/fragment":
                return self._send(200, main, headers=headers)
            return self._send(200, view.page_html(session.user.name, main, csrf), headers=headers)
        except ApiError as e:
            log.warning("API server: %s", str(e)[:300])
            self._send(502, view.message_html("The API server did not answer as expected", e.message))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _runs(self, user: User, csrf: str, headers: Headers, fragment: bool) -> None:
        query = urlsplit(self.path).query
        filters = explorer.parse_filters(parse_qs(query[:2000]))
        main, namespaces = self.app.runs_list(user, filters)
        if fragment:
            return self._send(200, main, headers=headers)
        return self._send(200, explorer.explorer_page(
            "Runs", "Runs", user.name, csrf, "/runs/fragment" + filters.query(), "Live: runs update as they change.",
            explorer.filter_form(filters, namespaces), main), headers=headers)

    def _run(self, user: User, csrf: str, headers: Headers, ns: str, name: str, fragment: bool) -> None:
        if not _NS.match(ns) or not _NAME.match(name):
            return self._send(404, view.message_html("Not found", "There is no such run: namespace and name must "
                                                                  "be Kubernetes names."), headers=headers)
        status, main = self.app.run_page(user, ns, name)
        if fragment:
            return self._send(status, main, headers=headers)
        href = explorer.run_href(ns, name)
        return self._send(status, explorer.explorer_page(
            f"{ns}/{name}", "Run", user.name, csrf, href + "/fragment", "Live: the run updates as it changes.",
            explorer.run_heading(ns, name), main), headers=headers)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        try:
            form = self._form()  # the whole request is in: no longer counted as waiting for it
            self.server.received(self.connection)
            if self._refuse_unauthenticated_proxy():
                return None
            if not self._same_origin():
                self._user = None
                return self._json(403, {"message": "cross-site request refused"})
            if form is None:
                self._user = None
                return self._json(413, {"message": f"the request body must be a form of at most {MAX_BODY} bytes"})
            if path == "/login":
                return self._login(form)
            if path not in ("/decide", "/logout"):
                return self._send(404, view.message_html("Not found", "There is no such page."))
            session, headers = self._signed_in()
            if session is None:
                return None
            token = form.get("csrf") or self.headers.get("X-CSRF-Token")
            if not session.csrf_ok(self.app.settings.key, token):
                return self._json(403, {"message": "missing or wrong CSRF token: reload the page"})
            if path == "/logout":
                return self._redirect("/login", {"Set-Cookie": identity.cookie_header("", 0,
                                                                                      self.app.settings.secure_cookies)})
            status, message = self.app.decide(session.user, form)
            log.info("decision %s on %s/%s by %s: %s", form.get("decision", "")[:8], form.get("namespace", "")[:63],
                     form.get("name", "")[:253], session.user.name[:64], status)
            if self._wants_json():
                return self._json(status, {"ok": status == 200, "message": message}, headers)
            return self._send(status, view.message_html("Decision sent" if status == 200 else "Not decided", message),
                              headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _proxy_note(self) -> str | None:
        if self.app.settings.auth == "proxy":
            return "This inbox signs people in through the auth proxy in front of it; a token is not accepted here."
        return None

    def _send_login(self, error: str | None, status: int = 200, headers: Headers | None = None) -> None:
        """The sign-in page. In token mode its form carries a CSRF token bound to a fresh nonce in
        a cookie of its own (SameSite=Strict, Path=/login): a form posted from anywhere else (login
        CSRF: signing someone in as the attacker) has neither."""
        s = self.app.settings
        extra = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        if s.auth != "token":
            return self._send(status, view.login_html(error, self._proxy_note()), headers=extra)
        nonce = secrets.token_urlsafe(16)
        extra.append(("Set-Cookie", identity.cookie_header(nonce, identity.LOGIN_FORM_SECONDS, s.secure_cookies,
                                                           name=identity.LOGIN_COOKIE, path="/login")))
        self._send(status, view.login_html(error, None, identity.login_csrf(s.key, nonce)), headers=extra)

    def _login(self, form: dict[str, str]) -> None:
        s = self.app.settings
        self._user = None
        if s.auth != "token":
            return self._send(400, view.login_html("Sign-in by token is off: use the auth proxy.", self._proxy_note()))
        nonce = identity.parse_cookies(self.headers.get("Cookie")).get(identity.LOGIN_COOKIE)
        if not identity.login_csrf_ok(s.key, nonce, form.get("csrf")):
            log.warning("sign-in refused: the form's CSRF token is missing or not the one of its cookie")
            return self._send_login(LOGIN_CSRF_REFUSED, 403)
        token = form.get("token", "").strip()
        if not token or len(token) > MAX_TOKEN:
            return self._send_login("Paste a token.", 400)
        try:
            user = self.app.kube.token_review(token, list(s.token_audiences) or None)
        except AudienceRefused as e:
            log.warning("sign-in refused: %s", one_line(str(e), 300))
            return self._send_login("This token is not meant for this inbox: the API server's answer names none of "
                                    "the audiences the inbox requires.", 401)
        except ApiError as e:
            log.warning("TokenReview failed: HTTP %s: %s", e.status, e.message[:300])
            return self._send_login("The API server could not check the token (TokenReview).", 502)
        if user is None:
            return self._send_login("The API server did not accept this token.", 401)
        now = time.time()
        try:
            user = identity.checked_user(user.name, user.groups)
            session = identity.new_session(user, now, s.session_ttl, token=token, key=s.key)
            value = identity.encode_session(session, s.key)
        except identity.IdentityError as e:
            return self._send_login(f"Cannot sign in: {e}", 400)
        finally:
            del token
        if session.expires <= now:
            return self._send_login("This token has expired.", 401)
        self._user = user
        self._redirect("/", [
            ("Set-Cookie", identity.cookie_header(value, session.expires - int(now), s.secure_cookies)),
            ("Set-Cookie", identity.cookie_header("", 0, s.secure_cookies, name=identity.LOGIN_COOKIE, path="/login")),
        ])

    def _events(self, session: identity.Session, headers: Headers) -> None:
        """Server-sent events: ``change`` on each watch event of the person's agentruns, a comment
        every 15 s, closed after ``sse_seconds`` (the browser reconnects and the page refreshes).
        At most ``max_watches_per_stream`` watches (informers on the API client's loop) per stream and ``max_watches``
        in all; beyond either, the stream sends a ``change`` every ``poll_seconds`` instead. It ends
        no later than the session, and in token mode when the token is due to be checked again
        (the browser reconnects, and that request checks it)."""
        app = self.app
        user = session.user
        now = time.time()
        left = session.expires - now
        if app.settings.auth == "token":
            left = min(left, session.checked + app.settings.session_recheck - now)
        if not app.streams.acquire(blocking=False):
            return self._json(503, {"message": "too many live connections"})
        watches: list[Any] = []
        held = 0
        try:
            scopes = app.watch_scopes(user)
            if scopes is not None:
                while held < len(scopes) and app.watches.acquire(blocking=False):
                    held += 1
                if held < len(scopes):
                    for _ in range(held):
                        app.watches.release()
                    held = 0
                    log.warning("live updates for %s: %d watches would exceed %d in all; polling",
                                user.name[:64], len(scopes), app.settings.max_watches)
                    scopes = None
            self.send_response(200)
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.send_header("X-Accel-Buffering", "no")
            for k, v in (list(headers.items()) if isinstance(headers, dict) else headers):
                self.send_header(k, v)
            self.end_headers()
            self.close_connection = True
            self._log(200)
            out: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1000)
            for scope in scopes or []:
                watches.append(app.watch(user, scope, out))
            self.wfile.write(b"retry: 2000\n\n")
            self.wfile.flush()
            end = time.monotonic() + max(1.0, min(float(app.settings.sse_seconds), left))
            wait = 15 if scopes is not None else min(15, app.settings.poll_seconds)
            next_poll = time.monotonic() + app.settings.poll_seconds
            while time.monotonic() < end:
                try:
                    ev = out.get(timeout=wait)
                except queue.Empty:
                    if scopes is None and time.monotonic() >= next_poll:
                        next_poll = time.monotonic() + app.settings.poll_seconds
                        ev = {"type": "POLL", "key": ""}
                        self.wfile.write(f"event: change\ndata: {json.dumps(ev)}\n\n".encode())
                    else:
                        self.wfile.write(b": keep-alive\n\n")
                else:
                    self.wfile.write(f"event: change\ndata: {json.dumps(ev)}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            for w in watches:
                app.unwatch(w)
            for _ in range(held):
                app.watches.release()
            app.streams.release()


class InboxServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` (a thread per connection) that bounds what a connection that has
    not yet sent a whole request can hold: it must send it (request line, headers, body; and the
    TLS handshake) within ``request_timeout`` or it is closed, and at most ``max_pending`` such
    connections are kept: a new one closes the oldest. Half-sent requests, however many, hold at
    most ``max_pending`` threads, and a real request still gets in. TLS (``tls``) is set up per
    connection in its own thread, never in the accepting one."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # the listen backlog (the standard library's 5 makes a burst of connections wait on SYN retries)

    def __init__(self, address: tuple[str, int], handler: type[Handler], settings: Settings,
                 tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.request_timeout, self.max_pending = settings.request_timeout, max(1, settings.max_pending)
        self._pending: dict[Any, float] = {}  # connection -> deadline, oldest first
        self._plock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._reap, daemon=True, name="inbox-reaper").start()

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        self.waiting(request)
        super().process_request(request, client_address)

    def waiting(self, conn: Any) -> None:
        """``conn`` waits for (the rest of) a request: from now on it has ``request_timeout``."""
        evicted = None
        with self._plock:
            self._pending.pop(conn, None)
            if len(self._pending) >= self.max_pending:
                evicted = next(iter(self._pending))
                del self._pending[evicted]
            self._pending[conn] = time.monotonic() + self.request_timeout
        if evicted is not None:
            _drop(evicted)

    def received(self, conn: Any) -> None:
        with self._plock:
            self._pending.pop(conn, None)

    def pending(self) -> int:
        with self._plock:
            return len(self._pending)

    def shutdown_request(self, request: Any) -> None:
        self.received(request)
        super().shutdown_request(request)

    def _reap(self) -> None:
        while not self._closed.wait(0.25):
            now = time.monotonic()
            with self._plock:
                late = [c for c, deadline in self._pending.items() if deadline <= now]
                for c in late:
                    del self._pending[c]
            for c in late:
                _drop(c)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a connection closed by the deadline, a failed TLS handshake, a client gone: one line, no traceback
        import sys

        log.debug("connection ended: %s", type(sys.exc_info()[1]).__name__)


def _drop(conn: Any) -> None:
    """End a connection whose thread is blocked reading it (its read returns at once)."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass


def make_server(app: Inbox, host: str, port: int, tls: ssl.SSLContext | None = None) -> InboxServer:
    handler = type("InboxHandler", (Handler,), {"app": app, "timeout": app.settings.io_timeout})
    return InboxServer((host, port), handler, app.settings, tls)
