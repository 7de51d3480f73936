"""Retries: what a failed lap attempt was (its typed reason and its cause), the backoff, and the
end of the attempts."""

from __future__ import annotations

from datetime import datetime, timedelta

from agentrun.api.contract import ExitCode
from agentrun.api.reasons import LapOutcome, Reason, RetryReason
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, LapRetries
from agentrun.api.text import one_line
from agentrun.api.types import parse_duration

from .actions import Decision, LapFinished, LapRetried, LostLapSpan
from .context import Ctx
from .observed import ObservedJob
from .text import cause_text, lap_cause, signal_name

MAX_RETRY_ENTRIES = 20
MAX_LAST_REASON_CHARS = 512
# Pod / Job reasons of an attempt that ended because its pod went away (the text head, as observed).
_EVICTION_HEADS = ("Evicted", "Preempting", "Preempted", "NodeLost", "NodeShutdown", "Shutdown", "Terminated",
                   "PodGone", "UnexpectedAdmissionError")


def next_lap_attempt(status: AgentRunStatus) -> tuple[int, int]:
    """The lap and attempt the next Job would run."""
    lap = status.lap + 1
    entry = next((r for r in status.retries if r.lap == lap), None)
    return lap, (entry.retries if entry else 0) + 1


def backoff_seconds(spec: AgentRunSpec, failed_attempt: int) -> float:
    """Delay after the ``failed_attempt``-th failed attempt: initial * factor^(n-1), capped."""
    b = spec.retry.backoff
    delay = parse_duration(b.initial) * (float(b.factor) ** max(0, failed_attempt - 1))
    return float(min(delay, parse_duration(b.max)))


def job_cause(job: ObservedJob) -> str | None:
    """The cause of a failed Job's attempt: the runner's message as the shell read it, else taken
    from the pod's termination message (bounded, secrets redacted)."""
    return cause_text(job.message) or lap_cause(job.termination_message)


def classify_failure(job: ObservedJob) -> tuple[RetryReason, str]:
    """The typed reason of a failed lap Job (not exit 2 or 3) and the human text of it: its head
    (``RetryableError``, ``DeadlineExceeded: ...``, ``OOMKilled``, ``exit code 137``) and its cause
    (``RetryableError: model endpoint http://m:8080/v1 unreachable (ConnectError)``)."""
    head = job.reason or (f"exit code {job.exit_code}" if job.exit_code is not None else "Failed")
    if job.exit_code is not None and job.exit_code > 128 and head in ("Error", f"exit code {job.exit_code}"):
        head = f"killed by {signal_name(job.exit_code - 128)} (exit code {job.exit_code})"
    first = head.split(":", 1)[0].strip()
    if first == "DeadlineExceeded":
        kind = RetryReason.TIMEOUT
    elif job.exit_code == ExitCode.RETRYABLE:
        kind, head = RetryReason.RETRYABLE_EXIT, "RetryableError"
    elif first == "OOMKilled":
        kind = RetryReason.OOM_KILLED
    elif first in _EVICTION_HEADS:
        kind = RetryReason.EVICTED
    else:
        kind = RetryReason.POD_FAILED
    cause = job_cause(job)
    return kind, f"{head}: {cause}" if cause else head


_SENT_ITS_SPAN = frozenset({RetryReason.RETRYABLE_EXIT, RetryReason.CHECKPOINT_MISSING, RetryReason.PERMANENT,
                            RetryReason.JOB_MISMATCH})
"""Failures after which the attempt's ``lap`` span is not the operator's to send: the runner exited by
itself (exit 75, exit 0 without a checkpoint, exit 2), or the Job was not the run's attempt."""


def lap_span_lost(kind: RetryReason, job: ObservedJob | None) -> bool:
    """Whether a failed attempt ended without sending its own ``lap`` span: its pod is gone or its
    exit is unknown (eviction, lapTimeout, a lost Job), it was OOM-killed, or it was killed by a
    signal other than SIGTERM (the runner handles SIGTERM: it ends its spans, sends them and exits
    143). Any other exit code went through the runner's exit, which sends the span."""
    if kind in _SENT_ITS_SPAN:
        return False
    if kind in (RetryReason.OOM_KILLED, RetryReason.JOB_MISSING) or job is None or job.exit_code is None:
        return True
    return job.exit_code > 128 and job.exit_code != ExitCode.TERMINATED


def record_retry(c: Ctx, lap: int, attempt: int, kind: RetryReason, reason: str,
                 started_at: datetime | None = None) -> Decision | None:
    """Record a failed attempt (status.retries[].lastReason holds ``reason``, cause included; the
    metrics get ``kind``). Returns the final Decision when the attempts are exhausted, else None
    (the run is Retrying; the caller goes on to the next step, which waits for the backoff)."""
    o, st = c.o, c.st
    reason = one_line(reason, MAX_LAST_REASON_CHARS)
    entries = {r.lap: r for r in st.retries}
    entry = entries.get(lap) or LapRetries(lap=lap, retries=0)
    entry.retries = max(entry.retries, attempt)
    entry.last_reason = reason
    entries[lap] = entry
    st.retries = sorted(entries.values(), key=lambda r: r.lap)[-MAX_RETRY_ENTRIES:]
    st.total_retries += 1
    st.active_job = None
    if started_at is not None:
        c.act(LapFinished(lap, LapOutcome.of_failure(kind), max(0.0, (o.now - started_at).total_seconds())))
    lost = None
    if o.tracing and started_at is not None:  # the attempt's lap span, when the attempt could not send it
        job = next((j for j in o.jobs if (j.lap, j.attempt) == (lap, attempt)), None)
        if lap_span_lost(kind, job):
            lost = LostLapSpan(attempt, started_at, max(o.now, started_at), reason)
    c.act(LapRetried(lap, kind, lost))
    lc = st.lifecycle
    base = lc.attempts_before_retry if lc is not None and lc.retried_lap == lap else 0
    allowed = c.spec.retry.attempts_per_lap
    if attempt - base >= allowed:
        since = f" since retry {lc.retries}" if base and lc is not None else ""
        return c.fail(Reason.RETRIES_EXHAUSTED,
                      f"lap {lap} failed {attempt - base} of {allowed} attempt(s){since}; last: {reason}",
                      lap=lap, attempt=attempt)
    delay = backoff_seconds(c.spec, attempt)
    st.next_attempt_at = o.now + timedelta(seconds=delay)
    c.phase("Retrying", Reason.LAP_RETRY,
            f"lap {lap} attempt {attempt} failed ({reason}); attempt {attempt + 1} in {delay:g}s")
    c.event("Warning", Reason.LAP_RETRY, f"lap {lap} attempt {attempt} failed ({reason}); retrying in {delay:g}s",
            lap, attempt)
    return None
