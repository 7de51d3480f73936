"""The effects a lap needs, as small Protocols: a model, a tool runner, a journal and a tracer.

The step logic (:mod:`agentrun.lap.step`) only talks to these; the CLI wires the real ones
(OpenAI-compatible or scripted model, HTTP tools, the S3 journal), tests wire in-memory fakes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from agentrun.api.mcp import McpToolRef
from agentrun.api.spec import McpServer, ToolSpec
from agentrun.checkpoint.schema import McpServerTools, Message, Usage

JOURNAL_KIND_MODEL = "ModelResponse"
JOURNAL_KIND_TOOL = "ToolResult"
JOURNAL_KIND_MCP_TOOLS = "McpTools"

OfferedTool = ToolSpec | McpToolRef
"""A tool the model is offered: an HTTP tool of the spec, or a listed tool of an MCP server."""


@dataclass(frozen=True)
class ModelCall:
    """A tool call asked for by the model, as parsed from the provider's response."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    argument_error: str | None = None
    """Set when the provider's arguments were not a JSON object; the error goes back to the model."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.argument_error is not None:
            out["argumentError"] = self.argument_error
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> ModelCall:
        return ModelCall(
            id=str(d["id"]),
            name=str(d["name"]),
            arguments=dict(d.get("arguments") or {}),
            argument_error=d.get("argumentError"),
        )


@dataclass(frozen=True)
class ModelResponse:
    """One model response: text, tool calls (ids already normalized) and token usage."""

    content: str | None
    tool_calls: tuple[ModelCall, ...] = ()
    usage: Usage = field(default_factory=Usage)

    def to_json(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "toolCalls": [c.to_json() for c in self.tool_calls],
            "usage": self.usage.to_api(),
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ModelResponse:
        return ModelResponse(
            content=d.get("content"),
            tool_calls=tuple(ModelCall.from_json(c) for c in d.get("toolCalls", [])),
            usage=Usage.model_validate(d.get("usage") or {}),
        )


@dataclass(frozen=True)
class ModelRequest:
    """What the lap sends to the model: the window and the declared tools."""

    lap: int
    messages: tuple[Message, ...]
    tools: tuple[OfferedTool, ...]


class Model(Protocol):
    """A chat model with tool calling. Raises RetryableLapError / PermanentLapError."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...


@dataclass(frozen=True)
class ToolOutcome:
    """Result of one executed tool call."""

    status: Literal["ok", "error"]
    result: str
    http_status: int | None = None


class ToolRunner(Protocol):
    """Executes a declared tool with validated arguments.

    ``idempotency_key`` is sent to side-effecting tools (HTTP: ``Idempotency-Key`` header).
    Raises RetryableLapError when the call may or may not have happened (timeout, 5xx): the lap
    is retried and the replay sends the same key.
    """

    def call(self, tool: ToolSpec, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome: ...


class McpTools(Protocol):
    """Lists and calls the tools of MCP servers (``lap/tools/mcp.py``), same failure policy as ToolRunner:
    ``call`` raises RetryableLapError when the call may or may not have happened (the replay sends the
    same key), returns an ``error`` outcome for an MCP error result; ``list_tools`` raises
    RetryableLapError when the server cannot be reached."""

    def list_tools(self, server: McpServer) -> McpServerTools: ...

    def call(self, tool: McpToolRef, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome: ...


class Journal(Protocol):
    """The journal of one lap (``journal/<lap>/<name>.json``): write-once entries."""

    def get(self, name: str) -> dict[str, Any] | None: ...

    def put(self, name: str, body: dict[str, Any]) -> bool:
        """Write the entry if absent; False if it already existed (nothing written)."""
        ...


AttributeValue = str | bool | int | float
"""A span attribute's value (OpenTelemetry's scalar types)."""


class TraceSpan(Protocol):
    """A span of the lap's trace, open while its ``with`` block runs."""

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None: ...

    def set_error(self, message: str) -> None:
        """Mark the span failed (a lap that exits with a failure code, without an exception)."""
        ...


class Tracer(Protocol):
    """The lap's spans (``lap/tracing``): OpenTelemetry when an OTLP endpoint is configured, else
    :data:`NO_TRACER`. ``span`` opens a child of the current span (the lap's first: a child of the
    run's root span, in the run's trace); an exception leaving the block marks the span failed.
    ``headers`` is the W3C trace context of the current span (``traceparent``), sent with every
    model and tool request; ``capture_content`` whether spans may carry messages, arguments and
    results (the GenAI conventions' opt-in)."""

    capture_content: bool

    def span(self, name: str, attributes: Mapping[str, AttributeValue]) -> AbstractContextManager[TraceSpan]: ...

    def headers(self) -> dict[str, str]: ...

    def record(self, name: str, attributes: Mapping[str, AttributeValue], start: datetime, end: datetime) -> None:
        """A span of the run that already happened (from ``start`` to ``end``), a child of the run's
        root span: the wait for an approval decision."""
        ...


class _NoSpan:
    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        return None

    def set_error(self, message: str) -> None:
        return None


class NoTracer:
    """Tracing off: spans that record nothing, no headers."""

    capture_content = False

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue]) -> Iterator[TraceSpan]:
        yield _NO_SPAN

    def headers(self) -> dict[str, str]:
        return {}

    def record(self, name: str, attributes: Mapping[str, AttributeValue], start: datetime, end: datetime) -> None:
        return None


_NO_SPAN = _NoSpan()
NO_TRACER: Tracer = NoTracer()
