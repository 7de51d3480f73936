"""What ``decide`` is given: the run as the shell observed it (:class:`Observed`), and the results
of the reads it asked for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agentrun.api.agent import AgentProblem, ResolvedAgent
from agentrun.api.spec import AgentRunManifestSpec, AgentRunSpec
from agentrun.api.status import AgentRunStatus, StoreLocation
from agentrun.api.tenancy import PolicyCheck
from agentrun.checkpoint.schema import LapRecord, RunState, Totals

JobState = Literal["active", "succeeded", "failed"]


@dataclass(frozen=True)
class ObservedJob:
    """A lap Job of the run, as seen in the cluster (with its pod's exit, when finished)."""

    name: str
    lap: int
    attempt: int
    state: JobState
    exit_code: int | None = None
    reason: str | None = None  # DeadlineExceeded, Evicted, OOMKilled, BackoffLimitExceeded, ...
    message: str | None = None
    agent_version: str | None = None
    started_at: datetime | None = None
    waiting_reason: str | None = None
    """Of an active Job: why its pod's container is not running yet (CreateContainerConfigError, ...)."""
    waiting_message: str | None = None
    waiting_since: datetime | None = None
    """Since when the pod exists without running (its creationTimestamp)."""
    approval: str | None = None
    """The Job's ``agentrun.dev/approval`` annotation (the decision it executes); None when the Job
    has none (created by an earlier release)."""
    store: StoreLocation | None = None
    """The store the Job was given (its environment), when known."""
    suspended: bool = False
    """The Job's spec.suspend is true (created so for Kueue; unset when Kueue admits it)."""
    queue_name: str | None = None
    """The Job's Kueue LocalQueue (label kueue.x-k8s.io/queue-name), when it has one."""
    uid: str | None = None
    """The Job's metadata.uid (Kueue labels the Workload it makes with it)."""
    termination_message: str | None = None
    """Of a finished Job: its newest pod's container termination message, raw (with
    ``terminationMessagePolicy: FallbackToLogsOnError``, the tail of the lap's log). ``decide``
    takes the cause of a failed attempt from it (:func:`lap_cause`: the runner's ``error`` of its
    last "lap failed" line, else the last line; bounded, secrets redacted) when ``message`` is None.
    None: not read (an active Job, or a Job that is not the run's current attempt)."""


@dataclass(frozen=True)
class CheckpointRead:
    """Result of reading ``laps/<lap>.json``."""

    lap: int
    kind: Literal["ok", "missing", "unavailable", "unreadable"]
    record: LapRecord | None = None
    key: str | None = None
    uri: str | None = None
    sha256: str | None = None
    written_at: datetime | None = None
    error: str | None = None
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    size: int | None = None  # stored bytes of the lap object


@dataclass(frozen=True)
class ForkRead:
    """Result of writing (or finding) the run's fork snapshot from ``spec.forkFrom``."""

    lap: int
    kind: Literal["ok", "missing", "unavailable", "unreadable"]
    state: RunState | None = None
    key: str | None = None
    uri: str | None = None
    sha256: str | None = None
    written_at: datetime | None = None
    error: str | None = None
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None


@dataclass(frozen=True)
class StoreProbeRead:
    """The verdict of the store's conditional-write probe (``checkpoint/probe.py``, cached per
    endpoint and bucket by the shell): does it honour ``If-None-Match: *``?"""

    kind: Literal["ok", "unsafe", "unavailable", "invalid"]
    """invalid: no store is configured, or its configuration cannot be used (``detail`` says why)."""
    endpoint: str = ""
    """Redacted endpoint URL, or "AWS S3"."""
    bucket: str = ""
    detail: str | None = None


@dataclass(frozen=True)
class SentCall:
    """A tool call sent after the rewind point (a lap record's, or the unfinished lap's journal)."""

    lap: int
    call_id: str
    tool: str
    unconfirmed: bool = False
    """The unfinished lap's journaled model response asked for it but no result was journaled: it
    may have been sent (the lap stopped between sending it and journaling the answer)."""


@dataclass(frozen=True)
class RewindRead:
    """What the shell found for ``ReadRewind``: the state through ``from_lap`` (``point``: the
    record or fork snapshot object of that lap, None for lap 0; ``totals`` and ``outcome`` of the
    state through it) and every tool call sent after it, in order."""

    from_lap: int
    through_lap: int
    kind: Literal["ok", "missing", "unavailable", "unreadable"]
    point: CheckpointRead | None = None
    agent_version: str | None = None
    totals: Totals | None = None
    outcome: str | None = None
    """The outcome type of lap ``from_lap`` (continue, awaiting-approval, ...); None for lap 0."""
    calls: tuple[SentCall, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class AttemptFailureRead:
    """Result of reading ``attempts/<lap>-<attempt>.json`` (best effort: may be None)."""

    lap: int
    attempt: int
    report: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class AdmissionProblem:
    """The operator's admission policies are not in place (``controller/policycheck.py``, checked by
    the shell at start and every resync, never per reconcile): ``reason`` is
    ``AdmissionPoliciesMissing``, ``AdmissionPoliciesOutdated`` or ``AdmissionPoliciesUnknown``,
    ``message`` names the policies and bindings. While it stands no lap starts."""

    reason: str
    message: str


@dataclass(frozen=True)
class PinnedAgentRead:
    """The run's pinned Agent copy (``status.agent.digest``), as the shell read it from the store (or
    from its memory of that digest), or just wrote it (``StoreAgent``)."""

    digest: str
    kind: Literal["ok", "unavailable", "unreadable"]
    resolved: ResolvedAgent | None = None
    error: str | None = None


@dataclass(frozen=True)
class WorkloadRead:
    """The Workload Kueue made of a held lap Job (``controller/kueueview.py``): ``missing`` while
    Kueue has not made it, ``unavailable`` when it cannot be read (Kueue not installed, no RBAC)."""

    job: str
    kind: Literal["ok", "missing", "unavailable"]
    name: str | None = None
    message: str | None = None
    """Kueue's reason for the wait (the Workload's QuotaReserved condition), raw: decide bounds it;
    or, when ``unavailable``, why."""


@dataclass(frozen=True)
class QueueSlot:
    """A run that has not started, in a namespace an AgentRunPolicy limits (``maxActiveRuns``), as
    the shell placed it from its watch cache (``decide/queue.py``): ``admitted`` when the active runs
    plus the waiting ones before it (and itself) fit the limit."""

    position: int
    """1-based place among the namespace's waiting runs (by spec.priority, then creation)."""
    active: int
    """Runs of the namespace that hold a slot (started, not finished)."""
    limit: int
    policy: str
    scope: str = "namespace"
    """Which limit: ``namespace`` (maxActiveRuns), ``Agent NAME`` or ``model NAME``."""

    @property
    def admitted(self) -> bool:
        return self.active + self.position <= self.limit


@dataclass(frozen=True)
class Observed:
    namespace: str
    name: str
    uid: str
    generation: int
    spec: AgentRunSpec | None
    status: AgentRunStatus
    now: datetime
    annotations: Mapping[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    spec_error: str | None = None
    jobs: tuple[ObservedJob, ...] = ()
    checkpoint: CheckpointRead | None = None
    attempt_failure: AttemptFailureRead | None = None
    rewind: RewindRead | None = None
    fork: ForkRead | None = None
    store_probe: StoreProbeRead | None = None
    """The store probe's verdict; None: not probed yet (decide asks with ``ProbeStore``)."""
    pod_config_grace_seconds: float = 30.0
    """AGENTRUN_POD_CONFIG_GRACE_SECONDS: how long a lap pod may wait on a config error before the
    run says so (condition + Warning Event)."""
    resolved_store: StoreLocation | None = None
    """The store a new run would use now (spec.checkpoint, else the operator's defaults): pinned
    into status.store before the run's first Job, never used after that."""
    store_error: str | None = None
    """Why there is no ``resolved_store`` (no URI anywhere)."""
    store_retry_seconds: float = 10.0
    """AGENTRUN_STORE_RETRY_SECONDS: how soon a run whose store is unavailable is looked at again."""
    lap_image: str = ""
    """AGENTRUN_LAP_IMAGE: the lap image of a run without spec.agent.image (part of an approval's
    target digest: the effective image)."""
    policy_check: PolicyCheck | None = None
    """The tenancy re-check of the stored spec against the AgentRunPolicies of its namespace
    (controller/tenancy.py), read by the shell for a live run; None: not read or not enforced
    (the operator may not read the policies)."""
    admission: AdmissionProblem | None = None
    """The operator's admission policies are missing or not the version its code expects (the
    shell's check, ``controller/policycheck.py``); None: in place (or allowed to be missing). While
    set, decide starts no lap Job and takes no approval decision."""
    request: AgentRunManifestSpec | None = None
    """A run of an Agent (``spec.agentRef``): its spec as written (``spec`` is None until ``decide``
    resolved it against the pinned copy: ``decide/agents.py``)."""
    agent_current: ResolvedAgent | AgentProblem | None = None
    """Of a run of an Agent: its Agent as the watch cache holds it now, resolved with the run's
    parameters by the shell (``agentrun.api.agent.resolve``), or why it cannot be."""
    agent_pinned: PinnedAgentRead | None = None
    """Of a run of an Agent: the copy ``status.agent.digest`` names (read by the shell)."""
    tracing: bool = False
    """The operator passes an OTLP endpoint to lap Jobs (its tracing is on): the run records its
    trace id (``status.traceId``)."""
    default_queue_name: str | None = None
    """The Kueue LocalQueue of the namespace's AgentRunPolicy (``defaultQueueName``), for a run
    without spec.queueName; None: none."""
    workload: WorkloadRead | None = None
    """Of a run whose active Job Kueue holds: its Workload as the shell read it; None: not read."""
    queue: QueueSlot | None = None
    """Of a run that has not started, where an AgentRunPolicy limits its namespace's active runs: its
    place (``decide/queue.py``); None: no limit applies, or the run holds a slot."""
    refusal: str | None = None
    """The run's refusal streak, as the shell remembers it (the last ``Backoff.streak``, until a
    reconcile succeeds): ``decide_after`` posts one Event per streak."""
