"""The bad-input table on the real API server: every malformed AgentRun of
tests/fixtures/bad-input/agentruns.yaml is refused at ``kubectl apply`` with a message that names
the field; the valid base manifest of the same table is accepted (the negative control, so the
table cannot pass vacuously). Create cases use ``--dry-run=server`` (admission, schema and CEL run
in full, nothing is stored); update cases (immutable fields) change a real object.

Unknown fields: kubectl 1.36 defaults to ``--validate=strict`` (server-side field validation
``Strict``), so an unknown field is an error (``strict decoding error: unknown field "spec.x"``),
not a silent prune; with ``--validate=warn`` it is a warning and the field is pruned (asserted
below, so a change of kubectl's default shows up here).

The last test runs the operator (grace AGENTRUN_POD_CONFIG_GRACE_SECONDS=3) on a run whose lap pod
cannot start because its API key Secret is missing: the run says so and waits for the Secret.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "bad-input"))
import bad_input_table as table  # noqa: E402
from e2e.cluster import install_api  # noqa: E402
from e2e_support import wait_for  # noqa: E402
from test_operator_e2e import Env  # noqa: E402

pytestmark = [pytest.mark.e2e]

CASES = table.cases()


@pytest.fixture(scope="module")
def ns(cluster):
    name = f"bad-{uuid.uuid4().hex[:6]}"
    install_api(cluster)
    cluster.kubectl_run("create", "namespace", name)
    yield name
    cluster.kubectl_run("delete", "namespace", name, "--wait=false", check=False)


def _apply(cluster, ns: str, doc: dict, *flags: str):
    return cluster.kubectl_run("apply", "-n", ns, *flags, "-f", "-", input=yaml.safe_dump(doc), check=False)


def test_the_table_is_big_and_well_formed():
    names = [c["name"] for c in CASES]
    assert len(names) >= 25 and len(names) == len(set(names)), names
    for c in CASES:
        assert c.get("expect") and c.get("op", "create") in ("create", "update"), c
        assert c.get("patch") or c.get("remove"), c


def test_the_valid_base_manifest_is_accepted(cluster, ns):
    """Negative control: the base of every case applies cleanly, dry-run and for real."""
    doc = table.manifest(table.base())
    doc["metadata"]["name"] = "control"
    r = _apply(cluster, ns, doc, "--dry-run=server")
    assert r.returncode == 0, r.stderr
    r = _apply(cluster, ns, doc)
    assert r.returncode == 0 and "created" in r.stdout, r.stderr
    got = json.loads(cluster.kubectl_run("get", "agentrun", "control", "-n", ns, "-o", "json").stdout)
    assert got["spec"]["budget"] == {"maxLaps": 10, "maxCostUSD": "5.00"}
    # and an allowed update of it (a version bump, suspend) is accepted too
    doc["spec"]["agent"]["version"] = "v2"
    r = _apply(cluster, ns, doc)
    assert r.returncode == 0 and "configured" in r.stdout, r.stderr


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_malformed_agentrun_is_refused_naming_the_field(cluster, ns, case):
    name = f"bad-{case['name']}"[:63].rstrip("-")
    if case.get("op", "create") == "update":
        r = _apply(cluster, ns, table.update_base(case, name))
        assert r.returncode == 0, f"the base of an update case must be accepted: {r.stderr}"
        r = _apply(cluster, ns, table.case_manifest(case, name))
    else:
        r = _apply(cluster, ns, table.case_manifest(case, name), "--dry-run=server")
    assert r.returncode != 0, f"{case['name']} was accepted: {r.stdout}"
    for text in case["expect"]:
        assert text in r.stderr, f"{case['name']}: {text!r} not in: {r.stderr}"
    # one clear error: the message is about this manifest, not a transport or client failure
    assert "error when" in r.stderr or "is invalid" in r.stderr, r.stderr
    if case.get("op") == "update":  # the stored object is unchanged
        got = json.loads(cluster.kubectl_run("get", "agentrun", name, "-n", ns, "-o", "json").stdout)
        assert got["spec"] == table.update_base(case, name)["spec"]


def test_unknown_field_is_only_a_warning_with_validate_warn(cluster, ns):
    """What the default strict mode turns into an error is, with --validate=warn, a warning and the
    field is pruned (the API server does not store unknown fields of a structural schema)."""
    doc = table.manifest(table.base(), {"metadata": {"name": "warned"}, "spec": {"maxLaps": 5}})
    r = _apply(cluster, ns, doc, "--validate=warn")
    assert r.returncode == 0, r.stderr
    assert 'unknown field "spec.maxLaps"' in r.stderr, r.stderr
    got = json.loads(cluster.kubectl_run("get", "agentrun", "warned", "-n", ns, "-o", "json").stdout)
    assert "maxLaps" not in got["spec"], got["spec"]


# ------------------------------------------------------------------ a missing Secret (the lap pod)


@pytest.fixture(scope="module")
def op(cluster, s3, tmp_path_factory):
    e = Env(cluster, s3, tmp_path_factory.mktemp("bad-input-operator"))
    e.prepare_namespace()
    fh = open(e.log, "ab")
    e.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"],
                              env=e.operator_env(AGENTRUN_POD_CONFIG_GRACE_SECONDS="3"),
                              stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    yield e
    if e.proc.poll() is None:
        os.killpg(e.proc.pid, signal.SIGKILL)
        e.proc.wait(10)
    e.tools.shutdown()
    cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def _progressing(op, name: str) -> dict:
    return next((c for c in op.status(name).get("conditions") or [] if c["type"] == "Progressing"), {})


def test_missing_secret_is_named_and_the_run_continues_once_it_exists(op):
    doc = op.run_doc("nokey", [{"content": "done"}])
    doc["spec"]["agent"]["model"]["apiKeySecretRef"] = {"name": "model-key", "key": "api-key"}
    op.apply(doc)
    try:
        cond = wait_for("SecretMissing (no Secret)", lambda: (c := _progressing(op, "nokey")).get("reason") == "SecretMissing"
                        and "does not exist" in c["message"] and c, timeout=180)
        assert "Secret 'model-key' does not exist" in cond["message"], cond
        assert op.status("nokey")["phase"] == "Pending"
        # the Secret exists, but without the key: the condition follows the kubelet's new message
        op.kubectl("create", "secret", "generic", "model-key", "-n", op.ns, "--from-literal=other=x")
        cond = wait_for("SecretMissing (no key)", lambda: "has no key" in (c := _progressing(op, "nokey")).get("message", "")
                        and c, timeout=180)
        assert "Secret 'model-key' has no key 'api-key'" in cond["message"], cond
        warnings = [e for e in op.events("nokey") if e["reason"] == "SecretMissing"]
        assert warnings and all(e["type"] == "Warning" for e in warnings), warnings
        assert len(op.jobs("nokey")) == 1  # the run waits on its one Job: no retry, no new Job
        # the fix: add the key. The kubelet starts the pod, the lap runs, the run succeeds
        op.kubectl("patch", "secret", "model-key", "-n", op.ns, "--type=merge",
                   "-p", json.dumps({"stringData": {"api-key": "sk-e2e-NEVER-SHOWN"}}))
        st = op.wait_phase("nokey", "Succeeded", "Failed", timeout=240)
        assert st["phase"] == "Succeeded" and st.get("totalRetries", 0) == 0, st
        assert len(op.jobs("nokey")) == 1
        shown = json.dumps(op.get("nokey")) + json.dumps(op.events("nokey"))
        assert "sk-e2e-NEVER-SHOWN" not in shown
    except Exception:
        sys.__stderr__.write(op.log.read_text(errors="replace")[-5000:] + "\n")
        raise
