"""Model-chosen text in chat messages is text, never markup (agentrun.notify.plan): a Slack
``<!channel>`` or ``<url|label>``, a Teams ``[label](url)``, ESC and bidi controls all arrive
inert. Pure."""
from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from agentrun.notify import plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
S = plan.Settings(inbox_url="https://inbox.example")
SPOOF = "<!channel> <https://evil.example|Open the approval inbox> &amp; [Open the approval inbox](https://evil.example)"
CONTROLS = "pay\x1b[2J\u202eACME\u2066\r\nsecond line"


def notice(arguments: str, tool: str = "pay", owner: str = "finance") -> plan.Notice:
    run = {"metadata": {"namespace": "team-a", "name": "inv", "uid": "u-1"}, "spec": {"approval": {}},
           "status": {"phase": "AwaitingApproval",
                      "approval": {"state": "Pending", "callId": "call_1", "tool": tool, "owner": owner,
                                   "deadline": (NOW + timedelta(hours=1)).isoformat(), "arguments": arguments}}}
    return plan.announcements(run, NOW, S)[0]


def slack(n: plan.Notice) -> str:
    return plan.body(n, "slack")["text"]


def teams_values(n: plan.Notice) -> list[str]:
    card = plan.body(n, "teams")["attachments"][0]["content"]
    return [card["body"][0]["text"]] + [f["value"] for f in card["body"][1]["facts"]]


def test_slack_control_sequences_and_links_in_arguments_are_inert():
    text = slack(notice(json.dumps({"note": SPOOF})))
    # the only "<" left is the inbox link the chart configured
    assert re.findall(r"<[^>]*>", text) == ["<https://inbox.example/#run-team-a.inv|Open the approval inbox>"]
    assert "&lt;!channel&gt;" in text and "&lt;https://evil.example|Open the approval inbox&gt;" in text
    assert "&amp;amp;" in text  # an entity in the arguments is shown as typed, not decoded


def test_slack_escapes_the_tool_and_owner_too():
    text = slack(notice("{}", tool="<!here>", owner="<@U123>"))
    assert "<!here>" not in text and "<@U123>" not in text
    assert "&lt;!here&gt;" in text and "&lt;@U123&gt;" in text


def test_teams_markdown_links_and_emphasis_in_arguments_are_inert():
    values = teams_values(notice(json.dumps({"note": SPOOF + " **bold** _it_ `code`"}), tool="[x](https://evil)"))
    joined = "\n".join(values)
    assert not re.search(r"(?<!\\)[\[\]()]", joined)  # every bracket and parenthesis is escaped
    assert "\\[Open the approval inbox\\]\\(https://evil.example\\)" in joined
    assert "\\*\\*bold\\*\\*" in joined and "\\_it\\_" in joined and "\\`code\\`" in joined
    assert "\\<\\!channel\\>" in joined
    assert plan.teams_text("- item") == "\\- item" and plan.teams_text("1. first") == "1\\. first"
    assert plan.teams_text("a-b 1.5") == "a-b 1.5"  # only a list marker at the start is one


def test_controls_and_bidi_are_escaped_in_every_format():
    n = notice(json.dumps({"note": CONTROLS}), tool=CONTROLS, owner=CONTROLS)
    g = plan.body(n, "generic")
    for text in [*slack(n).split("\n"), *teams_values(n), g["arguments"], g["tool"], g["owner"], g["title"]]:
        assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), text
    assert "\\x1b" in g["arguments"] and "\\u202e" in g["arguments"] and "\\r\\n" in g["arguments"]
    assert slack(n).count("\n") == 9  # title, eight facts, the link: the arguments' newline is escaped
    assert "*Tool:* pay\\x1b[2J\\u202eACME\\u2066\\r\\nsecond line\n" in slack(n)  # escaped, not cut


@given(st.text(max_size=2000))
def test_any_text_makes_no_slack_markup(text):
    out = plan.slack_text(text)
    assert "<" not in out and ">" not in out
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]", out)
    assert not re.search(r"&(?!amp;|lt;|gt;)", out)


@given(st.text(max_size=2000))
def test_any_text_makes_no_teams_markup(text):
    out = plan.teams_text(text)
    # every Markdown punctuation character is preceded by a backslash that is itself not escaped
    unescaped = re.sub(r"\\.", "", out)
    assert not re.search(r"[\\`*_~\[\]()<>#|!{}]", unescaped), out
