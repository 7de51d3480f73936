"""``agentrun approvals`` against the real local control plane with the operator running: the queue
lists a waiting run with its owner and tool, a decision on a run that is not waiting is refused,
and ``approve`` resumes a waiting run to Succeeded.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py; ``env`` (the operator as a
subprocess, its namespace, the tool server), the diagnostics on failure and ``_approval_run`` come
from test_operator_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_operator_e2e import _approval_run, _diagnostics_on_failure, env  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def cli(e, *args: str) -> subprocess.CompletedProcess:
    """``agentrun approvals ARGS`` with the cluster's kubeconfig, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "agentrun.cli.main", "approvals", *args],
                          env=e.cluster.env(), capture_output=True, text=True, timeout=60, check=False)


def test_cli_approval_queue_refuses_early_decisions_and_approves(env):  # noqa: F811 (the fixture)
    # a run that is not waiting: the decision is refused, nothing is annotated
    env.apply(env.run_doc("cli-early", [{"content": "x"}], suspend=True))
    env.wait_phase("cli-early", "Suspended")
    r = cli(env, "approve", "cli-early", "-n", env.ns, "--reason", "too early")
    assert r.returncode == 5, (r.stdout, r.stderr)  # ExitCode.CONFLICT: not in the phase the verb needs
    assert "not awaiting approval (phase Suspended)" in r.stderr, r.stderr
    assert "approved" not in (env.get("cli-early")["metadata"].get("annotations") or {})

    # a run waiting for approval shows up in the queue with its owner and tool
    _approval_run(env, "cli-queue")
    r = cli(env, "list", "-A")
    assert r.returncode == 0, r.stderr
    header, *rows = [line.split() for line in r.stdout.splitlines()]
    assert header == ["NAMESPACE", "NAME", "OWNER", "TOOL", "TARGET", "APPROVALS", "LAP", "AGE", "DEADLINE",
                      "ON-TIMEOUT"], header
    row = next((x for x in rows if x[:2] == [env.ns, "cli-queue"]), None)
    assert row is not None, r.stdout
    # TARGET is "METHOD URL", APPROVALS "0 of 1"
    assert row[2:5] == ["e2e-team", "refund", "POST"] and row[6:10] == ["0", "of", "1", "1"], row
    assert row[-1] == "reject", row
    assert not [x for x in rows if x[:2] == [env.ns, "cli-early"]], r.stdout  # not waiting: not queued
    r = cli(env, "list", "-n", env.ns, "-o", "json")
    queued = json.loads(r.stdout)
    assert [(q["name"], q["owner"], q["tool"]) for q in queued] == [("cli-queue", "e2e-team", "refund")]
    assert 0 < queued[0]["secondsLeft"] <= 3600
    r = cli(env, "list", "-n", env.ns, "--owner", "someone-else", "-o", "json")
    assert json.loads(r.stdout) == []
    r = cli(env, "show", "cli-queue", "-n", env.ns)
    assert r.returncode == 0 and '"order": "cli-queue"' in r.stdout and "Deadline:" in r.stdout, r.stdout

    # approve: the operator records the decision and the run resumes to Succeeded
    r = cli(env, "approve", "cli-queue", "-n", env.ns, "--reason", "ok")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "approved call" in r.stdout and "refund" in r.stdout, r.stdout
    st = env.wait_phase("cli-queue", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st
    assert st["approval"]["state"] == "Approved" and st["approval"]["reason"] == "ok", st["approval"]
    assert len([c for c in env.calls("/refund") if c["arguments"].get("order") == "cli-queue"]) == 1
    # the queue is empty again
    assert json.loads(cli(env, "list", "-n", env.ns, "-o", "json").stdout) == []
