"""Every violation branch of the chaos invariants fires (issue 36: 10 of 41 branches, and invariant 9,
were never shown firing). ``test_invariants.BROKEN`` breaks a correct record one way at a time; this
module adds a broken record for each branch it left out, builds the live-cluster evidence of
invariant 9 (``check_no_orphans``, ``check_nothing_left``) from the kubernetes client's own models,
and then proves the list complete: every statement of ``e2e/chaos/invariants.py`` that reports a
violation (found by parsing the module) is executed by one of these broken records, traced line by
line. A new branch without a record that fires it fails ``test_every_violation_branch_fires``.

The faults injected into the real product (``agentrun.testfault``) are the other half: they run
through the real pipeline in ``tests/e2e/test_chaos_negative.py``. docs/chaos.md ("Every violation
branch") lists each branch with what fires it."""

from __future__ import annotations

import ast
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e.chaos import invariants as inv
from e2e.chaos import rawstore
from e2e.chaos.schedule import POD_SIGKILL, Fault
from kubernetes.client import (
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodStatus,
)
from test_invariants import BROKEN, K_A, K_B, K_C, NAME, UID, good, tool_record

from agentrun.checkpoint.store import canonical_json, sha256_hex
from agentrun.controller.decide.jobs import job_name


# ---------------------------------------------------------------------------------- records
def _resigned(ev: inv.Evidence, lap: int, change: Callable[[dict], None]) -> None:
    """Lap ``lap``'s object rewritten as a writer would have written it: its document changed and
    its sha256 metadata matching the new bytes (so only the check that reads the change fires)."""
    x = ev.runs[NAME].laps[lap - 1]
    doc = copy.deepcopy(x.doc)
    change(doc)
    data = canonical_json(doc)
    ev.runs[NAME].laps[lap - 1] = rawstore.read_lap(x.key, data, {"sha256": sha256_hex(data)})


def _tool_total(ev: inv.Evidence, **changes: int) -> None:
    for f, d in changes.items():
        ev.tool["totals"][f] = ev.tool["totals"].get(f, 0) + d


def _two_more_requests(ev: inv.Evidence) -> None:
    """K_C (lap 2, one attempt) requested twice more, both answered from the record."""
    ev.tool["keys"][K_C]["requests"] += 2
    ev.tool["keys"][K_C]["replays"] += 2
    _tool_total(ev, requests=2, replays=2)


def _victim_b(ev: inv.Evidence) -> None:
    """The held victim of a pod SIGKILL was call ``b`` (the 2nd call of lap 1)."""
    ev.faults.append(Fault(kind=POD_SIGKILL, at=0.0, fired_at=3.0, landed=True, mid_call=True, target="b"))


def _a_sent_after_b(ev: inv.Evidence) -> None:
    _victim_b(ev)
    ev.tool["keys"][K_A]["lastRequestAt"] = ev.tool["keys"][K_B]["firstRequestAt"] + 1.5


def _attempt_gap(ev: inv.Evidence) -> None:
    j = ev.jobs[1]  # lap 1 attempt 2 -> attempt 3 (its name follows: only the gap is wrong)
    j.attempt, j.name = 3, job_name(NAME, UID, 1, 3)


EXTRA: dict[str, tuple[Callable[[inv.Evidence], Any], str]] = {
    "a run that is gone": (lambda ev: ev.runs.pop(NAME), "the AgentRun is gone"),
    "a bad request at the tool server": (lambda ev: _tool_total(ev, requests=1, badRequests=1),
                                        "bad request(s) at the tool server"),
    "more requests than every attempt could send": (_two_more_requests, "the attempts that could send them"),
    "status.lap short of the store": (lambda ev: ev.runs[NAME].status.update(lap=2), "laps: store 3, script 3, status 2"),
    "an object holding another lap": (lambda ev: _resigned(ev, 2, lambda d: d.update(lap=5)), "holds lap 5"),
    "an object of another run": (lambda ev: _resigned(ev, 2, lambda d: d["run"].update(uid="0" * 36)),
                                 "belongs to run uid 000"),
    "wrong running totals": (lambda ev: _resigned(ev, 3, lambda d: d["totals"].update(inputTokens=1)),
                             "lap 3 totals 3/1/"),
    "a schema version the decoder does not know": (lambda ev: _resigned(ev, 2, lambda d: d.update(schemaVersion=9)),
                                                   "schemaVersion 9 unknown"),
    "a Job without lap/attempt labels": (lambda ev: setattr(ev.jobs[0], "lap", None), "no lap/attempt labels"),
    "Job attempts with a gap": (_attempt_gap, "lap 1 Job attempts [1, 3] not 1..3"),
    "no status watch, no ticker": (lambda ev: setattr(ev, "watched", False),
                                   "the status watch and the ticker did not run"),
    "a call sent again after the next call of its lap (a result not journaled)": (
        _a_sent_after_b, "was not reused from the lap's journal"),
}


def test_a_correct_record_with_a_held_victim_passes():
    """check_journaled on the real tool record: lap 1 sent a (twice: its first attempt was killed
    before a was journaled), then b; with b the held victim, a was last sent before b."""
    ev = good()
    _victim_b(ev)
    assert inv.check_all(ev) == []


@pytest.mark.parametrize("name", list(EXTRA))
def test_each_further_broken_record_fails(name):
    ev = good()
    assert inv.check_all(ev) == []
    breaker, expected = EXTRA[name]
    breaker(ev)
    violations = inv.check_all(ev)
    assert any(expected in v for v in violations), violations


# ---------------------------------------------------------------------------------- invariant 9
RUN_UID, JOB_UID = "run-uid-1", "job-uid-1"


def _job(name: str, owner: str, done: bool = True, active: int = 0) -> V1Job:
    return V1Job(metadata=V1ObjectMeta(name=name, uid=f"uid-{name}" if name != "j1" else JOB_UID,
                                       owner_references=[V1OwnerReference(api_version="agentrun.dev/v1alpha1",
                                                                          kind="AgentRun", name="r", uid=owner)]),
                 status=V1JobStatus(active=active, conditions=[V1JobCondition(type="Complete", status="True")]
                                    if done else []))


def _pod(name: str, owner: str, phase: str = "Succeeded") -> V1Pod:
    return V1Pod(metadata=V1ObjectMeta(name=name, owner_references=[V1OwnerReference(
        api_version="batch/v1", kind="Job", name="j1", uid=owner)]), status=V1PodStatus(phase=phase))


class Cluster:
    """What check_no_orphans / check_nothing_left read of the live cluster (World's list_jobs,
    list_pods, live_lap_processes), as the kubernetes client returns it."""

    def __init__(self, jobs: list[V1Job], pods: list[V1Pod], pids: list[int] = ()) -> None:  # type: ignore[assignment]
        self.jobs, self.pods, self.pids = jobs, pods, list(pids)

    def list_jobs(self, ns: str) -> list[V1Job]:
        return self.jobs

    def list_pods(self, ns: str) -> list[V1Pod]:
        return self.pods

    def live_lap_processes(self, ns: str) -> list[int]:
        return self.pids


RUNS = {"r": {"metadata": {"uid": RUN_UID}}}
ORPHANS: dict[str, tuple[Cluster, str]] = {
    "a Job owned by no existing run": (Cluster([_job("j1", "gone-run")], []), "no existing AgentRun"),
    "a Job still running after every run ended": (Cluster([_job("j1", RUN_UID, done=False, active=1)], []),
                                                  "not finished although every run is terminal"),
    "a pod owned by no existing Job": (Cluster([_job("j1", RUN_UID)], [_pod("p1", "gone-job")]), "no existing Job"),
    "a pod still running": (Cluster([_job("j1", RUN_UID)], [_pod("p1", JOB_UID, "Running")]), "still Running"),
}
LEFT: dict[str, tuple[Cluster, str]] = {
    "a Job left after the runs were deleted": (Cluster([_job("j1", RUN_UID)], []), "Job j1 left"),
    "a pod left after the runs were deleted": (Cluster([], [_pod("p1", JOB_UID)]), "pod p1 (Succeeded) left"),
    "a live lap process left": (Cluster([], [], [4242]), "lap process 4242 still alive"),
}


def test_invariant_9_holds_on_a_clean_cluster():
    assert inv.check_no_orphans(Cluster([_job("j1", RUN_UID)], [_pod("p1", JOB_UID)]), "ns", RUNS) == []
    assert inv.check_nothing_left(Cluster([], []), "ns") == []


@pytest.mark.parametrize("name", list(ORPHANS))
def test_invariant_9_no_orphans_fails(name):
    cluster, expected = ORPHANS[name]
    v = inv.check_no_orphans(cluster, "ns", RUNS)
    assert any(expected in x for x in v), v


@pytest.mark.parametrize("name", list(LEFT))
def test_invariant_9_nothing_left_fails(name):
    cluster, expected = LEFT[name]
    v = inv.check_nothing_left(cluster, "ns")
    assert any(expected in x for x in v), v


# ---------------------------------------------------------------------------------- completeness
SOURCE = Path(inv.__file__)


def violation_statements() -> dict[int, tuple[str, tuple[str, ...]]]:
    """line -> (function, the literal pieces of its message) of every statement of
    invariants.py that reports a violation, inside a ``check_*`` function: an ``out.append(...)``,
    an ``out += ...``, an ``out = [...]`` comprehension, a ``return [<str>]``."""
    found: dict[int, tuple[str, tuple[str, ...]]] = {}

    def literal(node: ast.AST) -> tuple[str, ...]:
        parts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        return tuple(p for p in parts if len(p.strip()) >= 4) or tuple(parts)

    for fn in ast.walk(ast.parse(SOURCE.read_text())):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("check_"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                    and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "append" \
                    and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "out":
                found[node.lineno] = fn.name, literal(node)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "out":
                found[node.lineno] = fn.name, literal(node)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "out" for t in node.targets) \
                    and isinstance(node.value, ast.ListComp):
                found[node.lineno] = fn.name, literal(node)
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.List) and node.value.elts:
                found[node.lineno] = fn.name, literal(node)
    return found


def _traced(run: Callable[[], Any]) -> set[int]:
    """The lines of invariants.py executed while ``run`` ran."""
    lines: set[int] = set()
    target = str(SOURCE)

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == target else None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(old)
    return lines


def _broken_records() -> dict[str, Callable[[], Any]]:
    """Every broken record above and in test_invariants, as a call of the checks."""
    out: dict[str, Callable[[], Any]] = {}
    for table in (BROKEN, EXTRA):
        for name, (breaker, _) in table.items():
            def run(breaker: Callable[[inv.Evidence], Any] = breaker) -> Any:
                ev = good()
                breaker(ev)
                return inv.check_all(ev)
            out[name] = run

    def header_dropped() -> Any:  # test_invariants' real tool server without the Idempotency-Key header
        ev = good()
        ev.tool = tool_record(send_key=False)
        return inv.check_all(ev)
    out["the Idempotency-Key header dropped"] = header_dropped
    for name, (cluster, _) in ORPHANS.items():
        out[name] = lambda c=cluster: inv.check_no_orphans(c, "ns", RUNS)
    for name, (cluster, _) in LEFT.items():
        out[name] = lambda c=cluster: inv.check_nothing_left(c, "ns")
    return out


def test_every_violation_branch_fires():
    """Each violation statement is executed by some broken record AND that record's violations
    carry a piece of the statement's message (a comprehension's line runs even when it yields
    nothing)."""
    statements = violation_statements()
    assert len(statements) >= 49, statements  # 41 branches of check_all at 2bc70ce, +1 check_journaled, +7 of invariant 9
    fired_by: dict[int, list[str]] = {line: [] for line in statements}
    for name, run in _broken_records().items():
        violations: list[str] = []
        lines = _traced(lambda run=run: violations.extend(run()))
        for line in lines & set(statements):
            if any(piece in v for piece in statements[line][1] for v in violations):
                fired_by[line].append(name)
    never = {line: statements[line] for line, who in fired_by.items() if not who}
    assert not never, f"violation statements of {SOURCE.name} no broken record fires (line: check, message): {never}"
