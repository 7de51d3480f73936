"""One lap, as a function of the state it starts from: ``run_lap(ctx, state, effects) -> LapRecord``.

The only effects go through the injected Model, ToolRunner and Journal (and a crash hook used by
tests). Replay safety inside the lap:

1. The model response is journaled (``model``) before any tool call; a replay reuses it, so the call
   ids, hence the idempotency keys, are the same.
2. Each executed tool call's result is journaled (``tool-<callId>``) right after the call; a replay
   reuses it (``replayed=True``) instead of calling again. A call that ran but whose result was not
   journaled (crash in between) is sent again with the same ``Idempotency-Key``: the tool dedupes.
3. If a journal put finds an entry already there (a racing runner), that entry wins.

Tool calls of one response are handled in order. Calls that need no approval run; the FIRST call
that needs approval becomes the lap's pending approval (not run); any further call needing
approval in the same response is answered "not executed: ask again after the decision" (status
error). The lap then ends ``awaiting-approval``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from agentrun.api.approval import arguments_sha256, target_sha256
from agentrun.api.mcp import McpToolRef, find_mcp_tool
from agentrun.api.spec import AgentRunSpec, ToolSpec
from agentrun.api.types import format_usd
from agentrun.checkpoint.codec import tool_message_text
from agentrun.checkpoint.schema import (
    KEY_SCHEME,
    ApprovalDecision,
    Compaction,
    KeyScheme,
    LapRecord,
    McpServerTools,
    McpToolList,
    Message,
    Outcome,
    PendingApproval,
    RunRef,
    RunState,
    Timings,
    ToolCall,
    ToolCallRecord,
    Totals,
)
from agentrun.lap.cost import lap_cost_usd
from agentrun.lap.discovery import ToolSet, offered_tools, tools_version
from agentrun.lap.errors import ConfigError, PermanentLapError
from agentrun.lap.interfaces import (
    JOURNAL_KIND_MCP_TOOLS,
    JOURNAL_KIND_MODEL,
    JOURNAL_KIND_TOOL,
    NO_TRACER,
    Journal,
    McpTools,
    Model,
    ModelCall,
    ModelRequest,
    ModelResponse,
    OfferedTool,
    ToolOutcome,
    ToolRunner,
    Tracer,
)
from agentrun.lap.keys import (
    MCP_TOOLS_JOURNAL_NAME,
    MODEL_JOURNAL_NAME,
    approved_journal_name,
    idempotency_key,
    tool_journal_name,
)
from agentrun.lap.tools.validate import argument_errors, check_tool_schemas
from agentrun.lap.tracing.semconv import approval_span, chat_result, chat_span, tool_result, tool_span
from agentrun.lap.window import APPROVAL_PREFIX, apply_compaction, build_window, plan_compaction


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _no_crash(point: str) -> None:
    return None


@dataclass(frozen=True)
class LapContext:
    """Who and what this lap is."""

    spec: AgentRunSpec
    run: RunRef
    lap: int
    attempt: int
    agent_version: str
    decision: ApprovalDecision | None = None
    key_scheme: KeyScheme = KEY_SCHEME
    """How this lap derives idempotency keys: the run's recorded scheme (``RunState.keyScheme``)."""
    image: str | None = None
    """The lap's image as the operator set it (AGENTRUN_IMAGE): part of a call's target digest."""
    history: int = 0
    """The run's history this lap is in (0 unless the run was rewound in place): part of its keys."""

    def target_sha256(self, tool: ToolSpec | McpToolRef | None, arguments: dict[str, Any]) -> str:
        """``api.approval.target_sha256`` of a call of ``tool`` under this lap's spec and image."""
        return target_sha256(tool, self.image or self.spec.agent.image or "", arguments_sha256(arguments))


@dataclass
class Effects:
    """The effects of a lap. ``crash`` is called at named points (test hook; a no-op normally)."""

    model: Model
    tools: ToolRunner
    journal: Journal
    crash: Callable[[str], None] = _no_crash
    log: Callable[..., None] = lambda msg, **kw: None
    clock: Callable[[], datetime] = _utcnow
    mcp: McpTools | None = None
    """The MCP client (``lap/tools/mcp.py``); needed only when the spec declares mcpServers."""
    tracer: Tracer = NO_TRACER
    """The lap's spans (``lap/tracing``): one per model call and per tool call, answered or from the journal."""


@dataclass
class _Acc:
    """What the lap has produced so far (local, mutable while the lap runs)."""

    messages: list[Message] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)
    executed: int = 0
    tools_seconds: float = 0.0


# ---------------------------------------------------------------------------- checks


def check_start(ctx: LapContext, state: RunState) -> None:
    """Refuse to run a lap that does not follow the state (PermanentLapError, named)."""
    if state.lap != ctx.lap - 1:
        raise PermanentLapError(f"lap {ctx.lap} cannot run on the state after lap {state.lap}")
    if state.last_outcome is not None and state.last_outcome.type in ("done", "failed"):
        raise PermanentLapError(
            f"lap {ctx.lap} cannot run: lap {state.lap} ended the run ({state.last_outcome.type})"
        )


def opening_messages(spec: AgentRunSpec) -> list[Message]:
    """Lap 1 starts the conversation: the system prompt (if set) and the task, both lap 0."""
    system = spec.agent.window.system_prompt
    head = [Message(role="system", content=system, lap=0)] if system else []
    return [*head, Message(role="user", content=spec.task, lap=0)]


# ---------------------------------------------------------------------------- the tools


def lap_tools(ctx: LapContext, state: RunState, fx: Effects) -> tuple[ToolSet, McpToolList | None]:
    """The tools this lap offers and, when its MCP listings differ from the run's recorded ones, the
    new version to record. The listings are journaled before the model is asked (``mcp-tools``): a
    replay of the lap offers the same tools, whatever the servers list by then."""
    servers = ctx.spec.agent.mcp_servers
    if not servers:
        return ToolSet(http=tuple(ctx.spec.agent.tools)), None
    found = fx.journal.get(MCP_TOOLS_JOURNAL_NAME)
    if found is None:
        if fx.mcp is None:
            raise PermanentLapError("spec.agent.mcpServers is set but this lap has no MCP client")
        listings = [fx.mcp.list_tools(server) for server in servers]
        body = {"kind": JOURNAL_KIND_MCP_TOOLS, "servers": [x.to_api() for x in listings]}
        if not fx.journal.put(MCP_TOOLS_JOURNAL_NAME, body):
            found = fx.journal.get(MCP_TOOLS_JOURNAL_NAME)
    if found is not None:
        listings = [McpServerTools.model_validate(x) for x in found["servers"]]
        fx.log("MCP tool listing reused from the journal")
    if [x.server for x in listings] != [server.name for server in servers]:
        raise PermanentLapError("the journaled MCP tool listing is of other servers than spec.agent.mcpServers")
    toolset, skipped = offered_tools(ctx.spec.agent, listings)
    if skipped:
        fx.log("MCP tools not offered: their names are not 1-38 letters, digits, '_' or '-'", tools=skipped[:20])
    try:
        check_tool_schemas(list(toolset.mcp))
    except ConfigError as e:
        raise PermanentLapError(str(e)) from None
    version = tools_version(state.mcp_tools, listings)
    if version is not None:
        fx.log("MCP tools recorded", version=version.version, changes=version.changes)
    return toolset, version


# ---------------------------------------------------------------------------- tool calls


def _tool_record_from_journal(body: dict[str, Any], replayed: bool) -> ToolCallRecord:
    return ToolCallRecord.model_validate({**body["record"], "replayed": replayed})


def _send(fx: Effects, tool: OfferedTool, arguments: dict[str, Any], key: str) -> ToolOutcome:
    if isinstance(tool, McpToolRef):
        if fx.mcp is None:
            raise PermanentLapError(f"tool '{tool.name}' is an MCP tool but this lap has no MCP client")
        return fx.mcp.call(tool, arguments, key)
    return fx.tools.call(tool, arguments, key)


def execute_call(
    ctx: LapContext, fx: Effects, acc: _Acc, tool: OfferedTool, call_id: str, arguments: dict[str, Any],
    key: str, journal_name: str,
) -> ToolCallRecord:
    """Run one validated call exactly once per lap: reuse the journal, else call and journal (in a
    span ``execute_tool <tool>``)."""
    capture = fx.tracer.capture_content
    with fx.tracer.span(*tool_span(tool, call_id, key, arguments, capture)) as span:
        record = _execute_call(ctx, fx, acc, tool, call_id, arguments, key, journal_name)
        span.set_attributes(tool_result(record, capture))
    return record


def _execute_call(
    ctx: LapContext, fx: Effects, acc: _Acc, tool: OfferedTool, call_id: str, arguments: dict[str, Any],
    key: str, journal_name: str,
) -> ToolCallRecord:
    found = fx.journal.get(journal_name)
    if found is not None:
        fx.log("tool result reused from the journal", tool=tool.name, call_id=call_id, key=key)
        return _tool_record_from_journal(found, replayed=True)
    acc.executed += 1
    started, t0 = fx.clock(), time.monotonic()
    outcome = _send(fx, tool, arguments, key)
    acc.tools_seconds += time.monotonic() - t0
    fx.crash(f"after-tool-call-{acc.executed}")
    record = ToolCallRecord(
        call_id=call_id, tool=tool.name, arguments=arguments, idempotency_key=key, status=outcome.status,
        result=outcome.result, http_status=outcome.http_status, started_at=started, finished_at=fx.clock(),
    )
    body = {"kind": JOURNAL_KIND_TOOL, "record": record.to_api()}
    if not fx.journal.put(journal_name, body):
        winner = fx.journal.get(journal_name)
        if winner is not None:
            record = _tool_record_from_journal(winner, replayed=True)
    fx.crash(f"after-tool-journal-{acc.executed}")
    fx.log("tool called", tool=tool.name, call_id=call_id, key=key, status=record.status, http_status=record.http_status)
    return record


def _not_run(call: ModelCall, key: str, status: str, result: str | None) -> ToolCallRecord:
    return ToolCallRecord(
        call_id=call.id, tool=call.name, arguments=call.arguments, idempotency_key=key,
        status=status, result=result,
    )


def _tool_message(record: ToolCallRecord, lap: int) -> Message:
    """The answer the model sees: the result, or ``error: ...`` / ``<status>: ...`` (the rule the
    stored lap record relies on to keep the result once: ``codec.tool_message_text``)."""
    return Message(role="tool", content=tool_message_text(record.status, record.result), tool_call_id=record.call_id, lap=lap)


def handle_call(
    ctx: LapContext, fx: Effects, acc: _Acc, call: ModelCall, pending: PendingApproval | None,
    toolset: ToolSet | None = None,
) -> tuple[ToolCallRecord, PendingApproval | None]:
    """Decide and (maybe) run one call of the model response. Returns its record and the pending approval."""
    toolset = toolset or ToolSet(http=tuple(ctx.spec.agent.tools))
    key = idempotency_key(ctx.run, ctx.lap, call.name, call.id, ctx.key_scheme, ctx.history)
    tool = toolset.get(call.name)
    if tool is None:
        names = ", ".join(toolset.names()) or "(none)"
        return _not_run(call, key, "unknown-tool", f"unknown tool '{call.name}'; declared tools: {names}"), pending
    problem = call.argument_error or argument_errors(tool, call.arguments)
    if problem:
        return _not_run(call, key, "invalid-arguments", f"invalid arguments for '{tool.name}': {problem}"), pending
    if tool.requires_approval and pending is None:
        approval = PendingApproval(
            call_id=call.id, tool=tool.name, arguments=call.arguments, idempotency_key=key,
            lap=ctx.lap, requested_at=fx.clock(),
            target_sha256=ctx.target_sha256(tool, call.arguments) if ctx.image else None,
        )
        return _not_run(call, key, "awaiting-approval", None), approval
    if tool.requires_approval:
        msg = f"not executed: call {pending.call_id if pending else '?'} of this response already awaits approval; ask again after the decision"
        return _not_run(call, key, "error", msg), pending
    return execute_call(ctx, fx, acc, tool, call.id, call.arguments, key, tool_journal_name(call.id)), pending


# ---------------------------------------------------------------------------- approvals


def _decision_text(pending: PendingApproval, decision: ApprovalDecision) -> str:
    who = f" by {decision.decided_by}" if decision.decided_by else ""
    why = f": {decision.reason}" if decision.reason else ""
    verb = {"approved": "approved", "rejected": "rejected", "timed-out": "timed out (no decision before the deadline)"}
    tail = "" if decision.decision == "approved" else "; the call was not executed"
    return f"call {pending.call_id} of tool {pending.tool} {verb[decision.decision]}{who}{why}{tail}"


def resolve_pending(
    ctx: LapContext, fx: Effects, acc: _Acc, pending: PendingApproval, toolset: ToolSet | None = None,
) -> tuple[ApprovalDecision | None, Outcome | None, PendingApproval | None]:
    """Apply the decision to the pending call (run it if approved, with the recorded key).

    Returns the decision (None: not applied), an outcome that ends the lap early (timed-out with
    onTimeout: fail; or an approval whose target changed: the call is not sent and is asked for
    again, the third item being the pending call asked again).

    The decision is bound to the call: its id and the digest of its full arguments must be the
    pending call's (else the lap fails permanently: the record or the Job was tampered with), and
    an approval's target digest must be the call's under this lap's spec and image.
    """
    decision = ctx.decision
    if decision is None:
        raise PermanentLapError(
            f"lap {ctx.lap} started without a decision for pending approval of tool {pending.tool} "
            f"(call {pending.call_id}): set AGENTRUN_APPROVAL_DECISION"
        )
    if decision.call_id and decision.call_id != pending.call_id:
        raise PermanentLapError(
            f"the decision is for call {decision.call_id} but the pending approval is call {pending.call_id} "
            f"of tool {pending.tool}"
        )
    args_digest = arguments_sha256(pending.arguments)
    if decision.arguments_sha256 and decision.arguments_sha256 != args_digest:
        raise PermanentLapError(
            f"the decision is bound to arguments with sha256 {decision.arguments_sha256} but the pending call "
            f"{pending.call_id} of tool {pending.tool} has arguments with sha256 {args_digest}; not executed"
        )
    decision = decision.model_copy(update={"call_id": pending.call_id})
    if ctx.attempt == 1:  # the wait, once per decision (a retry of this lap does not record it again)
        fx.tracer.record(*approval_span(pending, decision), start=pending.requested_at,
                         end=decision.decided_at or fx.clock())  # to the decision (an older Job: this lap's start)
    toolset = toolset or ToolSet(http=tuple(ctx.spec.agent.tools))
    declared: ToolSpec | McpToolRef | None = ctx.spec.tool(pending.tool) or find_mcp_tool(ctx.spec.agent, pending.tool)
    if decision.decision == "approved" and decision.target_sha256:
        current = ctx.target_sha256(declared, pending.arguments)
        if current != decision.target_sha256:
            fx.log("approved call not sent: its target changed since the approval; asking again",
                   tool=pending.tool, call_id=pending.call_id, approved_target=decision.target_sha256,
                   current_target=current)
            again = pending.model_copy(update={"requested_at": fx.clock(), "target_sha256": current})
            return None, Outcome(type="awaiting-approval", message=(
                f"call {pending.call_id} of tool {pending.tool} was not sent: its target (the tool's definition "
                f"or the lap image) changed since it was approved; approval asked again")), again
    tool = toolset.get(pending.tool)
    if tool is None and isinstance(declared, McpToolRef):
        raise PermanentLapError(
            f"tool '{declared.tool}' of the pending approval (call {pending.call_id}) is no longer listed by MCP "
            f"server '{declared.server.name}'; the call was not executed"
        )
    if tool is None:
        raise PermanentLapError(
            f"tool '{pending.tool}' of the pending approval is not declared by agent version {ctx.agent_version}"
        )
    text = APPROVAL_PREFIX + _decision_text(pending, decision)
    if decision.decision != "approved":
        status: Literal["rejected", "timed-out"] = "rejected" if decision.decision == "rejected" else "timed-out"
        record = ToolCallRecord(
            call_id=pending.call_id, tool=pending.tool, arguments=pending.arguments,
            idempotency_key=pending.idempotency_key, status=status, result=text[len(APPROVAL_PREFIX):],
        )
        acc.calls.append(record)
        acc.messages.append(Message(role="tool", content=text, tool_call_id=pending.call_id, lap=ctx.lap))
        if decision.decision == "timed-out" and ctx.spec.approval.on_timeout == "fail":
            return decision, Outcome(type="failed", message=f"approval of tool {pending.tool} timed out (onTimeout: fail)"), None
        return decision, None, None
    problem = argument_errors(tool, pending.arguments)
    if problem:
        record = ToolCallRecord(
            call_id=pending.call_id, tool=pending.tool, arguments=pending.arguments,
            idempotency_key=pending.idempotency_key, status="invalid-arguments",
            result=f"invalid arguments for '{tool.name}' under agent version {ctx.agent_version}: {problem}",
        )
    else:
        record = execute_call(
            ctx, fx, acc, tool, pending.call_id, pending.arguments, pending.idempotency_key,
            approved_journal_name(pending.call_id),
        )
    acc.calls.append(record)
    result = record.result if record.status == "ok" else f"{record.status}: {record.result}"
    acc.messages.append(
        Message(role="tool", content=f"{text}\nresult: {result}", tool_call_id=pending.call_id, lap=ctx.lap)
    )
    return decision, None, None


# ---------------------------------------------------------------------------- the model


def journaled_model_call(
    ctx: LapContext, fx: Effects, window: list[Message], toolset: ToolSet | None = None,
) -> tuple[ModelResponse, bool]:
    """The lap's model response: from the journal if recorded, else asked and journaled first (in a
    span ``chat <model>``)."""
    offered = toolset.offered() if toolset is not None else tuple(ctx.spec.agent.tools)
    request = ModelRequest(lap=ctx.lap, messages=tuple(window), tools=offered)
    capture = fx.tracer.capture_content
    with fx.tracer.span(*chat_span(ctx.spec.agent.model, request, capture, ctx.run.uid)) as span:
        response, reused = _journaled_model_call(fx, request)
        span.set_attributes(chat_result(response, capture, reused))
    return response, reused


def _journaled_model_call(fx: Effects, request: ModelRequest) -> tuple[ModelResponse, bool]:
    found = fx.journal.get(MODEL_JOURNAL_NAME)
    if found is not None:
        fx.log("model response reused from the journal")
        return ModelResponse.from_json(found["response"]), True
    response = fx.model.complete(request)
    body = {"kind": JOURNAL_KIND_MODEL, "response": response.to_json()}
    if not fx.journal.put(MODEL_JOURNAL_NAME, body):
        winner = fx.journal.get(MODEL_JOURNAL_NAME)
        if winner is not None:
            return ModelResponse.from_json(winner["response"]), True
    return response, False


def assistant_message(response: ModelResponse, lap: int) -> Message:
    calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in response.tool_calls]
    return Message(role="assistant", content=response.content, tool_calls=calls, lap=lap)


# ---------------------------------------------------------------------------- the lap


def totals_after(state: RunState, usage_in: int, usage_out: int, cost_usd: str) -> Totals:
    prev = state.totals
    return Totals(
        laps=prev.laps + 1,
        input_tokens=prev.input_tokens + usage_in,
        output_tokens=prev.output_tokens + usage_out,
        cost_usd=format_usd(Decimal(prev.cost_usd) + Decimal(cost_usd)),
    )


def run_lap(ctx: LapContext, state: RunState, fx: Effects) -> LapRecord:
    """Run lap ``ctx.lap`` on ``state`` (the state after lap - 1) and return its LapRecord."""
    started = fx.clock()
    check_start(ctx, state)
    toolset, mcp_tools = lap_tools(ctx, state, fx)
    acc = _Acc(messages=opening_messages(ctx.spec) if ctx.lap == 1 else [])
    decision: ApprovalDecision | None = None
    early: Outcome | None = None
    pending: PendingApproval | None = None
    if state.pending_approval is not None:
        decision, early, pending = resolve_pending(ctx, fx, acc, state.pending_approval, toolset)
    elif ctx.decision is not None:
        fx.log("approval decision ignored: no approval is pending", decision=ctx.decision.decision)
    compaction: Compaction | None = plan_compaction(state, ctx.spec, ctx.lap, acc.messages)
    window = build_window(apply_compaction(state, compaction), ctx.spec, acc.messages)
    response = ModelResponse(content=None)
    model_seconds = 0.0
    if early is None:
        t0 = time.monotonic()
        response, reused = journaled_model_call(ctx, fx, window, toolset)
        model_seconds = 0.0 if reused else time.monotonic() - t0
        fx.crash("after-model-journal")
        acc.messages.append(assistant_message(response, ctx.lap))
        for call in response.tool_calls:
            record, pending = handle_call(ctx, fx, acc, call, pending, toolset)
            acc.calls.append(record)
            if record.status != "awaiting-approval":
                acc.messages.append(_tool_message(record, ctx.lap))
    outcome = early or _outcome(response, pending)
    cost = lap_cost_usd(response.usage, ctx.spec.agent.model.pricing)
    return LapRecord(
        agent_version=ctx.agent_version, run=ctx.run, lap=ctx.lap, attempt=ctx.attempt,
        prev_sha256=state.last_sha256, outcome=outcome, messages=acc.messages, tool_calls=acc.calls,
        pending_approval=pending, approval_decision=decision, usage=response.usage, cost_usd=cost,
        totals=totals_after(state, response.usage.input_tokens, response.usage.output_tokens, cost),
        compaction=compaction, key_scheme=ctx.key_scheme, mcp_tools=mcp_tools,
        timings=Timings(started_at=started, finished_at=fx.clock(), model_seconds=round(model_seconds, 3), tools_seconds=round(acc.tools_seconds, 3)),
    )


def _outcome(response: ModelResponse, pending: PendingApproval | None) -> Outcome:
    if pending is not None:
        return Outcome(type="awaiting-approval", message=f"tool {pending.tool} (call {pending.call_id}) awaits approval")
    if not response.tool_calls:
        return Outcome(type="done", message=None)
    return Outcome(type="continue", message=None)
