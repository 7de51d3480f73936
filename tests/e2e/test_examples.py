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
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_support import ToolGate, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import tool_server  # noqa: E402
from e2e.cluster import install_api  # noqa: E402
from test_operator_e2e import Env  # noqa: E402

VALID = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "invalid-run.yaml")


@pytest.fixture(scope="module")
def crd(cluster):
    install_api(cluster)
    return cluster


@pytest.mark.e2e
def test_examples_are_found():
    assert {"invoice-run.yaml", "openai-run.yaml", "simple-run.yaml", "approval-run.yaml"} <= set(VALID)


@pytest.mark.e2e
@pytest.mark.parametrize("name", VALID)
def test_example_is_accepted_by_the_api_server(crd, name):
    r = crd.kubectl_run("apply", "--dry-run=server", "-n", "default", "-f", str(EXAMPLES / name), check=False)
    assert r.returncode == 0, f"{name} refused by the API server:\n{r.stderr}"
    assert "(server dry run)" in r.stdout, r.stdout


@pytest.mark.e2e
def test_invalid_example_is_refused_naming_the_fields(crd):
    r = crd.kubectl_run("apply", "--dry-run=server", "-n", "default", "-f", str(EXAMPLES / "invalid-run.yaml"),
                        check=False)
    assert r.returncode != 0, r.stdout
    assert "spec.budget.maxLaps" in r.stderr, r.stderr
    assert "spec.approval.owner is required" in r.stderr, r.stderr


def _invoice_doc(tool_url: str) -> dict:
    """The example, its tools behind ``tool_url`` (a ToolGate), with long tool and lap timeouts: the
    gate, not a timeout, decides when the held call ends."""
    text = (EXAMPLES / "invoice-run.yaml").read_text().replace("http://127.0.0.1:8765/", f"{tool_url}/")
    doc = yaml.safe_load(text)
    spec = doc["spec"]
    assert len(spec["agent"]["model"]["script"]) >= 8
    for t in spec["agent"]["tools"]:
        t["http"]["timeout"] = "10m"
    spec["lapTimeout"] = "15m"
    spec["retry"]["backoff"] = {"initial": "1s", "max": "2s", "factor": 2}
    return doc


def _invoice(args: object) -> object:
    return isinstance(args, dict) and args.get("invoice")


def kill_lap_mid_call(env: Env, gate: ToolGate, run: str, timeout: float = 240) -> None:
    """With record_invoice INV-1003 held at ``gate``: delete the run's lap pod while that call is
    surely in flight, wait for the retried lap to send the same call (same key) while the killed
    one is still held, then open the gate: one is executed, the other answered from the record."""
    def arrived() -> int:
        return gate.arrived(where=lambda args: _invoice(args) == "INV-1003")

    wait_for("record_invoice INV-1003 held at the gate", arrived, timeout=timeout)
    pods = json.loads(env.kubectl("get", "pods", "-n", env.ns, "-l", f"agentrun.dev/run={run}",
                                  "-o", "json").stdout)["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") in ("Running", "Pending")]
    assert running, pods
    env.kubectl("delete", "pod", *running, "-n", env.ns, "--wait=false")
    wait_for("the retried INV-1003 call at the gate", lambda: arrived() >= 2, timeout=timeout)
    gate.open()


@pytest.mark.e2e
@pytest.mark.slow
def test_invoice_example_end_to_end_each_side_effect_once(cluster, s3, tmp_path_factory):
    env = Env(cluster, s3, tmp_path_factory.mktemp("examples"))
    env.prepare_namespace()
    env.start_operator()
    run = "invoices-2024-06"
    # INV-1003's call is held at a gate: the lap pod is killed while it is surely in flight
    gate = ToolGate(env.tool_url, hold=lambda args: _invoice(args) == "INV-1003")
    try:
        env.apply(_invoice_doc(gate.url))
        kill_lap_mid_call(env, gate, run)

        st = env.wait_phase(run, "AwaitingApproval", "Failed", timeout=240)
        assert st["phase"] == "AwaitingApproval", st
        assert st["lap"] == 8 and st["approval"]["tool"] == "schedule_payment", st
        assert st["waitingOn"] == "finance-approvers", st
        assert st["totalRetries"] >= 1, st  # the killed lap was retried
        assert env.calls("/payments/schedule") == []  # nothing paid before the decision

        env.kubectl("annotate", "agentrun", run, "-n", env.ns, "approved=true", "agentrun.dev/reason=e2e")
        st = env.wait_phase(run, "Succeeded", "Failed", timeout=240)
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
        gate.close()
        env.kill_operator()
        env.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", env.ns, "--wait=false", check=False)


def _start_tool_server(tmp: Path, record: Path) -> tuple[subprocess.Popen, str]:
    port_file = tmp / "port"
    port_file.unlink(missing_ok=True)
    p = subprocess.Popen([sys.executable, str(EXAMPLES / "tool_server.py"), "--port", "0", "--record", str(record),
                          "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("tool server port file", lambda: port_file.exists() and port_file.read_text().strip(), timeout=20)
    return p, f"http://127.0.0.1:{port_file.read_text().strip()}"


def _post(url: str, body: dict, key: str) -> tuple[dict, bool]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r), r.headers.get("Idempotent-Replayed") == "true"


def test_tool_server_refuses_a_repeated_key_across_its_own_restart(tmp_path):
    """Not e2e: the demo tool server alone. A key executes once; a repeat (also after the server
    restarted from its record) gets the first response and only moves the refused counter."""
    record = tmp_path / "calls.jsonl"
    p, url = _start_tool_server(tmp_path, record)
    try:
        first, replayed = _post(f"{url}/ledger/invoices", {"invoice": "INV-1"}, "r_1:2:record_invoice:call_1")
        assert not replayed
        again, replayed = _post(f"{url}/ledger/invoices", {"invoice": "INV-1"}, "r_1:2:record_invoice:call_1")
        assert replayed and again == first
    finally:
        p.terminate()
        p.wait(10)
    p, url = _start_tool_server(tmp_path, record)
    try:
        after, replayed = _post(f"{url}/ledger/invoices", {"invoice": "INV-1"}, "r_1:2:record_invoice:call_1")
        assert replayed and after == first
        _post(f"{url}/ledger/invoices", {"invoice": "INV-2"}, "r_1:3:record_invoice:call_1")
        with urllib.request.urlopen(f"{url}/calls", timeout=5) as r:
            calls = json.load(r)
        assert [(c["arguments"]["invoice"], c["repeatsRefused"]) for c in calls] == [("INV-1", 1), ("INV-2", 0)]
        assert len(record.read_text().splitlines()) == 2  # executions only
        show = subprocess.run([sys.executable, str(EXAMPLES / "tool_server.py"), "--show", "--url", url],
                              capture_output=True, text=True, timeout=20)
        assert show.returncode == 0, show.stderr
        assert "2 call(s) executed, 1 repeat(s) refused, 0 key(s) executed twice" in show.stdout, show.stdout
        assert "r_1:2:record_invoice:call_1" in show.stdout
    finally:
        p.terminate()
        p.wait(10)
    down = subprocess.run([sys.executable, str(EXAMPLES / "tool_server.py"), "--show", "--url", url],
                          capture_output=True, text=True, timeout=20)
    assert down.returncode == 1 and "cannot reach" in down.stderr
