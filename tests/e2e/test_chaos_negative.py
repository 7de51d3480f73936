"""The chaos suite's negative control through the real pipeline (issue 36; docs/chaos.md, "Negative
control"). One chaos world (a restartable control plane, S3 behind the cuttable proxy, the recording
tool server, operator replicas, lap processes) runs a short control scenario, which must pass, then
one short scenario per test-only fault of the product (``agentrun.testfault``), each of which must
FAIL the invariant that fault breaks, naming it. A fault the invariants let through fails the build."""

from __future__ import annotations

import pytest
from e2e.chaos.negative import CASES, FaultWorld, run_case
from e2e_support import running_world

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    yield from running_world(FaultWorld(tmp_path_factory.mktemp("chaos-negative")))


@pytest.mark.timeout(900)  # each scenario is bounded by negative.TIMEOUT (180 s); ~30-60 s each when idle
@pytest.mark.parametrize("case", CASES, ids=[c.fault.value if c.fault else "control" for c in CASES])
def test_the_invariants_catch_an_injected_fault(world, case):
    verdict = run_case(world, case)
    print(verdict.describe())
    assert verdict.ok, verdict.describe()
