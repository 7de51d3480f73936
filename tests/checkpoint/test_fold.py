"""fold(): the pure state transition of a lap record."""

from __future__ import annotations

import json

import pytest
from ckpt_builders import RUN, make_record
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.checkpoint.errors import CorruptCheckpoint
from agentrun.checkpoint.fold import fold, fold_all, initial_state
from agentrun.checkpoint.schema import Compaction, LapRecord, Message, RunRef, RunState
from agentrun.checkpoint.store import canonical_json, sha256_hex


def chain(records: list[LapRecord]) -> list[tuple[LapRecord, str]]:
    """Give each record a prevSha256 and a sha256, as the store would."""
    out: list[tuple[LapRecord, str]] = []
    prev = None
    for r in records:
        r = r.model_copy(update={"prev_sha256": prev})
        prev = sha256_hex(canonical_json(r.to_api()))
        out.append((r, prev))
    return out


def test_first_lap_appends_messages_and_sets_bookkeeping() -> None:
    record = make_record(1, plan=["a", "b"])
    state = fold(initial_state(RUN), record, "s1")
    assert state.lap == 1
    assert state.last_sha256 == "s1"
    assert state.agent_version == "invoice-agent:1.0.0"
    assert state.messages == record.messages
    assert state.plan == ["a", "b"]
    assert state.last_outcome == record.outcome
    assert state.totals == record.totals
    assert state.pending_approval is None


def test_plan_is_kept_when_a_lap_does_not_change_it() -> None:
    s = fold(initial_state(RUN), make_record(1, plan=["x"]), "s1")
    s = fold(s, make_record(2, "s1"), "s2")
    assert s.plan == ["x"]
    s = fold(s, make_record(3, "s2", plan=[]), "s3")
    assert s.plan == []


def test_compaction_drops_old_laps_but_keeps_the_task() -> None:
    task = Message(role="user", content="Extract every invoice.", lap=0)
    first = make_record(1)
    first = first.model_copy(update={"messages": [task, *first.messages]})
    s = fold_all(initial_state(RUN), chain([first, make_record(2), make_record(3)]))
    assert {m.lap for m in s.messages} == {0, 1, 2, 3}
    compacting = make_record(4, compaction=Compaction(through_lap=2, summary="laps 1-2: 2 docs", pinned_facts=["EUR"]))
    s = fold(s.model_copy(update={"last_sha256": None}), compacting, "s4")
    assert {m.lap for m in s.messages} == {0, 3, 4}
    assert s.messages[0] == task
    assert (s.summary, s.pinned_facts, s.compacted_through_lap) == ("laps 1-2: 2 docs", ["EUR"], 2)


def test_pending_approval_is_set_then_cleared_by_a_decision() -> None:
    s = fold(initial_state(RUN), make_record(1, pending=True), "s1")
    assert s.pending_approval is not None and s.pending_approval.call_id == "pay_1"
    s2 = fold(s, make_record(2, "s1"), "s2")
    assert s2.pending_approval == s.pending_approval  # still waiting: nothing said otherwise
    s3 = fold(s2, make_record(3, "s2", decision="timed-out"), "s3")
    assert s3.pending_approval is None
    s4 = fold(s3, make_record(4, "s3", decision="approved", pending=True), "s4")
    assert s4.pending_approval is not None and s4.pending_approval.call_id == "pay_4"


def test_fold_does_not_mutate_its_input() -> None:
    s1 = fold(initial_state(RUN), make_record(1), "s1")
    before = s1.model_dump()
    fold(s1, make_record(2, "s1"), "s2")
    assert s1.model_dump() == before


@pytest.mark.parametrize("lap", [1, 3])
def test_a_gap_or_a_repeat_is_refused(lap: int) -> None:
    s = fold(initial_state(RUN), make_record(1), "s1")
    with pytest.raises(CorruptCheckpoint, match=f"cannot fold lap {lap} onto the state after lap 1"):
        fold(s, make_record(lap, "s1"), "x")


def test_a_broken_hash_chain_is_refused() -> None:
    s = fold(initial_state(RUN), make_record(1), "aaa")
    with pytest.raises(CorruptCheckpoint, match="lap 2 has prevSha256 bbb but lap 1 has sha256 aaa"):
        fold(s, make_record(2, "bbb"), "s2")


def test_a_record_of_another_run_is_refused() -> None:
    other = RunRef(namespace="billing", name="invoices-nov", uid="00000000-0000-0000-0000-000000000000")
    with pytest.raises(CorruptCheckpoint, match="not to billing/invoices-nov"):
        fold(initial_state(RUN), make_record(1, run=other))


# ---- properties ---------------------------------------------------------------------------

lap_spec = st.fixed_dictionaries(
    {
        "compact_back": st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
        "pending": st.booleans(),
        "decision": st.one_of(st.none(), st.sampled_from(["approved", "rejected", "timed-out"])),
        "plan": st.one_of(st.none(), st.lists(st.text(max_size=8), max_size=3)),
        "text": st.text(max_size=30),
    }
)


def build(specs: list[dict]) -> list[tuple[LapRecord, str]]:
    records = []
    for i, spec in enumerate(specs, start=1):
        compaction = None
        if spec["compact_back"] is not None and i - spec["compact_back"] >= 1:
            through = i - spec["compact_back"]
            compaction = Compaction(through_lap=through, summary=f"through {through}", pinned_facts=[spec["text"]])
        records.append(
            make_record(i, text=spec["text"], compaction=compaction, pending=spec["pending"],
                        decision=spec["decision"], plan=spec["plan"])
        )
    return chain(records)


def roundtrip(state: RunState) -> RunState:
    """What a snapshot write + read does to a state."""
    return RunState.model_validate(json.loads(canonical_json(state.to_api())))


@settings(max_examples=150, deadline=None)
@given(specs=st.lists(lap_spec, min_size=1, max_size=25), data=st.data())
def test_folding_from_any_snapshot_equals_folding_one_by_one(specs: list[dict], data: st.DataObject) -> None:
    pairs = build(specs)
    k = data.draw(st.integers(min_value=0, max_value=len(pairs)), label="snapshot lap")
    straight = fold_all(initial_state(RUN), pairs)
    snapshot = roundtrip(fold_all(initial_state(RUN), pairs[:k]))
    resumed = fold_all(snapshot, pairs[k:])
    assert resumed == straight
    assert roundtrip(straight) == straight


@settings(max_examples=150, deadline=None)
@given(specs=st.lists(lap_spec, min_size=1, max_size=25))
def test_folded_state_matches_a_direct_reading_of_the_records(specs: list[dict]) -> None:
    pairs = build(specs)
    state = fold_all(initial_state(RUN), pairs)
    records = [r for r, _ in pairs]
    through = max((r.compaction.through_lap for r in records if r.compaction), default=0)
    expected_messages = [m for r in records for m in r.messages if m.lap == 0 or m.lap > through]
    assert state.messages == expected_messages
    assert state.compacted_through_lap == through
    last_compaction = next((r.compaction for r in reversed(records) if r.compaction), None)
    assert state.summary == (last_compaction.summary if last_compaction else None)
    last_plan = next((r.plan for r in reversed(records) if r.plan is not None), [])
    assert state.plan == last_plan
    pending = None
    for r in records:
        if r.approval_decision is not None:
            pending = None
        if r.pending_approval is not None:
            pending = r.pending_approval
    assert state.pending_approval == pending
    assert (state.lap, state.last_sha256, state.totals) == (len(records), pairs[-1][1], records[-1].totals)
