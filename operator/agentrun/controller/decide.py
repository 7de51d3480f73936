"""The reconcile decision, pure: ``decide(observed) -> Decision``.

Everything the operator knows about a run is passed in (:class:`Observed`: the spec, the status,
annotations, the lap Jobs seen, the result of a checkpoint read, the time); everything it does is
returned as a list of actions. The I/O shell (``handlers.py``) performs them in order. When the
decision needs data first (``ReadCheckpoint`` / ``ReadAttemptFailure``), that is the ONLY action
returned: the shell reads, adds the result to ``Observed`` and calls ``decide`` again.

Invariants (tested with hypothesis in tests/controller):
* at most one ``CreateJob`` per decision, never for a lap attempt whose Job exists or is in
  ``status.activeJob``; applying the decision's status and calling ``decide`` again creates nothing;
* no Job while AwaitingApproval (undecided), Suspended, or terminal;
* no first lap (nor fork snapshot) before the store probe said the store honours conditional
  writes (``ProbeStore``); a finished run is deleted (``DeleteRun``) only past its ttl;
* attempts of a lap never exceed ``spec.retry.attemptsPerLap``;
* terminal phases do nothing (except removing a stray approval annotation and a leftover Job);
* write-ahead: a ``CreateJob`` happens only when the OBSERVED status (what the API server stored)
  already holds what the Job executes: the pinned store (``status.store``) and, for a lap that
  resumes after an approval, the decision (``status.approval`` Approved/Rejected/TimedOut). The
  decision that first records either returns the status change alone (and ``RequeueAfter(0)``);
  the Job follows on the next pass, so the status never shows a call pending once a Job resolving
  it exists;
* a decision (annotations) bound to another call (``agentrun.dev/call-id``,
  ``agentrun.dev/arguments-sha256``) or with a malformed field is refused: one Warning Event, the
  annotations removed, the run keeps waiting. Every value copied from annotations is bounded first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_REASON,
    ANN_REASON_SHORT,
    DECISION_ANNOTATIONS,
    MAX_CALL_ID_CHARS,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    SHA256_HEX_CHARS,
    arguments_sha256,
)
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import (
    TERMINAL_PHASES,
    ActiveJob,
    AgentRunStatus,
    ApprovalStatus,
    CheckpointRef,
    Condition,
    CostStatus,
    LapRetries,
    StorageStatus,
    StoreLocation,
)
from agentrun.api.types import format_usd, parse_duration
from agentrun.checkpoint.schema import LapRecord, Outcome, PendingApproval, RunState
from agentrun.lap.keys import CALL_ID_PATTERN

from .jobs import ApprovalEnv, approval_annotation, job_name

FINALIZER = "agentrun.dev/checkpoints"
MAX_RETRY_ENTRIES = 20
CONDITION_TYPES = ("Progressing", "AwaitingApproval", "Suspended", "Complete", "Failed")

JobState = Literal["active", "succeeded", "failed"]


# ----------------------------------------------------------------------------- observations


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
class AttemptFailureRead:
    """Result of reading ``attempts/<lap>-<attempt>.json`` (best effort: may be None)."""

    lap: int
    attempt: int
    report: Mapping[str, Any] | None = None


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


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class CreateJob:
    lap: int
    attempt: int
    agent_version: str
    name: str
    approval: ApprovalEnv | None = None
    store: StoreLocation | None = None
    """The run's pinned store (status.store as observed), for the Job's environment."""


@dataclass(frozen=True)
class DeleteJob:
    name: str


@dataclass(frozen=True)
class PatchStatus:
    status: AgentRunStatus


@dataclass(frozen=True)
class RemoveAnnotations:
    keys: tuple[str, ...]


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
class ProbeStore:
    """Probe the run's store for conditional writes (once per endpoint and bucket per process):
    the shell adds a ``StoreProbeRead``."""


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
    """Metric: a lap ended with an outcome."""

    lap: int
    outcome: str
    duration_seconds: float
    checkpoint_bytes: int | None = None  # stored bytes the lap added (None: not known)


@dataclass(frozen=True)
class LapRetried:
    """Metric: a lap attempt failed and will be retried (or exhausted the attempts)."""

    lap: int
    reason: str


Action = (
    CreateJob | DeleteJob | PatchStatus | RemoveAnnotations | Event | RequeueAfter | ReadCheckpoint
    | ReadAttemptFailure | ForkCheckpoint | AddFinalizer | RemoveFinalizer | DeleteCheckpoints | LapFinished | LapRetried
    | ProbeStore | DeleteRun
)


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)

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

    @property
    def needs_read(self) -> bool:
        return bool(self.of(ReadCheckpoint) or self.of(ReadAttemptFailure) or self.of(ForkCheckpoint)
                    or self.of(ProbeStore))


# ----------------------------------------------------------------------------- helpers


def next_lap_attempt(status: AgentRunStatus) -> tuple[int, int]:
    """The lap and attempt the next Job would run."""
    lap = status.lap + 1
    entry = next((r for r in status.retries if r.lap == lap), None)
    return lap, (entry.retries if entry else 0) + 1


def backoff_seconds(spec: AgentRunSpec, failed_attempt: int) -> float:
    """Delay after the ``failed_attempt``-th failed attempt: initial * factor^(n-1), capped."""
    b = spec.retry.backoff
    delay = parse_duration(b.initial) * (b.factor ** max(0, failed_attempt - 1))
    return min(delay, parse_duration(b.max))


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------- bounds of user input

# C0 and C1 controls, DEL, line/paragraph separators and the bidirectional overrides (which make a
# terminal show text in another order than it is stored).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHA256 = re.compile(f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> tuple[str, int]:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``, ``\\u202e``),
    and how many there were: safe for status, Events, logs and terminals."""

    def esc(m: re.Match[str]) -> str:
        ch = m.group()
        if ch in _NAMED_ESCAPES:
            return _NAMED_ESCAPES[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _CONTROL.subn(esc, text)


def shown(value: str, limit: int = 64) -> str:
    """A user-supplied value quoted for a message: control characters escaped, cut at ``limit``."""
    return '"' + _truncate(escape_controls(value)[0], limit) + '"'


def bounded_reason(text: str | None) -> tuple[str | None, int]:
    """A reason as status may hold it (control characters escaped, at most MAX_REASON_CHARS), and
    how many control characters were escaped."""
    if not text:
        return None, 0
    escaped, n = escape_controls(text)
    return _truncate(escaped, MAX_REASON_CHARS), n


def bounded_decider(text: str | None) -> str | None:
    """``decidedBy`` as status may hold it."""
    if not text:
        return None
    return _truncate(escape_controls(text)[0], MAX_DECIDED_BY_CHARS)


# ----------------------------------------------------------------------------- the pinned store

_STORE_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")


def store_uri_of_checkpoint(object_uri: str, namespace: str, name: str, uid: str) -> str | None:
    """``s3://bucket/prefix`` of a run from the full URI of one of its objects
    (``s3://bucket/prefix/<namespace>/<name>/<uid>/laps/...``), or None."""
    i = object_uri.find(f"/{namespace}/{name}/{uid}/")
    base = object_uri[:i] if i > 0 else ""
    return base if _STORE_URI.match(base) else None


def pinned_store(status: AgentRunStatus, namespace: str, name: str, uid: str,
                 jobs: tuple[ObservedJob, ...] = (), resolved: StoreLocation | None = None) -> StoreLocation | None:
    """The store a run already uses: ``status.store``; for a run started by an earlier release
    (no status.store), the location of its last checkpoint (status.checkpoint: uri, endpoint,
    region, pathStyle), else the store its active Job was given. Never the operator's current
    default for a run that has written anything; None for a run that has not started."""
    if status.store is not None:
        return status.store
    job_store = None
    if status.active_job is not None:
        job_store = next((j.store for j in jobs if j.name == status.active_job.name and j.store), None)
    cp = status.checkpoint
    base = store_uri_of_checkpoint(cp.uri, namespace, name, uid) if cp is not None and cp.uri else None
    if base is not None:
        assert cp is not None
        if cp.path_style is not None:  # the release that wrote it recorded where the store is
            return StoreLocation(uri=base, endpoint=cp.endpoint, region=cp.region, path_style=cp.path_style)
        where = job_store or resolved
        return StoreLocation(uri=base, endpoint=where.endpoint if where else None,
                             region=where.region if where else None, path_style=bool(where and where.path_style))
    return job_store


class _Ctx:
    def __init__(self, o: Observed) -> None:
        self.o = o
        self.st = o.status.model_copy(deep=True)
        self.actions: list[Action] = []

    def act(self, a: Action) -> None:
        self.actions.append(a)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str,
              lap: int | None = None, attempt: int | None = None) -> None:
        self.actions.append(Event(type_, reason, _truncate(message, 1024), lap, attempt))

    def phase(self, phase: str, reason: str, message: str) -> None:
        st, now = self.st, self.o.now
        st.phase = phase  # type: ignore[assignment]
        st.message = _truncate(message, 4096)
        truth = {
            "Progressing": phase in ("Pending", "Running", "Retrying"),
            "AwaitingApproval": phase == "AwaitingApproval",
            "Suspended": phase == "Suspended",
            "Complete": phase == "Succeeded",
            "Failed": phase in ("Failed", "BudgetExceeded"),
        }
        by_type = {c.type: c for c in st.conditions}
        conds = []
        for ctype in CONDITION_TYPES:
            value = "True" if truth[ctype] else "False"
            old = by_type.get(ctype)
            changed = old is None or old.status != value
            conds.append(
                Condition(
                    type=ctype,
                    status=value,
                    reason=reason,
                    message=_truncate(message, 1024),
                    observed_generation=self.o.generation,
                    last_transition_time=now if changed else old.last_transition_time,
                )
            )
        conds += [c for c in st.conditions if c.type not in CONDITION_TYPES]
        st.conditions = conds[:16]
        if phase in TERMINAL_PHASES:
            st.completed_at = st.completed_at or now
            st.waiting_on = None
            st.active_job = None
            st.next_attempt_at = None
        elif phase != "AwaitingApproval":
            st.waiting_on = None

    def fail(self, reason: str, message: str, phase: str = "Failed",
             lap: int | None = None, attempt: int | None = None) -> Decision:
        self.phase(phase, reason, message)
        self.event("Warning", reason, message, lap, attempt)
        return self.finish()

    def finish(self, touch_generation: bool = True) -> Decision:
        st = self.st
        if touch_generation:
            st.observed_generation = self.o.generation
        if st.model_dump() != self.o.status.model_dump():
            self.actions.append(PatchStatus(st))
        return Decision(self.actions)


# ----------------------------------------------------------------------------- decide


def decide(o: Observed) -> Decision:
    """What to do next for one AgentRun. Pure: no I/O, no clock (``o.now``)."""
    c = _Ctx(o)
    st = c.st
    spec = o.spec

    # Deletion: the Job goes with the owner (GC); the checkpoints only when retention is Delete.
    if o.deleting:
        return Decision([DeleteCheckpoints(), RemoveFinalizer()] if FINALIZER in o.finalizers else [])
    if spec is not None:
        if spec.checkpoint.retention == "Delete" and FINALIZER not in o.finalizers:
            c.act(AddFinalizer())
        elif spec.checkpoint.retention == "Retain" and FINALIZER in o.finalizers:
            c.act(RemoveFinalizer())

    terminal = st.phase in TERMINAL_PHASES
    waiting = st.phase == "AwaitingApproval" and st.approval is not None and st.approval.state == "Pending"

    # The store is pinned in status (write-ahead) before anything of a live run touches it.
    if not terminal and spec is not None and st.store is None:
        return _pin_store(c)

    # Approval deadline first: a decision that arrives after the deadline is too late.
    if waiting and spec is not None:
        timed_out = _apply_timeout(c)
        if timed_out is not None:
            return timed_out
        waiting = st.approval is not None and st.approval.state == "Pending"

    # Decisions: the `approved` annotation, or status.approval.decision set by a status patch.
    if waiting:
        ap = st.approval
        assert ap is not None
        if ANN_APPROVED in o.annotations:
            needs = _annotation_decision(c, ap)
            if needs is not None:
                return needs
        elif ap.decision is not None:  # the status route: bounded by the CRD; escape what it lets through
            reason, escaped = bounded_reason(ap.reason)
            if escaped:
                c.event("Warning", "ApprovalReasonEscaped",
                        f"status.approval.reason held {escaped} control character(s); recorded escaped")
            ap.reason, ap.decided_by = reason, bounded_decider(ap.decided_by)
        if ap.decision is not None:
            ap.state = "Approved" if ap.decision == "approved" else "Rejected"
            ap.decided_at = ap.decided_at or o.now
            by = f" by {ap.decided_by}" if ap.decided_by else ""
            why = f": {ap.reason}" if ap.reason else ""
            c.event(
                "Normal",
                "ApprovalDecided",
                f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) {ap.decision}{by}{why}",
            )
            waiting = False
    elif ANN_APPROVED in o.annotations:
        _consume_annotation(c, f"the run is not awaiting approval (phase {st.phase})")

    if terminal:
        for j in o.jobs:
            if j.state == "active":
                c.act(DeleteJob(j.name))
        _expire(c)
        return c.finish(touch_generation=False)

    if spec is None:
        return c.fail("InvalidSpec", f"the spec cannot be used: {o.spec_error or 'unknown error'}")

    # Fencing rests on the store honouring If-None-Match: probe it before the run's first write.
    if st.lap == 0 and st.active_job is None and st.checkpoint is None:
        blocked = _check_store_probe(c)
        if blocked is not None:
            return blocked

    # A fork starts from the source's lap N: its fork snapshot first, then lap N+1.
    if spec.fork_from is not None and st.checkpoint is None and st.lap == 0 and st.active_job is None:
        forked = _fork(c)
        if forked is not None:
            return forked
        return _next_step(c, st.phase == "AwaitingApproval")

    jobs = {j.name: j for j in o.jobs}

    # Adopt a Job whose creation was not recorded (lost status write, restart).
    if st.active_job is None and not waiting:
        lap, attempt = next_lap_attempt(st)
        name = job_name(o.name, o.uid, lap, attempt)
        if name in jobs:
            j = jobs[name]
            mismatch = _adoption_mismatch(st, j)
            if mismatch is not None:
                c.act(DeleteJob(name))
                c.event("Warning", "JobMismatch", f"Job {name} was not adopted: {mismatch}; it was deleted and the "
                        "lap attempt is retried with a new Job", lap, attempt)
                return _retry(c, lap, attempt, f"JobMismatch: {mismatch}")
            st.active_job = ActiveJob(
                name=name, lap=lap, attempt=attempt,
                agent_version=j.agent_version or spec.agent.version, started_at=j.started_at or o.now,
            )

    # Fence stray Jobs: an active Job that is not the run's current attempt must not write.
    for j in o.jobs:
        if j.state == "active" and (st.active_job is None or j.name != st.active_job.name):
            c.act(DeleteJob(j.name))

    if st.active_job is not None:
        result = _observe_active(c, jobs.get(st.active_job.name))
        if result is not None:
            return result

    return _next_step(c, waiting)


def _expire(c: _Ctx) -> None:
    """A finished run with spec.ttlSecondsAfterFinished: delete it once that long has passed
    since status.completedAt, else come back then."""
    o, st, spec = c.o, c.st, c.o.spec
    if spec is None or spec.ttl_seconds_after_finished is None or st.completed_at is None:
        return
    ttl = spec.ttl_seconds_after_finished
    left = (st.completed_at + timedelta(seconds=ttl) - o.now).total_seconds()
    if left > 0:
        c.act(RequeueAfter(max(0.5, left)))
        return
    kept = "deleted with it" if spec.checkpoint.retention == "Delete" else "kept"
    c.event("Normal", "TTLExpired", f"deleting the finished run: spec.ttlSecondsAfterFinished={ttl}s passed since "
            f"it finished at {st.completed_at.isoformat()}; its checkpoints are {kept} "
            f"(spec.checkpoint.retention {spec.checkpoint.retention})")
    c.act(DeleteRun(ttl))


def _check_store_probe(c: _Ctx) -> Decision | None:
    """Before the first lap (or fork): the store must honour conditional writes. Returns a
    Decision to stop (ask for the probe, fail, or wait for the store), or None to go on."""
    o, st = c.o, c.st
    pr = o.store_probe
    if pr is None:
        return Decision([ProbeStore()])
    if pr.kind == "invalid":
        return c.fail("InvalidConfiguration", f"the checkpoint store cannot be used: {pr.detail}")
    if pr.kind == "unsafe":
        return c.fail(
            "StoreUnsafe",
            f"the checkpoint store at {pr.endpoint} (bucket {pr.bucket}) does not honour conditional writes "
            f"(If-None-Match: *): {pr.detail}. Lap fencing depends on them, so no lap was started; use a store "
            "that honours them (see docs/operations.md, Store requirements) and recreate the run",
        )
    if pr.kind == "unavailable":
        progressing = next((x for x in st.conditions if x.type == "Progressing"), None)
        if not (progressing is not None and progressing.reason == "StoreUnavailable"):
            msg = (f"cannot probe the checkpoint store at {pr.endpoint} (bucket {pr.bucket}) for conditional "
                   f"writes yet (retrying): {pr.detail}")
            c.phase("Pending", "StoreUnavailable", msg)
            c.event("Warning", "StoreUnavailable", msg)
        c.act(RequeueAfter(10.0))
        return c.finish()
    return None


def _apply_timeout(c: _Ctx) -> Decision | None:
    """Past the deadline of a pending approval, apply spec.approval.onTimeout.

    Returns the final Decision when the run fails, else None (the approval is TimedOut, or
    still pending before its deadline)."""
    o, st, spec = c.o, c.st, c.o.spec
    ap = st.approval
    assert ap is not None and spec is not None
    if ap.state != "Pending" or o.now < ap.deadline:
        return None
    ap.state = "TimedOut"
    ap.decided_at = o.now
    ap.reason = "approval deadline passed"
    if spec.approval.on_timeout == "fail":
        _consume_annotation(c, "the approval deadline passed before it was read")
        return c.fail(
            "ApprovalTimedOut",
            f"approval of tool {ap.tool} (call {ap.call_id}, lap {ap.lap}) was not decided by "
            f"{ap.owner} before {ap.deadline.isoformat()}; spec.approval.onTimeout is fail",
        )
    c.event(
        "Warning",
        "ApprovalTimedOut",
        f"approval of tool {ap.tool} (call {ap.call_id}, lap {ap.lap}) timed out; the call is "
        "rejected (onTimeout: reject) and the run continues",
    )
    return None


def _remove_annotation_keys(c: _Ctx) -> None:
    keys = [k for k in DECISION_ANNOTATIONS if k in c.o.annotations]
    c.act(RemoveAnnotations(tuple(keys)))


def _consume_annotation(c: _Ctx, why: str) -> None:
    if ANN_APPROVED not in c.o.annotations:
        return
    _remove_annotation_keys(c)
    c.event(
        "Warning",
        "ApprovalIgnored",
        f"annotation {ANN_APPROVED}={shown(c.o.annotations[ANN_APPROVED])} ignored and removed: {why} "
        "(it cannot approve a future request in advance)",
    )


def _refuse_decision(c: _Ctx, reason: str, problems: list[str]) -> None:
    """A decision that cannot be applied: ONE Warning Event naming the fields, its annotations
    removed (so it is not read again), the run keeps waiting for the pending call."""
    ap = c.st.approval
    assert ap is not None
    _remove_annotation_keys(c)
    c.event("Warning", reason, f"decision refused and removed: {'; '.join(problems)}. The run still waits for "
            f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}); decide again")


def _annotation_decision(c: _Ctx, ap: ApprovalStatus) -> Decision | None:
    """Apply the decision in the annotations to the pending approval ``ap`` (in ``c.st``), or refuse
    it. Returns a Decision only when the pending call's record must be read first (a decision
    bound by digest to a call whose digest status does not hold: requested by an earlier release)."""
    o = c.o
    ann = o.annotations
    problems: list[str] = []
    raw = ann[ANN_APPROVED]
    value = raw.strip().lower()
    if value not in ("true", "false"):
        problems.append(f"{ANN_APPROVED}={shown(raw, 40)} is neither true nor false")
    reason_key = ANN_REASON if ann.get(ANN_REASON) else ANN_REASON_SHORT
    reason_raw = ann.get(reason_key) or None
    reason, escaped = None, 0
    if reason_raw is not None:
        reason, escaped = escape_controls(reason_raw)
        if len(reason) > MAX_REASON_CHARS:
            extra = f" ({escaped} control characters escaped)" if escaped else ""
            problems.append(f"{reason_key} is {len(reason)} characters{extra}, at most {MAX_REASON_CHARS}")
    decided_by = ann.get(ANN_DECIDED_BY) or None
    if decided_by is not None:
        if len(decided_by) > MAX_DECIDED_BY_CHARS:
            problems.append(f"{ANN_DECIDED_BY} is {len(decided_by)} characters, at most {MAX_DECIDED_BY_CHARS}")
        elif escape_controls(decided_by)[1]:
            problems.append(f"{ANN_DECIDED_BY}={shown(decided_by)} contains control characters")
    call_id = ann.get(ANN_CALL_ID)
    if call_id is not None:
        call_id = call_id.strip()
        if len(call_id) > MAX_CALL_ID_CHARS or not CALL_ID_PATTERN.match(call_id):
            problems.append(f"{ANN_CALL_ID}={shown(call_id, 40)} is not a call id "
                            f"(letters, digits, _ and -, at most {MAX_CALL_ID_CHARS})")
    digest = ann.get(ANN_ARGUMENTS_SHA256)
    if digest is not None:
        digest = digest.strip().lower()
        if not _SHA256.match(digest):
            problems.append(f"{ANN_ARGUMENTS_SHA256}={shown(digest, 40)} is not a sha256 "
                            f"({SHA256_HEX_CHARS} hex digits)")
    if problems:
        _refuse_decision(c, "ApprovalInvalid", problems)
        return None

    # The binding: the call the person saw must be the call pending now, with the same arguments.
    mismatches: list[str] = []
    if call_id is not None and call_id != ap.call_id:
        mismatches.append(f"{ANN_CALL_ID} is {call_id!r} but the pending call is {ap.call_id!r}")
    if digest is not None and not mismatches:
        expected = ap.arguments_sha256
        if expected is None:  # requested by an earlier release: digest the record's full arguments
            cp = o.checkpoint
            if cp is None or cp.lap != ap.lap:
                return Decision([ReadCheckpoint(ap.lap)])
            pa = cp.record.pending_approval if cp.kind == "ok" and cp.record is not None else None
            if pa is not None and pa.call_id == ap.call_id:
                expected = ap.arguments_sha256 = arguments_sha256(pa.arguments)
            else:
                mismatches.append(f"the arguments of call {ap.call_id} cannot be digested from its lap record "
                                  f"({cp.kind}{': ' + _truncate(cp.error, 200) if cp.error else ''}); decide "
                                  f"without {ANN_ARGUMENTS_SHA256}")
        if expected is not None and digest != expected:
            mismatches.append(f"{ANN_ARGUMENTS_SHA256} is {digest} but the arguments of the pending call "
                              f"{ap.call_id} have {expected}")
    if mismatches:
        _refuse_decision(c, "ApprovalBindingMismatch", mismatches)
        return None

    ap.decision = "approved" if value == "true" else "rejected"
    ap.reason = reason
    ap.decided_by = decided_by
    if escaped:
        c.event("Warning", "ApprovalReasonEscaped",
                f"{reason_key} held {escaped} control character(s); recorded escaped in status.approval.reason")
    _remove_annotation_keys(c)
    return None


def _approval_env(status: AgentRunStatus) -> ApprovalEnv | None:
    """The decision the next lap Job of ``status`` must carry: the decided approval of its last lap."""
    ap = status.approval
    if ap is None or ap.lap != status.lap or ap.state not in ("Approved", "Rejected", "TimedOut"):
        return None
    decision = {"Approved": "approved", "Rejected": "rejected", "TimedOut": "timed-out"}[ap.state]
    # bounded again: a status patch may have changed the reason or decider after the decision was recorded
    return ApprovalEnv(decision=decision, call_id=ap.call_id, reason=bounded_reason(ap.reason)[0],
                       decided_by=bounded_decider(ap.decided_by), arguments_sha256=ap.arguments_sha256)


def _adoption_mismatch(st: AgentRunStatus, job: ObservedJob) -> str | None:
    """Why a Job found in the cluster (its creation not recorded) must not be adopted, else None: it
    carries another decision or another store than the status. A Job without the annotation was
    created by an earlier release: its decision is not known, it is adopted."""
    if job.approval is not None:
        want = approval_annotation(_approval_env(st))
        if job.approval != want:
            return f"it carries the decision {shown(job.approval, 300)} but status says {shown(want, 300)}"
    if job.store is not None and st.store is not None and job.store != st.store:
        return f"it uses the store {job.store.uri} but the run's store is {st.store.uri}"
    return None


def _pin_store(c: _Ctx) -> Decision:
    """Fix the run's store in status.store; nothing else this pass (the next pass, once the status is
    stored, goes on)."""
    o, st = c.o, c.st
    pinned = pinned_store(o.status, o.namespace, o.name, o.uid, o.jobs, o.resolved_store)
    if pinned is not None:
        c.event("Normal", "StorePinned", f"checkpoint store pinned from the run's own records (it started under an "
                f"earlier release): {pinned.uri}")
    else:
        pinned = o.resolved_store
        if pinned is not None and o.status.checkpoint is not None:  # written before, but where cannot be told
            c.event("Warning", "StorePinned", f"the run's earlier checkpoint location cannot be read from "
                    f"status.checkpoint; pinned the operator's current default {pinned.uri}")
    if pinned is None:
        return c.fail("InvalidConfiguration", o.store_error or "no checkpoint store: spec.checkpoint.uri is not set "
                      "and the operator has no default (AGENTRUN_CHECKPOINT_URI)")
    st.store = pinned
    c.act(RequeueAfter(0.0))
    return c.finish()


# Waiting reasons of a container that the kubelet retries by itself once the configuration is fixed.
POD_CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "InvalidImageName")
_SECRET_MISSING = re.compile(r'secrets? "(?P<name>[^"]+)" not found')
_KEY_MISSING = re.compile(r"couldn't find key (?P<key>\S+) in Secret (?:[^/\s]+/)?(?P<name>[^\s,]+)")


def pod_config_problem(reason: str | None, message: str | None) -> tuple[str, str] | None:
    """(condition reason, explanation) for a lap pod stuck on its configuration, else None.

    The kubelet's messages (``secret "x" not found``, ``couldn't find key k in Secret ns/x``) name
    the Secret and key; they never hold a secret value."""
    if reason not in POD_CONFIG_ERRORS:
        return None
    text = message or reason
    m = _SECRET_MISSING.search(text)
    if m:
        return "SecretMissing", f"Secret {m['name']!r} does not exist in the run's namespace"
    m = _KEY_MISSING.search(text)
    if m:
        return "SecretMissing", f"Secret {m['name']!r} has no key {m['key']!r}"
    return "LapPodConfigError", f"{reason}: {_truncate(text, 300)}"


def _waiting_on_config(c: _Ctx, job: ObservedJob) -> None:
    """The active Job's pod cannot start because of its configuration (a missing Secret or key):
    past the grace, say so (phase Pending, condition reason SecretMissing / LapPodConfigError, one
    Warning Event) and keep the Job: creating the Secret is the fix and the kubelet then starts the
    pod by itself; spec.lapTimeout still bounds the attempt."""
    o, st = c.o, c.st
    aj = st.active_job
    assert aj is not None
    problem = pod_config_problem(job.waiting_reason, job.waiting_message)
    assert problem is not None
    reason, why = problem
    since = job.waiting_since or aj.started_at or o.now
    waited = (o.now - since).total_seconds()
    if waited < o.pod_config_grace_seconds:
        if st.phase != "Running":
            c.phase("Running", "LapRunning", f"lap {aj.lap} attempt {aj.attempt} starting (agent {aj.agent_version})")
        c.act(RequeueAfter(max(0.5, o.pod_config_grace_seconds - waited)))
        return
    msg = (f"lap {aj.lap} attempt {aj.attempt} cannot start: {why} ({job.waiting_reason}). The lap starts as "
           "soon as it is fixed; spec.lapTimeout bounds the wait")
    progressing = next((x for x in st.conditions if x.type == "Progressing"), None)
    if not (st.phase == "Pending" and progressing is not None and progressing.reason == reason
            and progressing.message == _truncate(msg, 1024)):
        c.phase("Pending", reason, msg)
        c.event("Warning", reason, msg, aj.lap, aj.attempt)
    c.act(RequeueAfter(15.0))


def _observe_active(c: _Ctx, job: ObservedJob | None) -> Decision | None:
    """Handle the Job in flight. Returns a Decision to stop, or None to go on to the next step."""
    o, st = c.o, c.st
    aj = st.active_job
    assert aj is not None and o.spec is not None
    if job is not None and job.state == "active" and pod_config_problem(job.waiting_reason, job.waiting_message):
        _waiting_on_config(c, job)
        return c.finish()
    if job is not None and job.state == "active":
        if st.phase not in ("Running",):
            c.phase("Running", "LapRunning", f"lap {aj.lap} attempt {aj.attempt} running (agent {aj.agent_version})")
        return c.finish()
    checkpointed = job is None or job.state == "succeeded" or job.exit_code == 3
    if checkpointed:
        cp = o.checkpoint
        if cp is None or cp.lap != aj.lap:
            return Decision([ReadCheckpoint(aj.lap)])
        if cp.kind == "ok" and cp.record is not None:
            if cp.record.lap != aj.lap:
                return c.fail("CheckpointUnreadable", f"{cp.key} holds lap {cp.record.lap}, expected lap {aj.lap}")
            _apply_lap(c, cp)
            return None
        if cp.kind == "unreadable":
            return c.fail(
                "CheckpointUnreadable",
                f"lap {aj.lap} checkpoint cannot be read: {cp.error}. The store was left untouched; "
                "fix or migrate the object (or upgrade agentrun), then recreate the run",
            )
        if cp.kind == "unavailable":
            # Once per lap attempt (the status remembers it), not on every requeue.
            progressing = next((x for x in st.conditions if x.type == "Progressing"), None)
            prefix = f"lap {aj.lap} attempt {aj.attempt} ended; its checkpoint cannot be read yet"
            if not (progressing is not None and progressing.reason == "StoreUnavailable"
                    and (progressing.message or "").startswith(prefix)):
                msg = f"{prefix} (store unavailable, retrying): {cp.error}"
                c.phase("Running", "StoreUnavailable", msg)
                c.event("Warning", "StoreUnavailable", msg, aj.lap, aj.attempt)
            c.act(RequeueAfter(10.0))
            return c.finish()
        # missing
        if job is None:
            return _retry(c, aj.lap, aj.attempt, "JobMissing: the lap Job disappeared before a checkpoint was written")
        return _retry(c, aj.lap, aj.attempt, f"CheckpointMissing: lap Job ended (exit {job.exit_code or 0}) "
                      "but no checkpoint was written")
    if job.exit_code == 2:
        af = o.attempt_failure
        if af is None or (af.lap, af.attempt) != (aj.lap, aj.attempt):
            return Decision([ReadAttemptFailure(aj.lap, aj.attempt)])
        detail = None
        if af.report:
            detail = af.report.get("message") or af.report.get("error")
        detail = detail or job.message or "no failure report was written"
        c.act(LapRetried(aj.lap, "Permanent"))
        if af.report and af.report.get("reason") == "CheckpointTooLarge":
            return c.fail("CheckpointTooLarge", f"lap {aj.lap} attempt {aj.attempt}: {detail}. The store was left "
                          "as it is; to go on, fork the run from its last lap with a higher limit "
                          "(agentrun fork --dry-run -o yaml, edit spec.checkpoint, kubectl apply)",
                          lap=aj.lap, attempt=aj.attempt)
        if af.report and af.report.get("reason") == "CheckpointUnreadable":
            return c.fail(
                "CheckpointUnreadable",
                f"lap {aj.lap} attempt {aj.attempt} cannot read the run's checkpoints: {detail}. The store was "
                "left untouched; fix or migrate the object (or upgrade agentrun), then recreate the run",
                lap=aj.lap, attempt=aj.attempt)
        return c.fail("LapFailedPermanently", f"lap {aj.lap} attempt {aj.attempt} failed permanently: {detail}",
                      lap=aj.lap, attempt=aj.attempt)
    reason = job.reason or (f"exit code {job.exit_code}" if job.exit_code is not None else "Failed")
    if job.exit_code == 75:
        reason = "RetryableError"
    if job.message:
        reason = f"{reason}: {job.message}"
    return _retry(c, aj.lap, aj.attempt, reason)


def _fork(c: _Ctx) -> Decision | None:
    """Apply the fork snapshot (asking the shell to write it first). Returns a Decision to stop, or
    None when the status now stands at the source's lap N (then the next step runs lap N+1)."""
    o, st = c.o, c.st
    assert o.spec is not None and o.spec.fork_from is not None
    ff = o.spec.fork_from
    fr = o.fork
    if fr is None or fr.lap != ff.lap:
        return Decision([ForkCheckpoint(ff.name, ff.uid, ff.lap)])
    source = f"lap {ff.lap} of agentrun {o.namespace}/{ff.name} (uid {ff.uid})"
    if fr.kind in ("missing", "unreadable") or (fr.kind == "ok" and fr.state is None):
        why = "it was never checkpointed" if fr.kind == "missing" else "it cannot be read"
        return c.fail("ForkSourceUnavailable", f"cannot fork from {source}: {why} ({fr.error or 'no state'}). "
                      "The source was left untouched; delete this run and fork from a checkpointed lap")
    if fr.kind == "unavailable":
        progressing = next((x for x in st.conditions if x.type == "Progressing"), None)
        if not (progressing is not None and progressing.reason == "StoreUnavailable"):
            msg = f"cannot read {source} yet (store unavailable, retrying): {fr.error}"
            c.phase("Pending", "StoreUnavailable", msg)
            c.event("Warning", "StoreUnavailable", msg)
        c.act(RequeueAfter(10.0))
        return c.finish()
    state = fr.state
    assert state is not None
    agent_version = state.agent_version or o.spec.agent.version
    st.lap = ff.lap
    st.agent_version = agent_version
    st.checkpoint = CheckpointRef(
        lap=ff.lap, key=fr.key or "", uri=fr.uri, sha256=fr.sha256 or "", written_at=fr.written_at,
        agent_version=agent_version, schema_version=state.schema_version,
        endpoint=fr.endpoint, region=fr.region, path_style=fr.path_style,
    )
    st.last_checkpoint_time = fr.written_at or o.now
    try:
        usd = format_usd(Decimal(state.totals.cost_usd))
    except (InvalidOperation, ValueError):
        usd = st.cost.usd
    st.cost = CostStatus(usd=usd, input_tokens=state.totals.input_tokens, output_tokens=state.totals.output_tokens)
    st.started_at = st.started_at or o.now
    c.event("Normal", "Forked", f"forked from {source}: the state through lap {ff.lap} was copied to {fr.key}; "
            f"the next lap is {ff.lap + 1}; cost so far ${usd}")
    outcome = state.last_outcome or Outcome(type="continue")
    _apply_outcome(c, ff.lap, outcome, state.pending_approval, requested_at=o.now)
    return None


def _retry(c: _Ctx, lap: int, attempt: int, reason: str) -> Decision:
    o, st = c.o, c.st
    assert o.spec is not None
    reason = _truncate(reason, 512)
    entries = {r.lap: r for r in st.retries}
    entry = entries.get(lap) or LapRetries(lap=lap, retries=0)
    entry.retries = max(entry.retries, attempt)
    entry.last_reason = reason
    entries[lap] = entry
    st.retries = sorted(entries.values(), key=lambda r: r.lap)[-MAX_RETRY_ENTRIES:]
    st.total_retries += 1
    st.active_job = None
    c.act(LapRetried(lap, reason.split(":")[0]))
    allowed = o.spec.retry.attempts_per_lap
    if attempt >= allowed:
        return c.fail("RetriesExhausted", f"lap {lap} failed {attempt} of {allowed} attempt(s); last: {reason}",
                      lap=lap, attempt=attempt)
    delay = backoff_seconds(o.spec, attempt)
    st.next_attempt_at = o.now + timedelta(seconds=delay)
    c.phase("Retrying", "LapRetry", f"lap {lap} attempt {attempt} failed ({reason}); attempt {attempt + 1} in {delay:g}s")
    c.event("Warning", "LapRetry", f"lap {lap} attempt {attempt} failed ({reason}); retrying in {delay:g}s",
            lap, attempt)
    return _next_step(c, False)


def _apply_lap(c: _Ctx, cp: CheckpointRead) -> None:
    o, st = c.o, c.st
    rec = cp.record
    assert rec is not None and o.spec is not None
    st.lap = rec.lap
    st.agent_version = rec.agent_version
    st.checkpoint = CheckpointRef(
        lap=rec.lap, key=cp.key or "", uri=cp.uri, sha256=cp.sha256 or "", written_at=cp.written_at,
        agent_version=rec.agent_version, schema_version=rec.schema_version,
        endpoint=cp.endpoint, region=cp.region, path_style=cp.path_style,
    )
    st.last_checkpoint_time = cp.written_at or o.now
    try:
        usd = format_usd(Decimal(rec.totals.cost_usd))
    except (InvalidOperation, ValueError):
        usd = st.cost.usd
    st.cost = CostStatus(usd=usd, input_tokens=rec.totals.input_tokens, output_tokens=rec.totals.output_tokens)
    st.active_job = None
    st.next_attempt_at = None
    duration = max(0.0, (rec.timings.finished_at - rec.timings.started_at).total_seconds())
    added = None
    if rec.storage is not None and cp.size is not None:
        total = StorageStatus(bytes=rec.storage.bytes + cp.size, objects=rec.storage.objects + 1)
        before = st.storage.bytes if st.storage is not None else 0
        added = total.bytes - before if 0 < before <= total.bytes else cp.size
        st.storage = total
    c.act(LapFinished(rec.lap, rec.outcome.type, duration, added))
    c.event(
        "Normal", "LapCheckpointed",
        f"lap {rec.lap} checkpointed ({rec.outcome.type}) by agent {rec.agent_version}; cost so far ${usd}",
    )
    _apply_outcome(c, rec.lap, rec.outcome, rec.pending_approval)


def _apply_outcome(c: _Ctx, lap: int, outcome: Outcome, pa: PendingApproval | None,
                   requested_at: datetime | None = None) -> None:
    """The phase after lap ``lap`` ended with ``outcome``. ``requested_at`` overrides the time of a
    pending approval (a fork asks again when it is created, with a fresh deadline)."""
    o, st = c.o, c.st
    assert o.spec is not None
    if outcome.type == "done":
        c.phase("Succeeded", "AgentDone", outcome.message or f"the agent finished after {lap} lap(s)")
        c.event("Normal", "Succeeded", st.message or "")
    elif outcome.type == "failed":
        c.phase("Failed", "AgentFailed", f"lap {lap}: {outcome.message or 'the agent reported failure'}")
        c.event("Warning", "AgentFailed", st.message or "")
    elif outcome.type == "awaiting-approval":
        if pa is None:
            c.phase("Failed", "CheckpointUnreadable", f"lap {lap} awaits approval but names no pending call")
            c.event("Warning", "CheckpointUnreadable", st.message or "")
            return
        spec = o.spec
        requested = requested_at or pa.requested_at
        deadline = requested + timedelta(seconds=parse_duration(spec.approval.timeout))
        args = json.dumps(pa.arguments, sort_keys=True)
        st.approval = ApprovalStatus(
            state="Pending", lap=lap, tool=pa.tool, call_id=pa.call_id, idempotency_key=pa.idempotency_key,
            arguments=_truncate(args, 4096), arguments_sha256=arguments_sha256(pa.arguments),
            arguments_truncated=len(args) > 4096, owner=spec.approval.owner, requested_at=requested,
            deadline=deadline,
        )
        st.waiting_on = spec.approval.owner
        msg = (f"lap {lap}: tool {pa.tool} (call {pa.call_id}) waits for {spec.approval.owner} until "
               f"{deadline.isoformat()}; decide with `kubectl annotate agentrun {o.name} approved=true|false`")
        c.phase("AwaitingApproval", "ApprovalRequested", msg)
        c.event("Normal", "ApprovalRequested", msg)


def _next_step(c: _Ctx, waiting: bool) -> Decision:
    """No Job in flight: wait, stop, or start the next lap attempt."""
    o, st = c.o, c.st
    spec = o.spec
    assert spec is not None
    if st.phase in TERMINAL_PHASES:
        return c.finish()
    if st.phase == "AwaitingApproval" and st.approval is not None and st.approval.state == "Pending":
        timed_out = _apply_timeout(c)
        if timed_out is not None:
            return timed_out
        if st.approval.state == "Pending":
            c.act(RequeueAfter(max(0.5, (st.approval.deadline - o.now).total_seconds())))
            return c.finish()
    elif st.phase == "AwaitingApproval" and st.approval is None:
        return c.finish()

    approval_env = _approval_env(st)

    if spec.suspend:
        if st.phase != "Suspended":
            c.phase("Suspended", "Suspended", f"suspended after lap {st.lap}; set spec.suspend=false to resume")
            c.event("Normal", "Suspended", f"run suspended after lap {st.lap}")
        return c.finish()
    if st.phase == "Suspended":
        c.event("Normal", "Resumed", f"run resumed at lap {st.lap + 1}")

    if st.next_attempt_at is not None and o.now < st.next_attempt_at and st.phase in ("Retrying", "Suspended"):
        if st.phase != "Retrying":
            c.phase("Retrying", "LapRetry", f"waiting for the backoff until {st.next_attempt_at.isoformat()}")
        c.act(RequeueAfter(max(0.5, (st.next_attempt_at - o.now).total_seconds())))
        return c.finish()

    lap, attempt = next_lap_attempt(st)
    if attempt > spec.retry.attempts_per_lap:
        return c.fail("RetriesExhausted", f"lap {lap} already failed {attempt - 1} attempt(s)")
    if lap > spec.budget.max_laps:
        return c.fail(
            "BudgetExceeded", f"lap {lap} would pass spec.budget.maxLaps={spec.budget.max_laps}",
            phase="BudgetExceeded",
        )
    if spec.budget.max_cost_usd is not None and Decimal(st.cost.usd) >= Decimal(spec.budget.max_cost_usd):
        return c.fail(
            "BudgetExceeded",
            f"cost ${st.cost.usd} reached spec.budget.maxCostUSD=${spec.budget.max_cost_usd} before lap {lap}",
            phase="BudgetExceeded",
        )

    version = spec.agent.version
    # Write-ahead: the Job is created only once the API server holds what it executes (the decision
    # it carries, the store it writes to). Otherwise record that first; the Job follows next pass.
    if o.status.store is None or (approval_env is not None
                                  and (o.status.lap, _approval_env(o.status)) != (st.lap, approval_env)):
        ap = st.approval
        after = f"call {ap.call_id} {approval_env.decision}; " if ap is not None and approval_env else ""
        c.phase("Running", "LapStarting", f"{after}lap {lap} attempt {attempt} starts (agent {version})")
        c.act(RequeueAfter(0.0))
        return c.finish()
    if attempt == 1 and st.agent_version and st.agent_version != version:
        c.event("Normal", "VersionChanged", f"lap {lap} runs agent version {version} (lap {st.lap} ran {st.agent_version})",
                lap, attempt)
    name = job_name(o.name, o.uid, lap, attempt)
    c.act(CreateJob(lap=lap, attempt=attempt, agent_version=version, name=name, approval=approval_env,
                    store=o.status.store))
    st.active_job = ActiveJob(name=name, lap=lap, attempt=attempt, agent_version=version, started_at=o.now)
    st.started_at = st.started_at or o.now
    st.next_attempt_at = None
    c.phase("Running", "LapRunning", f"lap {lap} attempt {attempt} running (agent {version})")
    return c.finish()
