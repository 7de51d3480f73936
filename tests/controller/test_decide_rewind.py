"""decide(): a rewind in place (``agentrun retry --from-lap N`` before the last checkpointed lap,
issue 31 item 1): refused naming the first side-effecting call sent after lap N, else the run stands
at lap N again in a new history (status.lifecycle.rewinds), its abandoned laps never read."""

from __future__ import annotations

from datetime import timedelta

from controller_world import World, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.contract import MAX_REWINDS, history_of
from agentrun.api.lifecycle import ANN_RETRY, ANN_RETRY_FROM_LAP, ANN_RETRY_REQUESTED_BY, RETRY_ANNOTATIONS
from agentrun.controller import decide as d
from agentrun.controller.decide.lifecycle import side_effecting

TOOLS = [
    {"name": "lookup", "http": {"url": "http://tools:8080/lookup"}, "sideEffects": False},
    {"name": "pay", "http": {"url": "http://tools:8080/pay"}},
]
MCP = [{"name": "ledger", "url": "http://ledger:8766/mcp", "sideEffects": ["book_*"]}]


def _spec(**over: object):
    agent = {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]},
             "tools": TOOLS, "mcpServers": MCP}
    return make_spec(agent=agent, **over)


def _failed_at(laps: int, calls: dict[int, list[str]] | None = None, **over: object) -> World:
    """A run that checkpointed ``laps`` laps (the tools each lap sent: ``calls``), then failed lap laps+1."""
    w = World(_spec(**over))
    w.reconcile()
    for lap in range(1, laps + 1):
        w.sent[lap] = [d.SentCall(lap, f"call_{i}", t) for i, t in enumerate((calls or {}).get(lap, []), start=1)]
        w.finish_job(cost=f"{lap * 0.10:.2f}")
        w.reconcile()
    lap = laps + 1
    w.sent[lap] = [d.SentCall(lap, f"call_{i}", t) for i, t in enumerate((calls or {}).get(lap, []), start=1)]
    w.fail_job(2)
    w.failure_reports[(lap, 1)] = {"message": "tool answered 400"}
    w.reconcile()
    assert w.status.phase == "Failed" and w.status.lap == laps
    w.events.clear()
    return w


def _retry(w: World, n: int, from_lap: int) -> d.Decision:
    w.annotations.update({ANN_RETRY: str(n), ANN_RETRY_REQUESTED_BY: "alice", ANN_RETRY_FROM_LAP: str(from_lap)})
    return w.reconcile()


def test_a_rewind_after_read_only_calls_starts_a_new_history_at_the_lap_after():
    w = _failed_at(4, {2: ["lookup"], 3: ["lookup", "ledger__list"], 5: ["lookup"]})
    w.sent[3] = [d.SentCall(3, "call_1", "lookup")]
    jobs_before = set(w.jobs)
    _retry(w, 1, 2)
    st_ = w.status
    lc = st_.lifecycle
    assert lc is not None and lc.rewinds == [2] and lc.last_retry_from_lap == 2 and lc.retries == 1
    assert st_.phase == "Running" and st_.lap == 2 and st_.cost.usd == "0.20", "the run stands at lap 2 again"
    assert st_.checkpoint is not None and st_.checkpoint.lap == 2
    assert w.created[-1][0] == 3, "lap 3 starts again"
    assert not set(RETRY_ANNOTATIONS) & set(w.annotations)
    assert w.reasons() == ["Retried"] and "rewound in place to lap 2" in w.events[0].message
    assert "history 1" in w.events[0].message
    assert jobs_before - set(w.jobs), "Jobs were deleted"
    assert not any(j.lap > 3 for j in w.jobs.values()), "the abandoned laps' Jobs are deleted"
    assert sorted(w.abandoned[0]) == [3, 4], "laps 3 and 4 are left in the old history"
    for _ in range(3):  # the new history runs on to the end
        w.finish_job(outcome="continue")
        w.reconcile()
    w.finish_job(outcome="done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and w.status.lap == 6


def test_a_rewind_after_a_side_effecting_call_is_refused_naming_it():
    w = _failed_at(4, {2: ["lookup"], 3: ["lookup", "pay"], 4: ["pay"]})
    before = w.status.model_copy(deep=True)
    _retry(w, 1, 2)
    assert w.reasons() == ["RetryRefused"]
    msg = w.events[0].message
    assert "call call_2 of tool \"pay\" in lap 3" in msg and "fork from lap 2" in msg and "retry from lap 4" in msg
    assert w.status.lap == before.lap == 4 and w.status.phase == "Failed"
    assert not (w.status.lifecycle and w.status.lifecycle.rewinds)
    assert not set(RETRY_ANNOTATIONS) & set(w.annotations), "the request is consumed, once"
    w.reconcile()
    assert w.reasons() == ["RetryRefused"], "one Event, no loop"


def test_the_unfinished_laps_journaled_call_counts():
    w = _failed_at(3, {4: ["lookup", "ledger__book_room"]})
    _retry(w, 1, 1)
    assert w.reasons() == ["RetryRefused"] and "call call_2 of tool \"ledger__book_room\" in lap 4" in w.events[0].message


def test_a_tool_the_spec_no_longer_declares_counts_as_side_effecting():
    spec = _spec()
    assert side_effecting(spec, "gone") and side_effecting(spec, "pay") and side_effecting(spec, "ledger__book_x")
    assert not side_effecting(spec, "lookup") and not side_effecting(spec, "ledger__list")


def test_a_rewind_waits_for_an_unavailable_store_without_events():
    w = _failed_at(3)
    w.rewind_kind = "unavailable"
    dec = _retry(w, 1, 1)
    assert w.events == [] and ANN_RETRY in w.annotations and w.status.lap == 3
    assert any(isinstance(a, d.RequeueAfter) and a.seconds > 0 for a in dec.actions)
    w.rewind_kind = "ok"
    w.reconcile()
    assert w.reasons() == ["Retried"] and w.status.lap == 1


def test_a_rewind_to_a_lap_never_checkpointed_or_before_a_fork_is_refused():
    w = _failed_at(3)
    _retry(w, 1, 7)
    assert w.reasons() == ["RetryRefused"] and "never checkpointed" in w.events[0].message
    w.events.clear()
    w.spec = _spec(forkFrom={"name": "src", "uid": "5eed", "lap": 2})
    _retry(w, 1, 1)
    assert w.reasons() == ["RetryRefused"] and "rewinds to lap 2 at the earliest" in w.events[0].message


def test_a_rewind_to_a_lap_that_waited_for_approval_is_refused():
    w = _failed_at(3)
    rec = w.store[2].record
    assert rec is not None
    w.store[2] = d.CheckpointRead(lap=2, kind="ok", record=rec.model_copy(
        update={"outcome": rec.outcome.model_copy(update={"type": "awaiting-approval"})}), key="k")
    _retry(w, 1, 2)
    assert w.reasons() == ["RetryRefused"] and "rewind to lap 1" in w.events[0].message


def test_a_rewind_needs_headroom_where_it_lands_and_changes_nothing_when_refused():
    w = _failed_at(3)
    w.spec = _spec(budget={"maxLaps": 10, "maxCostUSD": "0.05"})
    _retry(w, 1, 1)
    assert w.reasons() == ["RetryRefused"] and "maxCostUSD" in w.events[0].message
    assert w.status.lap == 3 and not (w.status.lifecycle and w.status.lifecycle.rewinds)


def test_retry_from_the_last_lap_is_a_plain_retry_in_place():
    w = _failed_at(3, {3: ["pay"]})
    _retry(w, 1, 3)
    assert w.reasons() == ["Retried"] and "same idempotency keys" in w.events[0].message
    assert w.rewind_reads == 0 and w.status.lap == 3
    lc = w.status.lifecycle
    assert lc is not None and lc.rewinds == [] and lc.last_retry_from_lap is None, "no rewind"


def test_a_rewind_of_a_cancelled_run_waits_for_its_lap_pod_to_be_gone():
    w = World(_spec())
    w.reconcile()
    for _ in range(2):
        w.finish_job()
        w.reconcile()
    w.spec = _spec(cancel={"reason": "stop"})
    w.generation += 1
    w.reconcile()
    assert w.status.phase == "Cancelled" and w.status.lap == 2
    w.spec = _spec()
    w.events.clear()
    dec = _retry(w, 1, 1)
    assert w.events == [] and w.rewind_reads == 0 and ANN_RETRY in w.annotations
    assert [a.seconds for a in dec.of(d.RequeueAfter)] == [60.0], "the stopped lap journals its call in flight first"
    w.now += timedelta(seconds=61)
    w.reconcile()
    assert w.reasons() == ["Retried"] and w.status.lap == 1 and w.rewind_reads == 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["finish", "finish", "finish", "fail", "retry", "rewind", "rewind", "tick"]),
                          st.integers(0, 6), st.sampled_from([False, False, False, True])), max_size=24))
def test_rewinds_never_undo_a_side_effect_nor_reuse_a_history_lap_attempt(ops):
    """Whatever the order of laps, failures, retries and rewinds: a rewind is applied only when no
    side-effecting call was sent after its lap in the current history; a Job's (history, lap,
    attempt) is never created twice; at most one Job runs; the rewinds stay within MAX_REWINDS."""
    w = World(_spec(retry={"attemptsPerLap": 2, "backoff": {"initial": "1s", "max": "2s", "factor": 2}},
                    budget={"maxLaps": 8}))
    w.reconcile()
    made: set[tuple[int, int, int]] = set()
    seen = 0
    for op, k, side in ops:
        lc = w.status.lifecycle
        done, rewinds = (lc.retries, list(lc.rewinds)) if lc is not None else (0, [])
        aj = w.status.active_job
        if op in ("finish", "fail") and aj is not None and aj.name in w.jobs and w.jobs[aj.name].state == "active":
            w.sent.setdefault(aj.lap, []).append(d.SentCall(aj.lap, f"c{aj.attempt}", "pay" if side else "lookup"))
            if op == "finish":
                w.finish_job(outcome="continue")
            else:
                w.fail_job(2)
        elif op in ("retry", "rewind"):
            w.annotations.update({ANN_RETRY: str(done + 1), ANN_RETRY_REQUESTED_BY: "u"})
            if op == "rewind":
                w.annotations[ANN_RETRY_FROM_LAP] = str(k % w.status.lap if w.status.lap else 0)
        else:
            w.now = w.status.next_attempt_at or w.now
        sent_before = {n: list(c) for n, c in w.sent.items()}
        lap_before = w.status.lap
        w.reconcile()
        lc = w.status.lifecycle
        after = list(lc.rewinds) if lc is not None else []
        if len(after) > len(rewinds):
            back = after[-1]
            assert back < lap_before
            assert not any(c.tool == "pay" for n, cs in sent_before.items() if n > back for c in cs), \
                "rewound past a side-effecting call"
        assert len(after) <= MAX_REWINDS
        for lap, attempt in w.created[seen:]:
            key = (history_of(after, lap), lap, attempt)
            assert key not in made, f"Job of {key} created twice"
            made.add(key)
        seen = len(w.created)
        assert sum(j.state == "active" for j in w.jobs.values()) <= 1
        assert not set(RETRY_ANNOTATIONS) & set(w.annotations) or w.rewind_kind != "ok"


def test_a_call_that_may_have_been_sent_refuses_the_rewind_saying_so() -> None:
    """A side-effecting call the unfinished lap's model asked for, its answer never journaled."""
    w = _failed_at(3)
    w.sent[4] = [d.SentCall(4, "call_2", "pay", unconfirmed=True)]
    _retry(w, 1, 2)
    assert w.reasons() == ["RetryRefused"]
    assert "call call_2 of tool \"pay\" in lap 4 has side effects and may have executed" in w.events[0].message
