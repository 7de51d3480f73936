"""Failure paths of the operator on the real local control plane with a real S3 server: budgets,
an unreadable checkpoint, lap timeouts, a permanent lap failure, retention Delete, two operator
replicas. Helpers (``Env``, ``_wait``, diagnostics on failure) come from test_operator_e2e.py.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py (e2e/cluster.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from e2e_support import ToolGate
from test_operator_e2e import ROOT, Env, _diagnostics_on_failure, _gated, _one_job_per_attempt, _wait  # noqa: F401

from agentrun.checkpoint.codec import encode_object, inflate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class FailEnv(Env):
    """Env with named operator replicas (each its own identity and log) and an S3 client."""

    def __init__(self, cluster: Any, s3: Any, tmp: Path) -> None:
        super().__init__(cluster, s3, tmp)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.s3c = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region,
                                aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)

    def start_operator(self, identity: str = "op-a", kubeconfig: str | None = None,  # type: ignore[override]
                       **settings: str) -> None:
        """Start replica ``identity`` (its own log), as ``kubeconfig``'s user when given, with more
        ``AGENTRUN_*`` settings."""
        env = self.operator_env(AGENTRUN_IDENTITY=identity, **settings)
        if kubeconfig:
            env["KUBECONFIG"] = kubeconfig
        log = self.tmp / f"operator-{identity}.log"
        fh = open(log, "ab")
        proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[identity], self.logs[identity] = proc, log
        if self.proc is None or self.proc.poll() is not None:
            self.proc, self.log = proc, log  # the diagnostics fixture prints this log

    def kill(self, identity: str) -> None:
        proc = self.procs[identity]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def kill_operator(self) -> None:
        for identity in self.procs:
            self.kill(identity)

    def lease_holder(self) -> str:
        r = self.kubectl("get", "lease", "agentrun-operator", "-n", self.ns, "-o", "jsonpath={.spec.holderIdentity}",
                         check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    def run_prefix(self, name: str) -> str:
        uid = self.get(name)["metadata"]["uid"]
        return f"e2e-{self.ns}/{self.ns}/{name}/{uid}/"

    def objects(self, prefix: str) -> dict[str, str]:
        """key -> ETag of every object under prefix."""
        out: dict[str, str] = {}
        for page in self.s3c.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=prefix):
            out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        return out

    def condition(self, name: str, ctype: str = "Failed") -> dict:
        return next(c for c in self.status(name)["conditions"] if c["type"] == ctype)



@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = FailEnv(cluster, s3, tmp_path_factory.mktemp("operator-failures"))
    e.prepare_namespace()
    e.start_operator("op-a")
    yield e
    e.kill_operator()
    e.tools.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


@pytest.fixture
def gate(env):
    g = ToolGate(env.tool_url)
    yield g
    g.close()


def _note(order: str, **extra: Any) -> dict:
    return {"content": order, "toolCalls": [{"name": "note", "arguments": {"order": order, **extra}}]}


def _stays(what: str, fn, seconds: float, interval: float = 0.5) -> None:
    """fn() must stay true for `seconds` (checked every `interval`): a negative check over a window."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert fn(), f"{what} stopped holding"
        time.sleep(interval)


# ------------------------------------------------------------------------------------- budget


def test_budget_max_laps_reached_before_the_agent_finishes(env):
    env.apply(env.run_doc("laps", [_note("laps1"), _note("laps2"), _note("laps3"), {"content": "done"}],
                          budget={"maxLaps": 2}))
    st = env.wait_phase("laps", "BudgetExceeded", "Succeeded", "Failed")
    assert st["phase"] == "BudgetExceeded", st
    assert st["lap"] == 2 and "maxLaps=2" in st["message"], st
    assert env.condition("laps")["reason"] == "BudgetExceeded"
    jobs = env.jobs("laps")
    _one_job_per_attempt(jobs)
    assert sorted(j["metadata"]["labels"]["agentrun.dev/lap"] for j in jobs) == ["1", "2"]  # no Job for lap 3
    assert "BudgetExceeded" in [e["reason"] for e in env.events("laps")]
    assert not [c for c in env.calls("/note") if c["arguments"].get("order") == "laps3"]


def test_budget_max_cost_reached(env):
    usage = {"inputTokens": 1_000_000, "outputTokens": 0}  # $1.00 per lap at the pricing below
    doc = env.run_doc("cost", [{**_note("cost1"), "usage": usage}, {**_note("cost2"), "usage": usage},
                               {**_note("cost3"), "usage": usage}, {"content": "done"}],
                      budget={"maxLaps": 10, "maxCostUSD": "1.50"})
    doc["spec"]["agent"]["model"]["pricing"] = {"inputPerMillionTokensUSD": "1.00", "outputPerMillionTokensUSD": "0"}
    env.apply(doc)
    st = env.wait_phase("cost", "BudgetExceeded", "Succeeded", "Failed")
    assert st["phase"] == "BudgetExceeded", st
    assert st["lap"] == 2 and "maxCostUSD" in st["message"], st
    assert float(st["cost"]["usd"]) == pytest.approx(2.0), st["cost"]
    assert len(env.jobs("cost")) == 2  # lap 1 ($1.00 < $1.50) ran lap 2; $2.00 stopped lap 3
    assert not [c for c in env.calls("/note") if c["arguments"].get("order") == "cost3"]


# ------------------------------------------------------------------------ unreadable checkpoint


# The checkpoint rows of the bad-input table (docs/bad-input.md): what was done to lap 1's object,
# and what the Failed condition's message must then say besides the key.
DAMAGE = {"garbage": "corrupt", "future-schema": "future", "truncated": "truncated", "foreign-run": "foreign"}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_unreadable_checkpoint_stops_failed_store_untouched_no_crash_loop(env, damage):
    name = DAMAGE[damage]
    if damage == "foreign-run":  # another run of the namespace, whose lap 1 is copied over ours below
        env.apply(env.run_doc("donor", [{"content": "done"}]))
        assert env.wait_phase("donor", "Succeeded", "Failed")["phase"] == "Succeeded"
    # lap 1's call is held at a gate until the operator has seen spec.suspend (observedGeneration),
    # so the run stops after lap 1 however slow the box is (it was a 3 s tool sleep to beat)
    gate = ToolGate(env.tool_url, hold=lambda args: isinstance(args, dict) and args.get("order") == f"{name}1")
    try:
        _unreadable_checkpoint(env, damage, name, gate)
    finally:
        gate.close()


def _unreadable_checkpoint(env, damage: str, name: str, gate: ToolGate) -> None:
    env.apply(_gated(env.run_doc(name, [_note(f"{name}1"), _note(f"{name}2"), {"content": "done"}]), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived(f"{name}1"), timeout=180)
    env.kubectl("patch", "agentrun", name, "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    generation = env.get(name)["metadata"]["generation"]
    _wait("the operator to see spec.suspend while lap 1 is in flight",
          lambda: (env.status(name).get("observedGeneration") or 0) >= generation, timeout=180)
    assert env.status(name).get("lap", 0) == 0 and env.status(name).get("activeJob"), env.status(name)
    gate.open()
    st = env.wait_phase(name, "Suspended", "Failed", "Succeeded")
    assert st["phase"] == "Suspended" and st["lap"] == 1, st
    key = st["checkpoint"]["key"]
    assert key.endswith("laps/00000001.json"), key
    head = env.s3c.head_object(Bucket=env.s3.bucket, Key=key)
    assert head["Metadata"].get("sha256") == st["checkpoint"]["sha256"]
    if damage == "garbage":  # overwrite the body, keep the metadata (the sha256 no longer matches)
        data, expect = b'{"schemaVersion": 2, "lap": 1, "broken": tru', "sha256"
    elif damage == "truncated":  # the first half of the object, re-uploaded with a matching sha256
        whole = env.s3c.get_object(Bucket=env.s3.bucket, Key=key)["Body"].read()
        data, expect = whole[: len(whole) // 2], "is a truncated or padded gzip stream"
        head["Metadata"]["sha256"] = hashlib.sha256(data).hexdigest()
    elif damage == "foreign-run":  # the donor's lap 1, byte for byte with its own metadata
        donor = env.s3c.get_object(Bucket=env.s3.bucket, Key=env.get("donor")["status"]["checkpoint"]["key"])
        data, expect = donor["Body"].read(), f"of {env.ns}/donor (uid {env.get('donor')['metadata']['uid']})"
        head["Metadata"] = donor["Metadata"]
    else:  # a well-formed object of a schema version this agentrun does not know, with its true sha256
        doc = json.loads(inflate(env.s3c.get_object(Bucket=env.s3.bucket, Key=key)["Body"].read(), key))
        doc["schemaVersion"] = 99
        data, expect = encode_object(doc), "schemaVersion 99"
        head["Metadata"]["sha256"] = hashlib.sha256(data).hexdigest()
    env.s3c.put_object(Bucket=env.s3.bucket, Key=key, Body=data, Metadata=head["Metadata"])
    prefix = env.run_prefix(name)
    before = env.objects(prefix)
    env.kubectl("patch", "agentrun", name, "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    st = env.wait_phase(name, "Failed", "Succeeded", timeout=240)
    assert st["phase"] == "Failed", st
    cond = env.condition(name)
    assert cond["status"] == "True" and cond["reason"] == "CheckpointUnreadable", cond
    assert "laps/00000001.json" in cond["message"] and expect in cond["message"], cond
    assert "CheckpointUnreadable" in [e["reason"] for e in env.events(name)]
    # the store is left intact: nothing deleted or rewritten, no lap 2 written
    after = env.objects(prefix)
    assert {k: v for k, v in after.items() if k in before} == before, (before, after)
    assert env.s3c.get_object(Bucket=env.s3.bucket, Key=key)["Body"].read() == data
    assert not [k for k in after if k.endswith("laps/00000002.json")], after
    assert not [c for c in env.calls("/note") if c["arguments"].get("order") == f"{name}2"]
    # no crash loop: no new Job attempt, still Failed, across more than one resync (5 s)
    n_jobs = len(env.jobs(name))
    assert n_jobs == 2, env.jobs(name)  # lap 1, then the one attempt of lap 2 that found the corruption
    _stays("Failed, no new Job", lambda: env.status(name).get("phase") == "Failed"
           and len(env.jobs(name)) == n_jobs, seconds=8)


# ------------------------------------------------------------------------------- lap timeout


def test_lap_timeout_is_retried_with_backoff_then_fails(env):
    doc = env.run_doc("slowlap", [_note("slowlap", sleepSeconds=30), {"content": "done"}],
                      lapTimeout="4s", retry={"attemptsPerLap": 2, "backoff": {"initial": "1s", "max": "2s", "factor": 2}})
    env.apply(doc)
    _wait("first attempt retried", lambda: env.status("slowlap").get("totalRetries", 0) >= 1
          or env.status("slowlap").get("phase") == "Failed", timeout=180)
    st = env.status("slowlap")
    if st.get("phase") == "Retrying":  # a phase seen between the attempts (may be missed if short)
        assert "DeadlineExceeded" in st["message"], st
    st = env.wait_phase("slowlap", "Failed", "Succeeded", timeout=240)
    assert st["phase"] == "Failed", st
    cond = env.condition("slowlap")
    assert cond["reason"] == "RetriesExhausted", cond
    assert "lap 1 failed 2 of 2" in cond["message"] and "DeadlineExceeded" in cond["message"], cond
    assert st["totalRetries"] == 2, st
    assert [(r["lap"], r["retries"]) for r in st["retries"]] == [(1, 2)], st["retries"]
    assert "DeadlineExceeded" in st["retries"][0]["lastReason"], st["retries"]
    jobs = env.jobs("slowlap")
    _one_job_per_attempt(jobs)
    assert sorted(j["metadata"]["labels"]["agentrun.dev/attempt"] for j in jobs) == ["1", "2"]
    assert all(j["spec"]["activeDeadlineSeconds"] == 4 for j in jobs)
    # the backoff: attempt 2 started at least `initial` (1 s) after attempt 1 ended
    a1, a2 = sorted(jobs, key=lambda j: j["metadata"]["labels"]["agentrun.dev/attempt"])
    ended = max(c["lastTransitionTime"] for c in a1["status"]["conditions"])
    assert a2["metadata"]["creationTimestamp"] > ended, (ended, a2["metadata"]["creationTimestamp"])
    retries = [e for e in env.events("slowlap") if e["reason"] == "LapRetry"]
    assert retries and "lap 1 attempt 1" in retries[0]["message"] and "DeadlineExceeded" in retries[0]["message"]
    # the operator's log line of the retry names the failing lap (1), not the last completed one (0)
    lines = [json.loads(line) for line in env.log.read_text(errors="replace").splitlines() if line.startswith("{")]
    retry_lines = [x for x in lines if x.get("name") == "slowlap" and x["msg"].startswith("LapRetry")]
    assert retry_lines and all(x["lap"] == 1 and x["attempt"] == 1 for x in retry_lines), retry_lines


# ---------------------------------------------------------------------- permanent failure (exit 2)


def test_version_bump_removing_the_pending_tool_fails_permanently(env):
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": "gone"}}]},
              {"content": "finished"}]
    env.apply(env.run_doc("toolgone", script))
    st = env.wait_phase("toolgone", "AwaitingApproval", "Failed", "Succeeded")
    assert st["phase"] == "AwaitingApproval" and st["approval"]["tool"] == "refund", st
    checkpoint = st["checkpoint"]
    prefix = env.run_prefix("toolgone")
    before = env.objects(prefix)
    # v2 of the agent no longer declares the tool of the pending approval
    patch = {"spec": {"agent": {"version": "v2", "tools": [
        {"name": "note", "http": {"url": f"{env.tool_url}/note", "timeout": "20s"}}]}}}
    env.kubectl("patch", "agentrun", "toolgone", "-n", env.ns, "--type=merge", "-p", json.dumps(patch))
    env.kubectl("annotate", "agentrun", "toolgone", "-n", env.ns, "approved=true")
    st = env.wait_phase("toolgone", "Failed", "Succeeded", timeout=240)
    assert st["phase"] == "Failed", st
    cond = env.condition("toolgone")
    assert cond["reason"] == "LapFailedPermanently", cond
    assert "refund" in cond["message"], cond
    assert st["totalRetries"] == 0 and len(env.jobs("toolgone")) == 2  # exit 2: not retried
    # the checkpoints are intact: lap 1 unchanged and still the run's checkpoint
    assert st["lap"] == 1 and st["checkpoint"]["sha256"] == checkpoint["sha256"]
    after = env.objects(prefix)
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [c for c in env.calls("/refund") if c["arguments"].get("order") == "gone"]


# --------------------------------------------------------------------------------- retention


def test_retention_delete_removes_the_checkpoints_retain_keeps_them(env):
    delete = env.run_doc("deleteme", [_note("deleteme"), {"content": "done"}])
    delete["spec"]["checkpoint"] = {"retention": "Delete"}
    env.apply(delete)
    env.apply(env.run_doc("keepme", [_note("keepme"), {"content": "done"}]))
    for name in ("deleteme", "keepme"):
        st = env.wait_phase(name, "Succeeded", "Failed")
        assert st["phase"] == "Succeeded", st
    assert "agentrun.dev/checkpoints" in env.get("deleteme")["metadata"].get("finalizers", [])
    assert "agentrun.dev/checkpoints" not in (env.get("keepme")["metadata"].get("finalizers") or [])
    del_prefix, keep_prefix = env.run_prefix("deleteme"), env.run_prefix("keepme")
    assert len([k for k in env.objects(del_prefix) if "/laps/" in k]) == 2
    kept = env.objects(keep_prefix)
    assert len([k for k in kept if "/laps/" in k]) == 2
    env.kubectl("delete", "agentrun", "deleteme", "keepme", "-n", env.ns, "--wait=true", "--timeout=60s")
    assert env.get("deleteme") == {} and env.get("keepme") == {}
    assert env.objects(del_prefix) == {}  # deleted before the finalizer was removed
    assert env.objects(keep_prefix) == kept


# ---------------------------------------------------------------------------- two operators


def test_two_operators_only_the_lease_holder_acts_and_the_standby_takes_over(env, gate):
    holder = _wait("a Lease holder", env.lease_holder)
    assert holder == "op-a"
    env.start_operator("op-b")
    _wait("op-b standby", lambda: "standby" in env.logs["op-b"].read_text(errors="replace"), timeout=120)
    script = [_note("ha1"), _note("ha2"), {"content": "done"}]
    env.apply(_gated(env.run_doc("ha", script), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived("ha1"), timeout=180)
    assert env.lease_holder() == "op-a"
    b_log = env.logs["op-b"].read_text(errors="replace")
    assert "created lap Job" not in b_log and "acquired" not in b_log, b_log[-2000:]
    assert "created lap Job" in env.logs["op-a"].read_text(errors="replace")
    env.kill("op-a")
    # how fast the standby takes over is a figure (the Lease duration), not asserted here
    _wait("op-b takes the Lease", lambda: env.lease_holder() == "op-b", timeout=180)
    gate.open()  # lap 1 ends after the failover: op-b adopts the Job it did not create
    st = env.wait_phase("ha", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    jobs = env.jobs("ha")
    _one_job_per_attempt(jobs)
    assert len(jobs) == 3 and st["totalRetries"] == 0, (jobs, st)
    b_log = env.logs["op-b"].read_text(errors="replace")
    assert "acquired by op-b" in b_log and "created lap Job" in b_log
    for order in ("ha1", "ha2"):
        assert len([c for c in env.calls("/note") if c["arguments"].get("order") == order]) == 1, order


# ------------------------------------------------------------------------------------ job quota


def test_a_job_quota_defers_the_lap_with_one_event_and_the_run_goes_on_once_it_is_lifted(env):
    """A ResourceQuota on count/jobs.batch refuses the lap Job (403 "exceeded quota", or "status
    unknown for quota" before the quota controller counted): the run is not failed; its status
    (Progressing False, JobRefused) and ONE Warning JobRefused Event quote the API server; the
    create is retried with the run's backoff, and the run proceeds once the quota is gone."""
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-jobs", "namespace": env.ns},
             "spec": {"hard": {"count/jobs.batch": "0"}}}
    env.apply(quota)
    try:
        env.apply(env.run_doc("quota", [_note("quota1"), {"content": "done"}]))
        _wait("a JobRefused Event", lambda: [e for e in env.events("quota") if e["reason"] == "JobRefused"])
        _stays("not Failed, no Job", lambda: env.status("quota").get("phase") != "Failed" and not env.jobs("quota"),
               10)
        refused = [e for e in env.events("quota") if e["reason"] == "JobRefused"]
        assert len(refused) == 1 and refused[0]["type"] == "Warning", refused
        assert "quota: no-jobs" in refused[0]["message"] and "count/jobs.batch" in refused[0]["message"], refused
        # the status says so too (written before the Event): not progressing, and why
        st = env.status("quota")
        progressing = next(c for c in st.get("conditions") or [] if c["type"] == "Progressing")
        assert progressing["status"] == "False" and progressing["reason"] == "JobRefused", st
        assert "quota: no-jobs" in progressing["message"] and "quota: no-jobs" in st["message"], st
    finally:
        env.kubectl("delete", "resourcequota", "no-jobs", "-n", env.ns, check=False)
    st = env.wait_phase("quota", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    assert len([e for e in env.events("quota") if e["reason"] == "JobRefused"]) == 1
