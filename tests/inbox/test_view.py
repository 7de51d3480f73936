"""The inbox's pages as pure functions of AgentRun dicts (agentrun.inbox.view)."""
from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from agentrun.api.approval import StoredCall, arguments_sha256
from agentrun.inbox import view
from agentrun.inbox.laps import LapSummary

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ARGS = {"amount": "10.00", "note": "<img src=x onerror=alert(1)>"}


def run(name="pay", phase="AwaitingApproval", **approval):
    ap = {"state": "Pending", "lap": 3, "tool": "refund", "callId": "call_1", "owner": "finance",
          "requestedAt": "2026-12-01T11:55:00Z", "deadline": "2026-12-01T12:10:00Z",
          "arguments": json.dumps(ARGS), "argumentsSha256": arguments_sha256(ARGS), **approval}
    return {"metadata": {"namespace": "team-a", "name": name, "uid": "u1", "resourceVersion": "42"},
            "spec": {"task": "pay <b>invoices</b>", "approval": {"onTimeout": "approve"}},
            "status": {"phase": phase, "lap": 3, "approval": ap, "cost": {"usd": "1.25"}}}


def test_card_of_a_waiting_run_from_the_store():
    c = view.card(run(), NOW, StoredCall(arguments=ARGS, call_id="call_1", lap=3),
                  [LapSummary(3, "awaiting-approval", "0.10", ("paying",), (("refund", "awaiting-approval", "{}", ""),))],
                  None, can_decide=True)
    assert (c.owner, c.tool, c.lap, c.call_id, c.cost_usd, c.on_timeout) == ("finance", "refund", 3, "call_1", "1.25",
                                                                              "approve")
    assert c.age_seconds == 300 and c.seconds_left == 600
    assert c.sha256 == arguments_sha256(ARGS) and json.loads(c.arguments) == ARGS and not c.warnings
    html = view.card_html(c, "tok")
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;b&gt;invoices" in html
    assert 'name="callId" value="call_1"' in html and f'name="sha256" value="{arguments_sha256(ARGS)}"' in html
    assert 'name="csrf" value="tok"' in html and "10m left" in html and "paying" in html


def test_card_falls_back_to_status_and_says_why():
    c = view.card(run(), NOW, StoredCall(error="store down"), [], "checkpoint store not read: store down", False)
    assert c.sha256 == arguments_sha256(ARGS) and "from status" in c.arguments_source
    assert any("store down" in w for w in c.warnings)
    html = view.card_html(c, "tok")
    assert "Read-only" in html and "<form" not in html and "checkpoint store not read" in html


def test_a_store_with_other_arguments_is_a_warning_and_the_store_digest_is_bound():
    other = {"amount": "99999.00"}
    c = view.card(run(), NOW, StoredCall(arguments=other, call_id="call_1", lap=3), [], None, True)
    assert c.sha256 == arguments_sha256(other)
    assert any("differs" in w for w in c.warnings)


def test_history_has_decided_runs_newest_first():
    runs = [run("a", "Running", state="Approved", decidedBy="alice", decidedAt="2026-12-01T11:00:00Z", reason="ok"),
            run("b", "Running", state="Rejected", decidedBy="bob", decidedAt="2026-12-01T11:30:00Z", reason="no"),
            run("c"), run("d", "Succeeded", state="TimedOut")]
    rows = view.history_rows(runs)
    assert [r["name"] for r in rows] == ["d", "b", "a"]  # d timed out at its deadline, 12:10
    html = view.history_html(rows)
    assert "2026-12-01 11:30:00Z" in html and "bob" in html and "Rejected" in html


def test_deadline_text():
    assert view.deadline_text(None) == "no deadline"
    assert view.deadline_text(0) == "overdue" and view.deadline_text(-5) == "overdue"
    assert view.deadline_text(3725) == "1h2m left"


@given(st.text(max_size=2000))
def test_any_text_is_escaped_and_bounded(text):
    out = view.esc(text, 100)
    assert "<" not in out and ">" not in out and '"' not in out
    assert len(out) <= 100 * 6  # each kept character escapes to at most 6


def test_empty_page():
    html = view.main_html([], [], "tok", ["You may not list AgentRuns in namespace x."])
    assert "Nothing is waiting" in html and "No decisions yet" in html and "may not list" in html


def test_no_buttons_when_the_call_cannot_be_bound():
    r = run(argumentsSha256=None)
    c = view.card(r, NOW, StoredCall(error="store down"), [], None, can_decide=True)
    assert c.sha256 is None
    html = view.card_html(c, "tok")
    assert "<form" not in html and "cannot be bound" in html


TARGET = {"method": "post", "url": "https://pay.example/wire", "headersSecret": "pay-creds"}


def test_the_card_shows_what_the_call_will_run_and_how_many_approvals_it_has():
    """status.approval.target / approvalsRequired / approvedBy (issue 29): shown, escaped, and the
    decision still carries exactly the call binding (call id, arguments sha256)."""
    r = run(target=TARGET, targetSha256="ab" * 32, approvalsRequired=2,
            approvedBy=[{"user": "alice", "at": "2026-12-01T11:58:00Z", "reason": "ok"}])
    c = view.card(r, NOW, StoredCall(arguments=ARGS, call_id="call_1", lap=3), [], None, can_decide=True)
    assert c.target == "POST https://pay.example/wire · headers from Secret pay-creds"
    assert c.approvals == "1 of 2 approvals (alice)"
    html = view.card_html(c, "tok")
    assert '<code class="target">POST https://pay.example/wire · headers from Secret pay-creds</code>' in html
    assert '<span class="approvals">1 of 2 approvals (alice)</span>' in html
    assert 'name="callId" value="call_1"' in html and f'name="sha256" value="{arguments_sha256(ARGS)}"' in html
    assert f'name="targetSha256" value="{"ab" * 32}"' in html
    with_image = view.card(run(target={**TARGET, "image": "ghcr.io/x/agent:1"}), NOW, StoredCall(), [], None, True)
    assert with_image.target.endswith(" · image ghcr.io/x/agent:1") and with_image.approvals is None


def test_a_run_from_before_targets_renders_as_before():
    c = view.card(run(), NOW, StoredCall(arguments=ARGS, call_id="call_1", lap=3), [], None, can_decide=True)
    assert c.target is None and c.approvals is None and c.target_sha256 is None
    html = view.card_html(c, "tok")
    assert "Will run" not in html and "approvals" not in html and "targetSha256" not in html


def test_the_card_of_a_run_of_an_agent_names_the_agent_it_runs():
    r = run()
    r["status"]["agent"] = {"name": "ledger-clerk", "version": "2026.12.1", "digest": "a" * 64}
    c = view.card(r, NOW, StoredCall(arguments=ARGS, call_id="call_1", lap=3), [], None, can_decide=True)
    assert c.agent == "Agent ledger-clerk version 2026.12.1"
    assert '<dt>Runs</dt><dd><span class="agent">Agent ledger-clerk version 2026.12.1</span></dd>' in view.card_html(c, "t")
    plain = view.card(run(), NOW, StoredCall(), [], None, True)
    assert plain.agent is None and 'class="agent"' not in view.card_html(plain, "t")
    r["status"]["agent"] = {"name": "<blink>x</blink>\n" + "n" * 900, "version": "<q>v</q>"}
    hostile = view.card(r, NOW, StoredCall(), [], None, True)
    html = view.card_html(hostile, "t")
    assert "<blink>" not in html and "<q>" not in html and "&lt;blink&gt;x" in html and "\n" not in hostile.agent
    assert len(hostile.agent) < 400
    assert "n" * 300 not in html


def test_target_and_approvers_from_the_run_are_escaped_and_bounded():
    evil = {"method": "GET<script>", "url": "https://x.example/" + "a" * 5000 + "\u202e<img src=x>",
            "headersSecret": "<b>s</b>"}
    by = [{"user": f"<i>u{i}</i>\n"} for i in range(9)] + [{"user": 7}, "junk"]
    c = view.card(run(target=evil, approvalsRequired=True, approvedBy=by, targetSha256="<x>"), NOW, StoredCall(),
                  [], None, True)
    html = view.card_html(c, "tok")
    assert "<script>" not in html and "<img" not in html and "<b>s" not in html and "<i>" not in html
    assert "\u202e" not in html
    assert len(c.target) < 1200 and "a" * 600 not in html
    assert c.approvals.startswith("9 of 1 approvals (") and "(4 more)" in c.approvals and "\n" not in c.approvals
    assert c.target_sha256 is None and "targetSha256" not in html


def test_a_request_withdrawn_by_a_cancel_is_shown_withdrawn_with_who_and_why():
    r = run("w", "Cancelled", state="Withdrawn")
    r["status"]["lifecycle"] = {"cancelledBy": "carol", "cancelReason": "wrong <i>customer</i>",
                                "cancelledAt": "2026-12-01T12:00:00Z"}
    rows = view.history_rows([r])
    assert [(x["state"], x["decidedBy"], x["decidedAt"]) for x in rows] == [("Withdrawn", "carol", "2026-12-01T12:00:00Z")]
    html = view.history_html(rows)
    assert 'class="state-withdrawn">Withdrawn' in html and "carol" in html and "<i>" not in html
