"""The operator on the real local control plane (kube-apiserver + etcd, kube-controller-manager,
process kubelet) with a real S3 server: ``agentrun operator`` runs as a subprocess.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py (e2e/cluster.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from e2e.cluster import install_api, operator_env
from e2e_support import ToolGate, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import tool_server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


_wait = wait_for


class Env:
    def __init__(self, cluster: Any, s3: Any, tmp: Path) -> None:
        self.cluster, self.s3, self.tmp = cluster, s3, tmp
        self.ns = f"e2e-{uuid.uuid4().hex[:6]}"
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "operator.log"
        self.record = tmp / "tool-calls.jsonl"
        self.tools = tool_server.serve(0, str(self.record))
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl_run(*args, check=check, input=input)

    def apply(self, doc: dict, check: bool = True) -> subprocess.CompletedProcess:
        return self.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc), check=check)

    def get(self, name: str) -> dict:
        r = self.kubectl("get", "agentrun", name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def status(self, name: str) -> dict:
        return self.get(name).get("status") or {}

    def wait_phase(self, name: str, *phases: str, timeout: float = 180) -> dict:
        return _wait(f"{name} phase in {phases}", lambda: (s := self.status(name)).get("phase") in phases and s,
                     timeout=timeout)

    def jobs(self, name: str) -> list[dict]:
        r = self.kubectl("get", "jobs", "-n", self.ns, "-l", f"agentrun.dev/run={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def pods(self, name: str) -> list[dict]:
        r = self.kubectl("get", "pods", "-n", self.ns, "-l", f"agentrun.dev/run={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def events(self, name: str) -> list[dict]:
        r = self.kubectl("get", "events", "-n", self.ns, "--field-selector", f"involvedObject.name={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def calls(self, path: str) -> list[dict]:
        if not self.record.exists():
            return []
        return [c for c in map(json.loads, self.record.read_text().splitlines()) if c["path"] == path]

    def inflight(self, order: str) -> bool:
        """True while the tool server is answering a call with arguments.order == order."""
        with urllib.request.urlopen(f"{self.tool_url}/_inflight", timeout=5) as r:
            return any(isinstance(a.get("arguments"), dict) and a["arguments"].get("order") == order
                       for a in json.load(r))

    def operator_env(self, **extra: str) -> dict[str, str]:
        """Environment of an operator subprocess: the cluster's kubeconfig, this module's S3 server,
        a short Lease and resync, watching only this module's namespace."""
        settings = {"AGENTRUN_LEASE_DURATION": "3", "AGENTRUN_RESYNC_SECONDS": "5", "AGENTRUN_JOB_TTL_SECONDS": "-1"}
        return operator_env(self.cluster, self.s3, namespace=self.ns, prefix=f"e2e-{self.ns}", **{**settings, **extra})

    def prepare_namespace(self) -> None:
        """The CRD and the approval admission policies, this module's namespace, the lap
        ServiceAccount and the S3 credentials Secret."""
        c = self.cluster
        install_api(c)
        c.kubectl_run("create", "namespace", self.ns)
        c.kubectl_run("create", "serviceaccount", "agentrun-lap", "-n", self.ns)
        c.kubectl_run("create", "secret", "generic", "s3-creds", "-n", self.ns,
                      f"--from-literal=AWS_ACCESS_KEY_ID={self.s3.access_key}",
                      f"--from-literal=AWS_SECRET_ACCESS_KEY={self.s3.secret_key}")

    def start_operator(self) -> None:
        env = self.operator_env()
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"], env=env,
                                     stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_operator(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def run_doc(self, name: str, script: list[dict], **spec: Any) -> dict:
        tools = [
            {"name": "note", "http": {"url": f"{self.tool_url}/note", "timeout": "20s"}},
            {"name": "refund", "requiresApproval": True, "http": {"url": f"{self.tool_url}/refund", "timeout": "5s"}},
        ]
        body = {
            "task": f"e2e {name}",
            "agent": {"version": spec.pop("version", "v1"),
                      "model": {"provider": "scripted", "script": script}, "tools": tools},
            "approval": {"owner": "e2e-team", "timeout": spec.pop("approval_timeout", "1h"),
                         "onTimeout": spec.pop("on_timeout", "reject")},
            "budget": {"maxLaps": 10},
            "lapTimeout": "60s",
            "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s", "factor": 2}},
            **spec,
        }
        return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name}, "spec": body}


def running_env(e: Env) -> Iterator[Env]:
    """The body of a module's ``env`` fixture: ``yield from running_env(Env(cluster, s3, tmp))``. The
    namespace is prepared and the operator started; afterwards the operator is killed, the tool
    server stopped and the namespace deleted (kept, to look at, when AGENTRUN_E2E_KEEP is set)."""
    e.prepare_namespace()
    e.start_operator()
    yield e
    e.kill_operator()
    e.tools.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        e.cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    yield from running_env(Env(cluster, s3, tmp_path_factory.mktemp("operator")))


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request, env):
    """On failure, print what CI needs to diagnose it: the operator's log since the test started,
    the runs/Jobs/pods/events of the namespace, and the output of every lap pod of the test."""
    log_offset = env.log.stat().st_size if env.log.exists() else 0
    pods_before = set(env.cluster.pods_dir.iterdir()) if env.cluster.pods_dir.exists() else set()
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        return
    out = [f"\n===== diagnostics of {request.node.name} (namespace {env.ns}) ====="]
    with open(env.log, "rb") as fh:
        fh.seek(log_offset)
        lines = fh.read().decode(errors="replace").splitlines()
    out.append(f"--- operator log ({env.log}), last 300 lines of this test ---")
    out += lines[-300:]
    for what in (["get", "agentruns,jobs,pods", "-o", "wide"], ["get", "events", "--sort-by=.lastTimestamp"],
                 ["get", "agentruns", "-o", "yaml"]):
        r = env.kubectl(*what, "-n", env.ns, check=False)
        out += [f"--- kubectl {' '.join(what)} ---", r.stdout + r.stderr]
    new_pods = sorted(set(env.cluster.pods_dir.iterdir()) - pods_before) if env.cluster.pods_dir.exists() else []
    for d in new_pods:
        for f in sorted(d.glob("*.log")):
            out.append(f"--- pod log {f} (last 60 lines) ---")
            out += f.read_text(errors="replace").splitlines()[-60:]
    sys.__stderr__.write("\n".join(out) + "\n")
    sys.__stderr__.flush()


def _one_job_per_attempt(jobs: list[dict]) -> None:
    keys = [(j["metadata"]["labels"]["agentrun.dev/lap"], j["metadata"]["labels"]["agentrun.dev/attempt"]) for j in jobs]
    assert len(keys) == len(set(keys)), keys


def _gated(doc: dict, gate: ToolGate, tool: str = "note") -> dict:
    """Route ``tool`` of the run through ``gate`` (e2e_support.ToolGate): a lap calling it stays in
    flight until the test opens the gate. The tool's and the lap's timeouts are long, so only the
    gate (or the test's kill) ends the call."""
    for t in doc["spec"]["agent"]["tools"]:
        if t["name"] == tool:
            t["http"]["url"] = gate.url + urlparse(t["http"]["url"]).path
            t["http"]["timeout"] = "10m"
    doc["spec"]["lapTimeout"] = "15m"
    return doc


@pytest.fixture
def gate(env):
    g = ToolGate(env.tool_url)
    yield g
    g.close()


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_invalid_specs_are_refused_naming_the_field(env):
    r = env.kubectl("apply", "-n", env.ns, "-f", str(ROOT / "examples" / "invalid-run.yaml"), check=False)
    assert r.returncode != 0
    assert "spec.budget.maxLaps" in r.stderr
    assert "spec.approval.owner" in r.stderr
    doc = env.run_doc("immutable", [{"content": "hi"}], suspend=True)
    env.apply(doc)
    doc["spec"]["task"] = "another task"
    r = env.apply(doc, check=False)
    assert r.returncode != 0 and "spec.task is immutable" in r.stderr


def test_happy_path_to_succeeded(env):
    script = [
        {"content": "noting", "toolCalls": [{"name": "note", "arguments": {"text": "hello"}}],
         "usage": {"inputTokens": 100, "outputTokens": 10}},
        {"content": "done", "usage": {"inputTokens": 100, "outputTokens": 10}},
    ]
    model_key = f"sk-e2e-{uuid.uuid4().hex}"
    env.kubectl("create", "secret", "generic", "model-key", "-n", env.ns, f"--from-literal=api-key={model_key}")
    doc = env.run_doc("happy", script)
    doc["spec"]["agent"]["model"]["apiKeySecretRef"] = {"name": "model-key", "key": "api-key"}
    env.apply(doc)
    st = env.wait_phase("happy", "Succeeded", "Failed", "BudgetExceeded")
    assert st["phase"] == "Succeeded", st
    assert st["lap"] == 2 and st["checkpoint"]["key"].endswith("laps/00000002.json")
    assert st["agentVersion"] == "v1" and st["lastCheckpointTime"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Complete"] == "True"
    jobs = env.jobs("happy")
    _one_job_per_attempt(jobs)
    assert len(jobs) == 2
    reasons = [e["reason"] for e in env.events("happy")]
    assert reasons.count("LapCheckpointed") == 2
    assert len(env.calls("/note")) == 1
    # kubectl get agentruns: the printer columns, with this run's values
    out = env.kubectl("get", "agentruns", "-n", env.ns).stdout.splitlines()
    assert out[0].split() == ["NAME", "PHASE", "LAP", "VERSION", "COST", "WAITING-ON", "LAST-CHECKPOINT", "AGE"], out[0]
    row = next(line.split() for line in out if line.split()[0] == "happy")
    assert row[1:4] == ["Succeeded", "2", "v1"] and row[4] == st["cost"]["usd"], row
    # status.storage: the run's two lap records (their journals deleted once written), as in the store
    import boto3

    s3 = boto3.client("s3", endpoint_url=env.s3.endpoint_url, region_name=env.s3.region,
                      aws_access_key_id=env.s3.access_key, aws_secret_access_key=env.s3.secret_key)
    run_prefix = st["checkpoint"]["key"].rsplit("laps/", 1)[0]
    mine = [o for o in s3.list_objects_v2(Bucket=env.s3.bucket, Prefix=run_prefix).get("Contents", [])
            if "/attempts/" not in o["Key"]]
    assert st["storage"] == {"bytes": sum(o["Size"] for o in mine), "objects": 2} and len(mine) == 2, (st, mine)
    # the operator that did all this ran on uvloop (the default; AGENTRUN_EVENT_LOOP=asyncio the other)
    assert "event loop: uvloop " in env.log.read_text(errors="replace")
    wide = env.kubectl("get", "agentruns", "-n", env.ns, "-o", "wide").stdout.splitlines()
    assert "STORAGE" in wide[0].split(), wide[0]
    # no secret value in the status, the Events, the Jobs or the operator log (secretKeyRef only)
    jobs_json = json.dumps(jobs)
    assert '"secretKeyRef"' in jobs_json
    pod_logs = "".join(f.read_text(errors="replace") for f in env.cluster.pods_dir.glob(f"{env.ns}_happy-*/*.log"))
    assert "lap checkpointed" in pod_logs  # the lap pods' output is there to be checked
    for where, text in (("status", json.dumps(st)), ("events", json.dumps(env.events("happy"))),
                        ("jobs", jobs_json), ("operator log", env.log.read_text(errors="replace")),
                        ("lap pod logs", pod_logs)):
        assert model_key not in text, f"model API key leaked into the {where}"
        assert env.s3.secret_key not in text, f"S3 secret key leaked into the {where}"


def test_kubectl_explain_documents_the_approval_fields(env):
    r = env.kubectl("explain", "agentrun.spec.approval")
    assert "KIND:" in r.stdout and "AgentRun" in r.stdout
    for field in ("owner", "timeout", "onTimeout"):
        assert field in r.stdout, r.stdout
    r = env.kubectl("explain", "agentrun.spec.approval.onTimeout")
    assert "reject" in r.stdout and "fail" in r.stdout, r.stdout


def _approval_run(env, name: str, **kw) -> None:
    script = [
        {"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": name}}]},
        {"content": "finished"},
    ]
    env.apply(env.run_doc(name, script, **kw))
    st = env.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded")
    assert st["phase"] == "AwaitingApproval", st
    assert st["waitingOn"] == "e2e-team" and st["approval"]["state"] == "Pending"
    # no lap running: every lap pod has exited (its Job may be marked Complete a moment later:
    # the run moves on at the pod's exit, docs/concepts.md "When a lap is over")
    assert env.jobs(name) and not [p for p in env.pods(name) if p["status"].get("phase") not in ("Succeeded", "Failed")]


def test_approval_approved_by_annotation(env):
    _approval_run(env, "approve")
    env.kubectl("annotate", "agentrun", "approve", "-n", env.ns, "approved=true", "agentrun.dev/reason=verified")
    st = env.wait_phase("approve", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st
    assert st["approval"]["state"] == "Approved" and st["approval"]["reason"] == "verified"
    assert "approved" not in (env.get("approve")["metadata"].get("annotations") or {})
    assert len([c for c in env.calls("/refund") if c["arguments"].get("order") == "approve"]) == 1


def test_approval_rejected(env):
    _approval_run(env, "reject")
    env.kubectl("annotate", "agentrun", "reject", "-n", env.ns, "approved=false")
    st = env.wait_phase("reject", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st  # a rejected call is not executed; the agent goes on
    assert st["approval"]["state"] == "Rejected"
    assert not [c for c in env.calls("/refund") if c["arguments"].get("order") == "reject"]


def test_approval_timeout_is_timed_out(env):
    # The deadline counts from the model's request inside lap 1, so on a slow box it may pass
    # before the operator first sees the pause: the test does not try to catch AwaitingApproval.
    # It checks what the status and the Events record instead: the approval was requested, timed
    # out no earlier than its deadline, and the next lap began only after that.
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": "timeout"}}]},
              {"content": "finished"}]
    env.apply(env.run_doc("timeout", script, approval_timeout="8s"))
    st = env.wait_phase("timeout", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st
    ap = st["approval"]
    assert ap["state"] == "TimedOut" and ap["tool"] == "refund" and ap["lap"] == 1, ap
    requested, deadline, decided = _ts(ap["requestedAt"]), _ts(ap["deadline"]), _ts(ap["decidedAt"])
    assert (deadline - requested).total_seconds() == 8, ap  # spec.approval.timeout, from the request
    assert decided >= deadline, ap  # never timed out early
    reasons = [e["reason"] for e in env.events("timeout")]
    assert "ApprovalRequested" in reasons and "ApprovalTimedOut" in reasons, reasons
    lap2 = [j for j in env.jobs("timeout") if j["metadata"]["labels"]["agentrun.dev/lap"] == "2"]
    assert len(lap2) == 1, env.jobs("timeout")
    # the lap after the decision started after the deadline (creationTimestamp has 1 s resolution)
    assert _ts(lap2[0]["metadata"]["creationTimestamp"]) >= deadline.replace(microsecond=0), (lap2, ap)
    assert not [c for c in env.calls("/refund") if c["arguments"].get("order") == "timeout"]


def test_annotation_on_a_run_not_waiting_is_removed(env):
    env.apply(env.run_doc("early", [{"content": "x"}], suspend=True))
    env.wait_phase("early", "Suspended")
    env.kubectl("annotate", "agentrun", "early", "-n", env.ns, "approved=true")
    _wait("annotation removed", lambda: "approved" not in (env.get("early")["metadata"].get("annotations") or {}))
    assert "ApprovalIgnored" in [e["reason"] for e in env.events("early")]


def test_suspend_and_resume(env):
    env.apply(env.run_doc("suspended", [{"content": "a", "toolCalls": [{"name": "note", "arguments": {"t": 1}}]},
                                        {"content": "b"}], suspend=True))
    st = env.wait_phase("suspended", "Suspended")
    assert st["lap"] == 0 and env.jobs("suspended") == []
    env.kubectl("patch", "agentrun", "suspended", "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    st = env.wait_phase("suspended", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded" and st["lap"] == 2
    assert "Resumed" in [e["reason"] for e in env.events("suspended")]


def test_suspend_mid_lap_finishes_the_lap_then_pauses(env, gate):
    script = [{"content": "slow", "toolCalls": [{"name": "note", "arguments": {"order": "midsuspend"}}]},
              {"content": "b", "toolCalls": [{"name": "note", "arguments": {"order": "midsuspend2"}}]},
              {"content": "done"}]
    env.apply(_gated(env.run_doc("midsuspend", script), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived("midsuspend"), timeout=180)
    env.kubectl("patch", "agentrun", "midsuspend", "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    gate.open()  # the suspension is in the API before lap 1 can end
    st = env.wait_phase("midsuspend", "Suspended", "Succeeded", "Failed")
    assert st["phase"] == "Suspended" and st["lap"] == 1, st  # the lap in flight finished and was checkpointed
    assert not st.get("activeJob") and len(env.jobs("midsuspend")) == 1
    assert len([c for c in env.calls("/note") if c["arguments"].get("order") == "midsuspend"]) == 1
    env.kubectl("patch", "agentrun", "midsuspend", "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    st = env.wait_phase("midsuspend", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded" and st["lap"] == 3, st
    _one_job_per_attempt(env.jobs("midsuspend"))
    assert len(env.jobs("midsuspend")) == 3


def test_lap_pod_deleted_mid_lap_is_retried_side_effect_once(env, gate):
    script = [{"content": "slow", "toolCalls": [{"name": "note", "arguments": {"order": "podkill"}}]},
              {"content": "done"}]
    env.apply(_gated(env.run_doc("podkill", script), gate))
    pod = _wait("lap pod running", lambda: next(iter(json.loads(env.kubectl(
        "get", "pods", "-n", env.ns, "-l", "agentrun.dev/run=podkill", "-o", "json").stdout)["items"]), None))
    _wait("the tool call held at the gate", lambda: gate.arrived("podkill"), timeout=180)
    env.kubectl("delete", "pod", pod["metadata"]["name"], "-n", env.ns, "--wait=false")
    # the retry reaches the same call with the same key while the killed attempt's call is still
    # held; then both go through (a tool server finishes a call it began even if its caller died):
    # one is executed, the other answered from the record
    _wait("the retried attempt's call at the gate", lambda: gate.arrived("podkill") >= 2, timeout=240)
    gate.open()
    st = env.wait_phase("podkill", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    assert st["totalRetries"] >= 1
    jobs = env.jobs("podkill")
    _one_job_per_attempt(jobs)
    assert len([c for c in env.calls("/note") if c["arguments"].get("order") == "podkill"]) == 1


def test_version_bump_mid_run(env, gate):
    script = [{"content": "slow", "toolCalls": [{"name": "note", "arguments": {"order": "bump"}}]},
              {"content": "done"}]
    env.apply(_gated(env.run_doc("bump", script), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived("bump"), timeout=180)
    env.kubectl("patch", "agentrun", "bump", "-n", env.ns, "--type=merge", "-p", '{"spec":{"agent":{"version":"v2"}}}')
    gate.open()  # the new version is in the API before lap 1 can end
    st = env.wait_phase("bump", "Succeeded", "Failed")
    assert st["phase"] == "Succeeded" and st["agentVersion"] == "v2" and st["checkpoint"]["agentVersion"] == "v2"
    events = env.events("bump")
    assert "VersionChanged" in [e["reason"] for e in events]
    checkpointed = sorted(e["message"] for e in events if e["reason"] == "LapCheckpointed")
    assert len(checkpointed) == 2, checkpointed
    assert "lap 1 " in checkpointed[0] and "agent v1" in checkpointed[0], checkpointed  # the lap in flight kept v1
    assert "lap 2 " in checkpointed[1] and "agent v2" in checkpointed[1], checkpointed


def test_operator_killed_mid_run_resumes_exactly_one_job_per_attempt(env, gate):
    script = [{"content": "slow", "toolCalls": [{"name": "note", "arguments": {"order": "restart"}}]},
              {"content": "two", "toolCalls": [{"name": "note", "arguments": {"order": "restart2"}}]},
              {"content": "done"}]
    env.apply(_gated(env.run_doc("restart", script), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived("restart"), timeout=180)
    env.kill_operator()
    gate.open()  # the lap finishes while the operator is down
    _wait("lap 1 Job finished", lambda: all((j.get("status") or {}).get("conditions") for j in env.jobs("restart")),
          timeout=180)
    env.start_operator()
    st = env.wait_phase("restart", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    jobs = env.jobs("restart")
    _one_job_per_attempt(jobs)
    assert len(jobs) == 3
    for order in ("restart", "restart2"):  # each side effect once at the tool server
        assert len([c for c in env.calls("/note") if c["arguments"].get("order") == order]) == 1, order


def test_deletion_garbage_collects_the_job(env):
    script = [{"content": "slow", "toolCalls": [{"name": "note", "arguments": {"order": "gc", "sleepSeconds": 20}}]}]
    env.apply(env.run_doc("gc", script))
    _wait("lap Job", lambda: env.jobs("gc"))
    env.kubectl("delete", "agentrun", "gc", "-n", env.ns, "--wait=true", "--timeout=60s")
    _wait("Job garbage-collected", lambda: env.jobs("gc") == [], timeout=180)
    _wait("lap pod gone", lambda: json.loads(env.kubectl(
        "get", "pods", "-n", env.ns, "-l", "agentrun.dev/run=gc", "-o", "json").stdout)["items"] == [], timeout=180)
