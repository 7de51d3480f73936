"""The lap's spans as attributes: names of the OpenTelemetry GenAI semantic conventions
(``gen_ai.*``) and agentrun's own (``agentrun.*``), and the pure functions that make each span's
attributes from the lap's values (docs/observability.md#traces lists them).

Message content (the window, the response, tool arguments and results) is added only when
``capture`` is true (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``), each value at
most :data:`MAX_CONTENT_CHARS`; the tracer redacts the lap's secrets from every string value.
Nothing here imports OpenTelemetry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from agentrun.api.contract import LAP_SPAN_NAME
from agentrun.api.mcp import McpToolRef
from agentrun.api.spec import ModelSpec
from agentrun.checkpoint.schema import ApprovalDecision, LapRecord, Message, PendingApproval, ToolCallRecord
from agentrun.lap.interfaces import AttributeValue, ModelRequest, ModelResponse, OfferedTool

Attributes = dict[str, AttributeValue]

# -- the GenAI semantic conventions --------------------------------------------------------------
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"
"""The older name of ``gen_ai.provider.name``, still read by many backends: both are set."""
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
CONTENT_ATTRIBUTES = frozenset({INPUT_MESSAGES, OUTPUT_MESSAGES, TOOL_CALL_ARGUMENTS, TOOL_CALL_RESULT})
"""The attributes that carry message content: set only when content capture is on."""
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
HTTP_STATUS = "http.response.status_code"
ERROR_TYPE = "error.type"

# -- agentrun's own --------------------------------------------------------------------------------
RUN_NAMESPACE = "agentrun.run.namespace"
RUN_NAME = "agentrun.run.name"
RUN_UID = "agentrun.run.uid"
LAP = "agentrun.lap"
ATTEMPT = "agentrun.attempt"
OUTCOME = "agentrun.lap.outcome"
COST_USD = "agentrun.lap.cost_usd"
EXIT_CODE = "agentrun.lap.exit_code"
FROM_JOURNAL = "agentrun.from_journal"
"""On a model or tool span: the answer was the journal's (a retried attempt), not a new call."""
IDEMPOTENCY_KEY = "agentrun.tool.idempotency_key"
TOOL_STATUS = "agentrun.tool.status"
TOOL_KIND = "agentrun.tool.kind"
MCP_SERVER = "agentrun.mcp.server"
APPROVAL_DECISION = "agentrun.approval.decision"
APPROVAL_BY = "agentrun.approval.decided_by"
APPROVAL_REQUESTED_LAP = "agentrun.approval.lap"
"""On an approval span: the lap that asked for the approval (the decision is applied by the next)."""

LAP_SPAN = LAP_SPAN_NAME
MAX_CONTENT_CHARS = 16384
"""At most this many characters of one content attribute (then ``…[truncated]``)."""


def bounded(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…[truncated]"


def _json(value: Any) -> str:
    return bounded(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


def lap_attributes(namespace: str, name: str, uid: str, lap: str, attempt: str) -> Attributes:
    """The lap span's attributes at its start (from the lap's environment, bounded)."""
    attrs: Attributes = {OPERATION: "invoke_agent", AGENT_NAME: bounded(name, 253), CONVERSATION_ID: bounded(uid, 64),
                         RUN_NAMESPACE: bounded(namespace, 63), RUN_NAME: bounded(name, 253), RUN_UID: bounded(uid, 64)}
    for key, raw in ((LAP, lap), (ATTEMPT, attempt)):
        if raw.isdigit():
            attrs[key] = int(raw)
    return attrs


def lap_result(code: int, record: LapRecord | None) -> Attributes:
    """The lap span's attributes at its end: the exit code and, when checkpointed, its outcome,
    cost and tokens."""
    attrs: Attributes = {EXIT_CODE: int(code)}
    if record is not None:
        attrs.update({OUTCOME: record.outcome.type, COST_USD: float(record.cost_usd),
                      INPUT_TOKENS: record.usage.input_tokens, OUTPUT_TOKENS: record.usage.output_tokens})
        decision = record.approval_decision
        if decision is not None:
            attrs[APPROVAL_DECISION] = decision.decision
            if decision.decided_by:
                attrs[APPROVAL_BY] = bounded(decision.decided_by, 256)
    return attrs


def _wire_message(m: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if m.role == "tool":
        parts.append({"type": "tool_call_response", "id": m.tool_call_id, "response": m.content or ""})
    elif m.content:
        parts.append({"type": "text", "content": m.content})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return {"role": m.role, "parts": parts}


def chat_span(spec: ModelSpec, request: ModelRequest, capture: bool, uid: str) -> tuple[str, Attributes]:
    """The name and starting attributes of a model call's span (``chat <model>``)."""
    provider = spec.provider
    attrs: Attributes = {OPERATION: "chat", PROVIDER: provider, SYSTEM: provider, REQUEST_MODEL: bounded(spec.name, 256),
                         CONVERSATION_ID: bounded(uid, 64), LAP: request.lap}
    if spec.temperature is not None:
        attrs[REQUEST_TEMPERATURE] = float(spec.temperature)
    if spec.max_output_tokens is not None:
        attrs[REQUEST_MAX_TOKENS] = int(spec.max_output_tokens)
    if spec.base_url:
        parts = urlsplit(spec.base_url)
        if parts.hostname:
            attrs[SERVER_ADDRESS] = parts.hostname
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = None
        if port:
            attrs[SERVER_PORT] = port
    if capture:
        attrs[INPUT_MESSAGES] = _json([_wire_message(m) for m in request.messages])
    return f"chat {bounded(spec.name, 128)}", attrs


def chat_result(response: ModelResponse, capture: bool, from_journal: bool) -> Attributes:
    """A model call's attributes once answered: its tokens (not for an answer from the journal,
    whose tokens the attempt that asked recorded), whether it came from the journal, the output."""
    attrs: Attributes = {FROM_JOURNAL: from_journal}
    if not from_journal:
        attrs.update({INPUT_TOKENS: response.usage.input_tokens, OUTPUT_TOKENS: response.usage.output_tokens})
    if capture:
        parts: list[dict[str, Any]] = [{"type": "text", "content": response.content}] if response.content else []
        parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
                  for c in response.tool_calls]
        attrs[OUTPUT_MESSAGES] = _json([{"role": "assistant", "parts": parts}])
    return attrs


def tool_span(
    tool: OfferedTool, call_id: str, key: str, arguments: Mapping[str, Any], capture: bool,
) -> tuple[str, Attributes]:
    """The name and starting attributes of a tool call's span (``execute_tool <tool>``)."""
    attrs: Attributes = {OPERATION: "execute_tool", TOOL_NAME: tool.name, TOOL_CALL_ID: call_id, TOOL_TYPE: "extension",
                         IDEMPOTENCY_KEY: key}
    if isinstance(tool, McpToolRef):
        attrs.update({TOOL_KIND: "mcp", MCP_SERVER: tool.server.name})
    else:
        attrs[TOOL_KIND] = "http"
    if capture:
        attrs[TOOL_CALL_ARGUMENTS] = _json(dict(arguments))
    return f"execute_tool {tool.name}", attrs


def tool_result(record: ToolCallRecord, capture: bool) -> Attributes:
    """A tool call's attributes once answered: its status, HTTP status, whether from the journal."""
    attrs: Attributes = {TOOL_STATUS: record.status, FROM_JOURNAL: record.replayed}
    if record.http_status is not None:
        attrs[HTTP_STATUS] = record.http_status
    if capture and record.result is not None:
        attrs[TOOL_CALL_RESULT] = bounded(record.result)
    return attrs


def approval_span(pending: PendingApproval, decision: ApprovalDecision) -> tuple[str, Attributes]:
    """The name and attributes of the wait for an approval (``approval <tool>``), from the request to
    the decision (``status.approval.decidedAt``, passed to the lap that applies it as
    ``AGENTRUN_APPROVAL_DECIDED_AT``; without it, the start of that lap)."""
    attrs: Attributes = {TOOL_NAME: pending.tool, TOOL_CALL_ID: pending.call_id, IDEMPOTENCY_KEY: pending.idempotency_key,
                         APPROVAL_REQUESTED_LAP: pending.lap, APPROVAL_DECISION: decision.decision}
    if decision.decided_by:
        attrs[APPROVAL_BY] = bounded(decision.decided_by, 256)
    return f"approval {pending.tool}", attrs
