"""decide() and the tenancy re-check (Observed.policy_check): a run that no longer complies with
its AgentRunPolicy stops before its next lap, with condition reason PolicyViolation; a lap in
flight is not cut; a compliant or unchecked run is untouched (the in-memory world)."""

from __future__ import annotations

from controller_world import World, make_spec

from agentrun.api.tenancy import PolicyCheck, Violation
from agentrun.controller import decide as d

BROKEN = PolicyCheck((("default", (Violation("spec.agent.image", "evil.example/agent:1", "images.allowed",
                                             "is not an allowed image"),)),))
CLEAN = PolicyCheck((("default", ()),))


def test_a_policy_violation_before_the_first_lap_fails_the_run_without_a_job_or_a_probe():
    w = World(make_spec())
    w.policy_check = BROKEN
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and dec.of(d.ProbeStore) == []
    assert w.status.phase == "Failed" and w.created == []
    ready = {c.type: c for c in w.status.conditions}
    failed = [c for c in w.status.conditions if c.reason == "PolicyViolation"]
    assert failed and "spec.agent.image" in failed[0].message and "evil.example/agent:1" in failed[0].message, ready


def test_a_policy_tightened_mid_run_lets_the_lap_in_flight_end_then_stops_before_the_next():
    w = World(make_spec())
    w.reconcile()
    assert w.created == [(1, 1)]
    w.policy_check = BROKEN
    dec = w.reconcile()  # lap 1 still running: nothing is cut, no new Job
    assert dec.of(d.DeleteJob) == [] and dec.of(d.CreateJob) == [] and w.status.phase == "Running"
    w.finish_job("continue", cost="0.10")
    w.reconcile()
    assert w.created == [(1, 1)], w.created  # lap 2 never started
    assert w.status.phase == "Failed" and w.status.lap == 1
    assert "lap 2 not started" in w.status.message or "spec.agent.image" in w.status.message, w.status.message
    assert "PolicyViolation" in w.reasons()


def test_a_compliant_or_unchecked_run_is_untouched():
    for check in (CLEAN, None):
        w = World(make_spec())
        w.policy_check = check
        w.reconcile()
        w.finish_job("continue")
        w.reconcile()
        w.finish_job("done")
        w.reconcile()
        assert w.status.phase == "Succeeded" and w.created == [(1, 1), (2, 1)]


def test_a_finished_run_is_not_failed_by_a_later_policy():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded"
    w.policy_check = BROKEN
    w.reconcile()
    assert w.status.phase == "Succeeded"
