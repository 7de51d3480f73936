"""The lap's connect-time address check (lap/netguard.py, issue 29): the address a connection
reaches, whatever name it came from, is checked against the run's AddressRules before any byte is
sent. Real sockets: a listener on a loopback address counts the connections it accepts, so "no
request was sent" is observed, not assumed (Linux routes all of 127.0.0.0/8 to lo)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lap_helpers import ChatServer, Listener, chat_reply, spec_doc, spec_of, tool

from agentrun.api import addresses as addr
from agentrun.api import tenancy as t
from agentrun.api.contract import Env
from agentrun.checkpoint.schema import Message
from agentrun.lap.errors import ConfigError
from agentrun.lap.interfaces import ModelRequest
from agentrun.lap.models import make_model
from agentrun.lap.models.openai import OpenAIModel
from agentrun.lap.netguard import AddressRefused, guarded_client, rules_from_env
from agentrun.lap.tools.http import HTTPToolRunner

DENY_127_0_0_2 = addr.AddressRules(denied=(("127.0.0.2/32", "AgentRunPolicy local rule destinations.deniedCIDRs"),))


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


def _tool_spec(url: str) -> Any:
    return spec_of(spec_doc([tool("lookup", url, sideEffects=False)], [])).agent.tools[0]


def test_a_tool_call_to_a_denied_address_fails_naming_tool_host_address_and_rule_and_sends_nothing(listener):
    runner = HTTPToolRunner(tries=3, backoff_seconds=0.0, rules=DENY_127_0_0_2)
    with pytest.raises(AddressRefused) as e:
        runner.call(_tool_spec(f"http://127.0.0.2:{listener.port}/q"), {"q": "x"}, "k1")
    assert str(e.value) == (
        "tool 'lookup': connection to host \"127.0.0.2\" refused: address 127.0.0.2 is in the denied range "
        "127.0.0.2/32 (AgentRunPolicy local rule destinations.deniedCIDRs); no request was sent")
    assert e.value.permanent and listener.accepted == 0  # refused once, not retried, nothing connected


def test_the_same_call_goes_through_when_the_rules_allow_the_address(listener):
    out = HTTPToolRunner(rules=addr.AddressRules()).call(_tool_spec(f"http://127.0.0.2:{listener.port}/q"), {}, "k1")
    assert out.status == "ok" and out.result == "{}" and listener.accepted == 1


def test_a_name_is_judged_by_the_address_it_resolves_to():
    """localhost passes admission where allowLoopback is true; a policy that refuses loopback also
    refuses it at connect time, whatever the name (a wildcard-DNS name or a rebinding one alike)."""
    lst = Listener("127.0.0.1")
    try:
        rules = addr.AddressRules.of({"strict": t.AgentRunPolicySpec()})
        with pytest.raises(AddressRefused) as e:
            HTTPToolRunner(rules=rules).call(_tool_spec(f"http://localhost:{lst.port}/q"), {}, "k1")
        assert 'connection to host "localhost" refused: address ' in str(e.value)
        assert "is loopback, refused unless allowLoopback is true (AgentRunPolicy strict rule " \
               "destinations.allowLoopback)" in str(e.value)
        assert lst.accepted == 0
    finally:
        lst.close()


def test_the_model_client_checks_its_connections_too(listener):
    doc = spec_doc([], [], model={"provider": "openai", "name": "m", "baseURL": f"http://127.0.0.2:{listener.port}/v1",
                                  "requestTimeout": "5s"})
    spec = spec_of(doc)
    env = {Env.ADDRESS_RULES: DENY_127_0_0_2.to_env()}
    model = make_model(spec, env)
    request = ModelRequest(lap=1, messages=(Message(role="user", content="hi", lap=0),), tools=())
    with pytest.raises(AddressRefused) as e:
        model.complete(request)
    assert str(e.value).startswith(f"model endpoint http://127.0.0.2:{listener.port}/v1/chat/completions: "
                                   "connection to host \"127.0.0.2\" refused: address 127.0.0.2 is in the denied "
                                   "range 127.0.0.2/32")
    assert listener.accepted == 0
    with ChatServer() as srv:  # the default rules (always-denied only) leave loopback alone
        srv.replies.append((200, chat_reply("ok")))
        m = OpenAIModel.from_spec(spec_of(spec_doc([], [], model={"provider": "openai", "name": "m",
                                                                  "baseURL": srv.base_url})).agent.model, None)
        assert m.complete(request).content == "ok"


def test_the_always_denied_ranges_hold_without_any_policy():
    with pytest.raises(AddressRefused) as e:
        HTTPToolRunner().call(_tool_spec("http://169.254.169.254/latest/meta-data/"), {}, "k1")
    assert "address 169.254.169.254 is in 169.254.0.0/16" in str(e.value)
    assert "(AgentRunPolicy rule destinations.alwaysDenied)" in str(e.value)
    with pytest.raises(AddressRefused):
        HTTPToolRunner().call(_tool_spec("http://[::ffff:169.254.169.254]/"), {}, "k1")


def test_a_proxys_address_is_checked(listener, monkeypatch):
    """With a proxy the connection is to the proxy: its address is what the rules judge."""
    client = guarded_client(DENY_127_0_0_2, proxy=f"http://127.0.0.2:{listener.port}")
    with pytest.raises(AddressRefused):
        client.get("http://example.invalid/")
    assert listener.accepted == 0


def test_rules_from_env():
    assert rules_from_env({}) == addr.AddressRules()
    assert rules_from_env({Env.ADDRESS_RULES: DENY_127_0_0_2.to_env()}) == DENY_127_0_0_2
    with pytest.raises(ConfigError, match="^AGENTRUN_ADDRESS_RULES is not valid: "):
        rules_from_env({Env.ADDRESS_RULES: '{"denied": [["nope", "r"]]}'})


def test_the_operator_hands_the_lap_the_rules_of_the_policies_it_resolved():
    """Both sides of the env contract: controller/decide/jobs.py writes what lap/netguard.py reads."""
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.decide.jobs import RunIdentity, build_env

    spec = spec_of(spec_doc([tool("lookup", "http://127.0.0.1:9/q")], []))
    policy = t.AgentRunPolicySpec.model_validate({"destinations": {"deniedCIDRs": ["127.0.0.2/32"]}})
    rules = t.check_all({}, {"local": policy}).rules
    env = {e["name"]: e.get("value") for e in build_env(RunIdentity("ns", "r", "u"), spec, 1, 1, "v1",
                                                          OperatorConfig(checkpoint_uri="s3://b/p"), address_rules=rules)}
    assert rules_from_env(env) == rules and ("127.0.0.2/32", "AgentRunPolicy local rule destinations.deniedCIDRs") \
        in rules_from_env(env).denied
    unset = {e["name"] for e in build_env(RunIdentity("ns", "r", "u"), spec, 1, 1, "v1", OperatorConfig(checkpoint_uri="s3://b/p"))}
    assert Env.ADDRESS_RULES not in unset


def test_bad_input_doc_quotes_the_connect_time_refusals():
    import ipaddress

    doc = (Path(__file__).resolve().parents[2] / "docs" / "bad-input.md").read_text()
    loopback = addr.AddressRules(allow_loopback=False, loopback_rule="AgentRunPolicy NAME rule destinations.allowLoopback")
    for a, rules in [("169.254.169.254", addr.AddressRules()), ("::ffff:169.254.169.254", addr.AddressRules()),
                     ("127.0.0.1", loopback), ("127.0.0.2", DENY_127_0_0_2)]:
        why = addr.address_refusal(ipaddress.ip_address(a), rules)
        assert f"refused: {why}; no request was sent" in doc, why


def test_the_checkpoint_stores_connections_are_checked_in_the_lap_process(listener, monkeypatch):
    """botocore over urllib3: the lap process routes urllib3's connections
    through the same check; the store names the refusal and fails permanently, nothing sent."""
    from urllib3.util import connection

    from agentrun.checkpoint.errors import CheckpointError, StoreConfigError
    from agentrun.checkpoint.schema import RunRef
    from agentrun.checkpoint.store import CheckpointStore, StoreConfig
    from agentrun.lap import netguard

    monkeypatch.setattr(connection, "create_connection", connection.create_connection)  # restored after
    monkeypatch.setattr(netguard, "_STORE_RULES", [])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    netguard.guard_store_connections("127.0.0.2", DENY_127_0_0_2)
    store = CheckpointStore(StoreConfig(uri="s3://bucket/p", endpoint_url=f"http://127.0.0.2:{listener.port}",
                                        region="us-east-1", path_style=True))
    with pytest.raises(StoreConfigError) as e:
        store.head_lap(RunRef(namespace="n", name="r", uid="u"), 1)
    assert str(e.value) == (
        "S3 HeadObject p/n/r/u/laps/00000001.json: connection to host \"127.0.0.2\" refused: address 127.0.0.2 is "
        "in the denied range 127.0.0.2/32 (AgentRunPolicy local rule destinations.deniedCIDRs); no request was sent")
    assert listener.accepted == 0
    assert str(e.value) in (Path(__file__).resolve().parents[2] / "docs" / "bad-input.md").read_text()
    netguard.guard_store_connections("s3.example.com", DENY_127_0_0_2)  # another store: not this one's rules
    with contextlib.suppress(CheckpointError):  # the listener is no S3: whatever it answers, it was reached
        store.head_lap(RunRef(namespace="n", name="r", uid="u"), 1)
    assert listener.accepted >= 1
