"""The pending call the CLI and the inbox read from a lap record (agentrun.api.approval.StoredCall.of,
approval_lap): one reading for both, on real lap records."""

from __future__ import annotations

from ckpt_builders import make_record

from agentrun.api.approval import StoredCall, approval_lap, arguments_sha256


def test_a_waiting_laps_record_gives_the_call_its_arguments_and_their_digest() -> None:
    stored = StoredCall.of(make_record(3, pending=True))
    assert (stored.call_id, stored.lap, stored.error) == ("pay_3", 3, None)
    assert stored.arguments == {"amount": "1.00"}
    assert stored.sha256 == arguments_sha256({"amount": "1.00"})


def test_a_record_without_a_pending_call_says_which_lap() -> None:
    stored = StoredCall.of(make_record(2))
    assert stored.arguments is None and stored.sha256 is None
    assert stored.error == "lap 2 in the checkpoint store has no pending approval"


def test_the_approvals_lap_comes_before_the_runs_lap_and_none_without_a_lap() -> None:
    assert approval_lap({"status": {"lap": 5, "approval": {"lap": 4}}}) == 4
    assert approval_lap({"status": {"lap": 5}}) == 5
    assert approval_lap({"status": {"lap": "7"}}) == 7
    assert approval_lap({"status": {}}) is None
    assert approval_lap({}) is None
