"""The routine Events' rate limit per run (controller/events.py), as client-go's spam filter: a
burst of 25, then one per 5 minutes; every other Event is posted; a suppressed one is counted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controller_world import UID, World, make_spec
from fake_kube import BODY, FakeKube, executor

from agentrun import metrics
from agentrun.api.reasons import ROUTINE_EVENT_REASONS, Reason
from agentrun.checkpoint.schema import RunRef
from agentrun.controller import decide as d
from agentrun.controller.events import BURST, REFILL_SECONDS, EventBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_run_posts_a_burst_of_routine_events_then_one_per_refill_and_every_other_event():
    clock = Clock()
    budget = EventBudget(clock=clock)
    a, b = ("ns", "a"), ("ns", "b")
    assert [budget.allow(a, Reason.LAP_CHECKPOINTED) for _ in range(BURST + 3)] == [True] * BURST + [False] * 3
    assert budget.allow(b, Reason.LAP_CHECKPOINTED)  # per run
    assert all(budget.allow(a, r) for r in (Reason.LAP_RETRY, Reason.APPROVAL_REQUESTED, Reason.AGENT_FAILED))
    clock.now += REFILL_SECONDS * 0.9
    assert not budget.allow(a, Reason.LAP_CHECKPOINTED)
    clock.now += REFILL_SECONDS * 0.2  # one token back
    assert budget.allow(a, Reason.LAP_CHECKPOINTED) and not budget.allow(a, Reason.LAP_CHECKPOINTED)
    clock.now += REFILL_SECONDS * 1000  # a long wait refills the burst, not more
    assert sum(budget.allow(a, Reason.LAP_CHECKPOINTED) for _ in range(BURST * 2)) == BURST
    budget.forget(a)
    assert budget.allow(a, Reason.LAP_CHECKPOINTED)
    assert ROUTINE_EVENT_REASONS == {Reason.LAP_CHECKPOINTED}


def test_past_the_limit_the_bucket_touched_longest_ago_is_dropped_not_every_bucket():
    clock = Clock()
    budget = EventBudget(clock=clock, limit=3)
    busy, quiet, other, new = ("ns", "busy"), ("ns", "quiet"), ("ns", "other"), ("ns", "new")
    budget.allow(quiet, Reason.LAP_CHECKPOINTED)
    for _ in range(BURST):
        budget.allow(busy, Reason.LAP_CHECKPOINTED)  # spent its burst
    budget.allow(other, Reason.LAP_CHECKPOINTED)
    assert len(budget) == 3
    assert budget.allow(new, Reason.LAP_CHECKPOINTED)  # a fourth run: "quiet" (touched longest ago) goes
    assert len(budget) == 3
    assert not budget.allow(busy, Reason.LAP_CHECKPOINTED)  # the spent bucket is kept: still limited
    assert len(budget) == 3  # "other" went now (touched before "new" and "busy")
    assert budget.allow(quiet, Reason.LAP_CHECKPOINTED)  # dropped: back with a full bucket


def test_the_executor_posts_the_first_burst_of_lap_events_and_counts_the_rest(monkeypatch):
    """Thirty laps of one run: 25 LapCheckpointed Events posted, 5 counted in
    agentrun_events_suppressed_total (and still logged); a Warning of the same run is posted."""
    kube = FakeKube()
    ex = executor(kube)
    run = RunRef(namespace="ns", name="run", uid=UID)
    before = metrics.REGISTRY.get_sample_value("agentrun_events_suppressed_total", {"reason": "LapCheckpointed"}) or 0
    o = World(spec=make_spec()).observed()

    async def main() -> None:
        for lap in range(1, 31):
            decision = d.Decision(actions=[d.Event("Normal", Reason.LAP_CHECKPOINTED, f"lap {lap} checkpointed")])
            await ex.execute(json.loads(json.dumps(BODY)), o, decision, run, o.spec)
        decision = d.Decision(actions=[d.Event("Warning", Reason.LAP_RETRY, "lap 31 attempt 1 failed")])
        await ex.execute(json.loads(json.dumps(BODY)), o, decision, run, o.spec)

    asyncio.run(main())
    posted: list[dict[str, Any]] = kube.events()
    assert [e["message"] for e in posted[:BURST]] == [f"lap {i} checkpointed" for i in range(1, BURST + 1)]
    assert [e["reason"] for e in posted[BURST:]] == ["LapRetry"]
    after = metrics.REGISTRY.get_sample_value("agentrun_events_suppressed_total", {"reason": "LapCheckpointed"})
    assert after == before + 30 - BURST
