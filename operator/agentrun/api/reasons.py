"""Typed reasons: of conditions and Events, of lap retries, of lap outcomes.

They are ``StrEnum`` values, so ``reason == "LapRetry"`` and JSON serialisation keep working;
``decide()`` produces only these, and the metrics label sets are built from them
(``agentrun.metrics.core``), so a new reason cannot land in ``other`` unnoticed.
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """The condition types of an AgentRun, each with its own reason and message."""

    PROGRESSING = "Progressing"
    AWAITING_APPROVAL = "AwaitingApproval"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"


class Reason(StrEnum):
    """Reasons of the run's conditions and Events (CamelCase, Kubernetes API conventions)."""

    # progress of laps
    LAP_STARTING = "LapStarting"
    QUEUED = "Queued"  # the namespace is at an AgentRunPolicy's maxActiveRuns: the run waits (status.queue)
    ADMITTED = "Admitted"  # a queued run got a slot: it starts
    KUEUE_QUEUED = "KueueQueued"  # the lap Job is suspended until Kueue admits it (status.kueue)
    LAP_RUNNING = "LapRunning"
    LAP_CHECKPOINTED = "LapCheckpointed"
    LAP_RETRY = "LapRetry"
    VERSION_CHANGED = "VersionChanged"
    TOOLS_CHANGED = "ToolsChanged"  # a lap recorded a new version of the run's MCP tools (one Event per version)
    # the end of a run
    AGENT_DONE = "AgentDone"
    SUCCEEDED = "Succeeded"
    AGENT_FAILED = "AgentFailed"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    LAP_FAILED_PERMANENTLY = "LapFailedPermanently"
    BUDGET_EXCEEDED = "BudgetExceeded"
    CHECKPOINT_UNREADABLE = "CheckpointUnreadable"
    CHECKPOINT_TOO_LARGE = "CheckpointTooLarge"
    INVALID_SPEC = "InvalidSpec"
    POLICY_VIOLATION = "PolicyViolation"  # agentrun.api.tenancy.CONDITION_REASON
    INVALID_CONFIGURATION = "InvalidConfiguration"
    TTL_EXPIRED = "TTLExpired"
    CANCELLED = "Cancelled"  # spec.cancel (agentrun.api.lifecycle)
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # spec.activeDeadline
    # retries in place (annotation agentrun.dev/retry)
    RETRIED = "Retried"
    RETRY_REFUSED = "RetryRefused"
    # runs of an Agent (spec.agentRef; agentrun.api.agent)
    AGENT_NOT_FOUND = "AgentNotFound"
    AGENT_INVALID = "AgentInvalid"
    INVALID_PARAMETERS = "InvalidParameters"
    AGENT_PINNED = "AgentPinned"
    AGENT_ROLLED_OUT = "AgentRolledOut"
    PINNED_AGENT_UNREADABLE = "PinnedAgentUnreadable"
    # the store
    STORE_PINNED = "StorePinned"
    STORE_UNAVAILABLE = "StoreUnavailable"
    STORE_UNSAFE = "StoreUnsafe"
    # forks
    FORKED = "Forked"
    FORK_SOURCE_UNAVAILABLE = "ForkSourceUnavailable"
    # approvals
    APPROVAL_REQUESTED = "ApprovalRequested"
    APPROVAL_DECIDED = "ApprovalDecided"
    APPROVAL_TIMED_OUT = "ApprovalTimedOut"
    APPROVAL_INVALID = "ApprovalInvalid"
    APPROVAL_BINDING_MISMATCH = "ApprovalBindingMismatch"
    APPROVAL_IGNORED = "ApprovalIgnored"
    APPROVAL_REASON_ESCAPED = "ApprovalReasonEscaped"
    APPROVAL_STALE = "ApprovalStale"
    APPROVAL_RECORDED = "ApprovalRecorded"  # one of N approvals (spec.approval.approvers)
    APPROVAL_DUPLICATE_APPROVER = "ApprovalDuplicateApprover"
    APPROVAL_CREATOR_REFUSED = "ApprovalCreatorRefused"
    APPROVAL_WITHDRAWN = "ApprovalWithdrawn"  # the run was cancelled or ran out of time while it waited
    # suspension
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    # Jobs and pods
    JOB_MISMATCH = "JobMismatch"
    JOB_REFUSED = "JobRefused"
    SECRET_MISSING = "SecretMissing"
    LAP_POD_CONFIG_ERROR = "LapPodConfigError"
    # the shell's own
    CHECKPOINT_DELETE_FAILED = "CheckpointDeleteFailed"
    STATUS_UPDATE_REFUSED = "StatusUpdateRefused"
    # the operator's admission policies (controller/policycheck.py): no lap starts until they are in place
    ADMISSION_POLICIES_MISSING = "AdmissionPoliciesMissing"
    ADMISSION_POLICIES_OUTDATED = "AdmissionPoliciesOutdated"
    ADMISSION_POLICIES_UNKNOWN = "AdmissionPoliciesUnknown"
    # the reasons of a condition that is not the phase's own (Kubernetes: every condition has a reason)
    NOT_PROGRESSING = "NotProgressing"
    NO_APPROVAL_PENDING = "NoApprovalPending"
    APPROVAL_APPROVED = "ApprovalApproved"
    APPROVAL_REJECTED = "ApprovalRejected"
    NOT_SUSPENDED = "NotSuspended"
    NOT_COMPLETE = "NotComplete"
    NOT_FAILED = "NotFailed"


class ScheduleReason(StrEnum):
    """Reasons of an AgentSchedule's Ready condition and of its Events (agentrun.schedule)."""

    # the Ready condition
    SCHEDULING = "Scheduling"  # True: runs are started at the scheduled times
    SUSPENDED = "Suspended"  # spec.suspend
    INVALID_SCHEDULE = "InvalidSchedule"  # cron refuses spec.schedule (the API server checks its shape only)
    INVALID_TIME_ZONE = "InvalidTimeZone"  # spec.timeZone is not in the zone database
    INVALID_SPEC = "InvalidSpec"  # the spec does not parse (a CRD older than the operator)
    RUN_REFUSED = "RunRefused"  # the API server refused to create the run (an admission policy, a quota)
    # Events
    RUN_CREATED = "RunCreated"
    RUN_REPLACED = "RunReplaced"  # concurrencyPolicy Replace cancelled an active run
    RUN_DELETED = "RunDeleted"  # history limits
    RUN_ALREADY_ACTIVE = "RunAlreadyActive"  # concurrencyPolicy Forbid skipped a time
    STARTING_DEADLINE_EXCEEDED = "StartingDeadlineExceeded"  # a missed time past startingDeadlineSeconds
    TOO_MANY_MISSED_TIMES = "TooManyMissedTimes"  # more than 100 times missed (only the latest is started)


#: Event reasons of the lap cadence (one per lap): rate-limited per run before they are posted, as
#: client-go's spam filter does (``agentrun.controller.events``); counted when suppressed
#: (``agentrun_events_suppressed_total{reason}``). Every other Event is always posted.
ROUTINE_EVENT_REASONS: frozenset[str] = frozenset({Reason.LAP_CHECKPOINTED})


class RetryReason(StrEnum):
    """Why a lap attempt failed: the ``reason`` label of ``agentrun_lap_retries_total`` and the head
    of ``status.retries[].lastReason``."""

    RETRYABLE_EXIT = "retryable_exit"
    """The runner exited 75 (model/tool timeout, 5xx, store unavailable)."""
    TIMEOUT = "timeout"
    """The lap passed spec.lapTimeout and was killed (Job DeadlineExceeded)."""
    OOM_KILLED = "oom_killed"
    EVICTED = "evicted"
    """The pod was evicted, preempted, deleted or lost with its node."""
    POD_FAILED = "pod_failed"
    """Any other non-zero exit or signal."""
    JOB_MISSING = "job_missing"
    """The lap Job disappeared before a checkpoint was written."""
    CHECKPOINT_MISSING = "checkpoint_missing"
    """The Job ended as if it had checkpointed, but no checkpoint is in the store."""
    JOB_MISMATCH = "job_mismatch"
    """A Job found in the cluster carried another decision or store than the status: deleted."""
    PERMANENT = "permanent"
    """The runner exited 2: not retried, the run fails."""
    OTHER = "other"


class LapOutcome(StrEnum):
    """How a lap attempt ended: the ``outcome`` label of ``agentrun_lap_duration_seconds``."""

    CONTINUE = "continue"
    DONE = "done"
    AWAITING_APPROVAL = "awaiting_approval"
    FAILED = "failed"
    """Checkpointed with the agent's ``failed`` outcome."""
    ALREADY_CHECKPOINTED = "already_checkpointed"
    """Exit 3: another writer had checkpointed the lap."""
    RETRYABLE_ERROR = "retryable_error"
    """Ended without a checkpoint; the lap is retried (exit 75, signal, OOM, eviction, lost Job)."""
    PERMANENT_ERROR = "permanent_error"
    """Exit 2: the run fails."""
    TIMEOUT = "timeout"
    """Killed at spec.lapTimeout."""
    OTHER = "other"

    @classmethod
    def of_checkpoint(cls, outcome_type: str) -> LapOutcome:
        """The label of a checkpointed lap's outcome type (``awaiting-approval`` -> ``awaiting_approval``)."""
        try:
            return cls(outcome_type.replace("-", "_"))
        except ValueError:
            return cls.OTHER

    @classmethod
    def of_failure(cls, reason: RetryReason) -> LapOutcome:
        """The label of an attempt that ended without its checkpoint."""
        if reason is RetryReason.TIMEOUT:
            return cls.TIMEOUT
        if reason is RetryReason.PERMANENT:
            return cls.PERMANENT_ERROR
        return cls.RETRYABLE_ERROR
