"""The test-only fault switch (``agentrun.testfault``, issue 36): what each fault does at its hook,
that it needs both markers (the module and ``AGENTRUN_TEST_FAULT``), that the hooks are inert when
the module is absent, and that the wheel the image installs does not contain it. The faults run
through the real pipeline in tests/e2e/test_chaos_negative.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from agentrun import testfault
from agentrun.checkpoint.schema import RunRef
from agentrun.controller.decide.actions import CreateJob
from agentrun.controller.decide.jobs import ApprovalEnv
from agentrun.lap.runner import StoreJournal
from agentrun.testfault import ENV, Fault

ROOT = Path(__file__).resolve().parents[2]
RUN = RunRef(namespace="ns", name="r", uid="8f2a1c0d-1111-2222-3333-444455556666")


def test_the_switch_names_its_faults_and_refuses_unknown_ones():
    assert testfault.parse("") == frozenset()
    assert testfault.parse(" rekey, double-job ,") == {Fault.REKEY, Fault.DOUBLE_JOB}
    with pytest.raises(ValueError, match=r"AGENTRUN_TEST_FAULT: unknown fault 'rekye'; choose from rekey, "
                                         r"skip-journal, double-job, lose-decision"):
        testfault.parse("rekye")
    assert testfault.active(Fault.SKIP_JOURNAL, {ENV: "skip-journal"})
    assert not testfault.active(Fault.SKIP_JOURNAL, {ENV: "rekey"})
    assert not testfault.active(Fault.SKIP_JOURNAL, {})


class Tools:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def call(self, tool: Any, arguments: dict[str, Any], idempotency_key: str) -> str:
        self.keys.append(idempotency_key)
        return "ok"

    def secrets(self) -> list[str]:
        return ["s"]


def test_rekey_changes_the_key_of_a_retried_attempt_only(monkeypatch):
    tools = Tools()
    assert testfault.lap_tools(tools, 2) is tools  # off
    monkeypatch.setenv(ENV, "rekey")
    assert testfault.lap_tools(tools, 1) is tools  # the first attempt keeps its keys
    rekeyed = testfault.lap_tools(tools, 2)
    rekeyed.call(None, {}, "r_x:1:note:call_1")
    assert tools.keys == ["r_x:1:note:call_1-a2"] and rekeyed.secrets() == ["s"]


class NoStore:
    """A store that must not be touched."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used: {name}")


class PutStore:
    def __init__(self) -> None:
        self.puts: list[str] = []

    def put_journal_entry(self, run: Any, lap: int, name: str, body: Any, agent_version: str) -> tuple[Any, bool]:
        self.puts.append(name)
        return type("Stored", (), {"size": 1})(), True


def test_skip_journal_skips_the_tool_results_only(monkeypatch):
    store = PutStore()
    StoreJournal(store, RUN, 1, "v1").put("tool-call_1", {"kind": "tool"})  # type: ignore[arg-type]
    assert store.puts == ["tool-call_1"]  # off: journaled
    monkeypatch.setenv(ENV, "skip-journal")
    assert StoreJournal(NoStore(), RUN, 1, "v1").put("tool-call_1", {"kind": "tool"}) is True  # type: ignore[arg-type]
    assert StoreJournal(NoStore(), RUN, 1, "v1").put("tool-approved-call_1", {}) is True  # type: ignore[arg-type]
    assert testfault.skip_journal("tool-call_1") and not testfault.skip_journal("model")


def test_double_job_and_lose_decision(monkeypatch):
    job = {"metadata": {"name": "a" * 50 + "-8f2a1-l1-a1", "labels": {"x": "y"}}, "spec": {"s": 1}}
    action = CreateJob(lap=2, attempt=1, agent_version="v1", name="r-8f2a1-l2-a1",
                       approval=ApprovalEnv(decision="approved", call_id="call_1"))
    assert testfault.second_job(job) is None and testfault.create_job(action) is action  # off
    monkeypatch.setenv(ENV, "double-job,lose-decision")
    dup = testfault.second_job(job)
    assert dup is not None and dup["metadata"]["name"].endswith("-dup") and len(dup["metadata"]["name"]) <= 63
    assert dup["metadata"]["labels"] == job["metadata"]["labels"] and dup["spec"] == job["spec"]
    assert job["metadata"]["name"] == "a" * 50 + "-8f2a1-l1-a1"  # the first Job's manifest is not changed
    assert testfault.create_job(action) == dataclasses.replace(action, approval=None)


def test_the_hooks_are_inert_without_the_module():
    """The image has no agentrun.testfault (the wheel excludes it): the hook sites import without it,
    and even with AGENTRUN_TEST_FAULT naming every fault the journal is written."""
    code = """
import sys
sys.modules["agentrun.testfault"] = None  # as absent as in the image: importing it raises ImportError
import agentrun.controller.execute as execute
import agentrun.lap.runner as runner
assert execute.testfault is None and runner.testfault is None
class Store:
    puts = []
    def put_journal_entry(self, run, lap, name, body, agent_version):
        self.puts.append(name)
        return type("Stored", (), {"size": 1})(), True
from agentrun.checkpoint.schema import RunRef
store = Store()
runner.StoreJournal(store, RunRef(namespace="n", name="r", uid="u"), 1, "v1").put("tool-call_1", {})
assert store.puts == ["tool-call_1"], store.puts
print("inert")
"""
    env = {**os.environ, ENV: ",".join(f.value for f in Fault)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "inert", r.stderr


@pytest.mark.slow
def test_the_wheel_and_so_the_image_do_not_contain_it(tmp_path):
    """make image and the Dockerfile install the project wheel (tools/image/build.sh project_wheel:
    `pip wheel --no-deps`); the same command here must leave agentrun/testfault out."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("agentrun-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "agentrun/lap/runner.py" in names and "agentrun/controller/execute.py" in names
    assert not [n for n in names if "testfault" in n]


def test_a_fault_the_invariants_let_through_is_not_as_expected():
    """The e2e negative control's verdict (e2e/chaos/negative.py): a fault case passes only when the
    invariant it breaks failed saying so; the control only when nothing failed."""
    from e2e.chaos.negative import CASES, Verdict

    control, rekey = CASES[0], next(c for c in CASES if c.fault == Fault.REKEY)
    assert Verdict(control, {}, [], 1.0).ok
    assert not Verdict(control, {}, ["timed out after 180s"], 1.0).ok
    assert not Verdict(rekey, {}, [], 1.0).ok  # every invariant held under the fault: fails the build
    assert not Verdict(rekey, {"5 exactly one Job per lap attempt": ["Job x created 2 times"]}, [], 1.0).ok
    assert Verdict(rekey, {rekey.invariant: ["side effects executed outside the scripted set: [...]"]}, [], 1.0).ok
    assert {c.fault for c in CASES} == {None, *Fault}  # every fault of the switch has its case
