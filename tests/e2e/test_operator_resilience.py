"""Resilience of the operator on the real local control plane: an approval that times out with
``onTimeout: fail``, and an S3 outage in the middle of a multi-lap run.

The module runs its own operator against its OWN S3 server (e2e.cluster.start_s3), reached through
a TCP proxy that the test can cut (``e2e.chaos.proxy.CuttableProxy``, shared with the chaos
suite): moto keeps its objects in memory only, so a stopped server would lose the checkpoints; a
network-level outage does not. The session ``s3``
fixture is not touched. Helpers come from test_operator_e2e.py / test_operator_failures.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from datetime import datetime
from typing import Any

import boto3
import pytest
from e2e.chaos.proxy import CuttableProxy
from e2e.cluster import leftover_processes, start_s3
from e2e_support import ToolGate, wait_for
from test_operator_e2e import ROOT, _diagnostics_on_failure, _gated, _one_job_per_attempt  # noqa: F401
from test_operator_failures import FailEnv, _note, _stays

from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class ResEnv(FailEnv):
    """FailEnv whose operator and lap pods reach the module's own S3 server through ``proxy``;
    ``s3c``/``store`` talk to the server directly (they see the data during an outage)."""

    def __init__(self, cluster: Any, s3: Any, proxy: CuttableProxy, tmp) -> None:
        super().__init__(cluster, dataclasses.replace(s3, endpoint_url=proxy.url), tmp)
        self.direct, self.proxy = s3, proxy
        self.s3c = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region,
                                aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)
        self.store = CheckpointStore(StoreConfig(uri=f"s3://{s3.bucket}/e2e-{self.ns}", endpoint_url=s3.endpoint_url,
                                                 region=s3.region, path_style=True), client=self.s3c)

    def run_ref(self, name: str) -> RunRef:
        return RunRef(namespace=self.ns, name=name, uid=self.get(name)["metadata"]["uid"])

    def lap_chain(self, name: str) -> list[tuple[Any, Any]]:
        """Every LapRecord of the run (verified sha256), asserting laps 1..N and the prevSha256 chain."""
        laps = list(self.store.iter_laps(self.run_ref(name)))
        assert [r.lap for r, _ in laps] == list(range(1, len(laps) + 1)), [r.lap for r, _ in laps]
        for i, (record, _) in enumerate(laps):
            expected = laps[i - 1][1].sha256 if i else None
            assert record.prev_sha256 == expected, (record.lap, record.prev_sha256, expected)
        return laps

    def run_calls(self, path: str, prefix: str) -> list[dict]:
        return [c for c in self.calls(path) if str(c["arguments"].get("order", "")).startswith(prefix)]

    def operator_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory):
    d = tmp_path_factory.mktemp("resilience-s3")
    s3 = start_s3(d)
    proxy = CuttableProxy(int(s3.endpoint_url.rsplit(":", 1)[1]))
    e = ResEnv(cluster, s3, proxy, tmp_path_factory.mktemp("operator-resilience"))
    try:
        e.prepare_namespace()
        e.start_operator("op-a")
        yield e
    finally:
        e.kill_operator()
        e.tools.shutdown()
        proxy.close()
        s3.stop()
        if os.environ.get("AGENTRUN_E2E_KEEP") is None:
            cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)
    assert not leftover_processes(d), "S3 server processes left behind"


# --------------------------------------------------------------------- approval onTimeout: fail


def test_approval_timeout_with_on_timeout_fail_ends_failed(env):
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": "tofail"}}]},
              {"content": "finished"}]
    # The deadline counts from the model's request inside lap 1, so on a slow box it may pass before
    # the operator first sees the pause: the test does not try to catch AwaitingApproval, it checks
    # what the status, the Events and the store record once the run has failed.
    env.apply(env.run_doc("tofail", script, approval_timeout="8s", on_timeout="fail"))
    st = env.wait_phase("tofail", "Failed", "Succeeded", timeout=180)
    assert st["phase"] == "Failed", st
    cond = env.condition("tofail")
    assert cond["status"] == "True" and cond["reason"] == "ApprovalTimedOut", cond
    assert "refund" in cond["message"] and "onTimeout is fail" in cond["message"], cond
    ap = st["approval"]
    assert ap["state"] == "TimedOut" and ap["tool"] == "refund" and ap["lap"] == 1, ap
    deadline = datetime.fromisoformat(ap["deadline"].replace("Z", "+00:00"))
    requested = datetime.fromisoformat(ap["requestedAt"].replace("Z", "+00:00"))
    decided = datetime.fromisoformat(ap["decidedAt"].replace("Z", "+00:00"))
    assert (deadline - requested).total_seconds() == 8 and decided >= deadline, ap  # never early
    reasons = [e["reason"] for e in env.events("tofail")]
    assert "ApprovalRequested" in reasons and "ApprovalTimedOut" in reasons, reasons
    checkpoint = st["checkpoint"]
    prefix = env.run_prefix("tofail")
    before = env.objects(prefix)
    assert [k for k in before if "/laps/" in k] == [checkpoint["key"]], before
    # no further lap: one Job (lap 1), across more than one resync (5 s); the tool never ran
    _stays("Failed with only lap 1's Job", lambda: env.status("tofail").get("phase") == "Failed"
           and [j["metadata"]["labels"]["agentrun.dev/lap"] for j in env.jobs("tofail")] == ["1"], seconds=7)
    assert not env.run_calls("/refund", "tofail")
    # the checkpoints are intact: lap 1 unchanged, still the run's checkpoint, nothing new written
    assert st["lap"] == 1 and st["checkpoint"]["sha256"] == checkpoint["sha256"], st["checkpoint"]
    assert env.objects(prefix) == before
    laps = env.lap_chain("tofail")
    assert len(laps) == 1 and laps[0][1].sha256 == checkpoint["sha256"]
    assert laps[0][0].outcome.type == "awaiting-approval", laps[0][0].outcome
    assert env.operator_alive()


# ------------------------------------------------------------------------------ S3 outage


def _events(env, name: str, reason: str) -> list[dict]:
    return [e for e in env.events(name) if e["reason"] == reason]


def test_s3_outage_mid_run_completes_exactly_once(env, request):
    name = "outage"
    script = [_note("outage1"), _note("outage2"), _note("outage3"), {"content": "done"}]
    # lap 2's tool call is held at a gate until the outage has begun (not a sleep to beat)
    gate = ToolGate(env.tool_url, hold=lambda args: isinstance(args, dict) and args.get("order") == "outage2")
    request.addfinalizer(gate.close)
    doc = _gated(env.run_doc(name, script, retry={"attemptsPerLap": 8,
                                                  "backoff": {"initial": "1s", "max": "3s", "factor": 2}}), gate)
    env.apply(doc)

    # outage 1, during lap 2: the lap's tool call is in flight; its result cannot be journaled
    wait_for("lap 2's tool call held at the gate", lambda: gate.arrived("outage2"), timeout=240)
    env.proxy.cut()
    gate.open()
    cut_at = time.time()
    retried = wait_for("lap 2 retried (exit 75)", lambda: next(
        (r for r in env.status(name).get("retries") or [] if r["lap"] == 2), None), timeout=180)
    assert "RetryableError" in retried["lastReason"], retried
    time.sleep(max(0.0, 15 - (time.time() - cut_at)))
    assert env.status(name).get("phase") not in ("Failed", "Succeeded"), env.status(name)
    env.proxy.resume()
    assert env.operator_alive(), "the operator exited during the outage"

    # outage 2, between laps: lap 3's checkpoint is written; the operator cannot read it
    lap3 = env.store.lap_key(env.run_ref(name), 3)

    def lap3_written() -> bool:
        try:
            env.s3c.head_object(Bucket=env.direct.bucket, Key=lap3)
            return True
        except env.s3c.exceptions.ClientError:
            return False

    wait_for("lap 3's checkpoint written", lap3_written, timeout=240, interval=0.05)
    env.proxy.cut()
    cut_at = time.time()
    unavailable = wait_for("StoreUnavailable posted", lambda: _events(env, name, "StoreUnavailable"), timeout=180)
    assert "lap 3 attempt 1 ended" in unavailable[0]["message"], unavailable
    time.sleep(max(0.0, 15 - (time.time() - cut_at)))  # several resyncs (5 s) and a requeue (10 s)
    assert env.status(name)["lap"] == 2, env.status(name)
    env.proxy.resume()

    st = env.wait_phase(name, "Succeeded", "Failed", "BudgetExceeded", timeout=300)
    assert st["phase"] == "Succeeded", st
    assert env.operator_alive(), "the operator exited"
    assert st["lap"] == 4, st

    # StoreUnavailable: at most once per lap attempt (Event count summed, by the lap/attempt it names)
    per_attempt: Counter = Counter()
    for e in _events(env, name, "StoreUnavailable"):
        key = e["message"].split(" ended;")[0]  # "lap N attempt M"
        per_attempt[key] += e.get("count") or 1
    assert per_attempt and all(n == 1 for n in per_attempt.values()), per_attempt

    # the lap that could not write was retried; one Job per attempt; lap 2 needed > 1 attempt
    jobs = env.jobs(name)
    _one_job_per_attempt(jobs)
    attempts = Counter(j["metadata"]["labels"]["agentrun.dev/lap"] for j in jobs)
    assert attempts["2"] >= 2 and attempts["1"] == 1 and attempts["3"] == 1 and attempts["4"] == 1, attempts
    assert st["totalRetries"] == attempts["2"] - 1, (st["totalRetries"], attempts)
    assert [r["lap"] for r in st["retries"]] == [2], st["retries"]
    assert any("RetryableError" in e["message"] for e in _events(env, name, "LapRetry"))

    # every side effect executed once at the tool server, one call per idempotency key
    calls = env.run_calls("/note", "outage")
    keys = Counter(c["idempotencyKey"] for c in calls)
    assert None not in keys and all(n == 1 for n in keys.values()), keys
    assert sorted(c["arguments"]["order"] for c in calls) == ["outage1", "outage2", "outage3"], calls

    # the lap chain is intact: laps 1..4, prevSha256 chaining, the status points at lap 4
    laps = env.lap_chain(name)
    assert len(laps) == 4, [r.lap for r, _ in laps]
    assert st["checkpoint"]["sha256"] == laps[-1][1].sha256 and st["checkpoint"]["key"] == laps[-1][1].key
    assert laps[-1][0].outcome.type == "done", laps[-1][0].outcome
    assert env.proxy.refused > 0  # clients did meet the outage
