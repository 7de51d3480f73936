"""Who is asking: signed session cookies, CSRF tokens and the trusted auth-proxy headers.

Pure apart from the key it is given. A session is a signed cookie (HMAC-SHA256) holding the
person's name, groups, expiry, a random nonce, when the sign-in was last checked and (token mode)
the bearer token, encrypted (``seal_token``): the inbox re-checks it with TokenReview every few
minutes, so a revoked token ends the session, and the session never outlives the token's ``exp``.
Because it is signed, not stored, every inbox replica accepts it and a restart keeps people signed
in when the key comes from a Secret. The CSRF token of a session is HMAC(key, "csrf:" + nonce): a
page from this server carries it in every form; a request from another site has the cookie (not
with SameSite=Strict, but defence in depth) yet never the token. The sign-in form has its own
(``login_csrf``), bound to a short-lived cookie set with the form (login CSRF).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentrun.api.approval import MAX_DECIDED_BY_CHARS
from agentrun.inbox.kube import User

COOKIE = "agentrun_inbox"
LOGIN_COOKIE = "agentrun_inbox_login"  # the sign-in form's nonce (login CSRF), Path=/login
LOGIN_FORM_SECONDS = 1800
MAX_GROUPS = 64
MAX_GROUP_CHARS = 256
MAX_COOKIE_CHARS = 3800  # browsers keep cookies up to 4096 bytes


RESERVED_PREFIX = "system:"


class IdentityError(ValueError):
    """A name or group that cannot be sent as an Impersonate-* header, or a bad session."""


class ReservedIdentity(IdentityError):
    """An auth proxy's header named a ``system:`` user or group (``system:masters``,
    ``system:serviceaccount:...``, ``system:nodes`` ...). Those are Kubernetes' own identities:
    no person signs in through an OIDC proxy as one, and the inbox's ServiceAccount may
    impersonate any group, so taking one from a header would hand out that group's power."""

    def __init__(self, what: str, value: str) -> None:
        self.what, self.value = what, value
        super().__init__(f"the auth proxy sent the {what} {value!r}: users and groups beginning with "
                         f"{RESERVED_PREFIX!r} are Kubernetes' own and are never accepted from proxy headers")


def _printable(value: str, limit: int, what: str) -> str:
    if not value or len(value) > limit or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise IdentityError(f"{what} must be 1..{limit} printable characters")
    try:
        value.encode("latin-1")  # an HTTP header value
    except UnicodeEncodeError:
        raise IdentityError(f"{what} must be Latin-1 (it travels in an Impersonate-* header)") from None
    return value


def checked_user(name: str, groups: list[str] | tuple[str, ...]) -> User:
    """A ``User`` whose name and groups can be impersonated, bounded; raises IdentityError."""
    name = _printable(name.strip(), MAX_DECIDED_BY_CHARS, "user name")
    out: list[str] = []
    for g in groups:
        g = g.strip()
        if g and g not in out:
            if len(out) == MAX_GROUPS:  # checked as they come: a long header costs no more than this
                raise IdentityError(f"more than {MAX_GROUPS} groups")
            out.append(_printable(g, MAX_GROUP_CHARS, "group"))
    return User(name=name, groups=tuple(out))


def proxy_user(headers: dict[str, str], user_header: str, groups_header: str | None,
               allowed_groups: tuple[str, ...] | frozenset[str] = ()) -> User | None:
    """The person an auth proxy (oauth2-proxy ``--pass-user-headers``: X-Forwarded-User,
    X-Forwarded-Groups comma-separated) put in front of the request, or None without the header.
    Only the groups in ``allowed_groups`` are kept (the others are dropped: the inbox never
    impersonates a group nobody listed). Raises ReservedIdentity for a ``system:`` user or group
    (listed or not), IdentityError for anything else that cannot be impersonated."""
    name = headers.get(user_header.lower())
    if not name:
        return None
    groups = (headers.get(groups_header.lower()) or "").split(",") if groups_header else []
    user = checked_user(name, groups)  # bounded first: the refusal below quotes a checked value
    if user.name.startswith(RESERVED_PREFIX):
        raise ReservedIdentity("user", user.name)
    for g in user.groups:
        if g.startswith(RESERVED_PREFIX):
            raise ReservedIdentity("group", g)
    return User(name=user.name, groups=tuple(g for g in user.groups if g in allowed_groups))


def proxy_secret_ok(sent: str | None, secret: bytes) -> bool:
    """The auth proxy's shared secret header, compared in constant time."""
    return bool(sent) and hmac.compare_digest(hashlib.sha256((sent or "").encode("utf-8", "replace")).digest(),
                                              hashlib.sha256(secret).digest())


@dataclass(frozen=True)
class Session:
    user: User
    expires: int  # unix seconds: the session ttl, or the token's exp if sooner
    nonce: str
    checked: int = 0  # unix seconds of the last TokenReview of the token (token mode)
    sealed: str | None = None  # token mode: the bearer token, sealed (seal_token); never in clear

    def csrf(self, key: bytes) -> str:
        return hmac.new(key, b"csrf:" + self.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, key: bytes, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(key).encode(), (token or "").encode("utf-8", "replace"))


def new_session(user: User, now: float, ttl_seconds: int, *, token: str | None = None, key: bytes = b"") -> Session:
    """A session of ``user`` from ``now``; with ``token`` (token mode) it ends at the token's
    ``exp`` if that is sooner, and keeps the token sealed with ``key`` for re-checks."""
    expires = int(now) + int(ttl_seconds)
    if token is not None:
        exp = token_expiry(token)
        if exp is not None:
            expires = min(expires, exp)
    return Session(user=user, expires=expires, nonce=secrets.token_urlsafe(16), checked=int(now),
                   sealed=seal_token(token, key) if token is not None else None)


def token_expiry(token: str) -> int | None:
    """The ``exp`` claim (unix seconds) of a JWT (ServiceAccount and OIDC tokens are), read without
    checking the signature: it is only used for a token the API server has just authenticated, to
    end the session no later than the token. None for a token that is not a JWT or has no exp."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        exp = json.loads(_unb64(parts[1])).get("exp")
    except (ValueError, AttributeError):
        return None
    return int(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def _token_key(key: bytes) -> bytes:
    return hmac.new(key, b"agentrun-inbox:token-seal", hashlib.sha256).digest()


_SEAL_AAD = b"agentrun-inbox:token"
_NONCE_BYTES = 12


def seal_token(token: str, key: bytes) -> str:
    """The token encrypted for the session cookie with AES-256-GCM (the ``cryptography`` package),
    under a key derived from the session key and a random 96-bit nonce. Whoever holds the cookie
    can use it on the inbox (as with any session cookie) but cannot read the token out of it and
    take it to the API server."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    return _b64(nonce + AESGCM(_token_key(key)).encrypt(nonce, token.encode(), _SEAL_AAD))


def open_token(sealed: str | None, key: bytes) -> str | None:
    """The token :func:`seal_token` sealed, or None when it is absent, altered or sealed by another key."""
    if not sealed:
        return None
    try:
        raw = _unb64(sealed)
    except ValueError:
        return None
    if len(raw) <= _NONCE_BYTES + 16:
        return None
    try:
        return AESGCM(_token_key(key)).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _SEAL_AAD).decode()
    except (InvalidTag, UnicodeDecodeError):
        return None


def rechecked(s: Session, user: User, now: float) -> Session:
    """The session after a TokenReview at ``now`` that answered ``user`` (same nonce: the page's
    CSRF token stays valid)."""
    return Session(user=user, expires=s.expires, nonce=s.nonce, checked=int(now), sealed=s.sealed)


def login_csrf(key: bytes, nonce: str) -> str:
    """The sign-in form's CSRF token, bound to the nonce in the LOGIN_COOKIE set with the form."""
    return hmac.new(key, b"login:" + nonce.encode("utf-8", "replace"), hashlib.sha256).hexdigest()


def login_csrf_ok(key: bytes, nonce: str | None, token: str | None) -> bool:
    return bool(nonce) and bool(token) and hmac.compare_digest(
        login_csrf(key, nonce or "").encode(), (token or "").encode("utf-8", "replace"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_session(s: Session, key: bytes) -> str:
    doc: dict[str, object] = {"u": s.user.name, "g": list(s.user.groups), "e": s.expires, "n": s.nonce,
                               "c": s.checked}
    if s.sealed:
        doc["t"] = s.sealed
    body = _b64(json.dumps(doc, separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    value = f"{body}.{sig}"
    if len(value) > MAX_COOKIE_CHARS:
        raise IdentityError("the token and groups are too long for a session cookie (at most "
                            f"{MAX_COOKIE_CHARS} characters)")
    return value


def decode_session(value: str | None, key: bytes, now: float) -> Session | None:
    """The session of a cookie value, or None (missing, forged, expired, malformed)."""
    if not value or len(value) > MAX_COOKIE_CHARS or "." not in value:
        return None
    body, sig = value.rsplit(".", 1)
    want = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(want.encode(), sig.encode("utf-8", "replace")):  # bytes: any text is comparable
        return None
    try:
        doc = json.loads(_unb64(body))
        sealed = doc.get("t")
        s = Session(user=checked_user(doc["u"], doc["g"]), expires=int(doc["e"]), nonce=str(doc["n"]),
                    checked=int(doc.get("c", 0)), sealed=sealed if isinstance(sealed, str) else None)
    except (ValueError, KeyError, TypeError):
        return None
    return s if s.expires > now else None


def cookie_header(value: str, max_age: int, secure: bool, name: str = COOKIE, path: str = "/") -> str:
    """Set-Cookie for the session: HttpOnly (no script reads it), SameSite=Strict (no other site
    sends it), Secure (HTTPS only) unless the inbox serves plain HTTP on loopback for development."""
    return (f"{name}={value}; Path={path}; Max-Age={max(0, int(max_age))}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


def parse_cookies(header: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (header or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out.setdefault(k.strip(), v.strip())
    return out
