"""The schedule's pure core, agentrun.schedule.core.plan: CronJob's rules, example by example and
by hypothesis (never two runs for one time, Forbid never starts beside an active run, Replace
cancels the active runs, the history keeps the newest N of each outcome)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.reasons import ScheduleReason as R
from agentrun.api.schedule import ANN_SCHEDULED_AT, LABEL_SCHEDULE, run_name
from agentrun.schedule.core import CancelRun, CreateRun, DeleteRun, Event, Run, Schedule, fmt, plan, refused

T0 = datetime(2030, 1, 1, 0, 0, tzinfo=UTC)
TEMPLATE = {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {"task": "nightly", "agent": {"version": "v1", "model": {"provider": "scripted",
                                                                             "script": [{"content": "done"}]}}}}


def sched(status: dict[str, Any] | None = None, created: datetime = T0, generation: int = 1, **spec: Any) -> Schedule:
    return Schedule(namespace="ns", name="nightly", uid="sched-uid", generation=generation, created=created,
                    spec={"schedule": "* * * * *", "runTemplate": TEMPLATE, **spec}, status=status or {})


def run(minute: int, phase: str | None = None, **kw: Any) -> Run:
    t = T0 + timedelta(minutes=minute)
    return Run(name=run_name("nightly", t), uid=f"uid-{minute}", phase=phase, scheduled=t, created=t,
               completed=t + timedelta(seconds=30) if phase in ("Succeeded", "Failed", "Cancelled") else None, **kw)


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


# ------------------------------------------------------------------------------------ examples

def test_nothing_before_the_first_time_then_the_run_of_that_time():
    p = plan(at(0.5), sched(), [])
    assert p.of(CreateRun) == []
    assert p.requeue_after == pytest.approx(30.1)
    p = plan(at(1), sched(), [])
    (create,) = p.of(CreateRun)
    assert create.name == f"nightly-{int(at(1).timestamp()) // 60}" == run_name("nightly", at(1))
    assert p.status and p.status["lastScheduleTime"] == fmt(at(1)) and p.status["activeCount"] == 1
    meta = create.body["metadata"]
    assert meta["labels"] == {"team": "a", LABEL_SCHEDULE: "nightly"}
    assert meta["annotations"] == {"note": "x", ANN_SCHEDULED_AT: "2030-01-01T00:01:00Z"}
    assert meta["ownerReferences"] == [{"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentSchedule",
                                        "name": "nightly", "uid": "sched-uid", "controller": True,
                                        "blockOwnerDeletion": True}]
    assert create.body["spec"] == TEMPLATE["spec"]  # as written: no defaults filled in
    assert [e.reason for e in p.of(Event)] == [R.RUN_CREATED]


def test_a_run_that_exists_already_is_that_time_done():
    """A crash after the create, before the status: the restarted operator creates nothing."""
    p = plan(at(1), sched(), [run(1)])
    assert p.of(CreateRun) == [] and p.of(Event) == []
    assert p.status and p.status["lastScheduleTime"] == fmt(at(1))


def test_after_downtime_only_the_most_recent_missed_time_starts():
    s = sched({"lastScheduleTime": fmt(at(1))})
    p = plan(at(10.5), s, [run(1, "Succeeded")])
    assert [c.name for c in p.of(CreateRun)] == [run_name("nightly", at(10))]


def test_more_than_100_missed_times_warn_once_with_the_create():
    p = plan(at(500), sched(), [])
    assert [c.scheduled for c in p.of(CreateRun)] == [at(500)]
    assert [e.reason for e in p.of(Event) if e.type == "Warning"] == [R.TOO_MANY_MISSED_TIMES]


def test_starting_deadline_skips_a_time_too_old_and_says_so_once():
    s = sched({"lastScheduleTime": fmt(at(1))}, startingDeadlineSeconds=20)
    p = plan(at(5.5), s, [])  # 00:05 is 30 s old: too late
    assert p.of(CreateRun) == []
    assert p.status and p.status["lastSkipped"] == {"time": fmt(at(5)), "reason": R.STARTING_DEADLINE_EXCEEDED}
    assert [e.reason for e in p.of(Event)] == [R.STARTING_DEADLINE_EXCEEDED]
    again = plan(at(5.6), sched(p.status, startingDeadlineSeconds=20), [])
    assert again.of(Event) == [] and again.status is None  # said once, nothing changed
    within = plan(at(6.2), sched(p.status, startingDeadlineSeconds=20), [])
    assert [c.scheduled for c in within.of(CreateRun)] == [at(6)]


def test_forbid_skips_while_one_is_active_and_starts_the_time_when_it_ends():
    s = sched({"lastScheduleTime": fmt(at(1))}, concurrencyPolicy="Forbid")
    p = plan(at(2), s, [run(1, "Running")])
    assert p.of(CreateRun) == []
    assert [e.reason for e in p.of(Event)] == [R.RUN_ALREADY_ACTIVE]
    assert p.status and p.status["lastSkipped"]["time"] == fmt(at(2))
    s2 = sched(p.status, concurrencyPolicy="Forbid")
    assert plan(at(2.5), s2, [run(1, "Running")]).of(Event) == []  # one Event per skipped time
    # as CronJob: the unmet time starts when the active run ends (no startingDeadlineSeconds)
    assert [c.scheduled for c in plan(at(2.7), s2, [run(1, "Succeeded")]).of(CreateRun)] == [at(2)]


def test_replace_cancels_the_active_run_and_starts_the_new_one():
    s = sched({"lastScheduleTime": fmt(at(1))}, concurrencyPolicy="Replace")
    p = plan(at(2), s, [run(1, "Running")])
    assert p.of(CancelRun) == [CancelRun(run(1).name, "uid-1", p.of(CancelRun)[0].reason)]
    assert "replaced by nightly-" in p.of(CancelRun)[0].reason
    assert [c.scheduled for c in p.of(CreateRun)] == [at(2)]
    assert plan(at(2), s, [run(1, "Running", cancelling=True)]).of(CancelRun) == []


def test_allow_starts_beside_the_active_run():
    s = sched({"lastScheduleTime": fmt(at(1))})
    p = plan(at(2), s, [run(1, "Running")])
    assert [c.scheduled for c in p.of(CreateRun)] == [at(2)] and p.of(CancelRun) == []
    assert p.status and [a["name"] for a in p.status["active"]] == [run(1).name, run(2).name]


def test_history_keeps_the_newest_of_each_outcome():
    runs = [run(1, "Succeeded"), run(2, "Failed"), run(3, "Succeeded"), run(4, "Cancelled"), run(5, "Succeeded"),
            run(6, "Succeeded"), run(7, "Running")]
    s = sched({"lastScheduleTime": fmt(at(7))}, successfulRunsHistoryLimit=2, failedRunsHistoryLimit=1)
    p = plan(at(7.5), s, runs)
    assert sorted(d.name for d in p.of(DeleteRun)) == sorted([run(1).name, run(3).name, run(2).name])
    assert p.status and p.status["lastRun"]["name"] == run(6).name
    assert p.status["lastSuccessfulTime"] == fmt(at(6) + timedelta(seconds=30))
    # a run already being deleted is not deleted again, and not counted
    p2 = plan(at(7.5), s, [*runs[:2], Run(**{**run(3, "Succeeded").__dict__, "deleting": True}), *runs[3:]])
    assert sorted(d.name for d in p2.of(DeleteRun)) == sorted([run(1).name, run(2).name])


def test_suspend_starts_nothing():
    p = plan(at(3), sched(suspend=True), [])
    assert p.of(CreateRun) == [] and p.requeue_after is None
    assert p.status and p.status["conditions"][0]["reason"] == R.SUSPENDED


@pytest.mark.parametrize(("spec", "reason", "text"), [
    ({"schedule": "99 * * * *"}, R.INVALID_SCHEDULE, "spec.schedule: '99 * * * *' is not a cron expression: Bad minute"),
    ({"schedule": "0 0 30 2 *"}, R.INVALID_SCHEDULE, "spec.schedule: '0 0 30 2 *' is not a cron expression"),
    ({"timeZone": "Mars/Olympus"}, R.INVALID_TIME_ZONE, "spec.timeZone: unknown time zone 'Mars/Olympus'"),
])
def test_a_schedule_cron_refuses_is_a_condition_and_one_event(spec, reason, text):
    p = plan(at(3), sched(**spec), [])
    assert p.of(CreateRun) == [] and p.requeue_after is None
    cond = p.status["conditions"][0]
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", reason, 1)
    assert cond["message"].startswith(text)
    assert [(e.type, e.reason) for e in p.of(Event)] == [("Warning", reason)]
    again = plan(at(4), sched(p.status, **spec), [])
    assert again.of(Event) == [] and again.status is None  # no second Event, no write: no hot loop


def test_time_zone_moves_the_times():
    s = sched(schedule="0 3 * * *", timeZone="Europe/Berlin")
    p = plan(datetime(2030, 1, 2, 2, 0, 30, tzinfo=UTC), s, [])  # 03:00 Berlin = 02:00 UTC in winter
    assert [c.scheduled for c in p.of(CreateRun)] == [datetime(2030, 1, 2, 2, 0, tzinfo=UTC)]


def test_macros():
    p = plan(datetime(2030, 1, 2, 0, 0, 5, tzinfo=UTC), sched(schedule="@daily"), [])
    assert [c.scheduled for c in p.of(CreateRun)] == [datetime(2030, 1, 2, tzinfo=UTC)]


def test_refused_create_is_a_condition_and_one_event():
    s = sched()
    r = refused(at(1), s, "nightly-1", "admission webhook said no\n\x1b[31m")
    assert r.status and r.status["conditions"][0]["reason"] == R.RUN_REFUSED
    assert "\\n\\x1b[31m" in r.status["conditions"][0]["message"]  # control characters escaped
    assert [e.reason for e in r.actions if isinstance(e, Event)] == [R.RUN_REFUSED]
    again = refused(at(1.1), sched(r.status), "nightly-1", "admission webhook said no\n\x1b[31m")
    assert again.actions == () and again.status is None
    # once the create goes through, Ready is True again (and the status is written)
    ok = plan(at(1.2), sched(r.status), [])
    assert ok.status and ok.status["conditions"][0]["reason"] == R.SCHEDULING


def test_steady_state_writes_nothing():
    p = plan(at(1), sched(), [])
    s2 = sched(p.status)
    p2 = plan(at(1.5), s2, [run(1)])
    s3 = sched(p2.status or s2.status)
    p3 = plan(at(1.6), s3, [run(1)])
    assert p3.status is None and p3.actions == ()


# ------------------------------------------------------------------------------------ hypothesis

PHASES = [None, "Pending", "Running", "Succeeded", "Failed", "Cancelled", "BudgetExceeded"]


@st.composite
def histories(draw: Any) -> tuple[list[Run], int, int, str]:
    minutes = draw(st.lists(st.integers(0, 60), unique=True, max_size=12))
    runs = [run(m, draw(st.sampled_from(PHASES))) for m in minutes]
    return runs, draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.sampled_from(["Allow", "Forbid", "Replace"]))


@settings(max_examples=300, deadline=None)
@given(histories(), st.floats(0, 70), st.one_of(st.none(), st.integers(0, 61)), st.one_of(st.none(), st.integers(0, 600)))
def test_plan_invariants(history, now_min, last_min, deadline):
    runs, ok_limit, bad_limit, policy = history
    status = {"lastScheduleTime": fmt(at(last_min))} if last_min is not None else {}
    spec: dict[str, Any] = {"concurrencyPolicy": policy, "successfulRunsHistoryLimit": ok_limit,
                            "failedRunsHistoryLimit": bad_limit}
    if deadline is not None:
        spec["startingDeadlineSeconds"] = deadline
    s = sched(status, **spec)
    now = at(now_min)
    p = plan(now, s, runs)
    creates = p.of(CreateRun)
    active = [r for r in runs if not r.ended]
    # at most one run per plan, never for a time that has a run, never in the future
    assert len(creates) <= 1
    for c in creates:
        assert c.name not in {r.name for r in runs}
        assert c.scheduled <= now and c.name == run_name("nightly", c.scheduled)
        if last_min is not None:
            assert c.scheduled > at(last_min)
        if deadline is not None:
            assert c.scheduled >= now - timedelta(seconds=deadline)
    # Forbid never starts beside an active run; Replace cancels every active run it starts beside
    if policy == "Forbid" and active:
        assert creates == []
    if policy == "Replace" and creates:
        assert {c.name for c in p.of(CancelRun)} == {r.name for r in active if not r.cancelling}
    if policy != "Replace":
        assert p.of(CancelRun) == []
    # the history keeps the newest N of each outcome and deletes only ended runs
    deleted = {d.name for d in p.of(DeleteRun)}
    ended = sorted((r for r in runs if r.ended), key=lambda r: r.when, reverse=True)
    ok = [r.name for r in ended if r.phase == "Succeeded"]
    bad = [r.name for r in ended if r.phase != "Succeeded"]
    assert deleted == set(ok[ok_limit:]) | set(bad[bad_limit:])
    # the next reconcile is due at the next scheduled time
    assert p.requeue_after is not None and 0 < p.requeue_after <= 60.1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 30), min_size=1, max_size=25), st.sampled_from(["Allow", "Forbid", "Replace"]))
def test_replaying_plans_never_creates_one_time_twice(nows, policy):
    """Apply the plans in order over a simulated store (the creates, the status; runs end at random
    as given by the ordering): each scheduled time gets at most one run."""
    status: dict[str, Any] = {}
    runs: dict[str, Run] = {}
    created: list[str] = []
    for i, m in enumerate(sorted(nows)):
        p = plan(at(m), sched(status, concurrencyPolicy=policy), list(runs.values()))
        for c in p.of(CreateRun):
            created.append(c.name)
            runs[c.name] = Run(name=c.name, uid=c.name, phase="Running", scheduled=c.scheduled, created=at(m))
        for x in p.of(CancelRun):
            runs[x.name] = Run(**{**runs[x.name].__dict__, "phase": "Cancelled"})
        if p.status is not None:
            status = p.status
        if i % 3 == 2:  # now and then every run ends
            runs = {k: Run(**{**r.__dict__, "phase": "Succeeded"}) for k, r in runs.items()}
    assert len(created) == len(set(created))
