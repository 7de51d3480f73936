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
* attempts of a lap never exceed ``spec.retry.attemptsPerLap``;
* terminal phases do nothing (except removing a stray approval annotation and a leftover Job).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from agentrun.api.approval import ANN_APPROVED, ANN_DECIDED_BY, ANN_REASON, ANN_REASON_SHORT
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
)
from agentrun.api.types import format_usd, parse_duration
from agentrun.checkpoint.schema import LapRecord, Outcome, PendingApproval, RunState

from .jobs import ApprovalEnv, job_name

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
    pod_config_grace_seconds: float = 30.0
    """AGENTRUN_POD_CONFIG_GRACE_SECONDS: how long a lap pod may wait on a config error before the
    run says so (condition + Warning Event)."""


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class CreateJob:
    lap: int
    attempt: int
    agent_version: str
    name: str
    approval: ApprovalEnv | None = None


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
        return bool(self.of(ReadCheckpoint) or self.of(ReadAttemptFailure) or self.of(ForkCheckpoint))


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
            raw = o.annotations[ANN_APPROVED].strip().lower()
            if raw in ("true", "false"):
                ap.decision = "approved" if raw == "true" else "rejected"
                reason = o.annotations.get(ANN_REASON) or o.annotations.get(ANN_REASON_SHORT)
                ap.reason = _truncate(reason, 1024) if reason else None
                ap.decided_by = o.annotations.get(ANN_DECIDED_BY) or None
                _remove_annotation_keys(c)
            else:
                _consume_annotation(c, f"its value {raw!r} is neither true nor false")
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
        return c.finish(touch_generation=False)

    if spec is None:
        return c.fail("InvalidSpec", f"the spec cannot be used: {o.spec_error or 'unknown error'}")

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
    keys = [k for k in (ANN_APPROVED, ANN_REASON, ANN_REASON_SHORT, ANN_DECIDED_BY) if k in c.o.annotations]
    c.act(RemoveAnnotations(tuple(keys)))


def _consume_annotation(c: _Ctx, why: str) -> None:
    if ANN_APPROVED not in c.o.annotations:
        return
    _remove_annotation_keys(c)
    c.event(
        "Warning",
        "ApprovalIgnored",
        f"annotation approved={c.o.annotations[ANN_APPROVED]!r} ignored and removed: {why} "
        "(it cannot approve a future request in advance)",
    )


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
            arguments=_truncate(args, 4096), owner=spec.approval.owner, requested_at=requested,
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

    approval_env = None
    ap = st.approval
    if ap is not None and ap.lap == st.lap and ap.state in ("Approved", "Rejected", "TimedOut"):
        decision = {"Approved": "approved", "Rejected": "rejected", "TimedOut": "timed-out"}[ap.state]
        approval_env = ApprovalEnv(decision=decision, call_id=ap.call_id, reason=ap.reason, decided_by=ap.decided_by)

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
    if attempt == 1 and st.agent_version and st.agent_version != version:
        c.event("Normal", "VersionChanged", f"lap {lap} runs agent version {version} (lap {st.lap} ran {st.agent_version})",
                lap, attempt)
    name = job_name(o.name, o.uid, lap, attempt)
    c.act(CreateJob(lap=lap, attempt=attempt, agent_version=version, name=name, approval=approval_env))
    st.active_job = ActiveJob(name=name, lap=lap, attempt=attempt, agent_version=version, started_at=o.now)
    st.started_at = st.started_at or o.now
    st.next_attempt_at = None
    c.phase("Running", "LapRunning", f"lap {lap} attempt {attempt} running (agent {version})")
    return c.finish()
