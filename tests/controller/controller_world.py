"""A tiny in-memory world for driving ``decide``: it applies actions the way the I/O shell does."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, StoreLocation
from agentrun.api.tenancy import PolicyCheck
from agentrun.checkpoint.schema import (
    ForkProvenance,
    LapRecord,
    Outcome,
    PendingApproval,
    RunRef,
    RunState,
    Timings,
    Totals,
)
from agentrun.controller import decide as d
from agentrun.controller.decide.jobs import approval_annotation

T0 = datetime(2030, 1, 1, tzinfo=UTC)
UID = "0f9e8d7c-1111-2222-3333-444455556666"
STORE = StoreLocation(uri="s3://bucket/prefix", endpoint="http://s3:9000", region="us-east-1", path_style=True)


def make_spec(**over: Any) -> AgentRunSpec:
    base: dict[str, Any] = {
        "task": "do it",
        "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]}},
        "budget": {"maxLaps": 10},
        "retry": {"attemptsPerLap": 3, "backoff": {"initial": "2s", "max": "10s", "factor": 2}},
        "approval": {"owner": "ops", "timeout": "3s", "onTimeout": "reject"},
        "lapTimeout": "30s",
    }
    for k, v in over.items():
        base[k] = v
    return AgentRunSpec.model_validate(base)


def record(lap: int, outcome: str = "continue", version: str = "v1", cost: str = "0.10", attempt: int = 1,
           pending: bool = False, message: str | None = None) -> LapRecord:
    return LapRecord(
        agent_version=version,
        run=RunRef(namespace="ns", name="run", uid=UID),
        lap=lap,
        attempt=attempt,
        outcome=Outcome(type=outcome, message=message),
        pending_approval=PendingApproval(
            call_id="c1", tool="refund", arguments={"x": 1}, idempotency_key=f"k:{lap}", lap=lap,
            requested_at=T0,
        ) if pending else None,
        totals=Totals(laps=lap, input_tokens=10 * lap, output_tokens=lap, cost_usd=cost),
        timings=Timings(started_at=T0, finished_at=T0 + timedelta(seconds=2)),
    )


def ok_read(rec: LapRecord) -> d.CheckpointRead:
    return d.CheckpointRead(
        lap=rec.lap, kind="ok", record=rec, key=f"p/ns/run/{UID}/laps/{rec.lap:08d}.json",
        sha256="ab" * 32, written_at=T0 + timedelta(seconds=rec.lap),
    )


def fork_read(lap: int, outcome: str = "continue", kind: str = "ok", cost: str = "0.30",
              pending: bool = False) -> d.ForkRead:
    """What the shell reports after writing a fork snapshot of the source's state through ``lap``."""
    if kind != "ok":
        return d.ForkRead(lap=lap, kind=kind, error=f"{kind} for the test")  # type: ignore[arg-type]
    src = RunRef(namespace="ns", name="src", uid="5eed0000-0000-0000-0000-000000000000")
    state = RunState(
        agent_version="v0", run=RunRef(namespace="ns", name="run", uid=UID), lap=lap, last_sha256="cd" * 32,
        last_outcome=Outcome(type=outcome),
        pending_approval=PendingApproval(call_id="c1", tool="refund", arguments={"x": 1}, idempotency_key="k",
                                         lap=lap, requested_at=T0 - timedelta(days=3)) if pending else None,
        totals=Totals(laps=lap, input_tokens=10 * lap, output_tokens=lap, cost_usd=cost),
        forked_from=ForkProvenance(run=src, lap=lap, sha256="cd" * 32),
    )
    return d.ForkRead(lap=lap, kind="ok", state=state, key=f"p/ns/run/{UID}/snapshots/{lap:08d}.json",
                      sha256="ef" * 32, written_at=T0, endpoint="http://s3:9000")


PROBE_OK = d.StoreProbeRead("ok", "http://s3:9000", "agentrun", "refused 412")


@dataclasses.dataclass
class World:
    """What the cluster and store hold for one run."""

    spec: AgentRunSpec
    status: AgentRunStatus = dataclasses.field(default_factory=AgentRunStatus)
    now: datetime = T0
    jobs: dict[str, d.ObservedJob] = dataclasses.field(default_factory=dict)
    created: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    create_actions: list[d.CreateJob] = dataclasses.field(default_factory=list)
    store: dict[int, d.CheckpointRead] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    finalizers: list[str] = dataclasses.field(default_factory=list)
    events: list[d.Event] = dataclasses.field(default_factory=list)
    generation: int = 1
    deleting: bool = False
    failure_reports: dict[tuple[int, int], dict] = dataclasses.field(default_factory=dict)
    fork_reads: list[d.ForkRead] = dataclasses.field(default_factory=list)
    """Answers to ForkCheckpoint, in order (the last one repeats)."""
    fork_calls: list[d.ForkCheckpoint] = dataclasses.field(default_factory=list)
    resolved_store: StoreLocation | None = dataclasses.field(default_factory=lambda: STORE.model_copy())
    """What the operator's defaults and the spec resolve to now (Observed.resolved_store)."""
    passes: list[tuple[d.Observed, d.Decision]] = dataclasses.field(default_factory=list)
    """Every decision applied, with what it observed (the status as stored before it)."""
    refuse_status: int = 0
    """The next N status patches are refused by the 'API server' (422): like the shell, the Jobs of
    that decision are acted on first, the status and everything after it are not."""
    probe: d.StoreProbeRead | None = PROBE_OK
    """The store probe's verdict the world answers ProbeStore with (and passes by default)."""
    probe_answer: d.StoreProbeRead = PROBE_OK
    """What the shell's probe finds when decide asks (``probe`` None)."""
    probes: int = 0
    deleted: bool = False
    """A DeleteRun was applied (the run is then deleting)."""
    policy_check: PolicyCheck | None = None
    """The tenancy re-check the shell reads (Observed.policy_check); None: not enforced."""
    lap_image: str = "registry.example/agentrun:1"
    """The operator's default lap image (Observed.lap_image)."""
    admission: d.AdmissionProblem | None = None
    """The admission policy check's verdict (Observed.admission); None: in place."""
    queue: d.QueueSlot | None = None
    """The run's place in its namespace's queue (Observed.queue); None: no limit."""
    tracing: bool = False
    """The operator's tracing is on (Observed.tracing)."""
    default_queue_name: str | None = None
    """The namespace policy's Kueue LocalQueue (Observed.default_queue_name)."""
    workload: d.WorkloadRead | None = None
    """The Workload of the held Job as the shell read it (Observed.workload)."""
    sent: dict[int, list[d.SentCall]] = dataclasses.field(default_factory=dict)
    """The tool calls each lap of the run's current history sent (its record's, or the unfinished
    lap's journal): what the shell's rewind survey (ReadRewind) finds."""
    abandoned: list[dict[int, d.CheckpointRead]] = dataclasses.field(default_factory=list)
    """The laps each applied rewind left behind (the store keeps them, the run never reads them)."""
    rewind_kind: str = "ok"
    """The kind of the rewind survey's answer (``unavailable``: the store does not answer)."""
    rewind_reads: int = 0

    def rewind_read(self, a: d.ReadRewind) -> d.RewindRead:
        """What the shell's survey of a rewind finds in this world's store."""
        self.rewind_reads += 1
        if self.rewind_kind != "ok":
            return d.RewindRead(a.from_lap, a.through_lap, self.rewind_kind, error="store down for the test")  # type: ignore[arg-type]
        point = self.store.get(a.from_lap) if a.from_lap else None
        if a.from_lap and point is None:
            return d.RewindRead(a.from_lap, a.through_lap, "missing", error=f"lap {a.from_lap} missing")
        rec = point.record if point is not None else None
        calls = tuple(c for lap in sorted(self.sent) if a.from_lap < lap <= a.through_lap + 1 for c in self.sent[lap])
        return d.RewindRead(a.from_lap, a.through_lap, "ok", point=point,
                            agent_version=rec.agent_version if rec else None,
                            totals=rec.totals if rec else Totals(), outcome=rec.outcome.type if rec else None,
                            calls=calls)

    def observed(self, checkpoint=None, attempt_failure=None, fork=None, rewind=None) -> d.Observed:
        return d.Observed(
            namespace="ns", name="run", uid=UID, generation=self.generation, spec=self.spec,
            status=self.status, now=self.now, annotations=dict(self.annotations),
            finalizers=tuple(self.finalizers), deleting=self.deleting, jobs=tuple(self.jobs.values()),
            checkpoint=checkpoint, attempt_failure=attempt_failure, fork=fork,
            resolved_store=self.resolved_store, store_probe=self.probe,
            store_error=None if self.resolved_store else "no store configured for the test",
            policy_check=self.policy_check, lap_image=self.lap_image, admission=self.admission,
            queue=self.queue, default_queue_name=self.default_queue_name, workload=self.workload,
            tracing=self.tracing, rewind=rewind,
        )

    def reconcile(self) -> d.Decision:
        """One reconcile as the shell runs it: a write-ahead pass (``RequeueAfter(0)``) is followed at
        once by the next pass. Returns every pass's actions merged (without the RequeueAfter(0))."""
        actions: list[d.Action] = []
        for _ in range(4):
            dec = self.reconcile_once()
            again = 0.0 in [a.seconds for a in dec.of(d.RequeueAfter)]
            actions += [a for a in dec.actions if not (isinstance(a, d.RequeueAfter) and a.seconds == 0.0)]
            if not again or self.refuse_status_pending:
                break
        else:
            raise AssertionError("decide kept asking to be called again")
        return d.Decision(actions)

    refuse_status_pending: bool = False

    def reconcile_once(self) -> d.Decision:
        """One pass, reads included, applying every action (like handlers.reconcile)."""
        self.refuse_status_pending = False
        cp = af = fk = rw = None
        for _ in range(4):
            dec = d.decide(self.observed(cp, af, fk, rw))
            if not dec.needs_read:
                break
            for a in dec.actions:
                if isinstance(a, d.ReadCheckpoint):
                    cp = self.store.get(a.lap) or d.CheckpointRead(lap=a.lap, kind="missing")
                if isinstance(a, d.ReadRewind):
                    rw = self.rewind_read(a)
                if isinstance(a, d.ReadAttemptFailure):
                    af = d.AttemptFailureRead(a.lap, a.attempt, self.failure_reports.get((a.lap, a.attempt)))
                if isinstance(a, d.ProbeStore):
                    self.probes += 1
                    self.probe = self.probe_answer
                if isinstance(a, d.ForkCheckpoint):
                    self.fork_calls.append(a)
                    assert self.fork_reads, "decide asked for a fork snapshot the test did not expect"
                    fk = self.fork_reads.pop(0) if len(self.fork_reads) > 1 else self.fork_reads[0]
        else:
            raise AssertionError("decide kept asking for reads")
        observed = self.observed(cp, af, fk, rw)
        self.passes.append((observed, dec))
        for a in dec.actions:  # Jobs first, as the shell does
            if isinstance(a, d.CreateJob):
                self.created.append((a.lap, a.attempt))
                self.create_actions.append(a)
                if a.name not in self.jobs:
                    self.jobs[a.name] = d.ObservedJob(a.name, a.lap, a.attempt, "active", agent_version=a.agent_version,
                                                      approval=approval_annotation(a.approval), store=a.store,
                                                      suspended=a.queue_name is not None, queue_name=a.queue_name,
                                                      uid=f"uid-{a.name}")
            elif isinstance(a, d.DeleteJob):
                self.jobs.pop(a.name, None)
        for w in dec.writes():  # the run's writes in the Decision's order, as the shell performs them
            if isinstance(w, d.RemoveAnnotations):
                for k in w.keys:
                    self.annotations.pop(k, None)
            elif self.refuse_status > 0:
                self.refuse_status -= 1
                self.refuse_status_pending = True
                return dec  # the shell stops after a refused status patch: nothing after it, no Events
            else:
                before = self.status.lifecycle.rewinds if self.status.lifecycle is not None else []
                self.status = w.status
                after = self.status.lifecycle.rewinds if self.status.lifecycle is not None else []
                if len(after) > len(before):  # a rewind: the laps after its point stay in the old history
                    back = after[-1]
                    self.abandoned.append({n: r for n, r in self.store.items() if n > back})
                    self.store = {n: r for n, r in self.store.items() if n <= back}
                    self.sent = {n: c for n, c in self.sent.items() if n <= back}
        for a in dec.actions:
            if isinstance(a, d.Event):
                self.events.append(a)
            elif isinstance(a, d.AddFinalizer):
                self.finalizers.append(a.name)
            elif isinstance(a, d.RemoveFinalizer):
                self.finalizers.remove(a.name)
            elif isinstance(a, d.DeleteRun):
                self.deleted = self.deleting = True
        return dec

    def active(self) -> d.ObservedJob:
        aj = self.status.active_job
        assert aj is not None, self.status
        return self.jobs[aj.name]

    def kueue_admits(self, at: datetime | None = None) -> None:
        """Kueue admits the active Job: it is unsuspended and starts (``at``: its startTime)."""
        j = self.active()
        self.jobs[j.name] = dataclasses.replace(j, suspended=False, started_at=at or self.now)

    def kueue_evicts(self) -> None:
        """Kueue evicts the active Job (preemption): suspended again, its pod stopped."""
        j = self.active()
        self.jobs[j.name] = dataclasses.replace(j, suspended=True)

    def finish_job(self, outcome: str = "continue", exit_code: int = 0, checkpoint: bool = True, **kw: Any) -> None:
        """The active Job ends (its pod's exit, observe.job_state); with exit 0 it wrote the lap's
        checkpoint first, unless ``checkpoint`` is False (a pod that exited 0 without one)."""
        j = self.active()
        if checkpoint and exit_code in (0, 3) and j.lap not in self.store:
            self.store[j.lap] = ok_read(record(j.lap, outcome, version=j.agent_version or "v1", attempt=j.attempt, **kw))
        state = "succeeded" if exit_code == 0 else "failed"
        self.jobs[j.name] = dataclasses.replace(j, state=state, exit_code=exit_code)

    def late_fail(self) -> None:
        """The Job controller marks the oldest Job whose pod exited 0 Failed (its lap timeout passed
        between the pod's exit and the Job controller's sync), and its pod is gone by then: what
        observe sees of it is the Failed condition."""
        done = sorted((j for j in self.jobs.values() if j.state == "succeeded"), key=lambda j: (j.lap, j.attempt))
        if done:
            self.jobs[done[0].name] = dataclasses.replace(done[0], state="failed", exit_code=None,
                                                          reason="DeadlineExceeded: the lap ran longer than spec.lapTimeout")

    def fail_job(self, exit_code: int | None = 75, reason: str | None = None, **kw: Any) -> None:
        """The active Job fails; ``kw``: more ObservedJob fields (``termination_message``, ``message``)."""
        j = self.active()
        self.jobs[j.name] = dataclasses.replace(j, state="failed", exit_code=exit_code, reason=reason, **kw)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]
