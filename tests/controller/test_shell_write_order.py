"""The shell performs the run's writes in the Decision's order (Decision.writes): annotations of a
decision that is not recorded go BEFORE the status, guarded by the resourceVersion the decision was
made on; a recorded decision's annotations go after its status."""

from __future__ import annotations

from controller_world import World, make_spec
from kubernetes.client.exceptions import ApiException
from test_shell_robustness import BODY, FakeKube, execute, executor

from agentrun.controller import decide as d
from agentrun.controller.execute import Outcome


def _run_writes(kube: FakeKube) -> list[tuple[str, object]]:
    return [("status" if p.endswith("/status") else "annotations", b) for m, p, b in kube.requests
            if m == "PATCH" and ("annotations" in str(b) or p.endswith("/status"))]


def test_annotations_of_an_unrecorded_decision_go_first_guarded_by_the_resource_version():
    o = World(spec=make_spec()).observed()
    status = o.status.model_copy(update={"phase": "AwaitingApproval"})
    dec = d.Decision([d.PatchStatus(status), d.RemoveAnnotations(("approved",), before_status=True)])
    kube = FakeKube()
    execute(executor(kube), o, dec)
    (first, meta), (second, _) = _run_writes(kube)
    assert (first, second) == ("annotations", "status")
    assert meta == {"metadata": {"annotations": {"approved": None}, "resourceVersion": BODY["metadata"]["resourceVersion"]}}


def test_a_recorded_decisions_annotations_go_after_its_status_unguarded():
    o = World(spec=make_spec()).observed()
    dec = d.Decision([d.RemoveAnnotations(("approved",)), d.PatchStatus(o.status.model_copy(update={"lap": 1}))])
    kube = FakeKube()
    execute(executor(kube), o, dec)
    (first, _), (second, meta) = _run_writes(kube)
    assert (first, second) == ("status", "annotations")
    assert meta == {"metadata": {"annotations": {"approved": None}}}


class ConflictingKube(FakeKube):
    def request(self, method, path_, **kw):
        if method == "PATCH" and not path_.endswith("/status"):
            self.requests.append((method, path_, kw.get("body")))
            raise ApiException(status=409, reason="Conflict")
        return super().request(method, path_, **kw)


def test_a_conflict_on_the_first_removal_writes_no_status_and_decides_again():
    o = World(spec=make_spec()).observed()
    dec = d.Decision([d.PatchStatus(o.status.model_copy(update={"lap": 1})),
                      d.RemoveAnnotations(("approved",), before_status=True)])
    kube = ConflictingKube()
    out = execute(executor(kube), o, dec)
    assert isinstance(out, Outcome) and out.requeue == 0.2
    assert kube.status_patches() == []
