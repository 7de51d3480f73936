"""Kueue: a lap Job submitted to a LocalQueue waits, suspended, until Kueue admits it.

The Job is created suspended with the queue label (``decide/jobs.py``). While it stays suspended
the run is ``Queued`` with reason ``KueueQueued`` and ``status.kueue`` names the Job, its LocalQueue
and the Workload Kueue made of it (read by the shell: ``controller/kueueview.py``). The run keeps
its slot under an AgentRunPolicy's ``maxActiveRuns`` (it has started). Once Kueue unsuspends the
Job the run is ``Running`` and ``status.kueue`` is cleared; the lap's duration counts from then.

Nothing else changes: the Job's ``activeDeadlineSeconds`` (spec.lapTimeout) counts from its start,
which the Job controller resets when it resumes a suspended Job, so a wait in Kueue's queue never
uses the lap's time. A Job that Kueue evicts (preemption) is suspended again: its pod gets SIGTERM
and the run is ``Queued`` again; the Job's next pod runs the same attempt with the same idempotency
keys, so what the lap journaled is answered from the journal. docs/scheduling.md#kueue.
"""

from __future__ import annotations

from agentrun.api.reasons import Reason
from agentrun.api.status import ActiveJob, KueueStatus
from agentrun.api.text import one_line

from .actions import Decision, RequeueAfter
from .context import Ctx
from .observed import ObservedJob, WorkloadRead

#: How often a run whose Job Kueue holds is looked at again (the Workload's message is re-read then).
HELD_RECHECK_SECONDS = 60.0
#: How soon a held Job's Workload is looked for again while Kueue has not made it yet.
WORKLOAD_MISSING_RECHECK_SECONDS = 5.0
MAX_KUEUE_MESSAGE_CHARS = 300


def queue_name(c: Ctx) -> str | None:
    """The LocalQueue of the run's next lap Job: spec.queueName, else the namespace's policy default."""
    return c.spec.queue_name or c.o.default_queue_name


def submitted(c: Ctx, aj: ActiveJob, queue: str) -> Decision:
    """A lap Job was just created suspended in ``queue``: the run is Queued until Kueue admits it
    (the status the next pass writes when it sees the Job held, so that pass writes nothing new)."""
    c.st.kueue = KueueStatus(local_queue=queue, job=aj.name, since=c.o.now)
    message, recheck = _hold(aj, aj.name, queue, None)
    c.phase("Queued", Reason.KUEUE_QUEUED, message)
    c.act(RequeueAfter(recheck))
    return c.finish()


def is_held(job: ObservedJob) -> bool:
    """The active Job is held: suspended (by agentrun for its LocalQueue, or by Kueue's webhook where
    Kueue manages Jobs without a queue name); it starts when it is unsuspended."""
    return job.state == "active" and job.suspended


def held(c: Ctx, aj: ActiveJob, job: ObservedJob) -> Decision:
    """Kueue holds the run's Job: phase Queued, ``status.kueue`` with the Workload when the shell
    found it and Kueue's own reason for the wait."""
    o, st = c.o, c.st
    previous = st.kueue if st.kueue is not None and st.kueue.job == job.name else None
    wl: WorkloadRead | None = o.workload if o.workload is not None and o.workload.job == job.name else None
    workload = wl.name if wl is not None and wl.kind == "ok" else (previous.workload if previous else None)
    st.kueue = KueueStatus(local_queue=job.queue_name, job=job.name, workload=workload,
                           since=previous.since if previous is not None else o.now)
    message, recheck = _hold(aj, job.name, job.queue_name, wl)
    if (o.now - st.kueue.since).total_seconds() >= HELD_RECHECK_SECONDS:
        recheck = HELD_RECHECK_SECONDS  # Kueue did not make the Workload in a minute: look less often
    c.phase("Queued", Reason.KUEUE_QUEUED, message)
    c.act(RequeueAfter(recheck))
    return c.finish()


def _hold(aj: ActiveJob, job: str, queue: str | None, wl: WorkloadRead | None) -> tuple[str, float]:
    """The message of a run whose Job Kueue holds, and how soon to look again."""
    where = (f"lap {aj.lap} attempt {aj.attempt}: Job {job} waits for Kueue in LocalQueue {queue}" if queue else
             f"lap {aj.lap} attempt {aj.attempt}: Job {job} is suspended (it has no queue label: held by Kueue "
             "managing Jobs without a queue name, or by someone who suspended it)")
    if wl is None or wl.kind == "missing":
        why = "Kueue has not made a Workload of it yet (is Kueue running, and does the LocalQueue exist?)"
        recheck = WORKLOAD_MISSING_RECHECK_SECONDS
    elif wl.kind == "unavailable":
        why = f"its Workload cannot be read: {wl.message or 'unknown error'}"
        recheck = HELD_RECHECK_SECONDS
    else:
        why = f"Workload {wl.name}" + (f": {one_line(wl.message, MAX_KUEUE_MESSAGE_CHARS)}" if wl.message else "")
        recheck = HELD_RECHECK_SECONDS
    return f"{where}; {why}", recheck


def released(c: Ctx, aj: ActiveJob, job: ObservedJob | None) -> None:
    """Kueue admitted the Job (or it is gone): ``status.kueue`` is cleared and the attempt's start
    moves to the Job's own start, so the lap's duration does not count the wait."""
    st = c.st
    if st.kueue is None:
        return
    if job is not None and job.name == st.kueue.job and job.started_at is not None \
            and (aj.started_at is None or job.started_at > aj.started_at):
        aj.started_at = job.started_at
    st.kueue = None
