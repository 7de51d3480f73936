"""What ``decide`` returns: frozen actions, performed in order by the shell, in a :class:`Decision`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, StoreLocation

from .jobs import ApprovalEnv

FINALIZER = "agentrun.dev/checkpoints"


@dataclass(frozen=True)
class CreateJob:
    lap: int
    attempt: int
    agent_version: str
    name: str
    approval: ApprovalEnv | None = None
    store: StoreLocation | None = None
    """The run's pinned store (status.store as observed), for the Job's environment."""
    queue_name: str | None = None
    """The Kueue LocalQueue the Job is submitted to (created suspended, labelled); None: no Kueue."""


@dataclass(frozen=True)
class DeleteJob:
    name: str
    grace_seconds: int | None = None
    """gracePeriodSeconds of the Job's DELETE (a cancel or a passed deadline); its pod then goes with
    its own terminationGracePeriodSeconds: SIGTERM, the lap finishes the journal write in flight.
    None: the API server's default."""


@dataclass(frozen=True)
class PatchStatus:
    status: AgentRunStatus
    best_effort: bool = False
    """Says why the run waits (``decide_after``, before a ``Backoff``): a refused or conflicting
    write of it is only logged, the Event beside it says the same."""


@dataclass(frozen=True)
class RemoveAnnotations:
    keys: tuple[str, ...]
    before_status: bool = False
    """Removed BEFORE the decision's status is written (a decision that is not recorded: stray,
    refused, stale), guarded by the run's resourceVersion; else after it (a recorded decision)."""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    lap: int | None = field(default=None, compare=False)
    """The lap the Event is about, for the log line (default: status.lap, the last checkpointed)."""
    attempt: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RequeueAfter:
    seconds: float


@dataclass(frozen=True)
class ReadCheckpoint:
    lap: int


@dataclass(frozen=True)
class ReadAttemptFailure:
    lap: int
    attempt: int


@dataclass(frozen=True)
class ForkCheckpoint:
    """Write the run's fork snapshot (the source's state through ``lap``) into the run's own store
    prefix, conditionally (idempotent), and read it back: the shell adds a ``ForkRead``."""

    source_name: str
    source_uid: str
    lap: int


@dataclass(frozen=True)
class ReadRewind:
    """Survey a rewind in place to lap ``from_lap`` of a run that stands at lap ``through_lap``: the
    state through ``from_lap`` and every tool call sent after it (the lap records up to
    ``through_lap`` and the journal of the unfinished lap after it): the shell adds a ``RewindRead``."""

    from_lap: int
    through_lap: int


@dataclass(frozen=True)
class ProbeStore:
    """Probe the run's store for conditional writes (once per endpoint and bucket per process):
    the shell adds a ``StoreProbeRead``."""


@dataclass(frozen=True)
class StoreAgent:
    """Write the run's resolved Agent copy content-addressed into its store prefix
    (``agents/<digest>.json``, create-only: idempotent) before status.agent names it: the shell
    adds a ``PinnedAgentRead`` of it."""

    resolved: Any
    """The :class:`~agentrun.api.agent.ResolvedAgent`."""
    digest: str


@dataclass(frozen=True)
class DeleteRun:
    """Delete the AgentRun itself (spec.ttlSecondsAfterFinished passed), with a precondition on
    its uid. Its checkpoints then go or stay by spec.checkpoint.retention (the finalizer)."""

    ttl_seconds: int


@dataclass(frozen=True)
class AddFinalizer:
    name: str = FINALIZER


@dataclass(frozen=True)
class RemoveFinalizer:
    name: str = FINALIZER


@dataclass(frozen=True)
class DeleteCheckpoints:
    """Delete the run's objects from the store (retention Delete), then remove the finalizer."""


@dataclass(frozen=True)
class LapFinished:
    """Metric: a lap attempt ended, with its checkpoint or without (an error outcome)."""

    lap: int
    outcome: str
    """A :class:`~agentrun.api.reasons.LapOutcome` (the ``outcome`` label)."""
    duration_seconds: float
    checkpoint_bytes: int | None = None  # stored bytes the lap added (None: not known)


@dataclass(frozen=True)
class LostLapSpan:
    """The ``lap`` span of a failed attempt that did not send its own (killed, its pod gone): the
    operator sends it (``controller/tracing.py``, span id ``api.contract.lap_span_id``)."""

    attempt: int
    started_at: datetime
    ended_at: datetime
    """When the failure was observed (the pod's end is not at hand)."""
    message: str
    """``status.retries[].lastReason`` (bounded, secrets redacted)."""


@dataclass(frozen=True)
class LapRetried:
    """Metric: a lap attempt failed and will be retried (or exhausted the attempts, or failed permanently)."""

    lap: int
    reason: str
    """A :class:`~agentrun.api.reasons.RetryReason` (the ``reason`` label)."""
    lost_span: LostLapSpan | None = None
    """Tracing on and the attempt did not send its ``lap`` span: the operator sends it."""


@dataclass(frozen=True)
class Backoff:
    """Stop here: the run is retried with its rate-limited backoff (``decide_after``: a refused
    write, the store away). The shell remembers ``streak`` as the run's refusal streak
    (:attr:`Observed.refusal`) until a reconcile succeeds: one Event per streak."""

    streak: str
    reason: str
    message: str


Action = (
    CreateJob | DeleteJob | PatchStatus | RemoveAnnotations | Event | RequeueAfter | ReadCheckpoint
    | ReadAttemptFailure | ReadRewind | ForkCheckpoint | AddFinalizer | RemoveFinalizer | DeleteCheckpoints | LapFinished | LapRetried
    | ProbeStore | DeleteRun | Backoff | StoreAgent
)


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    spec: AgentRunSpec | None = None
    """The effective spec ``decide`` acted on when it is not ``Observed.spec``: a run of an Agent,
    resolved against its pinned copy (the shell builds the lap Job from it)."""

    def of(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]

    @property
    def status(self) -> AgentRunStatus | None:
        patches = self.of(PatchStatus)
        return patches[-1].status if patches else None

    @property
    def requeue_after(self) -> float | None:
        delays = [a.seconds for a in self.of(RequeueAfter)]
        return min(delays) if delays else None

    def writes(self) -> list[PatchStatus | RemoveAnnotations]:
        """The writes of the run object, in the order the shell performs them: annotations that must
        go before the status (``before_status``), the status (the last patch), then the rest. A
        decision's order is a property of the Decision, not of the shell."""
        first = [a for a in self.of(RemoveAnnotations) if a.before_status]
        status = self.of(PatchStatus)[-1:]
        rest = [a for a in self.of(RemoveAnnotations) if not a.before_status]
        return [*first, *status, *rest]

    @property
    def needs_read(self) -> bool:
        return bool(self.of(ReadCheckpoint) or self.of(ReadAttemptFailure) or self.of(ForkCheckpoint)
                    or self.of(ProbeStore) or self.of(StoreAgent) or self.of(ReadRewind))
