"""Property tests of decide(): random sequences of cluster/user events never break the invariants."""

from __future__ import annotations

from datetime import timedelta

from controller_world import World, fork_read, make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.controller import decide as d

EVENTS = st.one_of(
    st.tuples(st.just("finish"), st.sampled_from(["continue", "continue", "done", "failed", "awaiting-approval"])),
    st.tuples(st.just("exit"), st.sampled_from([75, 3, 2, 137, None])),
    st.tuples(st.just("tick"), st.floats(min_value=0.1, max_value=20)),
    st.tuples(st.just("annotate"), st.sampled_from(["true", "false", "bogus"])),
    st.tuples(st.just("suspend"), st.booleans()),
    st.tuples(st.just("version"), st.sampled_from(["v1", "v2", "v3"])),
    st.tuples(st.just("lose-job"), st.none()),
    st.tuples(st.just("restart"), st.none()),
)


FORK = {"name": "src", "uid": "5eed0000-0000-0000-0000-000000000000", "lap": 2}
FORKS = {  # forkFrom lap 2, and what the shell reports for the fork snapshot
    None: [],
    "continue": [fork_read(2)],
    "awaiting-approval": [fork_read(2, outcome="awaiting-approval", pending=True)],
    "outage-then-continue": [fork_read(2, kind="unavailable"), fork_read(2)],
    "missing": [fork_read(2, kind="missing")],
}


def _spec(suspend: bool, version: str, attempts: int, on_timeout: str, fork: str | None = None):
    extra = {"forkFrom": FORK} if fork else {}
    return make_spec(
        **extra,
        suspend=suspend,
        agent={"version": version, "model": {"provider": "scripted", "script": [{"content": "x"}]}},
        retry={"attemptsPerLap": attempts, "backoff": {"initial": "1s", "max": "4s", "factor": 2}},
        approval={"owner": "ops", "timeout": "5s", "onTimeout": on_timeout},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(EVENTS, max_size=40),
    attempts=st.integers(min_value=1, max_value=4),
    on_timeout=st.sampled_from(["reject", "fail"]),
    fork=st.sampled_from(sorted(FORKS, key=str)),
)
def test_invariants(events, attempts, on_timeout, fork):
    suspend, version = False, "v1"
    w = World(_spec(suspend, version, attempts, on_timeout, fork), fork_reads=list(FORKS[fork]))
    for kind, arg in events:
        before = w.status
        if kind == "finish" and w.status.active_job and w.status.active_job.name in w.jobs:
            w.finish_job(arg, pending=(arg == "awaiting-approval"))
        elif kind == "exit" and w.status.active_job and w.status.active_job.name in w.jobs:
            if arg == 3:
                w.finish_job("continue", exit_code=3)
            else:
                w.fail_job(arg)
        elif kind == "tick":
            w.now += timedelta(seconds=arg)
        elif kind == "annotate":
            w.annotations["approved"] = arg
        elif kind == "suspend":
            suspend = arg
            w.generation += 1
        elif kind == "version":
            version = arg
            w.generation += 1
        elif kind == "lose-job" and w.status.active_job:
            w.jobs.pop(w.status.active_job.name, None)
        elif kind == "restart":
            pass  # nothing is kept in memory: the next reconcile starts from the status
        w.spec = _spec(suspend, version, attempts, on_timeout, fork)
        dec = w.reconcile()
        creates = dec.of(d.CreateJob)
        # at most one Job per decision; never twice the same lap attempt over the whole run
        assert len(creates) <= 1
        assert len(w.created) == len(set(w.created)), w.created
        for c in creates:
            assert c.attempt <= attempts
            assert c.agent_version == version
            assert not suspend
            assert before.phase not in ("Succeeded", "Failed", "BudgetExceeded")
        # no Job while waiting, suspended or terminal
        if w.status.phase in ("AwaitingApproval", "Suspended", "Succeeded", "Failed", "BudgetExceeded"):
            assert w.status.active_job is None
            assert not creates
        # the approved annotation never survives a reconcile
        assert "approved" not in w.annotations
        # idempotent: deciding again on the state just produced creates nothing and patches nothing
        asked = len(w.fork_calls)
        again = w.reconcile()
        if not (fork == "outage-then-continue" and asked == 1 and len(w.fork_calls) == 2):  # the store came back
            assert again.of(d.CreateJob) == [], (w.status, again)
            assert again.of(d.PatchStatus) == []
        # laps are checkpointed in order, and tries per lap never exceed the policy
        laps = [lap for lap, _ in w.created]
        assert laps == sorted(laps)
        for r in w.status.retries:
            assert r.retries <= attempts
        # a fork never runs the source's laps, and writes its snapshot until it succeeds, then never
        if fork:
            assert all(lap > FORK["lap"] for lap in laps), w.created
            assert len(w.fork_calls) <= len(FORKS[fork])
            if fork == "missing":
                assert w.created == [] and w.status.phase == "Failed"
        if w.status.phase == "AwaitingApproval":
            assert w.status.approval is not None and w.status.waiting_on == "ops"
