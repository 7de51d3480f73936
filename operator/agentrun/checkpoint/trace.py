"""A per-lap trace read from the lap records: what each lap did and why (pure formatting)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentrun.api.text import one_line as text_one_line
from agentrun.checkpoint.schema import LapRecord, ToolCallRecord

_HEADER = f"{'LAP':>6}  {'ATT':>3}  {'OUTCOME':<17}  {'TOKENS IN/OUT':>15}  {'COST USD':>10}  {'DURATION':>9}  TOOLS"


def one_line(text: str | None, limit: int) -> str:
    """``text`` on one line for a terminal (whitespace runs collapsed, every other control character
    escaped: model output and tool results are not the terminal's to interpret), cut to ``limit``
    characters with an ellipsis."""
    return text_one_line(" ".join((text or "").split()), limit)


def lap_doc(record: LapRecord, key: str | None = None, sha256: str | None = None,
            size: int | None = None) -> dict[str, Any]:
    """A lap as JSON, as ``agentrun trace -o json`` prints it and the run explorer reads it: the
    LapRecord (camelCase) plus its object's key, sha256 and stored size (``bytes``)."""
    doc = record.to_api()
    if key:
        doc["key"] = key
    if sha256:
        doc["sha256"] = sha256
    if size is not None:
        doc["bytes"] = size
    return doc


def _tool(call: ToolCallRecord) -> str:
    extra = []
    if call.http_status is not None:
        extra.append(str(call.http_status))
    if call.replayed:
        extra.append("replayed")
    return f"{call.tool}:{call.status}" + (f"({','.join(extra)})" if extra else "")


def format_lap(record: LapRecord, width: int = 120) -> list[str]:
    """The lines of one lap: a summary row, then the assistant's text and the outcome message."""
    seconds = (record.timings.finished_at - record.timings.started_at).total_seconds()
    tokens = f"{record.usage.input_tokens}/{record.usage.output_tokens}"
    tools = ", ".join(_tool(c) for c in record.tool_calls) or "-"
    lines = [
        f"{record.lap:>6}  {record.attempt:>3}  {record.outcome.type:<17}  {tokens:>15}  "
        f"{record.cost_usd:>10}  {seconds:>8.1f}s  {tools}"
    ]
    indent = " " * 8
    for message in record.messages:
        if message.role == "assistant" and message.content:
            lines.append(indent + "> " + one_line(message.content, width - len(indent) - 2))
    if record.outcome.message:
        lines.append(indent + "! " + one_line(record.outcome.message, width - len(indent) - 2))
    if record.pending_approval is not None:
        p = record.pending_approval
        lines.append(f"{indent}? approval pending for {p.tool} (call {p.call_id}) since {p.requested_at.isoformat()}")
    if record.approval_decision is not None:
        d = record.approval_decision
        by = f" by {d.decided_by}" if d.decided_by else ""
        lines.append(f"{indent}= call {d.call_id} {d.decision}{by}" + (f": {d.reason}" if d.reason else ""))
    if record.compaction is not None:
        lines.append(f"{indent}~ compacted laps <= {record.compaction.through_lap} into the summary")
    return lines


def format_trace(records: Iterable[LapRecord | tuple[LapRecord, Any]], width: int = 120) -> str:
    """A table of laps (lap, attempt, outcome, tokens, cost, duration, tools with status), each
    followed by the assistant's text, so the reasoning that led to a lap can be read. Accepts
    records or ``(record, stored_object)`` pairs as yielded by ``CheckpointStore.iter_laps``."""
    lines = [_HEADER]
    last = None
    for item in records:
        record = item[0] if isinstance(item, tuple) else item
        lines.extend(format_lap(record, width))
        last = record
    if last is None:
        lines.append("(no laps)")
    else:
        t = last.totals
        lines.append(
            f"totals through lap {last.lap}: {t.laps} laps, {t.input_tokens}/{t.output_tokens} tokens, "
            f"{t.cost_usd} USD"
        )
    return "\n".join(lines) + "\n"
