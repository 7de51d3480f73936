"""Unit tests of the pure parts: keys, call ids, token estimate, window and compaction."""

from __future__ import annotations

from datetime import UTC

from lap_helpers import RUN, spec_doc, spec_of

from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.schema import Compaction, Message, RunState, ToolCall
from agentrun.lap.keys import idempotency_key, normalize_call_ids
from agentrun.lap.window import (
    apply_compaction,
    bound_pins,
    bound_summary,
    build_window,
    compaction_candidates,
    extract_pins,
    message_budget,
    messages_tokens,
    plan_compaction,
    summarize_lap,
    text_tokens,
)


def test_idempotency_key_shape_and_stability() -> None:
    key = idempotency_key(RUN, 301, "extract_invoice", "doc_4410")
    assert key == "r_8f2a1c0d111122223333444455556666:301:extract_invoice:doc_4410"
    assert idempotency_key(RUN, 301, "extract_invoice", "doc_4410", "uid8") == "r_8f2a1c0d:301:extract_invoice:doc_4410"
    assert key == idempotency_key(RUN, 301, "extract_invoice", "doc_4410")
    assert key != idempotency_key(RUN, 302, "extract_invoice", "doc_4410")


def test_call_ids_are_normalized_unique_and_safe() -> None:
    assert normalize_call_ids(["call_abc", None, "bad/id", "call_abc"]) == ["call_abc", "call_2", "call_3", "call_4"]
    assert normalize_call_ids(["call_2", "call_2", None]) == ["call_2", "call_2_2", "call_3"]
    assert normalize_call_ids(["x" * 65]) == ["call_1"]


def test_token_estimate_is_ceil_chars_over_4() -> None:
    assert text_tokens("") == 0 and text_tokens("abc") == 1 and text_tokens("abcde") == 2
    m = Message(role="assistant", content="abcd", tool_calls=[ToolCall(id="c", name="t", arguments={"a": 1})], lap=1)
    assert messages_tokens([m]) == 4 + 1 + 4 + text_tokens('t{"a":1}')


def _lap_messages(lap: int, size: int = 400) -> list[Message]:
    call = ToolCall(id=f"c{lap}", name="extract_invoice", arguments={"doc": f"doc_{lap}"})
    return [
        Message(role="assistant", content=f"working on {lap}" + ("\nPIN: vendor ACME uses EUR" if lap == 3 else ""), tool_calls=[call], lap=lap),
        Message(role="tool", content="x" * size, tool_call_id=f"c{lap}", lap=lap),
    ]


def _state_through(n: int, size: int = 400, window: int = 1000) -> tuple[RunState, object]:
    spec = spec_of(spec_doc([], [], window={"maxTokens": window}))
    state = RunState(run=RUN, lap=n, messages=[Message(role="user", content=spec.task, lap=0)] + [
        m for lap in range(1, n + 1) for m in _lap_messages(lap, size)
    ])
    return state, spec


def test_no_compaction_when_the_window_fits() -> None:
    state, spec = _state_through(2, size=40)
    assert plan_compaction(state, spec, 3) is None


def test_compaction_brings_messages_under_half_the_budget_and_keeps_the_previous_lap() -> None:
    state, spec = _state_through(12)
    c = plan_compaction(state, spec, 13)
    assert c is not None and 1 <= c.through_lap < 12
    after = apply_compaction(state, c)
    assert messages_tokens(after.messages) <= message_budget(spec) // 2
    assert any(m.lap == 12 for m in after.messages) and any(m.lap == 0 for m in after.messages)
    last = c.summary.splitlines()[-1]
    assert last.startswith(f"lap {c.through_lap}: extract_invoice(doc=doc_{c.through_lap}) -> xxxx")


def test_compaction_is_bounded_over_a_long_run_and_pins_survive() -> None:
    spec = spec_of(spec_doc([], [], window={"maxTokens": 1000}))
    state = RunState(run=RUN, messages=[Message(role="user", content=spec.task, lap=0)])
    sizes = []
    for lap in range(1, 301):
        c = plan_compaction(state, spec, lap)
        window = build_window(apply_compaction(state, c), spec)
        sizes.append(messages_tokens(window))
        state = apply_compaction(state, c).model_copy(update={"messages": apply_compaction(state, c).messages + _lap_messages(lap), "lap": lap})
    assert max(sizes) <= spec.agent.window.max_tokens
    assert "vendor ACME uses EUR" in state.pinned_facts
    assert len(state.summary or "") <= message_budget(spec)
    assert "earlier lines omitted" in (state.summary or "")


def test_apply_compaction_equals_the_stores_fold() -> None:
    from datetime import datetime

    from agentrun.checkpoint.schema import LapRecord, Outcome, Timings

    state, spec = _state_through(12)
    c = plan_compaction(state, spec, 13)
    now = datetime.now(UTC)
    record = LapRecord(agent_version="v1", run=RUN, lap=13, attempt=1, outcome=Outcome(type="continue"),
                       messages=_lap_messages(13), compaction=c, timings=Timings(started_at=now, finished_at=now))
    folded = fold(state.model_copy(update={"lap": 12}), record)
    mine = apply_compaction(state, c)
    assert folded.messages == mine.messages + record.messages
    assert folded.summary == mine.summary and folded.pinned_facts == mine.pinned_facts


def test_compaction_never_splits_a_call_from_its_answer() -> None:
    call = ToolCall(id="pay1", name="pay", arguments={})
    msgs = [
        Message(role="user", content="t", lap=0),
        Message(role="assistant", content=None, tool_calls=[call], lap=1),
        Message(role="tool", content="[approval] approved", tool_call_id="pay1", lap=2),
        Message(role="assistant", content="ok", lap=2),
        Message(role="assistant", content="next", lap=3),
    ]
    assert compaction_candidates(msgs, 5) == [2, 3]
    assert compaction_candidates(msgs, 4) == [2]


def test_window_uses_the_current_system_prompt_and_memory() -> None:
    spec = spec_of(spec_doc([], [], window={"maxTokens": 1000, "systemPrompt": "New prompt."}))
    state = RunState(run=RUN, summary="lap 1: x", pinned_facts=["fact A"], messages=[
        Message(role="system", content="Old prompt.", lap=0), Message(role="user", content="task", lap=0)])
    window = build_window(state, spec)
    assert [m.role for m in window] == ["system", "user"]
    assert window[0].content.startswith("New prompt.") and "fact A" in window[0].content and "lap 1: x" in window[0].content


def test_long_messages_are_cut_in_the_window_only() -> None:
    spec = spec_of(spec_doc([], [], window={"maxTokens": 1000}))
    big = Message(role="tool", content="y" * 50_000, tool_call_id="c", lap=1)
    state = RunState(run=RUN, messages=[big])
    window = build_window(state, spec)
    assert len(window[-1].content) <= message_budget(spec) and "chars truncated" in window[-1].content
    assert len(state.messages[0].content) == 50_000


def test_summary_and_pins_bounds() -> None:
    lines = [f"lap {i}: " + "z" * 50 for i in range(100)]
    s = bound_summary(lines, 600)
    assert len(s) <= 600 and s.startswith("(") and s.endswith(lines[-1])
    again = bound_summary(s.splitlines() + ["lap 100: " + "n" * 50], 600)
    assert int(again.split()[0][1:]) > int(s.split()[0][1:])
    assert bound_pins(["a", "b", "a", "c" * 100], 20) == []
    assert bound_pins(["a", "b", "a"], 100) == ["a", "b"]


def test_summary_line_and_pins_of_a_lap() -> None:
    msgs = _lap_messages(3, size=10)
    assert summarize_lap(3, msgs) == 'lap 3: extract_invoice(doc=doc_3) -> xxxxxxxxxx; said "working on 3 PIN: vendor ACME uses EUR"'
    assert extract_pins([Message(role="assistant", content="a\nPIN: keep me\n", lap=1),
                         Message(role="tool", content="[approval] call c of tool pay approved by bob", tool_call_id="c", lap=2)]) == [
        "keep me", "call c of tool pay approved by bob"]
    assert Compaction  # imported for typing in other tests
