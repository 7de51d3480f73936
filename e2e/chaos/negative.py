"""The chaos suite's negative control through the real pipeline (issue 36, docs/chaos.md,
"Negative control"): the product is broken on purpose with a test-only fault
(``agentrun.testfault``, switched on by ``AGENTRUN_TEST_FAULT``), a short scenario runs against it
in the chaos world (real control plane, S3, tool server, operator, lap processes), and the
invariants must FAIL, naming the one the fault breaks. A control scenario of the same shapes runs
first without a fault and must pass, so a failure is the fault's, not the scenario's.

    python -m e2e.chaos.negative [--only rekey ...] [--dir DIR]

Each fault reaches its process through the environment: the operator replica gets
``AGENTRUN_TEST_FAULT`` (operator faults), and its lap Jobs run ``env AGENTRUN_TEST_FAULT=<fault>
agentrun lap`` (``AGENTRUN_LAP_COMMAND``; lap faults). Nothing else differs from the ``ci`` schedule:
the same runner, world, tool server, holds and checks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.testfault import ENV
from agentrun.testfault import Fault as TestFault
from e2e.chaos import invariants as inv
from e2e.chaos.runner import ScenarioFailed, ScenarioRun
from e2e.chaos.schedule import POD_SIGKILL, Fault, RunPlan, Scenario
from e2e.chaos.world import World, say

#: Every check of check_all, with the invariant of docs/chaos.md it belongs to.
CHECKS: list[tuple[str, Callable[[inv.Evidence], list[str]]]] = [
    ("1 every run reaches its terminal phase", inv.check_phases),
    ("2 every side effect happens exactly once", inv.check_side_effects),
    ("2 every side effect happens exactly once (journaled answers are reused)", inv.check_journaled),
    ("3-4 the store's chain and cost, status == store", inv.check_store),
    ("5 exactly one Job per lap attempt", inv.check_jobs),
    ("6 every fault landed", inv.check_faults_landed),
    ("7 status never shows a call Pending after it executed", inv.check_approvals),
    ("8 leadership", inv.check_leadership),
]

TIMEOUT = 180.0  # per scenario: ~30-60 s on an idle 2-core box; a broken product may never finish its runs


def _plan(name: str, calls: list[int], approval: str | None = None) -> RunPlan:
    """A run of len(calls)+1 laps: lap s makes calls[s] ``note`` calls (orders ``name/lap/j``); with
    ``approval``, lap 1 also asks for a ``refund`` that needs it (executed in lap 2)."""
    steps: list[dict[str, Any]] = []
    for s, n in enumerate(calls):
        steps.append({"content": f"lap {s + 1}",
                      "toolCalls": [{"name": "note", "arguments": {"order": f"{name}/{s + 1}/{j + 1}"}}
                                    for j in range(n)],
                      "usage": {"inputTokens": 100 + s, "outputTokens": 10 + s}})
    if approval:
        steps[0]["toolCalls"].append({"name": "refund", "arguments": {"order": f"{name}/refund"}})
    steps.append({"content": "done", "usage": {"inputTokens": 50, "outputTokens": 5}})
    return RunPlan(name=name, steps=steps, approval=approval)


def _sigkill(order: str) -> Fault:
    """A pod SIGKILL whose victim is the call ``order``, held in flight at the tool server."""
    return Fault(kind=POD_SIGKILL, at=0.0, target=order)


@dataclass(frozen=True)
class Case:
    fault: TestFault | None  # None: the control
    scenario: Callable[[], Scenario]
    invariant: str  # the CHECKS label that must fail ("" for the control: none may)
    says: str  # a piece of the violation it must report
    why: str


def _scn(name: str, runs: list[RunPlan], faults: list[Fault] | None = None) -> Scenario:
    return Scenario(name=name, runs=runs, faults=faults or [], timeout=TIMEOUT)


CASES: list[Case] = [
    Case(None, lambda: _scn("neg-control", [_plan("ct-000", [2, 1]), _plan("ct-001", [1], "approve"),
                                            _plan("ct-002", [1])], [_sigkill("ct-000/1/2")]),
         "", "", "the same shapes without a fault: a SIGKILL with the 2nd call of a lap in flight, an approval"),
    Case(TestFault.REKEY, lambda: _scn("neg-rekey", [_plan("rk-000", [1, 1]), _plan("rk-001", [1])],
                                       [_sigkill("rk-000/1/1")]),
         CHECKS[1][0], "outside the scripted set",
         "the retried attempt sends the killed call under another key: the tool executes it again"),
    Case(TestFault.SKIP_JOURNAL, lambda: _scn("neg-skip-journal", [_plan("sj-000", [2, 1]), _plan("sj-001", [1])],
                                              [_sigkill("sj-000/1/2")]),
         CHECKS[2][0], "was not reused from the lap's journal",
         "the retried attempt sends the lap's first call again, answered before the killed one was sent"),
    Case(TestFault.DOUBLE_JOB, lambda: _scn("neg-double-job", [_plan("dj-000", [1]), _plan("dj-001", [1])]),
         CHECKS[4][0], "name is not", "every lap attempt gets a second Job"),
    Case(TestFault.LOSE_DECISION, lambda: _scn("neg-lose-decision", [_plan("ld-000", [1], "approve"),
                                                                     _plan("ld-001", [1])]),
         CHECKS[0][0], "expected Succeeded",
         "the lap after the approval is started without the decision and refuses to run"),
]


class FaultWorld(World):
    """The chaos world, with ``fault`` switched on in the operator replicas started from now on and
    in their lap Jobs (through the lap command)."""

    fault: TestFault | None = None

    def operator_env(self, ns: str, identity: str) -> dict[str, str]:
        env = super().operator_env(ns, identity)
        if self.fault is not None:
            env[ENV] = self.fault.value
            lap = json.loads(env["AGENTRUN_LAP_COMMAND"])
            env["AGENTRUN_LAP_COMMAND"] = json.dumps([shutil.which("env") or "/usr/bin/env",
                                                      f"{ENV}={self.fault.value}", *lap])
        return env


@dataclass
class Verdict:
    case: Case
    failed: dict[str, list[str]]  # CHECKS label -> its violations
    other: list[str]  # violations no check of CHECKS gave (timeouts, orphans, ...)
    seconds: float

    @property
    def ok(self) -> bool:
        """The control passed; a fault failed the invariant it breaks, saying so."""
        if self.case.fault is None:
            return not self.failed and not self.other
        return any(self.case.says in v for v in self.failed.get(self.case.invariant, []))

    def describe(self) -> str:
        what = "control (no fault)" if self.case.fault is None else f"fault {self.case.fault.value}"
        head = f"{what}: {'as expected' if self.ok else 'NOT AS EXPECTED'} in {self.seconds:.0f}s"
        if self.case.fault is not None:
            head += f"; must fail invariant {self.case.invariant!r} saying {self.case.says!r}"
        lines = [head] + [f"  failed {label}: {v[0]}" + (f" (+{len(v) - 1} more)" if len(v) > 1 else "")
                          for label, v in self.failed.items()]
        lines += [f"  other: {o}" for o in self.other[:5]]
        if not self.failed and not self.other:
            lines.append("  every invariant held")
        return "\n".join(lines)


def run_case(world: FaultWorld, case: Case, seed: int = 0) -> Verdict:
    """Run the case's scenario with its fault on; return which invariants failed."""
    scn = case.scenario()
    world.fault = case.fault
    run = ScenarioRun(world, scn, seed, f"negative:{case.fault or 'control'}")
    t0 = time.time()
    message = ""
    try:
        run.execute()
    except ScenarioFailed as e:
        message = str(e)
    finally:
        world.fault = None
        world.kill_operators()
    ev: inv.Evidence | None = getattr(run, "evidence", None)
    failed = {label: v for label, fn in CHECKS if ev is not None and (v := fn(ev))}
    named = {x for v in failed.values() for x in v}
    other = [line.strip() for line in message.splitlines()[1:] if line.strip() and line.strip() not in named]
    if message and ev is None:
        other.append(message.splitlines()[0])
    world.kubectl("delete", "namespace", run.ns, "--wait=false", check=False)
    verdict = Verdict(case, failed, other, time.time() - t0)
    say(f"negative control: {verdict.describe()}")
    return verdict


def run_all(world: FaultWorld, only: list[str] | None = None) -> list[Verdict]:
    return [run_case(world, c) for c in CASES
            if not only or (c.fault.value if c.fault else "control") in only]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.chaos.negative", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="control and/or fault names")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args(argv)
    world = FaultWorld(a.dir or tempfile.mkdtemp(prefix="agentrun-chaos-negative-"))
    try:
        world.start()
        verdicts = run_all(world, a.only)
    finally:
        problems = world.stop()
    for v in verdicts:
        print(v.describe())
    bad = [v for v in verdicts if not v.ok]
    if bad or problems:
        print(f"NEGATIVE CONTROL FAILED: {len(bad)} case(s) not as expected; {problems or ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
