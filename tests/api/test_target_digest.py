"""api.approval: the target digest covers what decides what a call does (and only that), and the
shown target carries no credentials."""

from __future__ import annotations

import pytest

from agentrun.api.approval import call_target, shown_url, target_changes, target_sha256
from agentrun.api.spec import ToolSpec

BASE = {"name": "pay", "description": "pays", "requiresApproval": True,
        "http": {"url": "https://pay.example/pay"}}


def tool(**over) -> ToolSpec:
    doc = {**BASE, **over}
    doc["http"] = {**BASE["http"], **over.get("http", {})}
    return ToolSpec.model_validate(doc)


def digest(t: ToolSpec | None, image: str = "img:1", args: str = "a" * 64) -> str:
    return target_sha256(t, image, args)


def test_explicit_defaults_digest_as_omitted_ones_and_the_description_is_left_out():
    explicit = tool(http={"method": "POST", "timeout": "30s", "maxResultBytes": 16384}, sideEffects=True,
                    parameters={"type": "object"})
    assert digest(explicit) == digest(tool()) == digest(tool(description="reworded"))


@pytest.mark.parametrize("over", [
    {"http": {"url": "https://evil.example/pay"}}, {"http": {"url": "https://pay.example/pay?to=me"}},
    {"http": {"method": "PUT"}}, {"http": {"timeout": "31s"}}, {"http": {"maxResultBytes": 2048}},
    {"http": {"headersSecretRef": {"name": "h", "key": "k"}}}, {"parameters": {"type": "object", "required": ["x"]}},
    {"sideEffects": False}, {"requiresApproval": False}, {"name": "pay2"},
])
def test_every_part_of_the_definition_changes_the_digest(over):
    assert digest(tool(**over)) != digest(tool())


def test_the_image_the_arguments_and_a_removed_tool_change_the_digest():
    assert len({digest(tool()), digest(tool(), image="img:2"), digest(tool(), args="b" * 64), digest(None)}) == 4


def test_the_shown_url_has_no_credentials_no_query_values_no_controls_and_is_bounded():
    assert shown_url("https://u:pw@pay.example:8443/p/x?token=abc&to=me#frag") == "https://pay.example:8443/p/x?token=…&to=…"
    assert shown_url("http://[::1]:9/x") == "http://[::1]:9/x"
    assert "\\x1b" in shown_url("https://pay.example/\x1b[2J") and "\x1b" not in shown_url("https://pay.example/\x1b[2J")
    assert len(shown_url("https://pay.example/" + "x" * 5000)) == 512
    assert shown_url("https://pay.example:99999/") == "https://(unparsable URL)"


def test_the_shown_target_and_its_changes():
    t = call_target(tool(http={"headersSecretRef": {"name": "pay-h", "key": "k"}}), "img:1")
    assert t == {"method": "POST", "url": "https://pay.example/pay", "headersSecret": "pay-h", "image": "img:1"}
    u = call_target(tool(http={"url": "https://evil.example/pay"}), "img:2")
    assert target_changes(t, u) == ["url https://pay.example/pay -> https://evil.example/pay",
                                    "headers Secret pay-h -> (none)", "image img:1 -> img:2"]
    assert target_changes(t, t) == []
