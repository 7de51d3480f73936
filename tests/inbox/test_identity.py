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
    assert identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups") == User("carol@example.com",
                                                                                    ("finance", "ops"))
    assert identity.proxy_user({}, "X-Forwarded-User", "X-Forwarded-Groups") is None
    assert identity.proxy_user(h, "X-Forwarded-User", None) == User("carol@example.com")


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
        user = identity.proxy_user(h, "X-Forwarded-User", "X-Forwarded-Groups")
    except identity.ReservedIdentity as e:
        assert e.value.startswith("system:") and "system:" in str(e)
        return
    except identity.IdentityError:
        return
    assert user is None or (not user.name.startswith("system:") and not any(g.startswith("system:") for g in user.groups))
    if user is None:
        assert not name.strip()
