"""Builders of checkpoint records for the checkpoint tests (real models, no mocks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from agentrun.api.types import format_usd
from agentrun.checkpoint.schema import (
    ApprovalDecision,
    Compaction,
    LapRecord,
    Message,
    Outcome,
    PendingApproval,
    RunRef,
    Timings,
    ToolCall,
    ToolCallRecord,
    Totals,
    Usage,
)

RUN = RunRef(namespace="billing", name="invoices-nov", uid="8f2a1c0d-4b7e-4f10-9a51-2c3d4e5f6a7b")
T0 = datetime(2025, 11, 3, 10, 0, tzinfo=UTC)


def make_record(
    lap: int,
    prev_sha256: str | None = None,
    *,
    run: RunRef = RUN,
    attempt: int = 1,
    text: str | None = None,
    payload: int = 0,
    compaction: Compaction | None = None,
    pending: bool = False,
    decision: str | None = None,
    plan: list[str] | None = None,
    outcome: str = "continue",
    agent_version: str = "invoice-agent:1.0.0",
) -> LapRecord:
    """A plausible lap: an assistant message with one tool call, the tool's result."""
    call_id = f"call_{lap}"
    content = text if text is not None else f"lap {lap}: extracting doc_{4400 + lap}"
    result = '{"total": "10.00"}' + " " * payload
    started = T0 + timedelta(seconds=10 * lap)
    return LapRecord(
        agent_version=agent_version,
        run=run,
        lap=lap,
        attempt=attempt,
        prev_sha256=prev_sha256,
        outcome=Outcome(type=outcome),  # type: ignore[arg-type]
        messages=[
            Message(
                role="assistant",
                content=content,
                lap=lap,
                tool_calls=[ToolCall(id=call_id, name="extract_invoice", arguments={"doc": f"doc_{4400 + lap}"})],
            ),
            Message(role="tool", content=result, tool_call_id=call_id, lap=lap),
        ],
        tool_calls=[
            ToolCallRecord(
                call_id=call_id,
                tool="extract_invoice",
                arguments={"doc": f"doc_{4400 + lap}"},
                idempotency_key=f"{run.long_id}:{lap}:extract_invoice:{call_id}",
                status="ok",
                result=result,
                http_status=200,
                started_at=started,
                finished_at=started + timedelta(seconds=1),
            )
        ],
        plan=plan,
        pending_approval=(
            PendingApproval(
                call_id=f"pay_{lap}", tool="post_ledger", arguments={"amount": "1.00"},
                idempotency_key=f"{run.long_id}:{lap}:post_ledger:pay_{lap}", lap=lap, requested_at=started,
            )
            if pending
            else None
        ),
        approval_decision=(
            ApprovalDecision(call_id=f"pay_{lap - 1}", decision=decision, decided_by="alice")  # type: ignore[arg-type]
            if decision
            else None
        ),
        usage=Usage(input_tokens=1000, output_tokens=100),
        cost_usd="0.0125",
        totals=Totals(laps=lap, input_tokens=1000 * lap, output_tokens=100 * lap, cost_usd=format_usd(Decimal("0.0125") * lap)),
        compaction=compaction,
        timings=Timings(started_at=started, finished_at=started + timedelta(seconds=2), model_seconds=1.0, tools_seconds=1.0),
    )
