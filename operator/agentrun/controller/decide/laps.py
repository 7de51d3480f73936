"""Laps: the Job in flight (running, stuck on its configuration, ended), the checkpoint it wrote,
and the next lap attempt (or why there is none yet)."""

from __future__ import annotations

import re
from decimal import Decimal

from agentrun.api.contract import AttemptReason, ExitCode
from agentrun.api.reasons import LapOutcome, Reason, RetryReason
from agentrun.api.status import TERMINAL_PHASES, ActiveJob, CheckpointRef, StorageStatus
from agentrun.api.text import one_line, truncate
from agentrun.checkpoint.schema import LapRecord

from . import kueue
from .actions import (
    CreateJob,
    Decision,
    DeleteJob,
    LapFinished,
    LapRetried,
    ReadAttemptFailure,
    ReadCheckpoint,
    RequeueAfter,
)
from .admission import hold_lap
from .approvals import adoption_mismatch, apply_timeout, approval_env, bind_target
from .context import MAX_CONDITION_MESSAGE_CHARS, Ctx, condition
from .finish import apply_outcome, record_checkpoint
from .jobs import job_name
from .lifecycle import attempts_allowed, requeue_at_deadline
from .observed import CheckpointRead, ObservedJob
from .retries import classify_failure, job_cause, next_lap_attempt, record_retry
from .store import store_unavailable
from .text import cause_text
from .tools import announce_tools_changed

POD_CONFIG_RETRY_SECONDS = 15.0

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
        return Reason.SECRET_MISSING, f"Secret {m['name']!r} does not exist in the run's namespace"
    m = _KEY_MISSING.search(text)
    if m:
        return Reason.SECRET_MISSING, f"Secret {m['name']!r} has no key {m['key']!r}"
    return Reason.LAP_POD_CONFIG_ERROR, f"{reason}: {truncate(text, 300)}"


def waiting_on_config(c: Ctx, aj: ActiveJob, job: ObservedJob, problem: tuple[str, str]) -> None:
    """The active Job's pod cannot start because of its configuration (a missing Secret or key):
    past the grace, say so (phase Pending, condition reason SecretMissing / LapPodConfigError, one
    Warning Event) and keep the Job: creating the Secret is the fix and the kubelet then starts the
    pod by itself; spec.lapTimeout still bounds the attempt."""
    o, st = c.o, c.st
    reason, why = problem
    since = job.waiting_since or aj.started_at or o.now
    waited = (o.now - since).total_seconds()
    if waited < o.pod_config_grace_seconds:
        if st.phase != "Running":
            c.phase("Running", Reason.LAP_RUNNING, f"lap {aj.lap} attempt {aj.attempt} starting (agent {aj.agent_version})")
        c.act(RequeueAfter(max(0.5, o.pod_config_grace_seconds - waited)))
        return
    msg = (f"lap {aj.lap} attempt {aj.attempt} cannot start: {why} ({job.waiting_reason}). The lap starts as "
           "soon as it is fixed; spec.lapTimeout bounds the wait")
    progressing = condition(st, "Progressing")
    if not (st.phase == "Pending" and progressing is not None and progressing.reason == reason
            and progressing.message == one_line(msg, MAX_CONDITION_MESSAGE_CHARS)):
        c.phase("Pending", reason, msg)
        c.event("Warning", reason, msg, aj.lap, aj.attempt)
    c.act(RequeueAfter(POD_CONFIG_RETRY_SECONDS))


def observe_active(c: Ctx, aj: ActiveJob, job: ObservedJob | None) -> Decision | None:
    """Handle the Job in flight (``job``: the cluster's view of ``aj``, None when it is gone).
    Returns a Decision to stop, or None to go on to the next step."""
    st = c.st
    if job is not None and kueue.is_held(job):
        return kueue.held(c, aj, job)
    kueue.released(c, aj, job)
    if job is not None and job.state == "active":
        problem = pod_config_problem(job.waiting_reason, job.waiting_message)
        if problem is not None:
            waiting_on_config(c, aj, job, problem)
        elif st.phase != "Running":
            c.phase("Running", Reason.LAP_RUNNING,
                    f"lap {aj.lap} attempt {aj.attempt} running (agent {aj.agent_version})")
        return c.finish()
    if job is None or job.state == "succeeded" or job.exit_code == ExitCode.ALREADY_CHECKPOINTED:
        return _read_checkpoint(c, aj, job)
    if job.exit_code == ExitCode.PERMANENT:
        return _failed_permanently(c, aj, job)
    if job.exit_code is None:
        # Failed, and how its pod ended is not known (the pod is gone: a deadline passed, it was
        # evicted or deleted, or the Job controller marked the Job Failed after the pod's exit 0):
        # the checkpoint decides, as for a Job that is gone.
        return _read_checkpoint(c, aj, job, failed=True)
    kind, reason = classify_failure(job)
    return record_retry(c, aj.lap, aj.attempt, kind, reason, aj.started_at or c.o.now) or next_step(c)


def _read_checkpoint(c: Ctx, aj: ActiveJob, job: ObservedJob | None, failed: bool = False) -> Decision | None:
    """The attempt ended as if it checkpointed, its Job is gone, or (``failed``) its Job failed
    with no known exit of its pod: the checkpoint decides. Without one, a ``failed`` attempt is
    retried for the Job's own failure."""
    cp = c.o.checkpoint
    if cp is None or cp.lap != aj.lap:
        return Decision([ReadCheckpoint(aj.lap)])
    if cp.kind == "ok" and cp.record is not None:
        if cp.record.lap != aj.lap:
            return c.fail(Reason.CHECKPOINT_UNREADABLE, f"{cp.key} holds lap {cp.record.lap}, expected lap {aj.lap}")
        already = job is not None and job.exit_code == ExitCode.ALREADY_CHECKPOINTED
        apply_lap(c, cp, cp.record, LapOutcome.ALREADY_CHECKPOINTED if already else None)
        return None
    if cp.kind == "unreadable":
        return c.fail(Reason.CHECKPOINT_UNREADABLE, f"lap {aj.lap} checkpoint cannot be read: {cp.error}. The "
                      "store was left untouched; fix or migrate the object (or upgrade agentrun), then recreate the run")
    if cp.kind == "unavailable":  # once per lap attempt (the condition remembers it), not on every requeue
        return store_unavailable(c, "Running", f"lap {aj.lap} attempt {aj.attempt} ended; its checkpoint cannot be "
                                 "read yet (store unavailable, retrying): ", cp.error, aj.lap, aj.attempt)
    if failed and job is not None:
        kind, reason = classify_failure(job)
    elif job is None:  # missing
        kind, reason = RetryReason.JOB_MISSING, "JobMissing: the lap Job disappeared before a checkpoint was written"
    else:
        kind, reason = RetryReason.CHECKPOINT_MISSING, (f"CheckpointMissing: lap Job ended (exit {job.exit_code or 0}) "
                                                        "but no checkpoint was written")
    return record_retry(c, aj.lap, aj.attempt, kind, reason, aj.started_at or c.o.now) or next_step(c)


def _failed_permanently(c: Ctx, aj: ActiveJob, job: ObservedJob) -> Decision:
    """Exit 2: the run fails, named by the attempt report (read first), else the pod's cause."""
    o = c.o
    af = o.attempt_failure
    if af is None or (af.lap, af.attempt) != (aj.lap, aj.attempt):
        return Decision([ReadAttemptFailure(aj.lap, aj.attempt)])
    report = af.report or {}
    detail = cause_text(report.get("message") or report.get("error")) or job_cause(job) or "no failure report was written"
    where = f"lap {aj.lap} attempt {aj.attempt}"
    c.act(LapFinished(aj.lap, LapOutcome.PERMANENT_ERROR, max(0.0, (o.now - (aj.started_at or o.now)).total_seconds())))
    c.act(LapRetried(aj.lap, RetryReason.PERMANENT))
    if report.get("reason") == AttemptReason.CHECKPOINT_TOO_LARGE:
        return c.fail(Reason.CHECKPOINT_TOO_LARGE, f"{where}: {detail}. The store was left as it is; to go on, fork "
                      "the run from its last lap with a higher limit (agentrun fork --dry-run -o yaml, edit "
                      "spec.checkpoint, kubectl apply)", lap=aj.lap, attempt=aj.attempt)
    if report.get("reason") == AttemptReason.CHECKPOINT_UNREADABLE:
        return c.fail(Reason.CHECKPOINT_UNREADABLE, f"{where} cannot read the run's checkpoints: {detail}. The store "
                      "was left untouched; fix or migrate the object (or upgrade agentrun), then recreate the run",
                      lap=aj.lap, attempt=aj.attempt)
    return c.fail(Reason.LAP_FAILED_PERMANENTLY, f"{where} failed permanently: {detail}", lap=aj.lap,
                  attempt=aj.attempt)


def apply_lap(c: Ctx, cp: CheckpointRead, rec: LapRecord, outcome: LapOutcome | None = None) -> None:
    """Lap ``rec.lap`` is checkpointed: the run stands at it; then its outcome decides the phase.
    ``outcome``: the metric label of the attempt when not the record's own (exit 3)."""
    st = c.st
    usd = record_checkpoint(c, rec.lap, CheckpointRef(
        lap=rec.lap, key=cp.key or "", uri=cp.uri, sha256=cp.sha256 or "", written_at=cp.written_at,
        agent_version=rec.agent_version, schema_version=rec.schema_version,
        endpoint=cp.endpoint, region=cp.region, path_style=cp.path_style,
    ), rec.totals)
    st.active_job = None
    st.next_attempt_at = None
    duration = max(0.0, (rec.timings.finished_at - rec.timings.started_at).total_seconds())
    added = None
    if rec.storage is not None and cp.size is not None:
        total = StorageStatus(bytes=rec.storage.bytes + cp.size, objects=rec.storage.objects + 1)
        before = st.storage.bytes if st.storage is not None else 0
        added = total.bytes - before if 0 < before <= total.bytes else cp.size
        st.storage = total
    c.act(LapFinished(rec.lap, outcome or LapOutcome.of_checkpoint(rec.outcome.type), duration, added))
    c.event("Normal", Reason.LAP_CHECKPOINTED,
            f"lap {rec.lap} checkpointed ({rec.outcome.type}) by agent {rec.agent_version}; cost so far ${usd}")
    announce_tools_changed(c, rec)
    apply_outcome(c, rec.lap, rec.outcome, rec.pending_approval)


def next_step(c: Ctx) -> Decision:
    """No Job in flight: wait, stop, or start the next lap attempt."""
    o, st, spec = c.o, c.st, c.spec
    if st.phase in TERMINAL_PHASES:
        return c.finish()
    if st.phase == "AwaitingApproval" and st.approval is not None and st.approval.state == "Pending":
        timed_out = apply_timeout(c)
        if timed_out is not None:
            return timed_out
        if st.approval.state == "Pending":
            c.act(RequeueAfter(max(0.5, (st.approval.deadline - o.now).total_seconds())))
            return c.finish()
    elif st.phase == "AwaitingApproval" and st.approval is None:
        return c.finish()

    # The next attempt's Job exists already: a pass created it and its status write was lost. It
    # was started when everything below allowed it; adopt it (never create it again) and let it
    # end, whatever changed since (suspend, budget, policy: they apply from the next lap on).
    lap, attempt = next_lap_attempt(st)
    name = job_name(o.name, o.uid, lap, attempt)
    existing = next((j for j in o.jobs if j.name == name), None)
    if existing is not None:
        stop = adopt(c, existing)
        if stop is not None:
            return stop
        st.started_at = st.started_at or o.now
        st.next_attempt_at = None
        c.phase("Running", Reason.LAP_RUNNING,
                f"lap {lap} attempt {attempt} running (agent {existing.agent_version or spec.agent.version})")
        if existing.state != "active":
            c.act(RequeueAfter(0.0))  # it ended already: observe it on the next pass
        return c.finish()

    # An approved call is executed only for the target it was approved for: bound (an approval of an
    # earlier release), or asked again when the spec changed it since (ApprovalStale).
    ap = st.approval
    if ap is not None and ap.state == "Approved" and ap.lap == st.lap:
        read = bind_target(c, ap)
        if read is not None:
            return read
        again = st.approval
        if again is not ap and again is not None:
            c.act(RequeueAfter(max(0.5, (again.deadline - o.now).total_seconds())))
            return c.finish()
    decision_env = approval_env(st)

    if spec.suspend:
        if st.phase != "Suspended":
            c.phase("Suspended", Reason.SUSPENDED, f"suspended after lap {st.lap}; set spec.suspend=false to resume")
            c.event("Normal", Reason.SUSPENDED, f"run suspended after lap {st.lap}")
        return c.finish()
    if st.phase == "Suspended":
        c.event("Normal", Reason.RESUMED, f"run resumed at lap {st.lap + 1}")

    if st.next_attempt_at is not None and o.now < st.next_attempt_at and st.phase in ("Retrying", "Suspended"):
        if st.phase != "Retrying":
            c.phase("Retrying", Reason.LAP_RETRY, f"waiting for the backoff until {st.next_attempt_at.isoformat()}")
        c.act(RequeueAfter(max(0.5, (st.next_attempt_at - o.now).total_seconds())))
        return c.finish()

    if attempt > attempts_allowed(st, spec, lap):
        return c.fail(Reason.RETRIES_EXHAUSTED, f"lap {lap} already failed {attempt - 1} attempt(s)")
    if lap > spec.budget.max_laps:
        return c.fail(
            Reason.BUDGET_EXCEEDED, f"lap {lap} would pass spec.budget.maxLaps={spec.budget.max_laps}",
            phase="BudgetExceeded",
        )
    if spec.budget.max_cost_usd is not None and Decimal(st.cost.usd) >= Decimal(spec.budget.max_cost_usd):
        return c.fail(
            Reason.BUDGET_EXCEEDED,
            f"cost ${st.cost.usd} reached spec.budget.maxCostUSD=${spec.budget.max_cost_usd} before lap {lap}",
            phase="BudgetExceeded",
        )

    if o.policy_check is not None and not o.policy_check.ok:
        return c.fail(Reason.POLICY_VIOLATION, f"lap {lap} not started: {o.policy_check.message}")

    # The operator's admission policies are not in place: no lap starts (the shell queues the run
    # again when they are).
    if o.admission is not None:
        return hold_lap(c, lap, attempt)

    version = spec.agent.version
    # Write-ahead: the Job is created only once the API server holds what it executes (the decision
    # it carries, the store it writes to). Otherwise record that first; the Job follows next pass.
    if o.status.store is None or (decision_env is not None
                                  and (o.status.lap, approval_env(o.status)) != (st.lap, decision_env)):
        ap = st.approval
        after = f"call {ap.call_id} {decision_env.decision}; " if ap is not None and decision_env else ""
        c.phase("Running", Reason.LAP_STARTING, f"{after}lap {lap} attempt {attempt} starts (agent {version})")
        c.act(RequeueAfter(0.0))
        return c.finish()
    if attempt == 1 and st.agent_version and st.agent_version != version:
        c.event("Normal", Reason.VERSION_CHANGED,
                f"lap {lap} runs agent version {version} (lap {st.lap} ran {st.agent_version})", lap, attempt)
    queue = kueue.queue_name(c)
    c.act(CreateJob(lap=lap, attempt=attempt, agent_version=version, name=name, approval=decision_env,
                    store=o.status.store, queue_name=queue))
    st.active_job = ActiveJob(name=name, lap=lap, attempt=attempt, agent_version=version, started_at=o.now)
    if st.started_at is None:
        st.started_at = o.now
        requeue_at_deadline(c)
    st.next_attempt_at = None
    if queue is not None:
        return kueue.submitted(c, st.active_job, queue)
    c.phase("Running", Reason.LAP_RUNNING, f"lap {lap} attempt {attempt} running (agent {version})")
    return c.finish()


def adopt(c: Ctx, job: ObservedJob) -> Decision | None:
    """The Job of the run's next lap attempt exists although the status does not record it: the
    status write that followed its creation was lost (the operator stopped in between, or the write
    was refused). Adopt it (``st.active_job``), unless it carries another decision or store than
    the status: then it is deleted, with one Warning Event, and the attempt is retried with a new
    Job. Returns a Decision to stop with, or None once adopted."""
    o, st = c.o, c.st
    mismatch = adoption_mismatch(st, job)
    if mismatch is not None:
        c.act(DeleteJob(job.name))
        c.event("Warning", Reason.JOB_MISMATCH, f"Job {job.name} was not adopted: {mismatch}; it was deleted and "
                "the lap attempt is retried with a new Job", job.lap, job.attempt)
        return (record_retry(c, job.lap, job.attempt, RetryReason.JOB_MISMATCH, f"JobMismatch: {mismatch}")
                or next_step(c))
    st.active_job = ActiveJob(name=job.name, lap=job.lap, attempt=job.attempt,
                              agent_version=job.agent_version or c.spec.agent.version,
                              started_at=job.started_at or o.now)
    return None


def successors(aj: ActiveJob) -> tuple[tuple[int, int], tuple[int, int]]:
    """The lap attempts a pass may have started once ``aj`` ended, in a write the status then lost:
    the next lap (``aj`` checkpointed) or the next attempt of its lap (``aj`` failed)."""
    return (aj.lap + 1, 1), (aj.lap, aj.attempt + 1)
