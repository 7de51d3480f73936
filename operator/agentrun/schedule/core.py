"""The schedule's functional core: :func:`plan` ``(now, schedule, runs) -> Plan``, pure.

It follows CronJob's controller (k8s.io/kubernetes pkg/controller/cronjob, ``syncCronJob`` and
``mostRecentScheduleTime``):

- the times not yet met are those after ``status.lastScheduleTime`` (else the creation time), or
  after ``now - startingDeadlineSeconds`` when that is later, up to ``now``; only the most recent
  one is started, and more than :data:`MISSED_WARNING` of them is a warning Event;
- the run of a time is named after it (:func:`agentrun.api.schedule.run_name`), so a run that
  exists already (created before a crash, before its status was written) is that time done;
- ``Forbid`` starts nothing while a run is active (the time stays unmet: as CronJob, it is started
  when the active run ends, if the starting deadline still allows); ``Replace`` cancels the active
  runs (``spec.cancel``) and starts the new one; ``Allow`` starts it beside them;
- ``suspend`` starts nothing; an invalid schedule or time zone starts nothing and says why;
- the history limits keep the newest runs of each outcome (Succeeded; every other end) and delete
  the rest;
- the next reconcile is due at the next scheduled time.

Events are said once: a skipped time and a refusal are recorded in the status (``lastSkipped``,
the Ready condition), and the Event goes with the change of that record only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from agentrun.api.reasons import ScheduleReason as R
from agentrun.api.schedule import ANN_SCHEDULED_AT, KIND, LABEL_SCHEDULE, AgentScheduleSpec, run_name
from agentrun.api.status import TERMINAL_PHASES
from agentrun.api.text import one_line
from agentrun.api.types import parse_time

from .cron import Cron, InvalidCron

#: More missed times than this since the last one started is a warning (CronJob's 100).
MISSED_WARNING = 100
#: A reconcile is due this long after the next scheduled time (CronJob's nextScheduleTimeDuration adds 100 ms).
REQUEUE_MARGIN_SECONDS = 0.1
#: The condition type of a schedule.
READY = "Ready"
#: Bound of a refusal's message in the status and the Event.
MAX_MESSAGE_CHARS = 1024
API_VERSION = "agentrun.dev/v1alpha1"


def fmt(t: datetime) -> str:
    """RFC 3339 in UTC, seconds (the API server's form)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Run:
    """A run the schedule owns, as the plan needs it."""

    name: str
    uid: str
    phase: str | None = None
    scheduled: datetime | None = None  # annotation agentrun.dev/scheduled-at
    created: datetime | None = None
    completed: datetime | None = None  # status.completedAt
    cancelling: bool = False  # spec.cancel is set
    deleting: bool = False  # metadata.deletionTimestamp is set

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def when(self) -> datetime:
        """Its place in the history: the scheduled time, else the creation time."""
        return self.scheduled or self.created or datetime.min.replace(tzinfo=UTC)

    @classmethod
    def of(cls, body: dict[str, Any]) -> Run:
        meta = body.get("metadata") or {}
        st = body.get("status") or {}
        return cls(
            name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""), phase=st.get("phase"),
            scheduled=parse_time((meta.get("annotations") or {}).get(ANN_SCHEDULED_AT)),
            created=parse_time(meta.get("creationTimestamp")), completed=parse_time(st.get("completedAt")),
            cancelling=(body.get("spec") or {}).get("cancel") is not None,
            deleting=bool(meta.get("deletionTimestamp")))


@dataclass(frozen=True)
class Schedule:
    """An AgentSchedule as the plan needs it: its identity and its raw spec and status."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: datetime
    spec: dict[str, Any]
    status: dict[str, Any]
    deleting: bool = False

    @classmethod
    def of(cls, body: dict[str, Any]) -> Schedule:
        meta = body.get("metadata") or {}
        return cls(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                   uid=str(meta.get("uid") or ""), generation=int(meta.get("generation") or 0),
                   created=parse_time(meta.get("creationTimestamp")) or datetime.min.replace(tzinfo=UTC),
                   spec=body.get("spec") or {}, status=body.get("status") or {},
                   deleting=bool(meta.get("deletionTimestamp")))

    def owns(self, run: dict[str, Any]) -> bool:
        """``run`` is this schedule's: its label names it and this schedule (its UID) is its controller."""
        meta = run.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_SCHEDULE) != self.name:
            return False
        return any(o.get("uid") == self.uid and o.get("controller") for o in meta.get("ownerReferences") or [])


# ------------------------------------------------------------------------------------ actions

@dataclass(frozen=True)
class CreateRun:
    name: str
    scheduled: datetime
    body: dict[str, Any] = field(compare=False, hash=False)


@dataclass(frozen=True)
class CancelRun:
    """Set spec.cancel on an active run (concurrencyPolicy Replace)."""

    name: str
    uid: str
    reason: str


@dataclass(frozen=True)
class DeleteRun:
    """Delete an ended run past the history limit."""

    name: str
    uid: str


@dataclass(frozen=True)
class Event:
    type: str  # Normal, Warning
    reason: str
    message: str


Action = CreateRun | CancelRun | DeleteRun | Event


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    #: The whole new status (wire form), or None when it does not change.
    status: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    #: Seconds until the next reconcile is due (the next scheduled time), or None: none is due.
    requeue_after: float | None = None

    def of(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


# ------------------------------------------------------------------------------------ the plan

def _condition(old: dict[str, Any], sched: Schedule, status: str, reason: str, message: str,
               now: datetime) -> dict[str, Any]:
    prev = next((c for c in old.get("conditions") or [] if c.get("type") == READY), None)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {"type": READY, "status": status, "reason": reason, "message": message,
            "observedGeneration": sched.generation, "lastTransitionTime": since or fmt(now)}


def _said(old: dict[str, Any], cond: dict[str, Any]) -> bool:
    """The condition was already in the status (so its Event was posted)."""
    return any(c.get("type") == READY and all(c.get(k) == cond[k] for k in ("status", "reason", "message"))
               for c in old.get("conditions") or [])


def run_body(sched: Schedule, scheduled: datetime) -> dict[str, Any]:
    """The AgentRun of ``scheduled``: the template's spec as written (no defaults filled in), its
    labels and annotations, the schedule's label and the scheduled time, owned by the schedule."""
    template = sched.spec.get("runTemplate") or {}
    tmeta = template.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": run_name(sched.name, scheduled),
            "namespace": sched.namespace,
            "labels": {**(tmeta.get("labels") or {}), LABEL_SCHEDULE: sched.name},
            "annotations": {**(tmeta.get("annotations") or {}), ANN_SCHEDULED_AT: fmt(scheduled)},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": sched.name, "uid": sched.uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": template.get("spec") or {},
    }


def _history(runs: list[Run], spec: AgentScheduleSpec | None, limits: tuple[int, int] | None) -> list[DeleteRun]:
    """The ended runs past the history limits, newest kept (none when the limits are unknown)."""
    if limits is None:
        return []
    ok_limit, bad_limit = limits
    ended = sorted((r for r in runs if r.ended and not r.deleting), key=lambda r: (r.when, r.name), reverse=True)
    ok = [r for r in ended if r.phase == "Succeeded"]
    bad = [r for r in ended if r.phase != "Succeeded"]
    return [DeleteRun(r.name, r.uid) for r in ok[ok_limit:] + bad[bad_limit:]]


def _ended_status(old: dict[str, Any], runs: list[Run]) -> dict[str, Any]:
    """lastSuccessfulTime and lastRun from the ended runs (kept from the old status when the runs
    it named were deleted)."""
    out: dict[str, Any] = {}
    last_ok = parse_time(old.get("lastSuccessfulTime"))
    for r in runs:
        if r.phase == "Succeeded" and r.completed and (last_ok is None or r.completed > last_ok):
            last_ok = r.completed
    if last_ok is not None:
        out["lastSuccessfulTime"] = fmt(last_ok)
    ended = [r for r in runs if r.ended]
    if ended:
        newest = max(ended, key=lambda r: (r.when, r.name))
        last: dict[str, Any] = {"name": newest.name, "phase": newest.phase}
        if newest.scheduled:
            last["scheduledTime"] = fmt(newest.scheduled)
        if newest.completed:
            last["completionTime"] = fmt(newest.completed)
        old_last = old.get("lastRun") or {}
        old_when = parse_time(old_last.get("scheduledTime"))
        if not old_last or old_when is None or newest.scheduled is None or newest.scheduled >= old_when:
            out["lastRun"] = last
        else:
            out["lastRun"] = old_last
    elif old.get("lastRun"):
        out["lastRun"] = old["lastRun"]
    return out


def _active(runs: list[Run]) -> list[dict[str, Any]]:
    out = []
    for r in sorted(runs, key=lambda r: (r.when, r.name)):
        ref: dict[str, Any] = {"name": r.name}
        if r.uid:  # a run just created has none until the cache has it
            ref["uid"] = r.uid
        if r.scheduled:
            ref["scheduledTime"] = fmt(r.scheduled)
        out.append(ref)
    return out


def _finish(sched: Schedule, actions: list[Action], status: dict[str, Any],
            requeue: float | None) -> Plan:
    """The plan, with the status only when it changed."""
    return Plan(tuple(actions), None if status == sched.status else status, requeue)


def plan(now: datetime, sched: Schedule, owned: list[dict[str, Any]] | list[Run]) -> Plan:
    """What to do for ``sched`` at ``now``, given the runs it owns (bodies or :class:`Run`)."""
    runs = [r if isinstance(r, Run) else Run.of(r) for r in owned]
    old = sched.status
    if sched.deleting:
        return Plan()
    live = [r for r in runs if not r.deleting]
    active = [r for r in live if not r.ended]
    status: dict[str, Any] = {k: v for k, v in old.items() if k in ("lastScheduleTime", "lastSkipped")}
    status["observedGeneration"] = sched.generation
    status.update(_ended_status(old, live))
    actions: list[Action] = []

    try:
        spec: AgentScheduleSpec | None = AgentScheduleSpec.model_validate(sched.spec)
    except ValidationError as exc:
        spec = None
        problem: tuple[str, str] | None = (R.INVALID_SPEC, one_line(f"the spec does not parse: {exc}", MAX_MESSAGE_CHARS))
    cron: Cron | None = None
    if spec is not None:
        try:
            cron = Cron.parse(spec.schedule, spec.time_zone)
            problem = None
        except InvalidCron as exc:
            problem = (R.INVALID_TIME_ZONE if exc.field == "spec.timeZone" else R.INVALID_SCHEDULE, str(exc))
    limits = None if spec is None else (spec.successful_runs_history_limit, spec.failed_runs_history_limit)
    actions += _history(live, spec, limits)

    def done(cond: dict[str, Any], requeue: float | None, event_type: str = "Warning") -> Plan:
        status["active"] = _active(active)
        status["activeCount"] = len(active)
        status["conditions"] = [cond]
        if cond["reason"] != R.SCHEDULING and cond["reason"] != R.SUSPENDED and not _said(old, cond):
            actions.append(Event(event_type, cond["reason"], cond["message"]))
        return _finish(sched, actions, status, requeue)

    if problem is not None or spec is None or cron is None:
        reason, message = problem or (R.INVALID_SPEC, "the spec does not parse")
        return done(_condition(old, sched, "False", reason, message, now), None)
    if spec.suspend:
        return done(_condition(old, sched, "False", R.SUSPENDED, "spec.suspend is true: no new runs start", now),
                    None)

    ready = _condition(old, sched, "True", R.SCHEDULING,
                       f"next run at {fmt(cron.after(now))}", now)
    requeue = max(0.0, (cron.after(now) - now).total_seconds()) + REQUEUE_MARGIN_SECONDS
    last = parse_time(old.get("lastScheduleTime"))
    since = last or sched.created
    earliest = since
    deadline = spec.starting_deadline_seconds
    if deadline is not None:
        earliest = max(earliest, now - timedelta(seconds=deadline))
    due = cron.latest(earliest, now)

    def skip(t: datetime, reason: str, event_type: str, message: str) -> Plan:
        entry = {"time": fmt(t), "reason": reason}
        if old.get("lastSkipped") != entry:
            actions.append(Event(event_type, reason, message))
        status["lastSkipped"] = entry
        return done(ready, requeue)

    if due is None:
        missed = cron.latest(since, now) if deadline is not None else None
        if missed is not None:
            return skip(missed, R.STARTING_DEADLINE_EXCEEDED, "Warning",
                        f"the run for {fmt(missed)} was not started: more than startingDeadlineSeconds "
                        f"({deadline}) have passed since")
        return done(ready, requeue)

    name = run_name(sched.name, due)
    if any(r.name == name for r in runs):  # created before (a crash before its status was written)
        status["lastScheduleTime"] = fmt(max(due, last) if last else due)
        return done(ready, requeue)

    if active and spec.concurrency_policy == "Forbid":
        return skip(due, R.RUN_ALREADY_ACTIVE, "Normal",
                    f"the run for {fmt(due)} was not started: concurrencyPolicy is Forbid and "
                    + ", ".join(r.name for r in active[:5]) + (" is" if len(active) == 1 else " are") + " active")
    if active and spec.concurrency_policy == "Replace":
        for r in active:
            if not r.cancelling:
                actions.append(CancelRun(r.name, r.uid, f"replaced by {name} (schedule {sched.name}, "
                                                        "concurrencyPolicy Replace)"))
                actions.append(Event("Normal", R.RUN_REPLACED, f"cancelled {r.name}: replaced by {name} "
                                     "(concurrencyPolicy Replace)"))

    missed_count = cron.count(earliest, now, MISSED_WARNING + 1)
    if missed_count > MISSED_WARNING:
        actions.append(Event("Warning", R.TOO_MANY_MISSED_TIMES,
                             f"more than {MISSED_WARNING} scheduled times were missed; only the latest, {fmt(due)}, "
                             "is started (set startingDeadlineSeconds to bound the catch-up)"))
    actions.append(CreateRun(name, due, run_body(sched, due)))
    actions.append(Event("Normal", R.RUN_CREATED, f"created {name} for the scheduled time {fmt(due)}"))
    status["lastScheduleTime"] = fmt(due)
    active = active + [Run(name=name, uid="", phase=None, scheduled=due)]
    plan_ = done(ready, requeue)
    return plan_


def refused(now: datetime, sched: Schedule, name: str, message: str) -> Plan:
    """The API server refused to create run ``name``: condition Ready False (RunRefused) with its
    message, and one Event while the refusal stays the same. The time stays unmet (tried again with
    backoff by the shell)."""
    status = dict(sched.status)
    msg = one_line(f"the API server refused to create {name}: {message}", MAX_MESSAGE_CHARS)
    cond = _condition(sched.status, sched, "False", R.RUN_REFUSED, msg, now)
    actions: tuple[Action, ...] = () if _said(sched.status, cond) else (Event("Warning", R.RUN_REFUSED, msg),)
    status["conditions"] = [cond]
    status["observedGeneration"] = sched.generation
    return Plan(actions, None if status == sched.status else status, None)
