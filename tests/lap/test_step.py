"""Unit tests of the step logic with in-memory fakes of Model, ToolRunner and Journal."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from lap_helpers import RUN, Crash, FakeModel, FakeTools, MemoryJournal, comparable, spec_doc, spec_of, tool

from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.schema import ApprovalDecision, LapRecord, RunState, Usage
from agentrun.lap.errors import PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ModelCall, ModelResponse
from agentrun.lap.step import Effects, LapContext, run_lap

URL = "http://127.0.0.1:9"  # never contacted: FakeTools


def _spec(**kw: Any):
    tools = [
        tool("extract_invoice", URL, sideEffects=False),
        tool("pay", URL, requiresApproval=True),
        tool("notify", URL),
    ]
    return spec_of(spec_doc(tools, [], **kw))


def _resp(content: str | None, *calls: tuple[str, str, dict[str, Any]], usage: tuple[int, int] = (1000, 100)) -> ModelResponse:
    return ModelResponse(
        content=content,
        tool_calls=tuple(ModelCall(id=i, name=n, arguments=a) for i, n, a in calls),
        usage=Usage(input_tokens=usage[0], output_tokens=usage[1]),
    )


class Runner:
    """Runs laps in memory, keeping one journal per lap, folding records into the state."""

    def __init__(self, spec, responses: list[ModelResponse]) -> None:
        self.spec, self.model, self.tools = spec, FakeModel(responses), FakeTools()
        self.journals: dict[int, MemoryJournal] = {}
        self.state = RunState(run=RUN)
        self.logs: list[str] = []

    def lap(self, decision: ApprovalDecision | None = None, crash_at: str | None = None, spec=None, commit: bool = True) -> LapRecord:
        lap = self.state.lap + 1
        def crash(point: str) -> None:
            if point == crash_at:
                raise Crash(point)
        fx = Effects(model=self.model, tools=self.tools, journal=self.journals.setdefault(lap, MemoryJournal()),
                     crash=crash, log=lambda msg, **kw: self.logs.append(msg))
        ctx = LapContext(spec=spec or self.spec, run=RUN, lap=lap, attempt=1, agent_version=(spec or self.spec).agent.version, decision=decision)
        record = run_lap(ctx, self.state, fx)
        if commit:
            self.state = fold(self.state, record)
        return record


def test_lap_one_opens_the_conversation_and_runs_the_calls() -> None:
    r = Runner(_spec(), [_resp("extracting", ("c1", "extract_invoice", {"doc": "doc_4410"}), ("c2", "notify", {"doc": "d"}))])
    rec = r.lap()
    assert [(m.role, m.lap) for m in rec.messages] == [("system", 0), ("user", 0), ("assistant", 1), ("tool", 1), ("tool", 1)]
    assert rec.messages[1].content == r.spec.task
    assert [c.idempotency_key for c in rec.tool_calls] == ["r_8f2a1c0d111122223333444455556666:1:extract_invoice:c1", "r_8f2a1c0d111122223333444455556666:1:notify:c2"]
    assert [k for _, _, k in r.tools.calls] == ["r_8f2a1c0d111122223333444455556666:1:extract_invoice:c1", "r_8f2a1c0d111122223333444455556666:1:notify:c2"]
    assert rec.outcome.type == "continue" and rec.pending_approval is None
    # 1000 in * 2.50/M + 100 out * 10/M = 0.0025 + 0.001
    assert rec.cost_usd == "0.0035" and Decimal(rec.totals.cost_usd) == Decimal("0.0035")
    assert rec.totals.laps == 1 and rec.totals.input_tokens == 1000
    assert set(r.journals[1].entries) == {"model", "tool-c1", "tool-c2"}


def test_a_response_without_tool_calls_is_done_and_totals_accumulate() -> None:
    r = Runner(_spec(), [_resp("a", ("c1", "notify", {"doc": "x"})), _resp("all done")])
    r.lap()
    rec = r.lap()
    assert rec.outcome.type == "done" and rec.totals.laps == 2 and rec.totals.cost_usd == "0.007"
    with pytest.raises(PermanentLapError, match="lap 2 ended the run"):
        r.lap()


@pytest.mark.parametrize("point", ["after-model-journal", "after-tool-call-1", "after-tool-journal-1", "after-tool-call-2", "after-tool-journal-2"])
def test_a_replayed_lap_reuses_the_journal_and_equals_the_uncrashed_lap(point: str) -> None:
    responses = [_resp("go", ("c1", "notify", {"doc": "a"}), ("c2", "notify", {"doc": "b"}))]
    clean = Runner(_spec(), responses).lap()
    r = Runner(_spec(), responses)
    with pytest.raises(Crash):
        r.lap(crash_at=point)
    rec = r.lap()
    assert comparable(rec) == comparable(clean)
    assert len(r.model.requests) == 1, "a journaled model response is not requested again"
    keys = [k for _, _, k in r.tools.calls]
    # a call whose result was journaled is not sent again; one that ran but was not journaled is
    # sent again with the same key (the tool server dedupes it, see the S3 crash tests)
    expected_sends = {"after-model-journal": 2, "after-tool-call-1": 3, "after-tool-journal-1": 2,
                      "after-tool-call-2": 3, "after-tool-journal-2": 2}[point]
    assert len(keys) == expected_sends and set(keys) == {"r_8f2a1c0d111122223333444455556666:1:notify:c1", "r_8f2a1c0d111122223333444455556666:1:notify:c2"}
    journaled_before_crash = point in ("after-tool-journal-1", "after-tool-call-2", "after-tool-journal-2")
    assert any(c.replayed for c in rec.tool_calls) == journaled_before_crash


def test_unknown_tool_and_invalid_arguments_go_back_to_the_model() -> None:
    bad = ModelCall(id="c3", name="notify", arguments={}, argument_error="arguments are not valid JSON (Expecting value at char 0): {oops")
    r = Runner(_spec(), [ModelResponse(content=None, tool_calls=(
        ModelCall(id="c1", name="delete_everything", arguments={}),
        ModelCall(id="c2", name="notify", arguments={"doc": 5}),
        bad,
    ))])
    rec = r.lap()
    assert [c.status for c in rec.tool_calls] == ["unknown-tool", "invalid-arguments", "invalid-arguments"]
    tool_msgs = [m.content for m in rec.messages if m.role == "tool"]
    assert "unknown tool 'delete_everything'; declared tools: extract_invoice, pay, notify" in tool_msgs[0]
    assert "doc: 5 is not of type 'string'" in tool_msgs[1]
    assert "not valid JSON" in tool_msgs[2]
    assert r.tools.calls == [] and rec.outcome.type == "continue"


def _approval_run(decision: str | None, on_timeout: str = "reject") -> tuple[Runner, LapRecord, LapRecord]:
    spec = _spec(approval={"owner": "finance", "onTimeout": on_timeout})
    r = Runner(spec, [
        _resp("pay it", ("c1", "notify", {"doc": "before"}), ("c2", "pay", {"doc": "inv_7"}), ("c3", "pay", {"doc": "inv_8"}), ("c4", "notify", {"doc": "after"})),
        _resp("finished"),
    ])
    first = r.lap()
    d = ApprovalDecision(call_id="", decision=decision, reason="ok by policy", decided_by="alice") if decision else None
    second = r.lap(decision=d)
    return r, first, second


def test_approval_request_ends_the_lap_without_running_the_call() -> None:
    r, first, _ = _approval_run("approved")
    assert first.outcome.type == "awaiting-approval"
    assert [c.status for c in first.tool_calls] == ["ok", "awaiting-approval", "error", "ok"]
    assert "already awaits approval" in first.tool_calls[2].result
    assert first.pending_approval is not None and first.pending_approval.idempotency_key == "r_8f2a1c0d111122223333444455556666:1:pay:c2"
    assert not any(m.tool_call_id == "c2" for m in first.messages if m.role == "tool")


def test_approved_call_runs_once_with_the_recorded_key() -> None:
    r, first, second = _approval_run("approved")
    pay_calls = [k for n, _, k in r.tools.calls if n == "pay"]
    assert pay_calls == ["r_8f2a1c0d111122223333444455556666:1:pay:c2"]
    assert second.approval_decision is not None and second.approval_decision.decision == "approved"
    assert second.approval_decision.call_id == "c2" and second.tool_calls[0].status == "ok"
    assert second.messages[0].role == "tool" and second.messages[0].tool_call_id == "c2"
    assert second.messages[0].content.startswith("[approval] call c2 of tool pay approved by alice")
    assert second.outcome.type == "done" and r.state.pending_approval is None
    assert "tool-approved-c2" in r.journals[2].entries


@pytest.mark.parametrize("decision", ["rejected", "timed-out"])
def test_rejected_and_timed_out_calls_are_not_run_and_differ(decision: str) -> None:
    r, _, second = _approval_run(decision)
    assert [n for n, _, _ in r.tools.calls] == ["notify", "notify"]
    assert second.tool_calls[0].status == decision
    assert second.tool_calls[0].idempotency_key == "r_8f2a1c0d111122223333444455556666:1:pay:c2"
    assert "not executed" in second.messages[0].content
    assert second.outcome.type == "done"


def test_timed_out_with_on_timeout_fail_ends_failed_without_a_model_call() -> None:
    r, _, second = _approval_run("timed-out", on_timeout="fail")
    assert second.outcome.type == "failed" and "timed out" in (second.outcome.message or "")
    assert len(r.model.requests) == 1


def test_pending_approval_without_decision_is_permanent() -> None:
    r = Runner(_spec(), [_resp(None, ("c2", "pay", {"doc": "x"}))])
    r.lap()
    with pytest.raises(PermanentLapError, match="lap 2 started without a decision for pending approval of tool pay"):
        r.lap()


def test_decision_without_pending_approval_is_ignored_with_a_log_line() -> None:
    r = Runner(_spec(), [_resp("done")])
    rec = r.lap(decision=ApprovalDecision(call_id="zz", decision="approved"))
    assert rec.approval_decision is None and rec.outcome.type == "done"
    assert any("ignored" in line for line in r.logs)


def test_removed_tool_of_pending_approval_is_permanent_and_named() -> None:
    r = Runner(_spec(), [_resp(None, ("c2", "pay", {"doc": "x"}))])
    r.lap()
    v2 = spec_of(spec_doc([tool("notify", URL)], [], version="v2"))
    with pytest.raises(PermanentLapError, match="tool 'pay' of the pending approval is not declared by agent version v2"):
        r.lap(decision=ApprovalDecision(call_id="c2", decision="approved"), spec=v2)


def test_decision_for_another_call_is_refused() -> None:
    r = Runner(_spec(), [_resp(None, ("c2", "pay", {"doc": "x"}))])
    r.lap()
    with pytest.raises(PermanentLapError, match="decision is for call c9"):
        r.lap(decision=ApprovalDecision(call_id="c9", decision="approved"))


def test_retryable_tool_failure_propagates_and_nothing_is_journaled_for_it() -> None:
    r = Runner(_spec(), [_resp(None, ("c1", "notify", {"doc": "x"}))])
    r.tools.fail = lambda name: RetryableLapError("tool 'notify' returned HTTP 503")
    with pytest.raises(RetryableLapError):
        r.lap()
    assert set(r.journals[1].entries) == {"model"}


def test_a_racing_journal_entry_wins() -> None:
    """If another runner journaled a model response first, ours is discarded and theirs is used."""
    r = Runner(_spec(), [_resp("mine", ("c1", "notify", {"doc": "mine"}))])

    class RacingJournal(MemoryJournal):
        def put(self, name: str, body: dict[str, Any]) -> bool:
            if name == "model" and name not in self.entries:
                self.entries[name] = {"kind": "ModelResponse", "response": _resp("theirs").to_json()}
                return False
            return super().put(name, body)

    r.journals[1] = RacingJournal()
    rec = r.lap()
    assert rec.messages[-1].content == "theirs" and rec.outcome.type == "done" and r.tools.calls == []
