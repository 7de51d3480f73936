"""The checkpoint schema (current version): what one lap writes, and the state a resume rebuilds.

Every stored object carries ``schemaVersion`` and the ``agentVersion`` that wrote it. Objects of
older schema versions are read through ``agentrun.checkpoint.migrations``; an object of an unknown
(newer) schema version is refused with an error naming both versions.

A lap writes ONE ``LapRecord`` holding only that lap's delta. Every ``snapshotEvery`` laps a
``Snapshot`` (a ``RunState``) is written too, so a resume reads at most K+1 objects. The run state is
bounded: older messages are folded into ``summary`` / ``pinnedFacts`` by compaction, so a snapshot's
size does not grow with the run's length. The full per-lap trace stays in the lap records.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from agentrun.api.types import APIModel

SCHEMA_VERSION = 3
"""The schema version this code writes."""

KeyScheme = Literal["uid8", "uid128"]
KEY_SCHEME_UID8: KeyScheme = "uid8"
"""Idempotency keys ``r_<first 8 hex of the uid>:<lap>:<tool>:<callId>`` (schema versions 1-2; kept
by runs that were checkpointed with them, so their keys never change)."""
KEY_SCHEME_UID128: KeyScheme = "uid128"
"""Idempotency keys ``r_<the 32 hex of the uid>:<lap>:<tool>:<callId>`` (schema 3, new runs): unique
across runs and tenants, not only within a run."""
KEY_SCHEME: KeyScheme = KEY_SCHEME_UID128
"""The key scheme a run starts with when nothing in its checkpoints says otherwise."""


class CheckpointModel(APIModel):
    """Base of the checkpoint models: an ``APIModel`` (camelCase on the wire, unknown fields
    refused) whose validator is built on first use (``defer_build``), so a lap pod builds only the
    models it uses, and those it first uses after its model request only then; and whose field
    descriptions are not read from the attribute docstrings below (pydantic parses the module's
    source for that, at every lap's start, and no JSON schema is generated from these models)."""

    model_config = ConfigDict(defer_build=True, use_attribute_docstrings=False)


class RunRef(CheckpointModel):
    """Identity of a run: the AgentRun's namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    @property
    def short_id(self) -> str:
        """The run id of the legacy key scheme ``uid8``, e.g. ``r_8f2a1c0d`` (32 bits of the uid)."""
        return "r_" + self.uid.replace("-", "")[:8]

    @property
    def long_id(self) -> str:
        """The run id of the key scheme ``uid128``: ``r_`` + the uid's 32 hex digits (a Kubernetes
        uid is a UUID), e.g. ``r_8f2a1c0d4b7e4f109a512c3d4e5f6a7b``. A uid that is not 32 hex digits
        gets the first 32 hex digits of sha256(namespace/uid) instead (128 bits either way)."""
        hex32 = self.uid.replace("-", "").lower()
        if len(hex32) == 32 and all(ch in "0123456789abcdef" for ch in hex32):
            return "r_" + hex32
        return "r_" + hashlib.sha256(f"{self.namespace}/{self.uid}".encode()).hexdigest()[:32]

    def key_id(self, scheme: str) -> str:
        """The run part of an idempotency key under ``scheme``."""
        if scheme == KEY_SCHEME_UID8:
            return self.short_id
        if scheme == KEY_SCHEME_UID128:
            return self.long_id
        raise ValueError(f"unknown idempotency key scheme {scheme!r}")


class ToolCall(CheckpointModel):
    """A tool call requested by the model."""

    id: str = Field(description="Call id given by the model (or derived), unique within the lap.")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(CheckpointModel):
    """One message of the conversation."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    lap: int = Field(ge=0, description="The lap that appended this message (0: the task).")


ToolCallStatus = Literal[
    "ok",  # executed (or result reused from the journal), 2xx
    "error",  # executed, failed (non-2xx, timeout): the error goes back to the model
    "unknown-tool",  # the model asked for a tool that is not declared
    "invalid-arguments",  # arguments did not validate against the tool's schema
    "awaiting-approval",  # not executed: waits for a human
    "rejected",  # not executed: a human rejected it
    "timed-out",  # not executed: the approval deadline passed (onTimeout: reject)
]


class ToolCallRecord(CheckpointModel):
    """What happened to one tool call in a lap."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str = Field(description="run:lap:tool:call, stable across replays of the lap.")
    status: ToolCallStatus
    result: str | None = Field(default=None, description="Result text given back to the model.")
    http_status: int | None = None
    replayed: bool = Field(default=False, description="True if the result came from the journal, not a call.")
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Usage(CheckpointModel):
    """Token usage."""

    input_tokens: int = 0
    output_tokens: int = 0


class Outcome(CheckpointModel):
    """How the lap ended; the operator decides the next step from it."""

    type: Literal["continue", "done", "awaiting-approval", "failed"]
    message: str | None = None


class PendingApproval(CheckpointModel):
    """A tool call that waits for a human decision. No process waits with it."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str
    lap: int
    requested_at: datetime
    target_sha256: str | None = Field(
        default=None,
        description=(
            "agentrun.api.approval.target_sha256 of the call under the spec and image the lap ran with "
            "(optional: records of earlier releases have none; the operator then binds the current spec's)."
        ),
    )


class ApprovalDecision(CheckpointModel):
    """A human decision (or a timeout) applied to a pending call."""

    call_id: str
    decision: Literal["approved", "rejected", "timed-out"]
    reason: str | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    arguments_sha256: str | None = Field(
        default=None, description="The arguments digest the decision was bound to (checked before the call)."
    )
    target_sha256: str | None = Field(
        default=None, description="Of an approval: the target digest it was bound to (checked before the call)."
    )


class Compaction(CheckpointModel):
    """Older laps folded into a bounded summary; messages of laps <= throughLap leave the window."""

    through_lap: int
    summary: str
    pinned_facts: list[str] = Field(default_factory=list)


class Totals(CheckpointModel):
    """Running totals of the run, through this lap."""

    laps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: str = Field(default="0.00", alias="costUSD")


class Storage(CheckpointModel):
    """Bytes and objects of a run's checkpoint store (as stored, i.e. compressed)."""

    bytes: int = Field(default=0, ge=0)
    objects: int = Field(default=0, ge=0)


class Timings(CheckpointModel):
    """Timings of the lap."""

    started_at: datetime
    finished_at: datetime
    model_seconds: float = 0.0
    tools_seconds: float = 0.0


class McpToolInfo(CheckpointModel):
    """One tool as an MCP server listed it (bounded: ``lap/tools/mcp.py``)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class McpServerTools(CheckpointModel):
    """What one MCP server (``spec.agent.mcpServers[]``) listed: its tools and who it said it is."""

    server: str
    url: str
    server_info: dict[str, str] = Field(default_factory=dict, description="name, version (bounded).")
    tools: list[McpToolInfo] = Field(default_factory=list)


class McpToolList(CheckpointModel):
    """The MCP tools of a run: a version of the listings of every declared server. A lap whose
    listing differs from the run's recorded one (``RunState.mcpTools``) records the new one in its
    lap record with ``version`` + 1 and what changed (the operator emits ONE ToolsChanged Event)."""

    version: int = Field(ge=1)
    servers: list[McpServerTools] = Field(default_factory=list)
    changes: list[str] = Field(default_factory=list, description="What changed since the previous version.")


class LapRecord(CheckpointModel):
    """One lap's delta: the only object a lap must write. Key: ``.../laps/<lap:08d>.json``."""

    kind: Literal["LapRecord"] = "LapRecord"
    schema_version: int = SCHEMA_VERSION
    agent_version: str
    run: RunRef
    lap: int = Field(ge=1)
    attempt: int = Field(ge=1)
    prev_sha256: str | None = Field(
        default=None, description="sha256 of the previous lap's object: a hash chain over the history."
    )
    outcome: Outcome
    messages: list[Message] = Field(default_factory=list, description="Messages appended in this lap.")
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    plan: list[str] | None = Field(default=None, description="The plan after this lap, if it changed.")
    pending_approval: PendingApproval | None = None
    approval_decision: ApprovalDecision | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: str = Field(default="0.00", alias="costUSD")
    totals: Totals = Field(default_factory=Totals)
    compaction: Compaction | None = None
    timings: Timings
    key_scheme: KeyScheme = Field(
        default=KEY_SCHEME,
        description="How this lap derived its idempotency keys (uid8: schema <= 2 runs; uid128: new runs).",
    )
    storage: Storage | None = Field(
        default=None,
        description="The run's stored checkpoint bytes and objects before this record (schema >= 3).",
    )
    mcp_tools: McpToolList | None = Field(
        default=None,
        description=(
            "The MCP tools this lap listed, when they differ from the run's recorded ones (a new version); "
            "absent otherwise, and in runs without spec.agent.mcpServers."
        ),
    )


class ForkProvenance(CheckpointModel):
    """Where a forked run's state comes from: the source run, the lap it was folded through, and
    the sha256 of that lap's object (the source's ``lastSha256`` at that lap)."""

    run: RunRef
    lap: int = Field(ge=1)
    sha256: str | None = None


class RunState(CheckpointModel):
    """The state a lap starts from, folded from a snapshot plus the lap records after it.

    Stored as a snapshot every K laps under ``.../snapshots/<lap:08d>.json``.
    """

    kind: Literal["Snapshot"] = "Snapshot"
    schema_version: int = SCHEMA_VERSION
    agent_version: str | None = None
    run: RunRef
    lap: int = Field(default=0, ge=0, description="Last lap folded into this state (0: none yet).")
    last_sha256: str | None = None
    summary: str | None = None
    pinned_facts: list[str] = Field(default_factory=list)
    compacted_through_lap: int = 0
    messages: list[Message] = Field(default_factory=list, description="Messages not yet compacted.")
    plan: list[str] = Field(default_factory=list)
    pending_approval: PendingApproval | None = None
    last_outcome: Outcome | None = None
    totals: Totals = Field(default_factory=Totals)
    forked_from: ForkProvenance | None = Field(
        default=None,
        description="Set on a fork snapshot (and carried by every later state): the source run and lap.",
    )
    key_scheme: KeyScheme | None = Field(
        default=None,
        description="The run's idempotency key scheme (None before lap 1: the next lap picks KEY_SCHEME).",
    )
    storage: Storage = Field(
        default_factory=Storage,
        description="Bytes and objects stored through the last lap's record (its snapshot not included).",
    )
    mcp_tools: McpToolList | None = Field(
        default=None, description="The run's MCP tools as last recorded by a lap record (None: none listed yet).",
    )


class JournalEntry(CheckpointModel):
    """Envelope of a journal object (``.../journal/<lap:08d>/<name>.json``): the model response of a
    lap, or one tool call's result, written once (conditional put) before the lap checkpoint."""

    kind: Literal["JournalEntry"] = "JournalEntry"
    schema_version: int = SCHEMA_VERSION
    agent_version: str | None = None
    run: RunRef
    lap: int = Field(ge=1)
    name: str
    body: dict[str, Any]


class AttemptFailure(CheckpointModel):
    """Envelope of a lap attempt's failure report (``.../attempts/<lap:08d>-<attempt:03d>.json``)."""

    kind: Literal["AttemptFailure"] = "AttemptFailure"
    schema_version: int = SCHEMA_VERSION
    agent_version: str | None = None
    run: RunRef
    lap: int = Field(ge=1)
    attempt: int = Field(ge=1)
    body: dict[str, Any]
