"""The lap executes an approved call only for what was approved: the call id, the digest of its full
arguments and its target (the tool's definition and the lap image; api.approval.target_sha256)."""

from __future__ import annotations

from typing import Any

import pytest
from lap_helpers import RUN, FakeModel, FakeTools, MemoryJournal, spec_doc, spec_of, tool

from agentrun.api.approval import arguments_sha256, target_sha256
from agentrun.api.contract import Env
from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.schema import ApprovalDecision, LapRecord, RunState, Usage
from agentrun.lap.config import parse_decision
from agentrun.lap.errors import ConfigError, PermanentLapError
from agentrun.lap.interfaces import ModelCall, ModelResponse
from agentrun.lap.step import Effects, LapContext, run_lap

IMAGE = "registry.example/agentrun:1"
ARGS = {"doc": "inv-7"}


def _spec(url: str = "https://pay.example", image: str | None = None, **pay: Any):
    doc = spec_doc([tool("pay", url, requiresApproval=True, **pay)], [])
    if image:
        doc["agent"]["image"] = image
    return spec_of(doc)


class Laps:
    def __init__(self) -> None:
        self.model = FakeModel([
            ModelResponse(content=None, tool_calls=(ModelCall(id="c2", name="pay", arguments=ARGS),),
                          usage=Usage(input_tokens=10, output_tokens=1)),
            ModelResponse(content="paid", usage=Usage(input_tokens=10, output_tokens=1)),
        ])
        self.tools = FakeTools()
        self.state = RunState(run=RUN)
        self.logs: list[str] = []

    def lap(self, spec: Any, decision: ApprovalDecision | None = None, image: str | None = IMAGE) -> LapRecord:
        lap = self.state.lap + 1
        fx = Effects(model=self.model, tools=self.tools, journal=MemoryJournal(),
                     log=lambda msg, **kw: self.logs.append(msg))
        ctx = LapContext(spec=spec, run=RUN, lap=lap, attempt=1, agent_version="v1", decision=decision, image=image)
        rec = run_lap(ctx, self.state, fx)
        self.state = fold(self.state, rec)
        return rec


def _approved(spec: Any, image: str = IMAGE, **kw: Any) -> ApprovalDecision:
    digest = arguments_sha256(ARGS)
    doc = {"call_id": "c2", "decision": "approved", "decided_by": "alice", "arguments_sha256": digest,
           "target_sha256": target_sha256(spec.tool("pay"), image, digest)}
    return ApprovalDecision(**{**doc, **kw})


def test_the_pending_call_records_its_target_digest_under_the_spec_and_image_it_ran_with() -> None:
    spec = _spec()
    first = Laps().lap(spec)
    assert first.pending_approval is not None
    assert first.pending_approval.target_sha256 == target_sha256(spec.tool("pay"), IMAGE, arguments_sha256(ARGS))
    # a Job of an earlier release gives no image: nothing recorded, the operator binds the current spec
    assert Laps().lap(spec, image=None).pending_approval.target_sha256 is None  # type: ignore[union-attr]


def test_an_approval_for_the_same_target_is_executed_once() -> None:
    spec = _spec()
    laps = Laps()
    laps.lap(spec)
    second = laps.lap(spec, _approved(spec))
    assert [n for n, _, _ in laps.tools.calls] == ["pay"]
    assert second.tool_calls[0].status == "ok" and second.outcome.type == "done"
    assert second.approval_decision is not None and second.approval_decision.target_sha256 is not None


@pytest.mark.parametrize("changed", [
    {"url": "https://evil.example"},
    {"http": {"method": "PUT"}},
    {"http": {"headersSecretRef": {"name": "other", "key": "h"}}},
    {"parameters": {"type": "object"}},
    {"sideEffects": False},
    {"image": "registry.example/other:2"},
])
def test_an_approval_whose_target_changed_sends_nothing_and_asks_again(changed: dict[str, Any]) -> None:
    approved_spec = _spec()
    laps = Laps()
    first = laps.lap(approved_spec)
    image = changed.pop("image", IMAGE)
    now = _spec(**changed)
    second = laps.lap(now, _approved(approved_spec), image=image)
    assert laps.tools.calls == []  # nothing sent
    assert len(laps.model.requests) == 1  # and the model not asked: the lap only asks again
    assert second.outcome.type == "awaiting-approval"
    assert "was not sent: its target" in (second.outcome.message or "")
    pa = second.pending_approval
    assert pa is not None and pa.call_id == "c2" and pa.idempotency_key == first.pending_approval.idempotency_key  # type: ignore[union-attr]
    assert pa.target_sha256 == target_sha256(now.tool("pay"), image, arguments_sha256(ARGS))
    assert second.approval_decision is None and laps.state.pending_approval == pa


def test_a_description_change_is_not_a_target_change() -> None:
    spec = _spec()
    laps = Laps()
    laps.lap(spec)
    reworded = _spec(description="pays an invoice, carefully")
    laps.lap(reworded, _approved(spec))
    assert [n for n, _, _ in laps.tools.calls] == ["pay"]


def test_a_rejection_is_applied_whatever_the_target() -> None:
    spec = _spec()
    laps = Laps()
    laps.lap(spec)
    second = laps.lap(_spec(url="https://evil.example"), _approved(spec, decision="rejected"))
    assert laps.tools.calls == [] and second.tool_calls[0].status == "rejected"


def test_an_approval_bound_to_other_arguments_is_permanent_and_sends_nothing() -> None:
    spec = _spec()
    laps = Laps()
    laps.lap(spec)
    with pytest.raises(PermanentLapError, match="bound to arguments with sha256 0{64} but the pending call c2"):
        laps.lap(spec, _approved(spec, arguments_sha256="0" * 64))
    assert laps.tools.calls == []


def test_parse_decision_reads_the_digests_and_refuses_malformed_ones() -> None:
    env = {Env.APPROVAL_DECISION: "approved", Env.APPROVAL_CALL_ID: "c2",
           Env.APPROVAL_ARGUMENTS_SHA256: "A" * 64, Env.APPROVAL_TARGET_SHA256: "b" * 64}
    d = parse_decision(env)
    assert d is not None and d.arguments_sha256 == "a" * 64 and d.target_sha256 == "b" * 64
    with pytest.raises(ConfigError, match="AGENTRUN_APPROVAL_TARGET_SHA256 must be a sha256"):
        parse_decision({**env, Env.APPROVAL_TARGET_SHA256: "xyz"})
