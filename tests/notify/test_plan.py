"""What the notifier announces and how (agentrun.notify.plan): pure."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from agentrun.notify import plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
S = plan.Settings(deadline_near_seconds=600, inbox_url="https://inbox.example/")


def run(deadline_in: float = 3600, notified: dict | None = None, phase="AwaitingApproval", state="Pending",
        call="call_7", arguments='{"amount": "10.00", "to": "ACME"}'):
    ap = {"state": state, "lap": 4, "tool": "pay", "callId": call, "owner": "finance",
          "deadline": (NOW + timedelta(seconds=deadline_in)).isoformat(), "arguments": arguments}
    if notified is not None:
        ap["notified"] = notified
    return {"metadata": {"namespace": "team-a", "name": "inv", "uid": "u-1"},
            "spec": {"approval": {"onTimeout": "reject"}}, "status": {"phase": phase, "approval": ap}}


def kinds(r, now=NOW):
    return [n.kind for n in plan.announcements(r, now, S)]


def test_requested_once_then_deadline_near_once():
    assert kinds(run()) == ["requested"]
    assert kinds(run(notified={"callId": "call_7", "requestedAt": "x"})) == []
    assert kinds(run(600, notified={"callId": "call_7", "requestedAt": "x"})) == ["deadline-near"]
    assert kinds(run(30)) == ["requested", "deadline-near"]  # found late: both, in order
    assert kinds(run(30, notified={"callId": "call_7", "requestedAt": "x", "deadlineNearAt": "y"})) == []


def test_a_new_call_is_announced_again():
    assert kinds(run(notified={"callId": "call_6", "requestedAt": "x", "deadlineNearAt": "y"})) == ["requested"]


def test_nothing_for_runs_not_waiting():
    assert kinds(run(phase="Running")) == []
    assert kinds(run(state="Approved")) == []
    assert kinds({"metadata": {}, "status": {}}) == []


def test_notified_patch_keeps_the_same_calls_record():
    n = plan.announcements(run(60, notified={"callId": "call_7", "requestedAt": "2026-12-01T11:00:00Z"}), NOW, S)[0]
    p = plan.notified_patch(run(60, notified={"callId": "call_7", "requestedAt": "2026-12-01T11:00:00Z"}), n, NOW)
    assert p == {"status": {"approval": {"notified": {"callId": "call_7", "requestedAt": "2026-12-01T11:00:00Z",
                                                      "deadlineNearAt": "2026-12-01T12:00:00Z"}}}}
    n = plan.announcements(run(notified={"callId": "call_6", "requestedAt": "old"}), NOW, S)[0]
    assert plan.notified_patch(run(notified={"callId": "call_6", "requestedAt": "old"}), n, NOW) == {
        "status": {"approval": {"notified": {"callId": "call_7", "requestedAt": "2026-12-01T12:00:00Z"}}}}


def test_bodies():
    n = plan.announcements(run(), NOW, S)[0]
    g = plan.body(n, "generic")
    assert (g["kind"], g["owner"], g["tool"], g["namespace"], g["name"], g["callId"]) == (
        "requested", "finance", "pay", "team-a", "inv", "call_7")
    assert g["arguments"] == "amount=10.00, to=ACME" and g["inbox"] == "https://inbox.example/#run-team-a.inv"
    assert g["idempotencyKey"] == "u-1:call_7:requested"
    slack = plan.body(n, "slack")
    assert set(slack) == {"text"} and "*Approval needed: pay in team-a/inv*" in slack["text"]
    assert "<https://inbox.example/#run-team-a.inv|Open the approval inbox>" in slack["text"]
    teams = plan.body(n, "teams")
    card = teams["attachments"][0]["content"]
    assert teams["type"] == "message" and card["type"] == "AdaptiveCard"
    assert {"title": "Owner", "value": "finance"} in card["body"][1]["facts"]
    assert card["actions"][0]["url"] == "https://inbox.example/#run-team-a.inv"
    json.dumps([g, slack, teams])


@given(st.text(max_size=10000))
def test_summary_is_one_bounded_line(arguments):
    s = plan.summary(arguments)
    assert len(s) <= plan.SUMMARY_CHARS and "\n" not in s


def _targeted(digest: str, notified: dict | None = None, approved_by: int = 0):
    r = run(notified=notified)
    r["status"]["approval"].update({
        "target": {"method": "POST", "url": "https://pay.example/pay?token=…", "headersSecret": "pay-headers"},
        "targetSha256": digest, "approvalsRequired": 2, "approvedBy": [{"user": "alice"}] * approved_by})
    return r


def test_the_message_names_the_target_and_the_approvals_so_far():
    (n,) = plan.announcements(_targeted("a" * 64, approved_by=1), NOW, S)
    g = plan.body(n, "generic")
    assert (g["target"], g["headersSecret"], g["approvals"]) == ("POST https://pay.example/pay?token=…", "pay-headers", "1 of 2")
    text = plan.body(n, "slack")["text"]
    assert "*Target:* POST https://pay.example/pay?token=…" in text and "*Headers Secret:* pay-headers" in text
    assert "*Approvals:* 1 of 2" in text


def test_a_request_asked_again_for_a_new_target_is_announced_again_under_a_new_key():
    (first,) = plan.announcements(_targeted("a" * 64), NOW, S)
    done = plan.notified_patch(_targeted("a" * 64), first, NOW)["status"]["approval"]["notified"]
    assert done["targetSha256"] == "a" * 64
    assert plan.announcements(_targeted("a" * 64, notified=done), NOW, S) == []
    (again,) = plan.announcements(_targeted("b" * 64, notified=done), NOW, S)
    assert again.kind == "requested" and again.idempotency_key != first.idempotency_key
