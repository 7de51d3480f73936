"""The runc node's mapping of a pod onto OCI runtime specs (e2e/runc_node.py), without runc.

The pods here are what the operator builds (controller/decide/jobs.py) or small variations; the image is
a directory with an /etc/passwd. What runs is covered by tests/e2e/test_image_runc.py.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from e2e.image_store import Image, normalize_ref  # noqa: E402

from e2e import proc_kubelet, runc_node  # noqa: E402

REF = "ghcr.io/agentrun/agentrun:0.1.0"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the runc node runs as root (it chowns volumes to fsGroup)")


@pytest.fixture
def image(tmp_path) -> Image:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                           "agentrun:x:65532:65532:agentrun:/nonexistent:/usr/sbin/nologin\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\nagentrun:x:65532:\n")
    cfg = {"User": "65532:65532", "Entrypoint": ["agentrun"], "Cmd": ["operator"], "WorkingDir": "/",
           "Env": ["PATH=/opt/agentrun/bin:/usr/bin:/bin", "PYTHONUNBUFFERED=1"]}
    return Image(ref=REF, id="sha256:" + "0" * 64, rootfs=rootfs, config=cfg)


class FakeKubelet:
    def __init__(self, base: Path) -> None:
        self.base_dir = str(base)
        self.server = "https://127.0.0.1:6443"
        self.node = "agentrun-local"
        self.secrets = {"s3-creds": {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "sekret"}}
        self.tokens: list[dict] = []
        kl = self

        class V1:
            def create_namespaced_service_account_token(self, sa, ns, body, **_):
                kl.tokens.append({"sa": sa, "ns": ns, **body["spec"]})
                return SimpleNamespace(status=SimpleNamespace(token="tok-" + sa))

        self.v1 = V1()

    def _secret(self, ns, name, optional):
        return self.secrets.get(name)

    def _configmap(self, ns, name, optional):
        return {"ca.crt": "CA"} if name == "kube-root-ca.crt" else None


def _lap_pod() -> dict:
    from agentrun.api.spec import AgentRunSpec
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.decide.jobs import RunIdentity, build_job

    doc = yaml.safe_load((ROOT / "examples" / "invoice-run.yaml").read_text())
    cfg = OperatorConfig(checkpoint_uri="s3://b/p", lap_image=REF, credentials_secret="s3-creds")
    job = build_job(RunIdentity("ns", "run", str(uuid.uuid4())), AgentRunSpec.model_validate(doc["spec"]), 1, 1,
                    "v1", cfg)
    tmpl = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "run-l1-a1-x", "namespace": "ns", "uid": str(uuid.uuid4())}, "spec": tmpl["spec"]}


def _adopt(tmp_path: Path, pod: dict, image: Image, kl: FakeKubelet | None = None):
    kl = kl or FakeKubelet(tmp_path)
    node = runc_node.RuncNode(kl, proc_kubelet, runc="runc")
    pdir = tmp_path / "pods" / "p"
    pdir.mkdir(parents=True)
    runs = []
    for c in (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]:
        cr = proc_kubelet.ContainerRun(name=c["name"], argv=[], env={}, cwd=str(pdir), log_path="", pid_path="",
                                       fallback_logs=False)
        cr.kube_env = ProcEnv(kl).resolve(pod, c)
        runs.append(cr)
    images = {c["name"]: image for c in (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]}
    notes = node.adopt(pod, str(pdir), images, runs, {proc_kubelet.MARKER_ENV: pod["metadata"]["uid"]})
    cfgs = {cr.name: json.loads((Path(cr.bundle) / "config.json").read_text()) for cr in runs}
    return cfgs, notes, runs, pdir


class ProcEnv:
    """The kubelet's env resolution (proc_kubelet.ProcKubelet.resolve_env) against FakeKubelet."""

    def __init__(self, kl: FakeKubelet) -> None:
        self.kl = kl

    def resolve(self, pod: dict, c: dict) -> dict:
        fake = SimpleNamespace(_secret=self.kl._secret, _configmap=self.kl._configmap, node=self.kl.node,
                               node_status={"allocatable": {}})
        return proc_kubelet.ProcKubelet.resolve_env(fake, pod, c)


def test_the_operators_lap_pod_maps_onto_a_confined_container(tmp_path, image):
    cfgs, notes, runs, pdir = _adopt(tmp_path, _lap_pod(), image)
    cfg = cfgs["lap"]
    p = cfg["process"]
    assert p["user"] == {"uid": 65532, "gid": 65532, "additionalGids": [65532]}
    assert cfg["root"] == {"path": "rootfs", "readonly": True}
    assert p["noNewPrivileges"] is True
    assert all(v == [] for v in p["capabilities"].values()), p["capabilities"]
    assert "rlimits" not in p
    assert p["args"] == ["agentrun", "lap"]
    env = dict(e.split("=", 1) for e in p["env"])
    assert env["AWS_SECRET_ACCESS_KEY"] == "sekret" and env["PATH"].startswith("/opt/agentrun/bin")
    assert env["HOME"] == "/nonexistent" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert "KUBECONFIG" not in env
    assert {m["destination"]: m["options"] for m in cfg["mounts"] if m["type"] == "bind"} == {
        "/tmp": ["rbind", "nosuid", "nodev", "rw"]}
    tmp_vol = pdir / "volumes" / "tmp"
    assert tmp_vol.stat().st_mode & 0o7777 == 0o2777 and tmp_vol.stat().st_gid == 65532
    assert cfg["linux"]["resources"]["memory"] == {"limit": 2**30}
    assert cfg["linux"]["resources"]["cpu"] == {"shares": 102}
    deny = cfg["linux"]["seccomp"]["syscalls"][0]
    assert cfg["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ALLOW" and deny["action"] == "SCMP_ACT_ERRNO"
    assert {"mount", "unshare", "setns", "ptrace", "bpf", "keyctl"} <= set(deny["names"])
    assert {n["type"] for n in cfg["linux"]["namespaces"]} == {"pid", "ipc", "uts", "mount"}  # host network
    joined = "; ".join(notes)
    assert "network" in joined and "sizeLimit 256Mi" in joined
    assert (Path(runs[0].bundle) / "config.json").stat().st_mode & 0o777 == 0o600  # it holds the Secrets' values
    # the kubelet starts the supervisor, not the command
    assert runs[0].argv[-2:] == ["run", runs[0].bundle] and runs[0].cwd == runs[0].bundle


def test_projected_service_account_token_is_mounted_when_the_pod_asks(tmp_path, image):
    kl = FakeKubelet(tmp_path)
    pod = {"metadata": {"name": "op", "namespace": "sys", "uid": str(uuid.uuid4())},
           "spec": {"serviceAccountName": "agentrun-operator",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532},
                    "volumes": [{"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace",
                                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}],
                    "containers": [{"name": "operator", "image": REF, "command": ["agentrun", "operator"],
                                    "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                                                      "mountPath": runc_node.SA_MOUNT}]}]}}
    cfgs, notes, _, pdir = _adopt(tmp_path, pod, image, kl)
    mounts = {m["destination"]: m for m in cfgs["operator"]["mounts"] if m["type"] == "bind"}
    assert mounts[runc_node.SA_MOUNT]["options"][-1] == "ro"
    vol = Path(mounts[runc_node.SA_MOUNT]["source"])
    assert (vol / "token").read_text() == "tok-agentrun-operator"
    assert (vol / "ca.crt").read_text() == "CA" and (vol / "namespace").read_text() == "sys"
    assert (vol / "token").stat().st_mode & 0o777 == 0o644 and (vol / "token").stat().st_gid == 65532
    assert kl.tokens[0]["boundObjectRef"]["name"] == "op" and kl.tokens[0]["expirationSeconds"] == 3607
    assert any("not rotated" in n for n in notes)


@pytest.mark.parametrize(("change", "reason", "words"), [
    (lambda s: s["containers"][0].setdefault("securityContext", {}).update(privileged=True),
     "Unsupported", "securityContext.privileged"),
    (lambda s: s.update(hostPID=True), "Unsupported", "spec.hostPID"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "Unsupported", "hostPath"),
    (lambda s: s["containers"][0]["securityContext"].update(seccompProfile={"type": "Localhost",
                                                                            "localhostProfile": "x.json"}),
     "Unsupported", "seccompProfile Localhost"),
    (lambda s: s["securityContext"].update(runAsUser=0), "CreateContainerConfigError", "runAsNonRoot"),
    (lambda s: s["containers"][0]["securityContext"].update(capabilities={"add": ["NOPE"]}),
     "Unsupported", "unknown CAP_NOPE"),
    (lambda s: s["containers"][0]["volumeMounts"].append({"name": "tmp", "mountPath": "/x", "subPathExpr": "$(A)"}),
     "Unsupported", "subPathExpr"),
    (lambda s: s["securityContext"].update(sysctls=[{"name": "net.core.somaxconn", "value": "1024"}]),
     "Unsupported", "sysctls"),
])
def test_what_the_node_cannot_enforce_is_refused_naming_the_field(tmp_path, image, change, reason, words):
    pod = _lap_pod()
    change(pod["spec"])
    with pytest.raises(runc_node.Refused) as e:
        _adopt(tmp_path, pod, image)
    assert e.value.reason == reason and words in e.value.message, e.value.message


def test_command_and_args_follow_the_kubernetes_rules(tmp_path, image):
    def argv(**c):
        pod = _lap_pod()
        ctr = pod["spec"]["containers"][0]
        ctr.pop("command", None)
        ctr.update(c, env=[{"name": "X", "value": "1"}])
        return _adopt(tmp_path / uuid.uuid4().hex, pod, image)[0]["lap"]["process"]["args"]

    assert argv() == ["agentrun", "operator"]  # ENTRYPOINT + CMD
    assert argv(args=["lap", "$(X)"]) == ["agentrun", "lap", "1"]  # ENTRYPOINT + args
    assert argv(command=["sh", "-c"]) == ["sh", "-c"]  # command: CMD dropped
    assert argv(command=["sh"], args=["-c", "$$(X)"]) == ["sh", "-c", "$(X)"]


def test_seccomp_is_reported_not_enforced_where_runc_has_none(tmp_path, image):
    node = runc_node.RuncNode(FakeKubelet(tmp_path), proc_kubelet, runc="runc")
    node.seccomp_ok = False  # what check() finds with a runc without libseccomp
    b = node._bundle(_lap_pod(), tmp_path, _lap_pod()["spec"]["containers"][0], image, {}, {},
                     {"runAsUser": 65532}, {"tmp": tmp_path})
    assert "seccomp" not in b.config["linux"]
    assert any("seccompProfile RuntimeDefault" in n for n in b.not_enforced), b.not_enforced


def test_user_from_the_image_and_capabilities_add(tmp_path, image):
    pod = _lap_pod()
    del pod["spec"]["securityContext"]["runAsUser"], pod["spec"]["securityContext"]["runAsGroup"]
    pod["spec"]["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    p = _adopt(tmp_path, pod, image)[0]["lap"]["process"]
    assert p["user"]["uid"] == 65532 and p["user"]["gid"] == 65532  # the image's USER
    assert p["capabilities"]["bounding"] == ["CAP_NET_BIND_SERVICE"] and p["capabilities"]["ambient"] == []


def test_image_references_match_like_a_runtime():
    assert "docker.io/library/busybox:latest" in normalize_ref("busybox")
    assert "docker.io/library/busybox:1.36" in normalize_ref("busybox:1.36")
    assert normalize_ref(REF) == [REF]
    assert "localhost:5000/x:latest" in normalize_ref("localhost:5000/x")
