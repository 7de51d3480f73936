"""Property tests of decide(): random sequences of cluster/user events never break the invariants."""

from __future__ import annotations

from datetime import timedelta

from controller_world import World, fork_read, make_spec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_REASON,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    arguments_sha256,
)
from agentrun.api.status import StoreLocation
from agentrun.controller import decide as d

RIGHT_SHA = arguments_sha256({"x": 1})  # the arguments of the pending call of controller_world.record()
WRONG = "mallory"  # decided-by of decisions that must never be applied
DECISIONS = {  # annotations of a decision, and whether it may be applied
    "bare": ({ANN_APPROVED: "true"}, True),
    "bound": ({ANN_APPROVED: "true", ANN_CALL_ID: "c1", ANN_ARGUMENTS_SHA256: RIGHT_SHA}, True),
    "other-call": ({ANN_APPROVED: "true", ANN_CALL_ID: "c0", ANN_DECIDED_BY: WRONG}, False),
    "other-args": ({ANN_APPROVED: "true", ANN_CALL_ID: "c1", ANN_ARGUMENTS_SHA256: "0" * 64,
                    ANN_DECIDED_BY: WRONG}, False),
    "maybe": ({ANN_APPROVED: "maybe", ANN_DECIDED_BY: WRONG}, False),
    "huge-reason": ({ANN_APPROVED: "false", ANN_REASON: "r" * (MAX_REASON_CHARS + 1), ANN_DECIDED_BY: WRONG}, False),
    "long-decider": ({ANN_APPROVED: "true", ANN_DECIDED_BY: "m" * (MAX_DECIDED_BY_CHARS + 1)}, False),
    "control-decider": ({ANN_APPROVED: "true", ANN_DECIDED_BY: WRONG + "\x1b[2J"}, False),
    "control-reason": ({ANN_APPROVED: "true", ANN_REASON: "line one\nline\x1b two"}, True),
}
REFUSED_REASONS = ("ApprovalInvalid", "ApprovalBindingMismatch", "ApprovalIgnored")

EVENTS = st.one_of(
    st.tuples(st.just("finish"), st.sampled_from(["continue", "continue", "done", "failed", "awaiting-approval"])),
    # 0: the pod exited 0 without writing the lap's checkpoint
    st.tuples(st.just("exit"), st.sampled_from([75, 3, 2, 137, None, 0])),
    # the Job controller marks a Job whose pod exited 0 Failed afterwards (docs/concepts.md "When a lap is over")
    st.tuples(st.just("late-fail"), st.none()),
    st.tuples(st.just("tick"), st.floats(min_value=0.1, max_value=20)),
    st.tuples(st.just("annotate"), st.sampled_from(["true", "false", "bogus"])),
    st.tuples(st.just("decide"), st.sampled_from(sorted(DECISIONS))),
    st.tuples(st.just("refuse-status"), st.none()),
    st.tuples(st.just("default-store"), st.sampled_from(["s3://other/x", "s3://third/y"])),
    st.tuples(st.just("suspend"), st.booleans()),
    st.tuples(st.just("version"), st.sampled_from(["v1", "v2", "v3"])),
    st.tuples(st.just("lose-job"), st.none()),
    st.tuples(st.just("restart"), st.none()),
    st.tuples(st.just("kueue"), st.sampled_from(["admit", "admit", "evict"])),
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
# the status write recording lap 2's Job is lost, then the Job controller marks lap 1's Job Failed
# with its pod gone: lap 1's checkpoint decides it (not a retry of lap 1 that fences lap 2's Job)
@example(events=[("finish", "continue"), ("refuse-status", None), ("finish", "continue"), ("late-fail", None),
                 ("tick", 1.0)], attempts=2, on_timeout="reject", fork=None, queue=None)
@given(
    events=st.lists(EVENTS, max_size=40),
    attempts=st.integers(min_value=1, max_value=4),
    on_timeout=st.sampled_from(["reject", "fail"]),
    fork=st.sampled_from(sorted(FORKS, key=str)),
    queue=st.sampled_from([None, "lq"]),
)
def test_invariants(events, attempts, on_timeout, fork, queue):
    suspend, version = False, "v1"
    w = World(_spec(suspend, version, attempts, on_timeout, fork), fork_reads=list(FORKS[fork]),
              default_queue_name=queue)
    pinned = None
    decisions = 0
    refuse_next = False
    for kind, arg in events:
        before = w.status
        refused = False
        if refuse_next and kind != "refuse-status":
            # the write is lost with the event it follows (a lap's end, a decision, ...): the Jobs of
            # that pass exist, the status does not know them
            w.refuse_status, refused, refuse_next = 1, True, False
        # a Job ends once: the status may name one that ended already (its successor's write lost)
        live = bool(w.status.active_job and w.status.active_job.name in w.jobs
                    and w.jobs[w.status.active_job.name].state == "active")
        held = live and w.active().suspended  # Kueue holds it: no pod runs, it cannot end
        if kind == "kueue" and live:
            w.kueue_admits() if arg == "admit" else w.kueue_evicts()
        live = live and not held
        if kind == "finish" and live:
            w.finish_job(arg, pending=(arg == "awaiting-approval"))
        elif kind == "exit" and live:
            if arg == 3:
                w.finish_job("continue", exit_code=3)
            elif arg == 0:
                w.finish_job("continue", checkpoint=False)
            else:
                w.fail_job(arg)
        elif kind == "late-fail":
            w.late_fail()
        elif kind == "tick":
            w.now += timedelta(seconds=arg)
        elif kind == "annotate":
            w.annotations["approved"] = arg
            decisions += 1
        elif kind == "decide":
            w.annotations.update(DECISIONS[arg][0])
            decisions += 1
        elif kind == "refuse-status":  # refuse the first status write of the next event's reconcile
            refuse_next = True
            continue
        elif kind == "default-store":
            w.resolved_store = StoreLocation(uri=arg)
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
        ended = {j.name for j in w.jobs.values() if j.state != "active"}
        first_pass = len(w.passes)
        dec = w.reconcile()
        refused = refused and w.refuse_status == 0  # a status patch was refused in this reconcile
        w.refuse_status = 0
        # write-ahead: a Job is created only when the status the API server holds (what the pass
        # observed) already shows what it executes: the pinned store and the decision it carries. So
        # the pass that first records a decision never creates the Job that executes it.
        for observed, one in w.passes[first_pass:]:
            for c in one.of(d.CreateJob):
                assert observed.status.store is not None and c.store == observed.status.store
                if c.approval is not None:
                    ap = observed.status.approval
                    assert ap is not None and ap.state != "Pending" and ap.call_id == c.approval.call_id
                    assert ap.lap == c.lap - 1 and d._approval_env(observed.status) == c.approval
            was, now = observed.status.approval, one.status.approval if one.status else None
            if was is not None and was.state == "Pending" and (now is None or now.state != "Pending"):
                assert not one.of(d.CreateJob), "a Job in the pass that records the decision"
        # the status never shows a call pending once a Job that resolves it (the next lap) exists
        ap = w.status.approval
        if ap is not None and ap.state == "Pending":
            assert not [j for j in w.jobs.values() if j.lap > ap.lap], (ap, w.jobs)
        # the store is pinned before the first Job and never moves, whatever the default does
        if w.status.store is not None:
            pinned = pinned or w.status.store
            assert w.status.store == pinned
            assert all(c.store == pinned for c in w.create_actions)
        if w.created:
            assert pinned is not None
        # a decision bound to another call, or malformed, is never applied
        assert not (w.status.approval and w.status.approval.decided_by and WRONG in w.status.approval.decided_by)
        assert not (w.status.approval and w.status.approval.decided_by
                    and len(w.status.approval.decided_by) > MAX_DECIDED_BY_CHARS)
        # every refused decision gives one Warning Event at most: no more than decisions were made
        assert len([e for e in w.events if e.reason in REFUSED_REASONS]) <= decisions
        creates = dec.of(d.CreateJob)
        # at most one Job per decision; never twice the same lap attempt over the whole run
        assert len(creates) <= 1
        assert len(w.created) == len(set(w.created)), w.created
        # a Job that ended (its pod exited, whatever the Job controller marks later) is never fenced
        for a in dec.of(d.DeleteJob):
            assert a.name not in ended, (a, ended)
        for c in creates:
            assert c.attempt <= attempts
            assert c.agent_version == version
            assert not suspend
            assert before.phase not in ("Succeeded", "Failed", "BudgetExceeded")
        # no Job while waiting, suspended or terminal
        if w.status.phase in ("AwaitingApproval", "Suspended", "Succeeded", "Failed", "BudgetExceeded"):
            assert w.status.active_job is None
            assert refused or not creates  # a refused write leaves the status before the Job's creation
        if refused:  # the shell stopped after the refused status patch; the next reconcile does the work
            continue
        # Kueue: every Job goes to the LocalQueue; status.kueue names the held active Job, and only it
        assert all(c.queue_name == queue for c in creates)
        if w.status.kueue is not None:
            aj = w.status.active_job
            assert aj is not None and w.status.kueue.job == aj.name and w.status.phase == "Queued", w.status
            assert w.status.kueue.local_queue == (queue if w.jobs[aj.name].queue_name else None)
        aj = w.status.active_job
        if aj is not None and aj.name in w.jobs and w.jobs[aj.name].suspended and w.jobs[aj.name].state == "active" \
                and w.status.phase not in ("Suspended", "AwaitingApproval"):
            assert w.status.phase == "Queued" and w.status.kueue is not None, w.status
        # the approved annotation never survives a reconcile
        assert "approved" not in w.annotations
        assert not [k for k in w.annotations if k.startswith("agentrun.dev/")], w.annotations
        # idempotent: deciding again on the state just produced creates nothing and patches nothing
        asked = len(w.fork_calls)
        ended = {j.name for j in w.jobs.values() if j.state != "active"}
        again = w.reconcile()
        assert not [a for a in again.of(d.DeleteJob) if a.name in ended], (again, ended)
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
