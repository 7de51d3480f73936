"""Sessions, CSRF tokens and the auth-proxy headers (agentrun.inbox.identity): pure."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrun.inbox import identity
from agentrun.inbox.kube import User

KEY = b"k" * 32
NOW = 1_800_000_000.0


def test_a_session_round_trips_and_carries_no_token():
    s = identity.new_session(User("alice", ("finance", "system:authenticated")), NOW, 3600)
    value = identity.encode_session(s, KEY)
    assert identity.decode_session(value, KEY, NOW + 10) == s
    assert identity.decode_session(value, KEY, NOW + 3600) is None  # expired
    assert identity.decode_session(value, b"x" * 32, NOW) is None  # another key


def test_a_tampered_session_is_refused():
    value = identity.encode_session(identity.new_session(User("bob"), NOW, 60), KEY)
    body, sig = value.rsplit(".", 1)
    forged = identity.encode_session(identity.new_session(User("alice", ("system:masters",)), NOW, 60), b"y" * 32)
    assert identity.decode_session(forged.rsplit(".", 1)[0] + "." + sig, KEY, NOW) is None
    assert identity.decode_session(body + "." + sig[:-2] + "AA", KEY, NOW) is None


@given(st.text(max_size=300))
def test_any_cookie_value_decodes_to_a_session_or_none(value):
    assert identity.decode_session(value, KEY, NOW) is None


def test_csrf_token_is_bound_to_the_session():
    a = identity.new_session(User("alice"), NOW, 60)
    b = identity.new_session(User("alice"), NOW, 60)
    assert a.csrf_ok(KEY, a.csrf(KEY))
    assert not a.csrf_ok(KEY, b.csrf(KEY)) and not a.csrf_ok(KEY, None) and not a.csrf_ok(KEY, "")
    assert not a.csrf_ok(KEY, "é" * 64)


@pytest.mark.parametrize("name, groups, what", [
    ("", [], "user name"),
    ("alice\r\nImpersonate-Group: system:masters", [], "user name"),
    ("alice", ["ok", "bad\ngroup"], "group"),
    ("ålice☃", [], "Latin-1"),
    ("a" * 257, [], "user name"),
    ("alice", [f"g{i}" for i in range(65)], "groups"),
])
def test_names_that_cannot_be_impersonated_are_refused(name, groups, what):
    with pytest.raises(identity.IdentityError, match=what):
        identity.checked_user(name, groups)


def test_proxy_headers():
    h = {"x-forwarded-user": "carol@example.com", "x-forwarded-groups": "finance, ops,,finance"}
    allowed = frozenset({"finance", "ops"})
    assert identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups", allowed) == User("carol@example.com",
                                                                                             ("finance", "ops"))
    assert identity.proxy_user({}, "X-Forwarded-User", "X-Forwarded-Groups", allowed) is None
    assert identity.proxy_user(h, "X-Forwarded-User", None, allowed) == User("carol@example.com")


def test_only_allowed_groups_are_taken_from_proxy_headers():
    """A forwarded group nobody listed (kubeadm:cluster-admins) is dropped, not impersonated."""
    h = {"x-forwarded-user": "carol", "x-forwarded-groups": "finance,kubeadm:cluster-admins,ops"}
    user = identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups", frozenset({"finance"}))
    assert user == User("carol", ("finance",))
    assert identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups") == User("carol")  # none listed: none
    with pytest.raises(identity.ReservedIdentity):  # system: is refused even when not listed
        identity.proxy_user({**h, "x-forwarded-groups": "finance,system:masters"}, "X-Forwarded-User",
                            "X-Forwarded-Groups", frozenset({"finance"}))


def test_the_proxy_secret_is_compared_whole():
    secret = b"s3cret-of-the-proxy-0123456789"
    assert identity.proxy_secret_ok(secret.decode(), secret)
    for sent in (None, "", secret.decode()[:-1], secret.decode() + "x", "é" * 30):
        assert not identity.proxy_secret_ok(sent, secret)


def _jwt(claims: dict) -> str:
    import base64
    import json

    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{b64({'alg': 'RS256'})}.{b64(claims)}.c2ln"


def test_a_token_session_ends_at_the_tokens_expiry_and_keeps_the_token_only_sealed():
    token = _jwt({"sub": "alice", "exp": int(NOW) + 600})
    s = identity.new_session(User("alice"), NOW, 8 * 3600, token=token, key=KEY)
    assert s.expires == int(NOW) + 600 and s.checked == int(NOW)
    value = identity.encode_session(s, KEY)
    assert token not in value and token.split(".")[1] not in value
    back = identity.decode_session(value, KEY, NOW + 10)
    assert back == s and identity.open_token(back.sealed, KEY) == token
    assert identity.open_token(back.sealed, b"x" * 32) != token  # another key opens nothing useful
    assert identity.decode_session(value, KEY, NOW + 600) is None  # the token's expiry ends it
    # a token without exp (or not a JWT): the session ttl
    assert identity.new_session(User("a"), NOW, 60, token="opaque", key=KEY).expires == int(NOW) + 60
    assert identity.token_expiry(_jwt({"exp": "soon"})) is None and identity.token_expiry("a.b") is None
    # a re-check keeps the nonce (the page's CSRF token stays valid) and the expiry
    again = identity.rechecked(s, User("alice", ("g",)), NOW + 300)
    assert (again.nonce, again.expires, again.checked, again.sealed) == (s.nonce, s.expires, int(NOW) + 300, s.sealed)


def test_the_login_csrf_token_is_bound_to_its_nonce():
    t = identity.login_csrf(KEY, "n1")
    assert identity.login_csrf_ok(KEY, "n1", t)
    assert not identity.login_csrf_ok(KEY, "n2", t) and not identity.login_csrf_ok(KEY, None, t)
    assert not identity.login_csrf_ok(KEY, "n1", None) and not identity.login_csrf_ok(b"y" * 32, "n1", t)


def test_cookie_flags():
    c = identity.cookie_header("v", 60, secure=True)
    assert "HttpOnly" in c and "SameSite=Strict" in c and "Secure" in c and c.startswith("agentrun_inbox=v;")
    assert "Secure" not in identity.cookie_header("v", 60, secure=False)
    assert identity.parse_cookies("a=1; agentrun_inbox=x.y; b=2")["agentrun_inbox"] == "x.y"


def test_a_huge_groups_header_is_refused_after_the_first_groups_beyond_the_limit(monkeypatch):
    """An auth proxy's groups header of tens of thousands of names is refused as soon as the limit
    is passed: the work does not grow with the header (it was quadratic: each new group was
    compared with all the earlier ones before the count was checked)."""
    seen: list[str] = []
    real = identity._printable
    monkeypatch.setattr(identity, "_printable", lambda v, limit, what: seen.append(v) or real(v, limit, what))
    h = {"x-forwarded-user": "carol", "x-forwarded-groups": ",".join(f"g{i}" for i in range(30000))}
    with pytest.raises(identity.IdentityError, match="groups"):
        identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups")
    assert len(seen) == 1 + identity.MAX_GROUPS  # the name, then the groups up to the limit


_NAMES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters=","), max_size=20)


@given(st.one_of(_NAMES, _NAMES.map(lambda s: "system:" + s)),
       st.lists(st.one_of(_NAMES, _NAMES.map(lambda s: "system:" + s), _NAMES.map(lambda s: " system:" + s)), max_size=6))
def test_no_system_identity_ever_comes_from_proxy_headers(name, groups):
    h = {"x-forwarded-user": name, "x-forwarded-groups": ",".join(groups)}
    try:
        user = identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups", frozenset(g.strip() for g in groups))
    except identity.ReservedIdentity as e:
        assert e.value.startswith("system:") and "system:" in str(e)
        return
    except identity.IdentityError:
        return
    assert user is None or (not user.name.startswith("system:") and not any(g.startswith("system:") for g in user.groups))
    if user is None:
        assert not name.strip()
