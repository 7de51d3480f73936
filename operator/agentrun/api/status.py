"""The AgentRun status: what the operator observed and decided. Written only through the
status subresource. Everything needed to continue a run is here or in the checkpoint store, so
an operator restart resumes every run from it; nothing is kept in memory.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from .types import USD, APIModel

Phase = Literal[
    "Pending",  # accepted, no lap started yet; or the lap pod cannot start (condition SecretMissing)
    "Running",  # a lap Job is running (or about to be created)
    "Retrying",  # the last attempt failed; waiting for the backoff before the next attempt
    "AwaitingApproval",  # waiting for a human decision; no Job, no process
    "Suspended",  # spec.suspend is true; no Job between laps
    "Succeeded",  # the agent finished (terminal)
    "Failed",  # a permanent error (terminal)
    "BudgetExceeded",  # the next lap would pass maxLaps or maxCostUSD (terminal)
]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "BudgetExceeded"})


class Condition(APIModel):
    """A condition of the run, per Kubernetes API conventions."""

    type: str = Field(description="Type of the condition: Progressing, AwaitingApproval, Complete, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(description="Status of the condition.")
    reason: str = Field(description="Machine-readable CamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the condition was set for."
    )
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )


class CheckpointRef(APIModel):
    """The latest lap checkpoint of the run."""

    lap: int = Field(description="Lap of this checkpoint.")
    key: str = Field(description="Object key of the lap checkpoint in the store.")
    uri: str | None = Field(default=None, description="Full s3:// URI of the object.")
    sha256: str = Field(description="sha256 of the object's bytes.")
    written_at: datetime | None = Field(default=None, description="When the object was written.")
    agent_version: str = Field(description="Agent version that wrote the checkpoint.")
    schema_version: int = Field(description="Checkpoint schema version.")
    endpoint: str | None = Field(
        default=None, description="S3 endpoint URL the operator reads the store at (empty: AWS)."
    )
    region: str | None = Field(default=None, description="S3 region of the store, when set.")
    path_style: bool | None = Field(default=None, description="Whether the store is read with path-style addressing.")


class StorageStatus(APIModel):
    """Bytes and objects of the run's checkpoints in the store, as stored (compressed)."""

    bytes: int = Field(default=0, description="Stored bytes of the run's checkpoint objects so far.")
    objects: int = Field(default=0, description="Checkpoint objects of the run so far.")


class ApprovalStatus(APIModel):
    """A pending or decided human approval."""

    state: Literal["Pending", "Approved", "Rejected", "TimedOut"] = Field(description="State of the approval.")
    lap: int = Field(description="Lap that asked for the approval.")
    tool: str = Field(description="Tool whose call waits for the decision.")
    call_id: str = Field(description="Id of the pending call.")
    idempotency_key: str = Field(description="Idempotency key the call will carry when it runs.")
    arguments: str | None = Field(
        default=None, max_length=4096, description="Arguments of the call as JSON, truncated to 4 KiB."
    )
    owner: str = Field(description="Who must decide.")
    requested_at: datetime = Field(description="When the approval was requested.")
    deadline: datetime = Field(description="When the onTimeout policy applies.")
    decision: Literal["approved", "rejected"] | None = Field(
        default=None,
        description=(
            "The decision. Users may set it with a status patch, or with "
            "`kubectl annotate agentrun NAME approved=true|false`."
        ),
    )
    reason: str | None = Field(default=None, max_length=1024, description="Reason given with the decision.")
    decided_by: str | None = Field(default=None, max_length=256, description="Who decided, when known.")
    decided_at: datetime | None = Field(default=None, description="When the decision was recorded.")


class CostStatus(APIModel):
    """Spend and tokens of the run so far, summed from its checkpoints."""

    usd: USD = Field(default="0.00", description="Cost so far in USD.")
    input_tokens: int = Field(default=0, description="Input tokens so far.")
    output_tokens: int = Field(default=0, description="Output tokens so far.")


class ActiveJob(APIModel):
    """The lap Job in flight."""

    name: str = Field(description="Name of the Job.")
    lap: int = Field(description="Lap it runs.")
    attempt: int = Field(description="Attempt of that lap (1-based).")
    agent_version: str = Field(description="Agent version it runs.")
    started_at: datetime | None = Field(default=None, description="When the Job was created.")


class LapRetries(APIModel):
    """Retries of one lap."""

    lap: int = Field(description="The lap.")
    retries: int = Field(description="Failed attempts of the lap.")
    last_reason: str | None = Field(default=None, description="Why the last attempt failed.")


class AgentRunStatus(APIModel):
    """Observed state of an AgentRun."""

    phase: Phase = Field(
        default="Pending",
        description=(
            "Summary of the run's state, for humans: Pending (no lap started yet, or the lap pod cannot start, "
            "e.g. a missing Secret: see conditions), Running, Retrying (backoff before the next attempt), "
            "AwaitingApproval, Suspended, and the terminal Succeeded, Failed, BudgetExceeded."
        ),
    )
    message: str | None = Field(default=None, max_length=4096, description="Details of the phase.")
    observed_generation: int | None = Field(default=None, description="The metadata.generation last acted on.")
    lap: int = Field(default=0, description="Last checkpointed lap (0: none yet).")
    agent_version: str | None = Field(default=None, description="Agent version that wrote the last checkpoint.")
    checkpoint: CheckpointRef | None = Field(default=None, description="The latest lap checkpoint.")
    active_job: ActiveJob | None = Field(default=None, description="The lap Job in flight, if any.")
    next_attempt_at: datetime | None = Field(default=None, description="When the next attempt may start (backoff).")
    retries: list[LapRetries] = Field(
        default_factory=list,
        max_length=20,
        description="Retries per lap, for the most recent laps that needed any.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["lap"]},
    )
    total_retries: int = Field(default=0, description="Failed lap attempts over the whole run.")
    approval: ApprovalStatus | None = Field(default=None, description="The current or last approval.")
    waiting_on: str | None = Field(default=None, description="Owner of the pending approval, while waiting.")
    cost: CostStatus = Field(default_factory=CostStatus, description="Spend and tokens so far.")
    storage: StorageStatus | None = Field(
        default=None,
        description=(
            "The run's checkpoint objects so far (lap records, journal entries, snapshots) through the last "
            "lap's record, from the checkpoints themselves (schema 3; laps written by older versions are not "
            "counted; the snapshot of the last lap counts from the next lap on; attempt reports are not "
            "counted). Compare with spec.checkpoint.maxRunBytes."
        ),
    )
    started_at: datetime | None = Field(default=None, description="When the first lap started.")
    completed_at: datetime | None = Field(default=None, description="When the run reached a terminal phase.")
    last_checkpoint_time: datetime | None = Field(default=None, description="When the last checkpoint was written.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Conditions of the run.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
