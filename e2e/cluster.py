"""Start/stop agentrun's local Kubernetes control plane and S3 server.

Python API (used by ``mk/cluster.mk`` and by ``tests/e2e/conftest.py``)::

    from e2e.cluster import start_cluster, start_s3, sa_kubeconfig

    c = start_cluster("/tmp/kube")      # etcd + kube-apiserver + kube-controller-manager
                                         # + process kubelet, ready to run Jobs
    c.kubeconfig, c.server, c.admin_token, c.bin_dir, c.kubectl, c.ca_file
    c.kubectl_run("get", "nodes")       # CompletedProcess (text, checked)
    path = sa_kubeconfig(c, "ns", "sa")  # kubeconfig with a TokenRequest token
    c.stop()                             # stops everything, no process left

    s = start_s3("/tmp/s3")              # moto S3 on 127.0.0.1, bucket "agentrun"
    s.endpoint_url, s.bucket, s.access_key, s.secret_key, s.region
    s.stop()

CLI (what ``make cluster-up`` & co. call)::

    python3 e2e/cluster.py up   [--dir .localkube]
    python3 e2e/cluster.py down [--dir .localkube]
    python3 e2e/cluster.py s3-up|s3-down [--dir .localkube/s3]
    python3 e2e/cluster.py sa-kubeconfig [--dir .localkube] NAMESPACE SA OUT
    python3 e2e/cluster.py build        # print the localkube binary path
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from . import proc_kubelet  # type: ignore[no-redef]
    from .ports import free_port as _free_port
except ImportError:  # run as a script: e2e/ is on sys.path
    import proc_kubelet  # type: ignore[no-redef]
    from ports import free_port as _free_port  # type: ignore[no-redef]

E2E_DIR = Path(__file__).resolve().parent
BUILD_SH = E2E_DIR / "localkube" / "build.sh"
S3_SERVER = E2E_DIR / "s3_server.py"
PROC_KUBELET = E2E_DIR / "proc_kubelet.py"


class ClusterError(RuntimeError):
    pass


# ------------------------------------------------------------------ helpers


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _terminate(pid: int, grace: float, group: bool = True) -> None:
    """SIGTERM pid (its process group if group), SIGKILL after grace seconds."""
    if not pid or not _alive(pid):
        return
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    end = time.time() + grace
    while time.time() < end and _alive(pid):
        time.sleep(0.1)
    if _alive(pid) or group:
        try:
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.time() + 5
    while time.time() < end and _alive(pid):
        time.sleep(0.05)


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _ancestors(pid: int) -> set[int]:
    """pid and its parent chain up to init."""
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = open(f"/proc/{pid}/stat").read()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def leftover_processes(base_dir: str | os.PathLike, ignore: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """Live processes that belong to the cluster/S3 server in base_dir.

    Matches processes whose command line mentions base_dir (localkube and its
    children, the process kubelet, the S3 server) or whose environment carries
    the process kubelet's pod marker for base_dir.
    """
    d = str(Path(base_dir).resolve())
    marker = f"{proc_kubelet.DIR_ENV}={d}".encode()
    mine = _ancestors(os.getpid())  # never the caller or the shell/make that started it
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in mine:
            continue
        pid = int(p)
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(i in cmd for i in ignore):
            continue
        hit = (d + "/") in cmd or (d + " ") in cmd or cmd.rstrip("\0").endswith(d)
        if not hit:
            try:
                hit = marker in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                pass
        if hit and _alive(pid):
            found.append((pid, cmd.strip()))
    return found


def build_localkube() -> str:
    """Build (or reuse the cached) localkube binary; return its path."""
    t0 = time.time()
    r = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=None, text=True)
    if r.returncode != 0:
        raise ClusterError(f"building localkube failed (exit {r.returncode}); see the output above")
    path = r.stdout.strip().splitlines()[-1]
    if time.time() - t0 > 5:
        print(f"localkube built in {time.time() - t0:.0f}s: {path}", file=sys.stderr)
    return path


# ------------------------------------------------------------------ cluster


@dataclass
class Cluster:
    dir: Path
    kubeconfig: str
    server: str
    admin_token: str
    bin_dir: str
    ca_file: str
    version: str = ""
    pids: dict = field(default_factory=dict)
    node: str = ""  # "runc": the process kubelet runs pods whose image is local under runc (e2e/runc_node.py)

    @property
    def kubectl(self) -> str:
        return os.path.join(self.bin_dir, "kubectl")

    @property
    def pods_dir(self) -> Path:
        return self.dir / "pods"

    def env(self, base: dict | None = None) -> dict:
        """An environment with KUBECONFIG and the cluster's bin dir first on PATH."""
        e = dict(os.environ if base is None else base)
        e["KUBECONFIG"] = self.kubeconfig
        e["PATH"] = self.bin_dir + os.pathsep + e.get("PATH", "")
        return e

    def kubectl_run(self, *args: str, check: bool = True, input: str | None = None,
                    kubeconfig: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        env = self.env()
        if kubeconfig:
            env["KUBECONFIG"] = kubeconfig
        r = subprocess.run([self.kubectl, *args], env=env, input=input, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def stop(self) -> None:
        stop_cluster(self.dir)

    def restart_apiserver(self, down_seconds: float = 5.0, timeout: float = 120,
                          while_down: Callable[[], None] | None = None) -> float:
        """See restart_apiserver(): only for a cluster from start_restartable_cluster."""
        return restart_apiserver(self, down_seconds, timeout, while_down)

    def start_kubelet(self, timeout: float = 60) -> int:
        """Start the process kubelet (again); return its pid once the node is registered."""
        d = self.dir
        try:
            (d / "kubelet.ready").unlink()
        except FileNotFoundError:
            pass
        with open(d / "logs" / "kubelet.log", "ab") as logf:
            # pods inherit this env: the cluster's bin dir (version-matched kubectl) first on PATH
            kenv = self.env()
            kenv.pop("KUBECONFIG", None)
            kenv["AGENTRUN_NODE"] = self.node
            kl = subprocess.Popen([sys.executable, str(PROC_KUBELET), "--kubeconfig", self.kubeconfig,
                                   "--dir", str(d)], stdout=logf, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True, cwd=d, env=kenv)
        (d / "kubelet.pid").write_text(f"{kl.pid}\n")
        self.pids["kubelet"] = kl.pid
        end = time.time() + timeout
        while not (d / "kubelet.ready").exists():
            if kl.poll() is not None:
                raise ClusterError(f"process kubelet exited with {kl.returncode}:\n{_tail(d / 'logs' / 'kubelet.log')}")
            if time.time() > end:
                raise ClusterError(f"process kubelet not ready:\n{_tail(d / 'logs' / 'kubelet.log')}")
            time.sleep(0.2)
        self._kubelet_proc = kl
        return kl.pid

    def stop_kubelet(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop the process kubelet with sig (SIGKILL simulates a crash: pod processes survive it)."""
        pid = _read_pid(self.dir / "kubelet.pid")
        if not pid or not _alive(pid):
            return
        os.kill(pid, sig)
        kl = getattr(self, "_kubelet_proc", None)
        end = time.time() + timeout
        while time.time() < end:
            if kl is not None and kl.pid == pid:
                if kl.poll() is not None:
                    break
            elif not _alive(pid):
                break
            time.sleep(0.05)
        else:
            raise ClusterError(f"process kubelet {pid} did not stop on signal {sig}")

    @classmethod
    def load(cls, d: str | os.PathLike) -> Cluster:
        d = Path(d).resolve()
        st = json.loads((d / "cluster.json").read_text())
        return cls(dir=d, kubeconfig=st["kubeconfig"], server=st["server"], admin_token=st["admin_token"],
                   bin_dir=st["bin_dir"], ca_file=st["ca_file"], version=st.get("version", ""),
                   pids=dict(st.get("pids") or {}),
                   node=(d / "node").read_text().strip() if (d / "node").exists() else "")


def start_cluster(dir: str | os.PathLike, *, kubelet: bool = True, timeout: float = 240,
                  fresh: bool = True, binary: str | None = None, node: str = "") -> Cluster:
    """Start etcd, kube-apiserver, kube-controller-manager (and the process kubelet) in dir.

    node: "runc" runs pods whose images are in the local image store under runc
    (e2e/runc_node.py); "" (default) host processes only. The CLI (``up --node``, ``make dev``)
    takes it from $AGENTRUN_NODE; the e2e session cluster stays host processes, and
    tests/e2e/test_image_runc.py starts a runc one.

    Returns once /readyz is OK, the node is Ready and the default ServiceAccount
    exists. Raises ClusterError (with log tails) on failure, after cleaning up.
    """
    d = Path(dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir(exist_ok=True)
    if (d / "localkube.pid").exists() and _alive(_read_pid(d / "localkube.pid")):
        raise ClusterError(f"a cluster is already running in {d} (pid {_read_pid(d / 'localkube.pid')}); "
                           "stop it first (make cluster-down)")
    for stale in ("ready", "cluster.json", "kubelet.ready", "localkube.pid", "kubelet.pid"):
        try:
            (d / stale).unlink()
        except FileNotFoundError:
            pass
    if node not in ("", "runc"):
        raise ClusterError(f"AGENTRUN_NODE must be runc or empty, not {node!r}")
    (d / "node").write_text(node + "\n")
    binary = binary or os.environ.get("LOCALKUBE_BIN") or build_localkube()
    t0 = time.time()
    args = [binary, "up", "--dir", str(d), "--timeout", f"{int(timeout)}s"]
    if fresh:
        args.append("--fresh")
    with open(d / "logs" / "localkube.log", "ab") as logf:
        sup = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=d)
    (d / "localkube.pid").write_text(f"{sup.pid}\n")
    try:
        end = time.time() + timeout + 10
        while not (d / "ready").exists():
            if sup.poll() is not None:
                raise ClusterError(f"localkube up exited with {sup.returncode}:\n{_tail(d / 'logs' / 'localkube.log')}"
                                   f"\n--- apiserver.log:\n{_tail(d / 'logs' / 'apiserver.log', 20)}")
            if time.time() > end:
                raise ClusterError(f"control plane not ready after {timeout}s:\n{_tail(d / 'logs' / 'localkube.log')}")
            time.sleep(0.2)
        c = Cluster.load(d)
        c.pids["localkube"] = sup.pid
        if kubelet:
            c.start_kubelet(timeout=max(10.0, end - time.time()))
        # Pods can't be created before the namespace's default ServiceAccount exists.
        while True:
            r = c.kubectl_run("get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False)
            if r.returncode == 0:
                break
            if time.time() > end:
                raise ClusterError(f"default ServiceAccount never appeared: {r.stderr}\n"
                                   f"{_tail(d / 'logs' / 'controller-manager.log')}")
            time.sleep(0.3)
        (d / "startup-seconds").write_text(f"{time.time() - t0:.2f}\n")
        return c
    except BaseException:
        stop_cluster(d)
        raise


# ------------------------------------------------------------------ restartable control plane
#
# The localkube supervisor stops everything when one of its children dies, so the apiserver cannot
# be restarted under it. A *restartable* cluster is started by the supervisor (which creates the
# PKI, tokens, kubeconfigs and ports), then taken over: the exact command lines of etcd, the
# apiserver and the controller-manager are read from /proc, the supervisor is stopped (etcd keeps
# its data), and the three are started again from here, each in its own session, with the same
# argv. Their pids are kept in DIR/components.json; stop_cluster stops them.

COMPONENTS = ("etcd", "apiserver", "controller-manager")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def _wait_http_ok(url: str, timeout: float, token: str | None = None, ca_file: str | None = None) -> None:
    import ssl

    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
    end = time.time() + timeout
    last: object = None
    while time.time() < end:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001
            last = e
        time.sleep(0.2)
    raise ClusterError(f"{url} not OK after {timeout}s: {last}")


def _start_component(d: Path, name: str, argv: list[str]) -> int:
    with open(d / "logs" / f"{name}.log", "ab") as logf:
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=d)
    return p.pid


def _components(d: Path) -> dict:
    try:
        return json.loads((d / "components.json").read_text())
    except (OSError, ValueError):
        return {}


def _save_components(d: Path, comps: dict) -> None:
    (d / "components.json").write_text(json.dumps(comps, indent=2))


def start_restartable_cluster(dir: str | os.PathLike, *, timeout: float = 240, binary: str | None = None) -> Cluster:
    """Like start_cluster, but etcd, kube-apiserver and kube-controller-manager run as separate
    processes owned by this module, so ``Cluster.restart_apiserver()`` can stop and start the
    apiserver alone (same flags, etcd keeps the data)."""
    c = start_cluster(dir, kubelet=False, timeout=timeout, binary=binary)
    d = c.dir
    try:
        st = json.loads((d / "cluster.json").read_text())
        pids = st.get("pids") or {}
        argvs = {n: _cmdline(int(pids[n])) for n in COMPONENTS}
        _terminate(_read_pid(d / "localkube.pid"), grace=30, group=True)
        for n in COMPONENTS:
            if _alive(int(pids[n])):
                raise ClusterError(f"{n} (pid {pids[n]}) survived the supervisor's stop")
        etcd_url = st.get("etcd_url")
        comps: dict = {}
        for n in COMPONENTS:
            comps[n] = {"argv": argvs[n], "pid": _start_component(d, n, argvs[n])}
            _save_components(d, comps)
            if n == "etcd" and etcd_url:
                _wait_http_ok(f"{etcd_url}/health", timeout)
            if n == "apiserver":
                _wait_http_ok(f"{c.server}/readyz", timeout, token=c.admin_token, ca_file=c.ca_file)
        c.pids.update({n: comps[n]["pid"] for n in COMPONENTS})
        c.start_kubelet()
        end = time.time() + timeout
        while c.kubectl_run("get", "serviceaccount", "default", "-n", "default", check=False).returncode != 0:
            if time.time() > end:
                raise ClusterError("default ServiceAccount never appeared after the take-over")
            time.sleep(0.3)
        return c
    except BaseException:
        stop_cluster(d)
        raise


def restart_apiserver(c: Cluster, down_seconds: float = 5.0, timeout: float = 120,
                      while_down: Callable[[], None] | None = None) -> float:
    """Stop kube-apiserver (SIGTERM, SIGKILL after 20 s), wait down_seconds, start it again with the
    same argv, wait for /readyz. Needs a cluster from start_restartable_cluster. Returns the
    seconds the apiserver was unavailable. ``while_down``, if given, is called once the apiserver
    is stopped, and the apiserver stays down until it returns (then at least down_seconds in all):
    what must happen during the outage happens, whatever the box's speed."""
    comps = _components(c.dir)
    if "apiserver" not in comps:
        raise ClusterError(f"{c.dir} is not a restartable cluster (no components.json): use start_restartable_cluster")
    t0 = time.time()
    _terminate(int(comps["apiserver"]["pid"]), grace=20, group=True)
    if while_down is not None:
        while_down()
    time.sleep(max(0.0, down_seconds - (time.time() - t0)))
    comps["apiserver"]["pid"] = _start_component(c.dir, "apiserver", comps["apiserver"]["argv"])
    _save_components(c.dir, comps)
    c.pids["apiserver"] = comps["apiserver"]["pid"]
    _wait_http_ok(f"{c.server}/readyz", timeout, token=c.admin_token, ca_file=c.ca_file)
    return time.time() - t0


def restart_etcd(c: Cluster, down_seconds: float = 3.0, timeout: float = 120) -> tuple[float, bool]:
    """Stop etcd (SIGTERM, SIGKILL after 20 s), wait down_seconds, start it again with the same argv
    (so the same data dir: nothing is lost), wait for its /health and the apiserver's /readyz.
    Needs a cluster from start_restartable_cluster. Returns (seconds until the apiserver was ready
    again, whether the apiserver was seen not ready while etcd was down)."""
    comps = _components(c.dir)
    if "etcd" not in comps:
        raise ClusterError(f"{c.dir} is not a restartable cluster (no components.json): use start_restartable_cluster")
    t0 = time.time()
    _terminate(int(comps["etcd"]["pid"]), grace=20, group=True)
    seen_down = False
    while True:  # the apiserver must notice: /readyz fails (its etcd check) while etcd is away
        try:
            _wait_http_ok(f"{c.server}/readyz", 0.5, token=c.admin_token, ca_file=c.ca_file)
        except ClusterError:
            seen_down = True
        if time.time() - t0 >= down_seconds and (seen_down or time.time() - t0 >= down_seconds + 30):
            break
        time.sleep(0.3)
    comps["etcd"]["pid"] = _start_component(c.dir, "etcd", comps["etcd"]["argv"])
    _save_components(c.dir, comps)
    c.pids["etcd"] = comps["etcd"]["pid"]
    etcd_url = json.loads((c.dir / "cluster.json").read_text()).get("etcd_url")
    if etcd_url:
        _wait_http_ok(f"{etcd_url}/health", timeout)
    _wait_http_ok(f"{c.server}/readyz", timeout, token=c.admin_token, ca_file=c.ca_file)
    return time.time() - t0, seen_down


def stop_cluster(dir: str | os.PathLike, check: bool = True) -> None:
    """Stop the process kubelet (killing pod processes), then the control plane.

    Raises ClusterError if any process of the cluster is still alive afterwards
    (check=True), after SIGKILLing it.
    """
    d = Path(dir).resolve()
    _terminate(_read_pid(d / "kubelet.pid"), grace=25, group=True)
    _terminate(_read_pid(d / "localkube.pid"), grace=30, group=True)
    comps = _components(d)
    for n in reversed(COMPONENTS):  # a restartable cluster's own components, etcd last
        if n in comps:
            _terminate(int(comps[n]["pid"]), grace=20, group=True)
    try:
        (d / "components.json").unlink()
    except FileNotFoundError:
        pass
    proc_kubelet.kill_orphans(str(d), grace=2)
    left = leftover_processes(d, ignore=(S3_SERVER.name,))  # an S3 server may live in DIR/s3
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for f in ("ready", "kubelet.ready", "localkube.pid", "kubelet.pid"):
        try:
            (d / f).unlink()
        except FileNotFoundError:
            pass
    if left and check:
        raise ClusterError(f"processes were left behind in {d} and had to be SIGKILLed: {left}")


def sa_kubeconfig(cluster: Cluster, namespace: str, sa: str, out: str | os.PathLike | None = None,
                  duration: str = "24h") -> str:
    """Write a kubeconfig for ServiceAccount namespace/sa with a TokenRequest token; return its path."""
    token = cluster.kubectl_run("create", "token", sa, "-n", namespace, f"--duration={duration}").stdout.strip()
    out = Path(out) if out else cluster.dir / "sa" / f"{namespace}_{sa}.kubeconfig"
    out.parent.mkdir(parents=True, exist_ok=True)
    ca = Path(cluster.ca_file).read_text()
    out.write_text(proc_kubelet.make_kubeconfig(cluster.server, ca, f"system:serviceaccount:{namespace}:{sa}",
                                                token, namespace))
    out.chmod(0o600)
    return str(out)


# ------------------------------------------------------------------ the AgentRun API

# What `make dev` and the e2e tests install, in this order: the CRD, the approval admission policies
# (docs/security.md), the tenancy admission policy and its default binding, and the local control
# plane's AgentRunPolicy "default" (loopback tool servers and S3 are intended here), all generated by
# `make crds`. The AgentRunPolicy CRD (TENANCY_CRD, the policy's paramKind) is applied first.
API_MANIFESTS = ("agentrun.dev_agentruns.yaml", "agentrun.dev_admission-policies.yaml",
                 "agentrun.dev_admission-mutating.yaml", "agentrun.dev_tenancy-policy.yaml",
                 "../e2e/tenancy-local-policy.yaml")
TENANCY_CRD = "agentrun.dev_agentrunpolicies.yaml"
AGENT_CRD = "agentrun.dev_agents.yaml"  # the Agent kind (a run's spec.agentRef)
#: ``helm template`` arguments saying that the local control plane serves both admission kinds (plain
#: `helm template` cannot tell, and the chart then fails: docs/operations.md#admission-policies).
ADMISSION_APIS = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                  "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]


def install_api(cluster: Cluster) -> None:
    """Apply the CRDs, the approval and tenancy admission policies and the local AgentRunPolicy
    (idempotent), wait for the CRDs and until the policies admit AgentRuns."""
    crds = Path(__file__).resolve().parents[1] / "crds"
    cluster.kubectl_run("apply", "-f", str(crds / API_MANIFESTS[0]), "-f", str(crds / TENANCY_CRD),
                        "-f", str(crds / AGENT_CRD))
    cluster.kubectl_run("wait", "--for=condition=Established", "crd/agentruns.agentrun.dev",
                        "crd/agentrunpolicies.agentrun.dev", "crd/agents.agentrun.dev", "--timeout=60s")
    files = [a for name in API_MANIFESTS[1:] for a in ("-f", str(crds / name))]
    cluster.kubectl_run("apply", *files)
    wait_decisions_admitted(cluster)
    wait_tenancy_admitted(cluster)


_TENANCY_PROBE = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
                  "metadata": {"name": "tenancy-probe", "namespace": "default"},
                  "spec": {"task": "probe", "agent": {"version": "v1", "model": {"provider": "scripted",
                                                                                 "script": [{"content": "done"}]}}}}


def wait_tenancy_admitted(cluster: Cluster, timeout: float = 90, namespace: str = "default") -> None:
    """Wait until a valid AgentRun passes the tenancy policy in ``namespace`` (a server-side dry-run
    create): right after the policy, its binding and the AgentRunPolicy are applied, the API server
    may not know the paramKind or the param object yet and refuses every AgentRun."""
    probe = json.loads(json.dumps(_TENANCY_PROBE))
    probe["metadata"]["namespace"] = namespace
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.kubectl_run("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"a valid AgentRun is still refused after {timeout:.0f}s: {r.stderr.strip()}")
        time.sleep(1)


def wait_decisions_admitted(cluster: Cluster, timeout: float = 90) -> None:
    """Wait until AgentRuns pass every MutatingAdmissionPolicy that stamps them.

    Established only says the CRD is served. A policy is loaded some time after it is applied, and its
    type converter picks the CRD's schema up later still: until then every AgentRun it matches is
    refused with a 503 ("There can be a delay between when CustomResourceDefinitions are created").
    So a probe that merely got no 503 proves nothing (the policy may not be loaded yet). Probe with a
    server-side dry-run create of a valid run carrying ``approved``, and wait until the answer shows
    both stamps (``agentrun.dev/created-by`` and ``agentrun.dev/decided-by``): both policies ran."""
    probe = json.loads(json.dumps(_TENANCY_PROBE))
    probe["metadata"]["name"] = "admission-probe"
    probe["metadata"]["annotations"] = {"approved": "true"}
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.kubectl_run("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe),
                                check=False)
        if r.returncode == 0:
            stamped = json.loads(r.stdout).get("metadata", {}).get("annotations", {})
            if _STAMPS <= stamped.keys():
                return
            why = f"the answer lacks {sorted(_STAMPS - stamped.keys())}"
        else:
            why = r.stderr.strip()
        if time.monotonic() > deadline:
            raise ClusterError(f"AgentRuns not yet stamped by the admission policies after {timeout:.0f}s: {why}")
        time.sleep(1)


#: What the mutating admission policies stamp on a created run that carries a decision.
_STAMPS = frozenset({"agentrun.dev/created-by", "agentrun.dev/decided-by"})


# ------------------------------------------------------------------ S3


@dataclass
class S3Server:
    dir: Path
    endpoint_url: str
    bucket: str = "agentrun"
    access_key: str = "agentrun"
    secret_key: str = "agentrun-secret"
    region: str = "us-east-1"
    pid: int = 0

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region,
                "AGENTRUN_S3_BUCKET": self.bucket}

    def stop(self) -> None:
        stop_s3(self.dir)


def operator_env(cluster: Cluster, s3: S3Server, *, namespace: str, prefix: str,
                 endpoint: str | None = None, **settings: str) -> dict:
    """Environment of an ``agentrun operator`` subprocess on the local control plane: the cluster's
    kubeconfig, the S3 server (``endpoint``: a proxy in front of it, default the server itself)
    with checkpoints under ``s3://BUCKET/PREFIX``, lap pods running ``agentrun lap`` from this
    environment, the Lease in and the watch limited to ``namespace``, no metrics port. ``settings``
    (AGENTRUN_* names) add to or override these."""
    import json
    import shutil

    env = cluster.env()
    env.update({
        "AGENTRUN_CHECKPOINT_URI": f"s3://{s3.bucket}/{prefix}",
        "AGENTRUN_S3_ENDPOINT": endpoint or s3.endpoint_url,
        "AGENTRUN_S3_REGION": s3.region,
        "AGENTRUN_S3_PATH_STYLE": "true",
        "AGENTRUN_S3_CREDENTIALS_SECRET": "s3-creds",
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_DEFAULT_REGION": s3.region,
        "AGENTRUN_LAP_COMMAND": json.dumps([shutil.which("agentrun") or "agentrun", "lap"]),
        "AGENTRUN_LEASE_NAMESPACE": namespace,
        "AGENTRUN_NAMESPACES": namespace,
        "AGENTRUN_METRICS_PORT": "0",
    })
    env.update(settings)
    return env



def start_s3(dir: str | os.PathLike, port: int = 0, bucket: str = "agentrun", timeout: float = 120) -> S3Server:
    """Start moto's S3 server on 127.0.0.1 (conditional writes serialized) and create the bucket."""
    d = Path(dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    pidf = d / "s3.pid"
    if pidf.exists() and _alive(_read_pid(pidf)):
        raise ClusterError(f"an S3 server is already running from {d} (pid {_read_pid(pidf)})")
    port = port or _free_port()
    with open(d / "s3.log", "ab") as logf:
        p = subprocess.Popen([sys.executable, str(S3_SERVER), "--host", "127.0.0.1", "--port", str(port),
                              "--bucket", bucket, "--dir", str(d)],
                             stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    pidf.write_text(f"{p.pid}\n")
    s = S3Server(dir=d, endpoint_url=f"http://127.0.0.1:{port}", bucket=bucket, pid=p.pid)
    end = time.time() + timeout
    while True:
        if p.poll() is not None:
            raise ClusterError(f"S3 server exited with {p.returncode}:\n{_tail(d / 's3.log')}")
        try:
            with urllib.request.urlopen(f"{s.endpoint_url}/{bucket}?list-type=2", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:  # noqa: BLE001
            pass
        if time.time() > end:
            stop_s3(d)
            raise ClusterError(f"S3 server not ready after {timeout}s:\n{_tail(d / 's3.log')}")
        time.sleep(0.2)
    (d / "s3.json").write_text(json.dumps({"endpoint_url": s.endpoint_url, "bucket": bucket,
                                           "access_key": s.access_key, "secret_key": s.secret_key,
                                           "region": s.region, "pid": p.pid}, indent=2))
    return s


def stop_s3(dir: str | os.PathLike) -> None:
    d = Path(dir).resolve()
    _terminate(_read_pid(d / "s3.pid"), grace=5, group=True)
    for f in ("s3.pid",):
        try:
            (d / f).unlink()
        except FileNotFoundError:
            pass


# ------------------------------------------------------------------ CLI


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/cluster.py", description="agentrun local cluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    default_dir = os.environ.get("LOCALKUBE_DIR", ".localkube")
    for name in ("up", "down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=default_dir)
        if name == "up":
            p.add_argument("--keep-data", action="store_true", help="reuse etcd data from a previous run")
            p.add_argument("--no-kubelet", action="store_true")
            p.add_argument("--node", choices=("", "runc"), default=os.environ.get("AGENTRUN_NODE", ""),
                           help="runc: pods whose image is in the local image store run under runc "
                                "(default $AGENTRUN_NODE)")
    for name in ("s3-up", "s3-down"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=os.path.join(default_dir, "s3"))
        p.add_argument("--port", type=int, default=int(os.environ.get("S3_PORT", "0")))
    p = sub.add_parser("sa-kubeconfig")
    p.add_argument("--dir", default=default_dir)
    p.add_argument("namespace")
    p.add_argument("sa")
    p.add_argument("out")
    p = sub.add_parser("wait-admitted", help="wait until a valid AgentRun passes the tenancy policy and the "
                       "stamping admission policies (after kubectl apply -f crds/)")
    p.add_argument("--dir", default=default_dir)
    sub.add_parser("build")
    a = ap.parse_args(argv)

    if a.cmd == "build":
        print(build_localkube())
    elif a.cmd == "up":
        c = start_cluster(a.dir, fresh=not a.keep_data, kubelet=not a.no_kubelet, node=a.node)
        secs = (c.dir / "startup-seconds").read_text().strip()
        print(f"# agentrun local cluster {c.version} at {c.server} (started in {secs}s)", file=sys.stderr)
        print(f"# logs: {c.dir}/logs  pods: {c.dir}/pods  stop: make cluster-down", file=sys.stderr)
        print(f"export KUBECONFIG={c.kubeconfig}")
        print(f"export PATH={c.bin_dir}:$PATH")
    elif a.cmd == "down":
        d = Path(a.dir)
        if not d.exists():
            print(f"no cluster dir {d}", file=sys.stderr)
            return 0
        stop_cluster(d)
        print(f"cluster in {d.resolve()} stopped", file=sys.stderr)
    elif a.cmd == "status":
        d = Path(a.dir).resolve()
        for n in ("localkube", "kubelet"):
            pid = _read_pid(d / f"{n}.pid")
            print(f"{n}: {f'running pid {pid}' if pid and _alive(pid) else 'stopped'}")
    elif a.cmd == "s3-up":
        s = start_s3(a.dir, port=a.port)
        print(f"# S3 (moto) at {s.endpoint_url}, bucket {s.bucket}; stop: make s3-down", file=sys.stderr)
        for k, v in s.env().items():
            print(f"export {k}={v}")
    elif a.cmd == "s3-down":
        stop_s3(a.dir)
    elif a.cmd == "wait-admitted":
        c = Cluster.load(a.dir)
        wait_tenancy_admitted(c)
        wait_decisions_admitted(c)
    elif a.cmd == "sa-kubeconfig":
        print(sa_kubeconfig(Cluster.load(a.dir), a.namespace, a.sa, a.out))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
