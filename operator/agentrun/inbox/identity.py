"""Who is asking: signed session cookies, CSRF tokens and the trusted auth-proxy headers.

Pure apart from the key it is given. A session is a signed cookie (HMAC-SHA256) holding the
person's name, groups, expiry and a random nonce; nothing secret is in it (no token: the bearer
token is checked once with TokenReview at sign-in and then dropped). Because it is signed, not
stored, every inbox replica accepts it and a restart keeps people signed in when the key comes
from a Secret. The CSRF token of a session is HMAC(key, "csrf:" + nonce): a page from this server
carries it in every form; a request from another site has the cookie (not with SameSite=Strict,
but defence in depth) yet never the token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from agentrun.api.approval import MAX_DECIDED_BY_CHARS
from agentrun.inbox.kube import User

COOKIE = "agentrun_inbox"
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


def proxy_user(headers: dict[str, str], user_header: str, groups_header: str | None) -> User | None:
    """The person an auth proxy (oauth2-proxy ``--pass-user-headers``: X-Forwarded-User,
    X-Forwarded-Groups comma-separated) put in front of the request, or None without the header.
    Raises ReservedIdentity for a ``system:`` user or group, IdentityError for anything else that
    cannot be impersonated."""
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
    return user


@dataclass(frozen=True)
class Session:
    user: User
    expires: int  # unix seconds
    nonce: str

    def csrf(self, key: bytes) -> str:
        return hmac.new(key, b"csrf:" + self.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, key: bytes, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(key).encode(), (token or "").encode("utf-8", "replace"))


def new_session(user: User, now: float, ttl_seconds: int) -> Session:
    return Session(user=user, expires=int(now) + int(ttl_seconds), nonce=secrets.token_urlsafe(16))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_session(s: Session, key: bytes) -> str:
    body = _b64(json.dumps({"u": s.user.name, "g": list(s.user.groups), "e": s.expires, "n": s.nonce},
                           separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    value = f"{body}.{sig}"
    if len(value) > MAX_COOKIE_CHARS:
        raise IdentityError("too many or too long groups for a session cookie")
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
        s = Session(user=checked_user(doc["u"], doc["g"]), expires=int(doc["e"]), nonce=str(doc["n"]))
    except (ValueError, KeyError, TypeError):
        return None
    return s if s.expires > now else None


def cookie_header(value: str, max_age: int, secure: bool) -> str:
    """Set-Cookie for the session: HttpOnly (no script reads it), SameSite=Strict (no other site
    sends it), Secure (HTTPS only) unless the inbox serves plain HTTP on loopback for development."""
    return (f"{COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


def parse_cookies(header: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (header or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out.setdefault(k.strip(), v.strip())
    return out
