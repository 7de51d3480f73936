"""decide() and the admission policy check (Observed.admission, controller/policycheck.py): while
the operator's admission policies are missing or outdated no lap Job starts, the run says why
(Progressing=False with the check's reason, ONE Warning Event), a decision nobody checked is not
taken; once they are in place the run goes on (the in-memory world)."""

from __future__ import annotations

from controller_world import World, make_spec

from agentrun.controller import decide as d

MISSING = d.AdmissionProblem("AdmissionPoliciesMissing", "the operator's admission policies are not in place "
                             "(missing: ValidatingAdmissionPolicyBinding agentrun-decisions); install them")
OUTDATED = d.AdmissionProblem("AdmissionPoliciesOutdated", "the operator's admission policies are not in place "
                              "(outdated: ValidatingAdmissionPolicy agentrun-status-owner)")


def _progressing(w: World):
    return next(c for c in w.status.conditions if c.type == "Progressing")


def test_no_first_lap_while_the_policies_are_missing_then_it_starts_once_they_are_in_place():
    w = World(make_spec())
    w.admission = MISSING
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and w.created == []
    cond = _progressing(w)
    assert (cond.status, cond.reason) == ("False", "AdmissionPoliciesMissing"), cond
    assert "lap 1 attempt 1 not started" in cond.message and "agentrun-decisions" in cond.message
    assert w.status.message == cond.message
    assert w.reasons().count("AdmissionPoliciesMissing") == 1
    assert [e.type for e in w.events if e.reason == "AdmissionPoliciesMissing"] == ["Warning"]
    # every resync (or requeue) while missing: no Job, no second Event, no status write
    for _ in range(3):
        dec = w.reconcile()
        assert dec.of(d.CreateJob) == [] and dec.of(d.PatchStatus) == [] and dec.of(d.Event) == []
    # another problem: said once more
    w.admission = OUTDATED
    w.reconcile()
    assert _progressing(w).reason == "AdmissionPoliciesOutdated" and w.reasons().count("AdmissionPoliciesOutdated") == 1
    # in place: the lap starts, Progressing is True again
    w.admission = None
    dec = w.reconcile()
    assert w.created == [(1, 1)] and w.status.phase == "Running"
    assert _progressing(w).status == "True" and _progressing(w).reason == "LapRunning"


def test_a_lap_in_flight_ends_but_the_next_one_waits_for_the_policies():
    w = World(make_spec())
    w.reconcile()
    assert w.created == [(1, 1)]
    w.admission = MISSING
    w.finish_job("continue", cost="0.10")
    w.reconcile()
    assert w.status.lap == 1 and w.created == [(1, 1)]  # lap 1 recorded, lap 2 held back
    assert _progressing(w).reason == "AdmissionPoliciesMissing" and "lap 2 attempt 1" in _progressing(w).message
    w.admission = None
    w.reconcile()
    assert w.created == [(1, 1), (2, 1)]


def _await_approval(w: World) -> None:
    w.reconcile()
    w.finish_job("continue")
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert w.status.phase == "AwaitingApproval" and w.status.approval.state == "Pending"


def test_a_decision_by_annotation_while_the_policies_are_missing_is_removed_not_taken():
    w = World(make_spec())
    _await_approval(w)
    w.admission = MISSING
    w.annotations.update({"approved": "true", "agentrun.dev/decided-by": "mallory", "other": "x"})
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == [] and w.annotations == {"other": "x"}
    assert w.status.approval.state == "Pending" and w.status.approval.decision is None
    assert "ApprovalDecided" not in w.reasons()
    (ignored,) = [e for e in w.events if e.reason == "ApprovalIgnored"]
    assert ignored.type == "Warning" and "not taken and removed" in ignored.message
    assert "agentrun-decisions" in ignored.message  # names what is missing
    # once the policies are back, a real decision is taken
    w.admission = None
    w.annotations.update({"approved": "true"})
    w.reconcile()
    assert w.status.approval.state == "Approved" and w.created[-1] == (3, 1)


def test_a_decision_by_status_patch_while_the_policies_are_missing_is_cleared():
    w = World(make_spec())
    _await_approval(w)
    w.admission = OUTDATED
    w.status.approval.decision = "approved"
    w.status.approval.decided_by = "mallory"
    w.status.approval.reason = "trust me"
    dec = w.reconcile()
    assert dec.of(d.CreateJob) == []
    ap = w.status.approval
    assert (ap.state, ap.decision, ap.decided_by, ap.reason) == ("Pending", None, None, None)
    assert "ApprovalIgnored" in w.reasons() and "ApprovalDecided" not in w.reasons()


def test_without_a_problem_nothing_changes():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded" and not [r for r in w.reasons() if r.startswith("AdmissionPolicies")]
