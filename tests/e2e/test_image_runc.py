"""The agentrun image under runc on the local control plane (issue 15).

A control plane of its own whose process kubelet runs in runc mode (``start_cluster(node="runc")``,
what ``AGENTRUN_NODE=runc`` selects; e2e/runc_node.py), with the image of ``make image`` (built or
reused from the cache by tools/image/build.sh and loaded into the local image store):

* a lap pod exactly as the operator builds it (controller/decide/jobs.py: the restricted securityContext,
  the /tmp emptyDir, no service account token), its command replaced by a probe: inside the
  container ``id -u`` is 65532, a write to / fails (read-only file system), /tmp is writable, no
  service account token is mounted, no new privileges, no capabilities, the seccomp filter on
  (unshare(CLONE_NEWUSER) is refused); the node reports what it does not enforce in one Event;
* a pod asking for something the node cannot enforce (privileged) fails with a reason naming it;
* the invoice example end to end with every lap pod running ``agentrun lap`` in the image: a lap
  pod deleted mid-call, the approval, Succeeded at lap 10, each side effect once;
* the Helm chart installed with the image: the operator's Deployment runs from the image under
  the chart's securityContext, with the chart's ServiceAccount token mounted (in-cluster config),
  and drives a run to Succeeded.

Fixtures ``image_ref`` and ``rcluster`` (session, shared with tests/e2e/test_release.py):
tests/e2e/conftest.py. Skipped (with the reason) only where runc cannot run at all or the image cannot
be built here (not root, or mmdebstrap/buildah/runc missing: tools/install-image-tools.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from e2e_support import note_run, wait_for

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e import runc_node  # noqa: E402

# a cold image build takes minutes on a loaded box (the per-test default is 600 s)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

SA_MOUNT = runc_node.SA_MOUNT


def _pod_dir(cluster, ns: str, name: str) -> Path:
    return wait_for(f"pod dir of {ns}/{name}", lambda: next(iter(cluster.pods_dir.glob(f"{ns}_{name}_*")), None),
                    timeout=120)


def _pod(cluster, ns: str, name: str) -> dict:
    r = cluster.kubectl_run("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


PROBE = r"""
import ctypes, json, os, subprocess, sys
out = {"id_u": subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip(),
       "id_g": subprocess.run(["id", "-g"], capture_output=True, text=True).stdout.strip()}
try:
    open("/probe-root", "w").write("x")
    out["write_root"] = "written"
except OSError as e:
    out["write_root"] = e.strerror
with open("/tmp/probe", "w") as f:
    f.write("ok")
out["tmp"] = open("/tmp/probe").read()
out["sa_token"] = os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount")
out["kubeconfig"] = "KUBECONFIG" in os.environ
status = dict(ln.split(":\t", 1) for ln in open("/proc/self/status").read().splitlines() if ":\t" in ln)
out.update(seccomp=status["Seccomp"].strip(), nnp=status["NoNewPrivs"].strip(), capeff=status["CapEff"].strip())
libc = ctypes.CDLL(None, use_errno=True)
out["unshare_user"] = libc.unshare(0x10000000)
out["unshare_errno"] = ctypes.get_errno()
out["agentrun"] = subprocess.run(["agentrun", "--help"], capture_output=True, text=True).returncode
# the lap's MCP client (lap/tools/mcp.py), imported as a run declaring spec.agent.mcpServers does
out["mcp"] = subprocess.run([sys.executable, "-c", "from agentrun.lap.tools.mcp import preload; preload()"],
                            capture_output=True, text=True).returncode
print("PROBE " + json.dumps(out))
"""


def _lap_job(ns: str, name: str, ref: str, command: list[str]) -> dict:
    """A lap Job exactly as the operator builds it (controller/decide/jobs.py), with another command."""
    from agentrun.api.spec import AgentRunSpec
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.decide.jobs import RunIdentity, build_job

    doc = yaml.safe_load((ROOT / "examples" / "invoice-run.yaml").read_text())
    spec = AgentRunSpec.model_validate(doc["spec"])
    cfg = OperatorConfig(checkpoint_uri="s3://agentrun/probe", lap_image=ref, lap_command=tuple(command),
                         credentials_secret="")
    job = build_job(RunIdentity(ns, name, str(uuid.uuid4())), spec, 1, 1, "v1", cfg)
    job["metadata"].pop("ownerReferences", None)  # no AgentRun behind it: the GC would delete the Job
    job["metadata"]["name"] = name
    return job


def test_lap_pod_in_the_image_is_confined(rcluster, image_ref):
    c = rcluster
    ns = f"runc-{uuid.uuid4().hex[:6]}"
    c.kubectl_run("create", "namespace", ns)
    wait_for("default SA", lambda: c.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode == 0)
    c.kubectl_run("create", "serviceaccount", "agentrun-lap", "-n", ns)
    job = _lap_job(ns, "probe", image_ref, ["python3", "-c", PROBE])
    c.kubectl_run("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))
    tmpl = job["spec"]["template"]["spec"]
    assert tmpl["automountServiceAccountToken"] is False and tmpl["securityContext"]["runAsUser"] == 65532

    def done() -> dict | None:
        r = c.kubectl_run("get", "pods", "-n", ns, "-l", "job-name=probe", "-o", "json")
        pods = [p for p in json.loads(r.stdout)["items"] if p["status"].get("phase") in ("Succeeded", "Failed")]
        return pods[0] if pods else None

    pod = wait_for("the probe lap pod to finish", done, timeout=240, interval=1)
    pdir = _pod_dir(c, ns, pod["metadata"]["name"])
    log = (pdir / "lap.log").read_text()
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], log)
    got = json.loads(next(ln for ln in log.splitlines() if ln.startswith("PROBE "))[6:])
    print(f"\ninside the lap container: {got}")
    assert got["id_u"] == "65532" and got["id_g"] == "65532", got
    assert got["write_root"] == "Read-only file system", got
    assert got["tmp"] == "ok", got
    assert got["sa_token"] is False and got["kubeconfig"] is False, got
    assert got["nnp"] == "1" and int(got["capeff"], 16) == 0, got
    assert got["seccomp"] == "2", got  # a seccomp filter is installed
    assert got["unshare_user"] == -1 and got["unshare_errno"] == 1, got  # EPERM from the filter
    assert got["agentrun"] == 0 and got["mcp"] == 0, got
    # the OCI spec the node wrote for it
    cfg = json.loads((pdir / "runc" / "lap" / "config.json").read_text())
    assert cfg["root"]["readonly"] is True and cfg["process"]["noNewPrivileges"] is True
    assert cfg["process"]["user"]["uid"] == 65532 and 65532 in cfg["process"]["user"]["additionalGids"]
    assert cfg["linux"]["resources"]["memory"]["limit"] == 2**30  # limits.memory 1Gi (the chart default)
    assert [m["destination"] for m in cfg["mounts"] if m["type"] == "bind"] == ["/tmp"]
    # the node says what it does not enforce, once
    ev = json.loads(c.kubectl_run("get", "events", "-n", ns, "--field-selector",
                                  f"involvedObject.name={pod['metadata']['name']},reason=NotEnforced",
                                  "-o", "json").stdout)["items"]
    assert len(ev) == 1 and "network" in ev[0]["message"] and "sizeLimit" in ev[0]["message"], ev
    c.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


def test_a_pod_asking_for_what_the_node_cannot_enforce_fails_naming_it(rcluster, image_ref):
    c = rcluster
    ns = f"runc-{uuid.uuid4().hex[:6]}"
    c.kubectl_run("create", "namespace", ns)
    wait_for("default SA", lambda: c.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode == 0)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "priv"},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": image_ref, "command": ["true"],
                                    "securityContext": {"privileged": True}}]}}
    c.kubectl_run("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    st = wait_for("the privileged pod to fail", lambda: (p := _pod(c, ns, "priv")).get("status", {}).get("phase")
                  == "Failed" and p["status"], timeout=120)
    assert st["reason"] == "Unsupported" and "securityContext.privileged" in st["message"], st
    c.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


def test_invoice_example_in_the_image_each_side_effect_once(rcluster, s3, image_ref, tmp_path_factory):
    from e2e_support import ToolGate
    from test_examples import _invoice, _invoice_doc, kill_lap_mid_call
    from test_operator_e2e import Env

    class ImageEnv(Env):
        def operator_env(self, **extra: str) -> dict[str, str]:
            return super().operator_env(AGENTRUN_LAP_COMMAND=json.dumps(["agentrun", "lap"]),
                                        AGENTRUN_LAP_IMAGE=image_ref, **extra)

    env = ImageEnv(rcluster, s3, tmp_path_factory.mktemp("invoice-runc"))
    env.prepare_namespace()
    env.start_operator()
    run = "invoices-2024-06"
    gate = ToolGate(env.tool_url, hold=lambda args: _invoice(args) == "INV-1003")
    try:
        # INV-1003's call is held at a gate (as in test_examples): the lap pod is killed while it is
        # surely in flight, then the retried lap sends the same call (same key) and the gate opens
        env.apply(_invoice_doc(gate.url))
        kill_lap_mid_call(env, gate, run, timeout=400)

        st = env.wait_phase(run, "AwaitingApproval", "Failed", timeout=400)
        assert st["phase"] == "AwaitingApproval", (st, env.log.read_text()[-3000:])
        assert st["lap"] == 8 and st["totalRetries"] >= 1, st
        assert env.calls("/payments/schedule") == []
        env.kubectl("annotate", "agentrun", run, "-n", env.ns, "approved=true", "agentrun.dev/reason=e2e-runc")
        st = env.wait_phase(run, "Succeeded", "Failed", timeout=240)
        assert st["phase"] == "Succeeded" and st["lap"] == 10, st

        uid8 = env.get(run)["metadata"]["uid"][:8]
        record = [json.loads(line) for line in env.record.read_text().splitlines()]
        mine = [c for c in record if (c.get("idempotencyKey") or "").startswith(f"r_{uid8}")
                or c["path"] == "/invoices/batch"]
        booked = sorted(c["arguments"]["invoice"] for c in mine if c["path"] == "/ledger/invoices")
        assert booked == [f"INV-100{i}" for i in range(1, 7)], booked
        assert len([c for c in mine if c["path"] == "/payments/schedule"]) == 1
        assert len([c for c in mine if c["path"] == "/mail/send"]) == 1
        keys = [c["idempotencyKey"] for c in mine if c["path"] != "/invoices/batch"]
        assert len(keys) == len(set(keys)) == 8, keys
        # every lap pod ran in the image, under runc, as 65532 on a read-only root
        bundles = sorted(rcluster.pods_dir.glob(f"{env.ns}_*/runc/lap/config.json"))
        assert len(bundles) >= 11, bundles  # 10 laps + the retried one
        for b in bundles:
            cfg = json.loads(b.read_text())
            assert cfg["process"]["user"]["uid"] == 65532 and cfg["root"]["readonly"] is True, b
            assert cfg["process"]["args"] == ["agentrun", "lap"], cfg["process"]["args"]
    finally:
        gate.close()
        env.kill_operator()
        env.tools.shutdown()
        rcluster.kubectl_run("delete", "namespace", env.ns, "--wait=false", check=False)


def test_helm_installed_operator_runs_from_the_image(rcluster, s3, image_ref, tmp_path_factory):
    from test_helm_install import HelmEnv

    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    repo, _, tag = image_ref.rpartition(":")

    class ImageHelmEnv(HelmEnv):
        def write_values(self) -> None:
            super().write_values()
            values = yaml.safe_load(self.values.read_text())
            values["image"] = {"repository": repo, "tag": tag, "pullPolicy": "Never"}
            values["lap"].pop("command")  # the image's `agentrun lap`
            self.values.write_text(yaml.safe_dump(values))

    h = ImageHelmEnv(rcluster, s3, tmp_path_factory.mktemp("helm-runc"), helm)
    try:
        h.install()  # helm install --wait, then an operator pod holds the Lease
        pod = next(p for p in h.operator_pods() if p["status"].get("phase") == "Running")
        c = pod["spec"]["containers"][0]
        assert c["image"] == image_ref and c["securityContext"]["readOnlyRootFilesystem"] is True
        pdir = _pod_dir(rcluster, h.sys_ns, pod["metadata"]["name"])
        cfg = json.loads((pdir / "runc" / "operator" / "config.json").read_text())
        assert cfg["process"]["user"]["uid"] == 65532 and cfg["root"]["readonly"] is True
        assert cfg["process"]["noNewPrivileges"] is True and cfg["process"]["capabilities"]["effective"] == []
        assert "seccomp" in cfg["linux"]
        assert SA_MOUNT in [m["destination"] for m in cfg["mounts"]]  # the chart's SA token: in-cluster config
        assert cfg["process"]["args"] == ["agentrun", "operator"]

        name = "helm-runc"
        doc = note_run(name, "operator from the image", h.tool_url)
        h.kubectl("apply", "-n", h.ns, "-f", "-", input=yaml.safe_dump(doc))
        st = h.wait_phase(name, "Succeeded", "Failed", "BudgetExceeded", timeout=300)
        assert st["phase"] == "Succeeded", (st, h.diagnostics())
        assert len(h.calls("/note")) == 1
        lap_cfgs = sorted(rcluster.pods_dir.glob(f"{h.ns}_*/runc/lap/config.json"))
        assert lap_cfgs, "the lap pods did not run under runc"
        for p in lap_cfgs:
            assert SA_MOUNT not in [m["destination"] for m in json.loads(p.read_text())["mounts"]]
        logs = h.full_operator_logs()
        assert not [ln for ln in logs.splitlines() if " 403" in ln or "Forbidden" in ln], logs[-3000:]
    finally:
        h.tools.shutdown()
        h.uninstall()


def test_a_crashed_kubelet_leaves_no_container_behind(rcluster, image_ref):
    """SIGKILL the process kubelet while a container runs: the container (in its own session, not
    in the supervisor's process group) is killed and its root unmounted by the next kubelet, which
    marks the pod Failed (KubeletRestarted), like in host-process mode."""
    import signal

    c = rcluster
    ns = f"runc-{uuid.uuid4().hex[:6]}"
    c.kubectl_run("create", "namespace", ns)
    wait_for("default SA", lambda: c.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode == 0)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "containers": [{"name": "c", "image": image_ref, "command": ["sleep", "3600"],
                                    "securityContext": {"readOnlyRootFilesystem": True,
                                                        "allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}}]}}
    c.kubectl_run("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    wait_for("the sleeper to run", lambda: _pod(c, ns, "sleeper").get("status", {}).get("phase") == "Running",
             timeout=120)
    pdir = _pod_dir(c, ns, "sleeper")
    rootfs = str((pdir / "runc" / "c" / "rootfs").resolve())

    def sleepers() -> list[int]:
        out = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    if open(f"/proc/{p}/cmdline", "rb").read() == b"sleep\x003600\x00":
                        env = open(f"/proc/{p}/environ", "rb").read()
                        if f"AGENTRUN_PROCKUBELET_DIR={c.dir}".encode() in env:
                            out.append(int(p))
                except OSError:
                    pass
        return out

    wait_for("the container's sleep process", sleepers, timeout=60)
    c.stop_kubelet(sig=signal.SIGKILL)
    c.start_kubelet()
    st = wait_for("the pod to be marked failed", lambda: (p := _pod(c, ns, "sleeper")).get("status", {})
                  .get("phase") == "Failed" and p["status"], timeout=120)
    assert st["reason"] == "KubeletRestarted", st
    assert not sleepers(), "the container outlived the kubelet that started it"
    assert rootfs not in open("/proc/self/mountinfo").read(), "the container root is still mounted"
    c.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
