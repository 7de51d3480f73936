"""The manifests under examples/ on the real local control plane.

- every example is accepted by the API server (server-side dry-run against the generated CRD),
  except examples/invalid-run.yaml, which is refused with the offending fields named;
- the invoice example (examples/invoice-run.yaml) runs end to end with the operator, the lap
  runner and the recording tool server: a lap pod is deleted while its record_invoice call is in
  flight, the lap is retried, and the tool server's record holds every side effect exactly once
  (the replay's repeat is refused by its Idempotency-Key); the run stops at AwaitingApproval before
  the payment, and after the approval it books the payment once and Succeeds at lap 10.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import tool_server  # noqa: E402
from test_operator_e2e import Env  # noqa: E402

pytestmark = [pytest.mark.e2e]

VALID = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "invalid-run.yaml")


@pytest.fixture(scope="module")
def crd(cluster):
    cluster.kubectl_run("apply", "-f", str(ROOT / "crds" / "agentrun.dev_agentruns.yaml"))
    cluster.kubectl_run("wait", "--for=condition=Established", "crd/agentruns.agentrun.dev", "--timeout=60s")
    return cluster


def test_examples_are_found():
    assert {"invoice-run.yaml", "openai-run.yaml", "simple-run.yaml", "approval-run.yaml"} <= set(VALID)


@pytest.mark.parametrize("name", VALID)
def test_example_is_accepted_by_the_api_server(crd, name):
    r = crd.kubectl_run("apply", "--dry-run=server", "-n", "default", "-f", str(EXAMPLES / name), check=False)
    assert r.returncode == 0, f"{name} refused by the API server:\n{r.stderr}"
    assert "(server dry run)" in r.stdout, r.stdout


def test_invalid_example_is_refused_naming_the_fields(crd):
    r = crd.kubectl_run("apply", "--dry-run=server", "-n", "default", "-f", str(EXAMPLES / "invalid-run.yaml"),
                        check=False)
    assert r.returncode != 0, r.stdout
    assert "spec.budget.maxLaps" in r.stderr, r.stderr
    assert "spec.approval.owner is required" in r.stderr, r.stderr


def _invoice_doc(tool_url: str, slow_invoice: str) -> dict:
    text = (EXAMPLES / "invoice-run.yaml").read_text().replace("http://127.0.0.1:8765/", f"{tool_url}/")
    doc = yaml.safe_load(text)
    spec = doc["spec"]
    assert len(spec["agent"]["model"]["script"]) >= 8
    for step in spec["agent"]["model"]["script"]:
        for call in step.get("toolCalls") or []:
            if call["arguments"].get("invoice") == slow_invoice:
                call["arguments"]["sleepSeconds"] = 4  # slow enough to kill the lap pod mid-call
    spec["retry"]["backoff"] = {"initial": "1s", "max": "2s", "factor": 2}
    return doc


@pytest.mark.slow
def test_invoice_example_end_to_end_each_side_effect_once(cluster, s3, tmp_path_factory):
    env = Env(cluster, s3, tmp_path_factory.mktemp("examples"))
    env.prepare_namespace()
    env.start_operator()
    run = "invoices-2024-06"
    try:
        env.apply(_invoice_doc(env.tool_url, "INV-1003"))

        def inflight() -> bool:
            with urllib.request.urlopen(f"{env.tool_url}/_inflight", timeout=5) as r:
                return any((c.get("arguments") or {}).get("invoice") == "INV-1003" for c in json.load(r))

        wait_for("record_invoice INV-1003 in flight", inflight, timeout=120, interval=0.2)
        pods = json.loads(env.kubectl("get", "pods", "-n", env.ns, "-l", f"agentrun.dev/run={run}",
                                      "-o", "json").stdout)["items"]
        running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") in ("Running", "Pending")]
        assert running, pods
        env.kubectl("delete", "pod", *running, "-n", env.ns, "--wait=false")

        st = env.wait_phase(run, "AwaitingApproval", "Failed", timeout=180)
        assert st["phase"] == "AwaitingApproval", st
        assert st["lap"] == 8 and st["approval"]["tool"] == "schedule_payment", st
        assert st["waitingOn"] == "finance-approvers", st
        assert st["totalRetries"] >= 1, st  # the killed lap was retried
        assert env.calls("/payments/schedule") == []  # nothing paid before the decision

        env.kubectl("annotate", "agentrun", run, "-n", env.ns, "approved=true", "agentrun.dev/reason=e2e")
        st = env.wait_phase(run, "Succeeded", "Failed", timeout=120)
        assert st["phase"] == "Succeeded" and st["lap"] == 10, st

        record = [json.loads(line) for line in env.record.read_text().splitlines()]
        mine = [c for c in record if (c.get("idempotencyKey") or "").startswith(f"r_{env.get(run)['metadata']['uid'][:8]}")
                or c["path"] == "/invoices/batch"]
        booked = sorted(c["arguments"]["invoice"] for c in mine if c["path"] == "/ledger/invoices")
        assert booked == [f"INV-100{i}" for i in range(1, 7)], booked  # each invoice booked exactly once
        assert len([c for c in mine if c["path"] == "/payments/schedule"]) == 1
        assert len([c for c in mine if c["path"] == "/mail/send"]) == 1
        keys = [c["idempotencyKey"] for c in mine if c["path"] != "/invoices/batch"]
        assert len(keys) == len(set(keys)) == 8, keys
        # the retried lap sent INV-1003's call again with the same key: answered from the record
        view = {c["idempotencyKey"]: c["repeatsRefused"] for c in tool_server.calls_view() if c.get("idempotencyKey")}
        slow_key = next(c["idempotencyKey"] for c in mine if c["arguments"].get("invoice") == "INV-1003")
        assert slow_key.split(":")[1:3] == ["4", "record_invoice"], slow_key
        assert view[slow_key] >= 1, view
    finally:
        env.kill_operator()
        env.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", env.ns, "--wait=false", check=False)
