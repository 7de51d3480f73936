"""The AgentRun status: what the operator observed and decided. Written only through the
status subresource. Everything needed to continue a run is here or in the checkpoint store, so
an operator restart resumes every run from it; nothing is kept in memory.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from .approval import (
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    MAX_APPROVERS,
    MAX_CALL_ID_CHARS,
    MAX_DECIDED_BY_CHARS,
    MAX_IMAGE_CHARS,
    MAX_REASON_CHARS,
    MAX_TARGET_URL_CHARS,
    SHA256_HEX_CHARS,
)
from .contract import MAX_REWINDS
from .types import USD, APIModel

Phase = Literal[
    "Pending",  # accepted, no lap started yet; or the lap pod cannot start (condition SecretMissing)
    "Queued",  # an AgentRunPolicy's maxActiveRuns holds it (status.queue), or Kueue holds its lap Job (status.kueue)
    "Running",  # a lap Job is running (or about to be created)
    "Retrying",  # the last attempt failed; waiting for the backoff before the next attempt
    "AwaitingApproval",  # waiting for a human decision; no Job, no process
    "Suspended",  # spec.suspend is true; no Job between laps
    "Succeeded",  # the agent finished (terminal)
    "Failed",  # a permanent error (terminal)
    "BudgetExceeded",  # the next lap would pass maxLaps or maxCostUSD (terminal)
    "Cancelled",  # spec.cancel is set (terminal; a retry continues it)
    "DeadlineExceeded",  # spec.activeDeadline passed since status.startedAt (terminal)
]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "BudgetExceeded", "Cancelled", "DeadlineExceeded"})


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


class NotifiedStatus(APIModel):
    """What the operator's notifier has announced about the current approval (operator/agentrun/notify):
    each kind of message once per call, across operator restarts."""

    call_id: str = Field(max_length=MAX_CALL_ID_CHARS, description="The call the announcements are about.")
    requested_at: datetime | None = Field(
        default=None, description='When the "approval requested" message was delivered to the webhook.'
    )
    deadline_near_at: datetime | None = Field(
        default=None, description='When the "deadline near" message was delivered to the webhook.'
    )
    target_sha256: str | None = Field(
        default=None, max_length=SHA256_HEX_CHARS,
        description="The target the announcements are about (a request asked again for a new target is announced again).",
    )


class ApprovalTarget(APIModel):
    """Where the pending call goes, as a person is shown it (the digest targetSha256 binds all of it)."""

    method: str | None = Field(default=None, max_length=16, description="HTTP method of the tool's call.")
    url: str | None = Field(
        default=None, max_length=MAX_TARGET_URL_CHARS,
        description="URL of the tool's call, without user info (credentials), the query's values hidden.",
    )
    headers_secret: str | None = Field(
        default=None, max_length=253,
        description="Name of the Secret the call's extra headers come from (http.headersSecretRef), never a value.",
    )
    image: str | None = Field(
        default=None, max_length=MAX_IMAGE_CHARS, description="The lap image that sends the call."
    )


class ApprovalVote(APIModel):
    """One approver's approval of the pending call."""

    user: str = Field(max_length=MAX_DECIDED_BY_CHARS, description="Who approved (stamped by the API server).")
    at: datetime = Field(description="When the operator recorded the approval.")
    reason: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS, description="Reason given (control characters escaped)."
    )


class ApprovalStatus(APIModel):
    """A pending or decided human approval."""

    state: Literal["Pending", "Approved", "Rejected", "TimedOut", "Withdrawn"] = Field(
        description="State of the approval; Withdrawn: the run was cancelled (or ran out of time) while it waited.",
    )
    lap: int = Field(description="Lap that asked for the approval.")
    tool: str = Field(description="Tool whose call waits for the decision.")
    call_id: str = Field(description="Id of the pending call.")
    idempotency_key: str = Field(description="Idempotency key the call will carry when it runs.")
    arguments: str | None = Field(
        default=None, max_length=4096, description="Arguments of the call as JSON, truncated to 4 KiB."
    )
    arguments_sha256: str | None = Field(
        default=None,
        min_length=SHA256_HEX_CHARS,
        max_length=SHA256_HEX_CHARS,
        pattern=f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$",
        description=(
            "sha256 (hex) of the FULL arguments of the pending call (canonical JSON: sorted keys, no "
            "spaces, UTF-8), computed by the operator from the lap record, not from the 4 KiB cut above. "
            f"A decision may carry it in the annotation {ANN_ARGUMENTS_SHA256} (with "
            f"{ANN_CALL_ID}): a decision whose call id or digest differs from the pending call's "
            "is refused (Warning Event ApprovalBindingMismatch) and the run keeps waiting."
        ),
    )
    arguments_truncated: bool | None = Field(
        default=None,
        description="True when `arguments` was cut at 4 KiB; the full arguments are in the checkpoint store.",
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
    reason: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS,
        description="Reason given with the decision (control characters escaped).",
    )
    decided_by: str | None = Field(
        default=None, max_length=MAX_DECIDED_BY_CHARS,
        description=(
            "Who decided: the authenticated user the API server's admission policy stamped into the "
            f"decision (annotation {ANN_DECIDED_BY}, or this field on the status route)."
        ),
    )
    decided_at: datetime | None = Field(
        default=None,
        description=(
            "When the operator recorded the decision. The decision is in status before the lap Job "
            "that executes it is created (write-ahead)."
        ),
    )
    notified: NotifiedStatus | None = Field(
        default=None,
        description="Webhook notifications delivered for this approval (requested, deadline near); written by the operator.",
    )
    target: ApprovalTarget | None = Field(
        default=None,
        description="Where the call goes when approved: method, URL (no credentials), headers Secret name, lap image.",
    )
    target_sha256: str | None = Field(
        default=None,
        min_length=SHA256_HEX_CHARS,
        max_length=SHA256_HEX_CHARS,
        pattern=f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$",
        description=(
            "sha256 (hex) over everything that decides what the call does: the tool's definition (URL, "
            "method, headers Secret reference, timeout, result bound, parameters, sideEffects, "
            "requiresApproval), the lap image and argumentsSha256 (agentrun.api.approval.target_sha256). "
            "A decision is bound to it: when the spec changes it, the operator does not execute the call "
            "(Warning Event ApprovalStale naming what changed) and asks again, and the lap refuses to send "
            "a call whose current digest differs."
        ),
    )
    approvals_required: int | None = Field(
        default=None, ge=1, le=MAX_APPROVERS,
        description="Distinct approvers the call needs (spec.approval.approvers when it was requested).",
    )
    approved_by: list[ApprovalVote] = Field(
        default_factory=list,
        max_length=MAX_APPROVERS,
        description=(
            "The distinct approvers so far, in order; the approval is Approved when approvalsRequired of "
            "them approved. One rejection rejects."
        ),
    )


class StoreLocation(APIModel):
    """Where the run's checkpoints live: resolved from spec.checkpoint and the operator's defaults,
    fixed in status before the run's first Job, and used for the run's whole life (the lap Jobs'
    environment and the operator's own reads). Changing the operator's default store only affects
    new runs."""

    uri: str = Field(max_length=1024, description='Bucket and prefix, "s3://bucket/prefix".')
    endpoint: str | None = Field(
        default=None, max_length=2048,
        description="S3 endpoint URL (empty: AWS). Credentials in the URL are never recorded.",
    )
    region: str | None = Field(default=None, max_length=64, description="S3 region, when set.")
    path_style: bool = Field(default=False, description="Whether the store is addressed path-style.")


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


class OutcomeNotified(APIModel):
    """The outcome the operator's notifier announced (exactly once per outcome of the run)."""

    phase: str = Field(max_length=32, description="The terminal phase announced.")
    retries: int = Field(default=0, description="status.lifecycle.retries when it was announced (a retried run's next outcome is announced again).")
    at: datetime = Field(description="When the message was delivered to the webhook.")


class LifecycleStatus(APIModel):
    """Retries in place, the cancel and the outcome announcement of the run."""

    retries: int = Field(default=0, description="Retries in place so far (annotation agentrun.dev/retry).")
    last_retry_by: str | None = Field(
        default=None, max_length=MAX_DECIDED_BY_CHARS,
        description="Who requested the last retry (stamped by the API server: annotation agentrun.dev/retry-requested-by).",
    )
    last_retry_at: datetime | None = Field(default=None, description="When the operator applied the last retry.")
    last_retry_from_phase: str | None = Field(
        default=None, max_length=32, description="The terminal phase the last retry continued from.",
    )
    last_retry_from_lap: int | None = Field(
        default=None, description="The lap the last retry rewound to (annotation agentrun.dev/retry-from-lap), if any.",
    )
    retried_lap: int | None = Field(
        default=None, description="The lap the last retry started again (status.lap + 1 then).",
    )
    rewinds: list[int] = Field(
        default_factory=list, max_length=MAX_REWINDS,
        description=(
            "The lap each rewind in place went back to (agentrun retry --from-lap), in order. Rewind h starts "
            "history h of the run: the laps after it are stored under histories/<h>/ in the checkpoint store, "
            "and the abandoned laps of the earlier history are kept, never read. Empty: never rewound."
        ),
    )
    attempts_before_retry: int = Field(
        default=0,
        description=(
            "Attempts of retriedLap made before the last retry: attempt numbers go on from there (Job names "
            "stay distinct) while spec.retry.attemptsPerLap counts the attempts since the retry."
        ),
    )
    cancelled_by: str | None = Field(
        default=None, max_length=MAX_DECIDED_BY_CHARS,
        description="Who cancelled the run (annotation agentrun.dev/cancelled-by, stamped by the API server).",
    )
    cancel_reason: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS, description="spec.cancel.reason (control characters escaped).",
    )
    cancelled_at: datetime | None = Field(default=None, description="When the operator stopped the run for the cancel.")
    notified: OutcomeNotified | None = Field(
        default=None, description="The outcome announcement delivered (spec.notify.outcomes); written by the operator.",
    )


class PinnedAgent(APIModel):
    """The Agent definition a run of an Agent (spec.agentRef) runs: its resolved copy, stored
    content-addressed in the run's checkpoint prefix (agents/<digest>.json)."""

    name: str = Field(max_length=253, description="Name of the Agent.")
    version: str = Field(max_length=63, description="spec.version of the Agent when it was resolved.")
    digest: str = Field(
        min_length=SHA256_HEX_CHARS, max_length=SHA256_HEX_CHARS, pattern=f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$",
        description="sha256 (hex) of the resolved copy (the agent, rendered task, parameters and policies).",
    )
    uid: str | None = Field(
        default=None, max_length=128,
        description="metadata.uid of the Agent it was resolved from (a FollowLatest run follows only this object).",
    )
    pinned_at: datetime | None = Field(default=None, description="When the operator recorded it.")


class QueueStatus(APIModel):
    """Where a run that has not started waits: its namespace (or its Agent's or model's runs) is at an
    AgentRunPolicy's limit."""

    position: int = Field(ge=1, description="Place in the namespace's queue (1: admitted at the next free slot).")
    active: int = Field(ge=0, description="Active runs of the namespace (started, not finished) when last looked at.")
    limit: int = Field(ge=1, description="The limit in force (the lowest of the policies that set one).")
    policy: str = Field(max_length=253, description="The AgentRunPolicy whose limit that is.")
    scope: str = Field(
        default="namespace", max_length=300,
        description="Which limit the run waits for: namespace (maxActiveRuns), Agent NAME (maxActiveRunsPerAgent) "
        "or model NAME (maxActiveRunsPerModel). Position, active and limit count that scope's runs.",
    )


class KueueStatus(APIModel):
    """Of a run whose lap Job waits for Kueue to admit it (spec.queueName; docs/scheduling.md#kueue)."""

    local_queue: str | None = Field(
        default=None, max_length=63,
        description="The LocalQueue the Job was submitted to (its kueue.x-k8s.io/queue-name label); unset for a Job "
        "suspended without one.",
    )
    job: str = Field(max_length=63, description="The suspended lap Job.")
    workload: str | None = Field(
        default=None, max_length=253,
        description="The Workload Kueue made of the Job (kubectl describe workload NAME says why it waits); unset "
        "until Kueue made it, or when the operator cannot read Workloads.",
    )
    since: datetime = Field(description="When the operator first saw the Job held.")


class AgentRunStatus(APIModel):
    """Observed state of an AgentRun."""

    phase: Phase = Field(
        default="Pending",
        description=(
            "Summary of the run's state, for humans: Pending (no lap started yet, or the lap pod cannot start, "
            "e.g. a missing Secret: see conditions), Queued (not started: an AgentRunPolicy's maxActiveRuns is "
            "reached in its namespace, status.queue; or its lap Job waits for Kueue to admit it, status.kueue), "
            "Running, Retrying (backoff before the next attempt), "
            "AwaitingApproval, Suspended, and the terminal Succeeded, Failed, BudgetExceeded, Cancelled "
            "(spec.cancel) and DeadlineExceeded (spec.activeDeadline). A retry in place (annotation "
            "agentrun.dev/retry) continues a Failed, BudgetExceeded, Cancelled or DeadlineExceeded run."
        ),
    )
    message: str | None = Field(default=None, max_length=4096, description="Details of the phase.")
    observed_generation: int | None = Field(default=None, description="The metadata.generation last acted on.")
    lap: int = Field(default=0, description="Last checkpointed lap (0: none yet).")
    queue: QueueStatus | None = Field(
        default=None,
        description="Of a Queued run: its place in its namespace's queue (admitted by spec.priority, then creation "
        "order; docs/scheduling.md#concurrency-limits).",
    )
    kueue: KueueStatus | None = Field(
        default=None,
        description="Of a run whose lap Job Kueue holds (suspended until admitted): the Job, its LocalQueue and Workload.",
    )
    agent_version: str | None = Field(default=None, description="Agent version that wrote the last checkpoint.")
    agent: PinnedAgent | None = Field(
        default=None,
        description=(
            "Of a run of an Agent (spec.agentRef): the definition it runs, pinned at its first lap (a "
            "rollout: FollowLatest Agent's edits move it at a lap boundary)."
        ),
    )
    checkpoint: CheckpointRef | None = Field(default=None, description="The latest lap checkpoint.")
    store: StoreLocation | None = Field(
        default=None,
        description=(
            "The checkpoint store of this run, pinned before its first Job and used for its whole life "
            "(a run from an earlier release is pinned from status.checkpoint)."
        ),
    )
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
    lifecycle: LifecycleStatus | None = Field(
        default=None, description="Retries in place, the cancel and the outcome announcement of the run.",
    )
    trace_id: str | None = Field(
        default=None, max_length=32, pattern=r"^[0-9a-f]{32}$",
        description="The OpenTelemetry trace of the run (its uid's 128 bits): every lap, retry and approval wait "
        "of the run is a span in it. Set while the operator's tracing is on (the chart's tracing values; "
        "docs/observability.md#traces).",
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
