#!/usr/bin/env python3
"""runc_node: the process kubelet's container mode. A pod whose images are in the local image
store (e2e/image_store.py) runs its containers with runc, from the image's root filesystem, with
the pod's securityContext mapped onto the OCI runtime spec. Enabled by ``AGENTRUN_NODE=runc`` in
the environment of e2e/proc_kubelet.py (``start_cluster(node="runc")``, ``make dev`` with
``AGENTRUN_NODE=runc``); pods whose image is not in the store keep the host-process mode.

Per container, under the pod's directory ``DIR/pods/<ns>_<pod>_<uid>/runc/<container>/``:

* ``rootfs``: an overlay mount, lower = the image's unpacked rootfs (shared, never written),
  upper = a fresh per-container directory; with ``readOnlyRootFilesystem: true`` the OCI root is
  also ``readonly`` (the mount is read-only inside the container);
* ``config.json``: the OCI runtime spec (below), ``runc --root DIR/runc run --bundle ...`` in the
  foreground under a small supervisor (``python3 e2e/runc_node.py run BUNDLE``) that the kubelet
  starts like a host process: it mounts the overlay, runs runc, forwards SIGTERM/SIGINT to the
  container, and on the way out deletes the runc container and unmounts. The kubelet also cleans
  up after a supervisor that was SIGKILLed (``cleanup``) and, on start, after a previous kubelet
  (``cleanup_all``).

What is enforced (mapped onto the OCI spec):

* user: ``runAsUser`` / ``runAsGroup`` (container over pod), else the image's ``User`` (numeric or
  a name from the image's /etc/passwd); ``fsGroup`` and ``supplementalGroups`` as additional
  groups; ``runAsNonRoot: true`` with UID 0 is refused (like the kubelet);
* ``readOnlyRootFilesystem``; ``allowPrivilegeEscalation: false`` -> ``noNewPrivileges``;
* capabilities: the container runtime default set, minus ``drop`` (``ALL``: none), plus ``add``
  (a capability this host cannot grant is refused); bounding/effective/permitted, nothing
  inheritable or ambient (so a non-root process has none after exec, as with containerd);
* seccomp ``RuntimeDefault`` (container over pod): a filter that allows everything except the
  syscalls container runtimes' default profiles deny (mount, unshare/setns and namespace clone
  flags, ptrace, kexec, modules, keyring, bpf, perf_event_open, userfaultfd, io_uring, clock and
  time setting, swap, reboot...): EPERM. It is a deny list derived from those profiles, not
  containerd's allow list. ``Unconfined`` / unset: none. ``Localhost``: refused. Where runc has
  no libseccomp or the kernel no seccomp, RuntimeDefault is reported as not enforced;
* volumes as bind mounts: ``emptyDir`` (a per-pod directory, mode 0777, group ``fsGroup``),
  ``projected`` (serviceAccountToken through the TokenRequest API bound to the pod, configMap,
  secret, downwardAPI), ``secret``, ``configMap``, ``downwardAPI``; ``readOnly`` mounts; ``subPath``;
* env (with Secrets and ConfigMaps resolved by the kubelet) on top of the image's ``Env``,
  ``HOSTNAME``, ``HOME`` from the image's /etc/passwd, and ``KUBERNETES_SERVICE_HOST/PORT``
  pointing at the API server (127.0.0.1: there is no Service network), so in-cluster config
  works when a token is mounted (``automountServiceAccountToken``); none is mounted otherwise;
* ``command``/``args`` over the image's ``Entrypoint``/``Cmd`` (Kubernetes rules), ``workingDir``;
* resources: ``limits.memory`` (memory cgroup), ``limits.cpu`` (CFS quota), ``requests.cpu``
  (shares);
* PID, IPC, UTS and mount namespaces; /proc paths masked and read-only like runc's defaults.

Reported as not enforced (one Warning Event ``NotEnforced`` on the pod and a kubelet log line):
the network namespace (every container shares the host's, so loopback S3 and tool servers are
reachable; ports are not isolated), ``emptyDir.sizeLimit`` and ``medium: Memory`` (a plain
directory), ``ephemeral-storage`` and memory/cpu requests beyond CPU shares, probes and lifecycle
hooks, the projected token's rotation, ``terminationMessagePath`` (not read back).

Refused (the pod fails with reason ``Unsupported`` or ``CreateContainerConfigError`` and a message
naming the field): ``privileged``, ``hostPID``/``hostIPC``, ``shareProcessNamespace``, sysctls,
SELinux and AppArmor options, ``procMount: Unmasked``, ``Localhost`` seccomp, volume types other
than the ones above (hostPath, PVCs...), ``subPathExpr``, ``mountPropagation``, a pod whose
containers mix local images and images that are not in the store.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from . import image_store  # type: ignore[no-redef]
except ImportError:  # run as a script: e2e/ is on sys.path
    import image_store  # type: ignore[no-redef]

log = logging.getLogger("proc_kubelet.runc")

NODE_ENV = "AGENTRUN_NODE"
RUNC_ENV = "AGENTRUN_RUNC"  # the runc binary (default: runc on PATH)
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

# containerd's / Docker's default capability set of a non-privileged container
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")
CAP_NUMBERS = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
    "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_LINUX_IMMUTABLE": 9,
    "CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
    "CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18,
    "CAP_SYS_PTRACE": 19, "CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23,
    "CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25, "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27, "CAP_LEASE": 28,
    "CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31, "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37,
    "CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}

# RuntimeDefault: what the default profiles of Docker/containerd deny, as a deny list (EPERM)
SECCOMP_DENY = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "finit_module",
    "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module", "io_uring_enter",
    "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl",
    "lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
    "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "setns", "settimeofday",
    "stime", "swapoff", "swapon", "_sysctl", "sysfs", "umount", "umount2", "unshare", "uselib", "userfaultfd",
    "ustat", "vm86", "vm86old",
)
CLONE_NS_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


BASE_MOUNTS = (
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
     "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
)
MASKED_PATHS = ("/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class Refused(Exception):
    """The pod asks for something this node cannot enforce: it fails with this reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        message = message if len(message) <= 1024 else message[:1021] + "..."  # names from the spec: bounded
        super().__init__(message)
        self.reason = reason
        self.message = message


def seccomp_runtime_default() -> dict:
    rules: list[dict[str, Any]] = [{"names": list(SECCOMP_DENY), "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    for flag in CLONE_NS_FLAGS:  # clone(2) creating namespaces (clone3 cannot be filtered by flags: ENOSYS)
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
                      "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38})  # ENOSYS: libc falls back
    return {"defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"], "syscalls": rules}


def host_capabilities() -> set[str]:
    try:
        bnd = next(ln for ln in open("/proc/self/status") if ln.startswith("CapBnd:"))
        mask = int(bnd.split()[1], 16)
    except (OSError, StopIteration, ValueError):
        return set()
    return {name for name, bit in CAP_NUMBERS.items() if mask & (1 << bit)}


def parse_quantity(q: str | int | float) -> float:
    """A Kubernetes quantity ('256Mi', '1Gi', '500m', '2') as a number (bytes / cores)."""
    s = str(q).strip()
    bin_suffix = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    dec_suffix = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suf, mul in bin_suffix.items():
        if s.endswith(suf):
            return float(s[: -len(suf)]) * mul
    if s and s[-1] in dec_suffix:
        return float(s[:-1]) * dec_suffix[s[-1]]
    return float(s)


def lookup_user(rootfs: Path, user: str) -> tuple[int, int | None, str]:
    """The image's ``User`` ("uid", "uid:gid", "name", "name:group") -> (uid, gid or None, home),
    names resolved in the IMAGE's /etc/passwd and /etc/group."""
    name, _, group = user.partition(":")

    def table(path: str) -> list[list[str]]:
        try:
            return [ln.split(":") for ln in (rootfs / path).read_text().splitlines() if ln and not ln.startswith("#")]
        except OSError:
            return []

    passwd = table("etc/passwd")
    uid: int | None = None
    gid: int | None = None
    home = "/"
    if not name:
        uid = 0
    elif name.isdigit():
        uid = int(name)
    for row in passwd:
        if len(row) >= 6 and ((uid is None and row[0] == name) or (uid is not None and row[2] == str(uid))):
            uid = int(row[2]) if uid is None else uid
            gid = int(row[3])
            home = row[5] or "/"
            break
    if uid is None:
        raise Refused("CreateContainerConfigError", f"image user {name!r} is not in the image's /etc/passwd")
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            row = next((r for r in table("etc/group") if r[0] == group), None)
            if row is None:
                raise Refused("CreateContainerConfigError", f"image group {group!r} is not in the image's /etc/group")
            gid = int(row[2])
    return uid, gid, home


def home_of(rootfs: Path, uid: int) -> str:
    try:
        for ln in (rootfs / "etc/passwd").read_text().splitlines():
            row = ln.split(":")
            if len(row) >= 6 and row[2] == str(uid):
                return row[5] or "/"
    except OSError:
        pass
    return "/"


@dataclass
class Bundle:
    """One container's OCI bundle, what the supervisor (``run``) needs."""

    id: str
    dir: Path
    lower: Path
    config: dict
    not_enforced: list[str] = field(default_factory=list)

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "config.json"  # holds the env, Secrets included: root only, like a runtime's state
        cfg.touch(mode=0o600)
        os.chmod(cfg, 0o600)
        cfg.write_text(json.dumps(self.config, indent=1))
        (self.dir / "bundle.json").write_text(json.dumps({"id": self.id, "lower": str(self.lower)}))


class RuncNode:
    """Plans the runc containers of a pod for the process kubelet (``kubelet``: ProcKubelet)."""

    def __init__(self, kubelet: Any, kube: Any, runc: str | None = None,
                 store: image_store.ImageStore | None = None) -> None:
        self.kl = kubelet
        self.k = kube  # the proc_kubelet module: expand(), ConfigError, _field_path()
        self.runc = runc or os.environ.get(RUNC_ENV) or shutil.which("runc") or "runc"
        self.store = store or image_store.ImageStore()
        self.state_root = Path(kubelet.base_dir) / "runc"
        self.host_caps = host_capabilities()
        self.seccomp_ok = True  # check(): runc built with libseccomp and a kernel with seccomp
        u = urllib.parse.urlsplit(kubelet.server)
        self.api_host, self.api_port = u.hostname or "127.0.0.1", str(u.port or 443)

    @staticmethod
    def enabled() -> bool:
        return os.environ.get(NODE_ENV, "") == "runc"

    def check(self) -> None:
        """Fail the kubelet's start (clearly) when runc mode is asked for but cannot work."""
        if os.geteuid() != 0:
            raise RuntimeError(f"{NODE_ENV}=runc needs root (runc, overlay mounts)")
        try:
            version = subprocess.run([self.runc, "--version"], check=True, capture_output=True, text=True,
                                     timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise RuntimeError(f"{NODE_ENV}=runc but runc ({self.runc}) does not run: {e}") from None
        try:
            kernel = any(ln.startswith("Seccomp:") for ln in open("/proc/self/status"))
        except OSError:
            kernel = False
        self.seccomp_ok = "libseccomp" in version and kernel
        if not self.seccomp_ok:
            log.warning("runc node: no seccomp (runc without libseccomp or a kernel without it): "
                        "seccompProfile RuntimeDefault is reported as not enforced")
        self.state_root.mkdir(parents=True, exist_ok=True)
        log.info("runc node: runc %s, image store %s (%d image(s))", self.runc, self.store.root,
                 len(self.store.refs()))

    # ------------------------------------------------------------------ plan
    def images(self, pod: dict) -> dict[str, image_store.Image] | None:
        """The local image of every container, or None when no container's image is local (host
        processes). Refused when some are local and some are not."""
        spec = pod.get("spec") or {}
        cs = (spec.get("initContainers") or []) + (spec.get("containers") or [])
        found = {c["name"]: self.store.lookup(c.get("image") or "") for c in cs}
        if not any(found.values()):
            return None
        missing = sorted(f"{n} ({next(c.get('image') for c in cs if c['name'] == n)})"
                         for n, img in found.items() if img is None)
        if missing:
            raise Refused("Unsupported", f"containers {', '.join(missing)}: image not in the local image store "
                                         f"{self.store.root} while other containers' images are")
        return found  # type: ignore[return-value]

    def adopt(self, pod: dict, pdir: str, images: dict[str, image_store.Image], runs: list[Any],
              marker_env: dict[str, str]) -> list[str]:
        """Turn the kubelet's ContainerRuns of this pod (their ``kube_env``: the container env the
        kubelet resolved, Secrets and ConfigMaps included) into runc containers: write the volumes
        and the bundles, point argv/env/cwd at the supervisor. Returns what is not enforced.
        Raises Refused, or the kubelet's ConfigError (retried) for a missing Secret/ConfigMap."""
        spec = pod.get("spec") or {}
        psc = spec.get("securityContext") or {}
        self._check_pod(spec, psc)
        not_enforced = ["network: the host's network namespace (ports and traffic are not isolated)"]
        volumes = self._volumes(pod, Path(pdir), psc, not_enforced)
        by_name = {c["name"]: c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
        for cr in runs:
            b = self._bundle(pod, Path(pdir), by_name[cr.name], images[cr.name], cr.kube_env, marker_env, psc,
                             volumes)
            not_enforced += b.not_enforced
            b.write()
            cr.argv = [sys.executable, str(Path(__file__).resolve()), "run", str(b.dir)]
            cr.env = dict(marker_env, PATH=os.environ.get("PATH", "/usr/bin:/bin"), **{
                RUNC_ENV: self.runc, "AGENTRUN_RUNC_ROOT": str(self.state_root)})
            cr.cwd = str(b.dir)
            cr.bundle = str(b.dir)
        return not_enforced

    def event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        """One Event on the pod (best effort: a failure is logged)."""
        md = pod["metadata"]
        t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": md["name"],
                                   "namespace": md["namespace"], "uid": md["uid"]},
                "type": type_, "reason": reason, "message": message[:1024],
                "source": {"component": "proc-kubelet", "host": self.kl.node},
                "reportingComponent": "proc-kubelet", "reportingInstance": self.kl.node,
                "firstTimestamp": t, "lastTimestamp": t, "count": 1}
        try:
            self.kl.v1.create_namespaced_event(md["namespace"], body, _request_timeout=10)
        except Exception as e:  # noqa: BLE001
            log.warning("event %s on pod %s/%s: %s", reason, md["namespace"], md["name"], e)

    def _check_pod(self, spec: dict, psc: dict) -> None:
        for key in ("hostPID", "hostIPC", "shareProcessNamespace"):
            if spec.get(key):
                raise Refused("Unsupported", f"spec.{key}: not supported by the runc node")
        for key in ("sysctls", "seLinuxOptions", "appArmorProfile"):
            if psc.get(key):
                raise Refused("Unsupported", f"spec.securityContext.{key}: not enforced by the runc node")

    def _volumes(self, pod: dict, pdir: Path, psc: dict, not_enforced: list[str]) -> dict[str, Path]:
        spec = pod.get("spec") or {}
        ns = pod["metadata"]["namespace"]
        fs_group = psc.get("fsGroup")
        root = pdir / "volumes"
        out: dict[str, Path] = {}
        for i, v in enumerate(spec.get("volumes") or []):
            name = v["name"]
            d = root / name
            where = f"spec.volumes[{i}] ({name})"
            if "emptyDir" in v:
                ed = v.get("emptyDir") or {}
                d.mkdir(parents=True, exist_ok=True)
                os.chmod(d, 0o777)
                if fs_group is not None:
                    os.chown(d, 0, int(fs_group))
                    os.chmod(d, 0o2777)
                if ed.get("sizeLimit"):
                    not_enforced.append(f"{where}: emptyDir.sizeLimit {ed['sizeLimit']}")
                if ed.get("medium") == "Memory":
                    not_enforced.append(f"{where}: emptyDir.medium Memory (a directory on disk)")
            elif "projected" in v:
                pr = v["projected"] or {}
                files: dict[str, tuple[bytes, int | None]] = {}
                for src in pr.get("sources") or []:
                    files.update(self._source_files(pod, ns, src, where))
                self._write_files(d, files, pr.get("defaultMode", 0o644), fs_group)
                if any("serviceAccountToken" in s for s in pr.get("sources") or []):
                    not_enforced.append(f"{where}: the service account token is not rotated")
            elif "secret" in v or "configMap" in v or "downwardAPI" in v:
                kind = next(k for k in ("secret", "configMap", "downwardAPI") if k in v)
                src = dict(v[kind] or {})
                if kind == "secret":
                    src["name"] = src.pop("secretName", "")
                files = self._source_files(pod, ns, {kind: src}, where)
                self._write_files(d, files, src.get("defaultMode", 0o644), fs_group)
            else:
                kinds = sorted(k for k in v if k != "name")
                raise Refused("Unsupported", f"{where}: volume type {', '.join(kinds)} is not supported by the runc node")
            out[name] = d
        return out

    def _source_files(self, pod: dict, ns: str, src: dict, where: str) -> dict[str, tuple[bytes, int | None]]:
        """The files of one projected source / secret / configMap / downwardAPI volume."""
        from_proc = self.k.ConfigError
        files: dict[str, tuple[bytes, int | None]] = {}
        if "serviceAccountToken" in src:
            t = src["serviceAccountToken"] or {}
            files[t.get("path", "token")] = (self._token(pod, t).encode(), None)
        elif "configMap" in src or "secret" in src:
            kind = "configMap" if "configMap" in src else "secret"
            ref = src[kind] or {}
            getter = self.kl._configmap if kind == "configMap" else self.kl._secret
            data = getter(ns, ref.get("name", ""), bool(ref.get("optional")))
            if data is None:
                return files
            items = ref.get("items")
            if items:
                for it in items:
                    if it["key"] not in data:
                        if ref.get("optional"):
                            continue
                        raise from_proc(f"{where}: couldn't find key {it['key']} in {kind} {ns}/{ref.get('name')}")
                    files[it["path"]] = (data[it["key"]].encode(), it.get("mode"))
            else:
                files.update({k: (val.encode(), None) for k, val in data.items()})
        elif "downwardAPI" in src:
            for it in (src["downwardAPI"] or {}).get("items") or []:
                if it.get("fieldRef"):
                    files[it["path"]] = (self.k._field_path(pod, it["fieldRef"]["fieldPath"], self.kl.node).encode(),
                                         it.get("mode"))
                else:
                    raise Refused("Unsupported", f"{where}: downwardAPI resourceFieldRef is not supported")
        elif "clusterTrustBundle" in src or "podCertificate" in src:
            raise Refused("Unsupported", f"{where}: projected source {sorted(src)} is not supported")
        return files

    def _token(self, pod: dict, t: dict) -> str:
        md, spec = pod["metadata"], pod.get("spec") or {}
        sa = spec.get("serviceAccountName") or "default"
        body: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": int(t.get("expirationSeconds") or 3600),
                                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": md["name"],
                                                            "uid": md["uid"]}}}
        if t.get("audience"):
            body["spec"]["audiences"] = [t["audience"]]
        from kubernetes.client.rest import ApiException

        try:
            resp = self.kl.v1.create_namespaced_service_account_token(sa, md["namespace"], body, _request_timeout=10)
        except ApiException as e:
            raise self.k.ConfigError(f"token request for serviceaccount {md['namespace']}/{sa}: "
                                      f"{e.status} {e.reason}") from None
        return resp.status.token

    @staticmethod
    def _write_files(d: Path, files: dict[str, tuple[bytes, int | None]], default_mode: int,
                     fs_group: int | None) -> None:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        for rel, (data, mode) in files.items():
            if rel.startswith("/") or ".." in rel.split("/"):
                raise Refused("Unsupported", f"volume file path {rel!r} escapes the volume")
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            m = int(mode if mode is not None else default_mode)
            if fs_group is not None:
                os.chown(p, 0, int(fs_group))
                m |= 0o040 if m & 0o400 else 0  # group-readable for the fsGroup, like the kubelet
            os.chmod(p, m)

    def _bundle(self, pod: dict, pdir: Path, c: dict, img: image_store.Image, cenv: dict[str, str],
                marker_env: dict[str, str], psc: dict, volumes: dict[str, Path]) -> Bundle:
        md = pod["metadata"]
        name = c["name"]
        where = f"container {name}"
        sc = c.get("securityContext") or {}
        not_enforced: list[str] = []
        if sc.get("privileged"):
            raise Refused("Unsupported", f"{where}: securityContext.privileged is not supported by the runc node")
        for key in ("seLinuxOptions", "appArmorProfile"):
            if sc.get(key):
                raise Refused("Unsupported", f"{where}: securityContext.{key} is not enforced by the runc node")
        if sc.get("procMount") not in (None, "Default"):
            raise Refused("Unsupported", f"{where}: securityContext.procMount {sc['procMount']} is not supported")

        # ---- user
        img_uid, img_gid, _ = lookup_user(img.rootfs, img.user)
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        uid = img_uid if uid is None else int(uid)
        gid = sc.get("runAsGroup", psc.get("runAsGroup"))
        if gid is None:
            gid = img_gid if (sc.get("runAsUser", psc.get("runAsUser")) is None and img_gid is not None) else None
            if gid is None:
                _, gid, _ = lookup_user(img.rootfs, str(uid))
            gid = 0 if gid is None else gid
        gid = int(gid)
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) and uid == 0:
            raise Refused("CreateContainerConfigError",
                          f"{where}: container has runAsNonRoot and image will run as root")
        groups = sorted({int(g) for g in (psc.get("supplementalGroups") or [])}
                        | ({int(psc["fsGroup"])} if psc.get("fsGroup") is not None else set()))

        # ---- capabilities
        caps = set(DEFAULT_CAPS)
        capsc = sc.get("capabilities") or {}
        drops = {("CAP_" + x.upper()).replace("CAP_CAP_", "CAP_") for x in capsc.get("drop") or []}
        adds = {("CAP_" + x.upper()).replace("CAP_CAP_", "CAP_") for x in capsc.get("add") or []}
        caps = set() if "CAP_ALL" in drops else caps - drops
        if "CAP_ALL" in adds:
            adds = set(CAP_NUMBERS)
        unknown = sorted(a for a in adds if a not in CAP_NUMBERS)
        if unknown:
            raise Refused("Unsupported", f"{where}: securityContext.capabilities.add: unknown {', '.join(unknown)}")
        cannot = sorted(a for a in adds if a not in self.host_caps)
        if cannot:
            raise Refused("Unsupported", f"{where}: securityContext.capabilities.add {', '.join(cannot)}: "
                                         "this host cannot grant them")
        caps = sorted((caps | adds) & self.host_caps)

        # ---- seccomp
        prof = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
        seccomp = None
        if prof.get("type") == "RuntimeDefault":
            if self.seccomp_ok:
                seccomp = seccomp_runtime_default()
            else:
                not_enforced.append(f"{where}: seccompProfile RuntimeDefault (no seccomp in this runc/kernel)")
        elif prof.get("type") == "Localhost":
            raise Refused("Unsupported", f"{where}: seccompProfile Localhost is not supported by the runc node")

        # ---- process
        command, args = c.get("command"), c.get("args")
        from_kube = self.k.expand
        if command:
            argv = [from_kube(a, cenv) for a in command] + [from_kube(a, cenv) for a in (args or [])]
        else:
            argv = list(img.config.get("Entrypoint") or []) + (
                [from_kube(a, cenv) for a in args] if args is not None else list(img.config.get("Cmd") or []))
        if not argv:
            raise Refused("CreateContainerConfigError", f"{where}: no command: the image has no Entrypoint/Cmd")
        env: dict[str, str] = {}
        for e in img.env:
            k, _, v = e.partition("=")
            env[k] = v
        env.update({"HOSTNAME": md["name"], "HOME": home_of(img.rootfs, uid),
                    "KUBERNETES_SERVICE_HOST": self.api_host, "KUBERNETES_SERVICE_PORT": self.api_port,
                    "KUBERNETES_SERVICE_PORT_HTTPS": self.api_port})
        env.update(cenv)
        env.update(marker_env)  # lets the kubelet find a container process a crash left behind

        # ---- mounts
        mounts: list[dict[str, Any]] = [dict(m) for m in BASE_MOUNTS]
        for i, vm in enumerate(c.get("volumeMounts") or []):
            vwhere = f"{where}: volumeMounts[{i}] ({vm.get('name')})"
            if vm.get("subPathExpr"):
                raise Refused("Unsupported", f"{vwhere}: subPathExpr is not supported by the runc node")
            if vm.get("mountPropagation") not in (None, "None"):
                raise Refused("Unsupported", f"{vwhere}: mountPropagation is not supported by the runc node")
            src = volumes.get(vm["name"])
            if src is None:
                raise Refused("CreateContainerConfigError", f"{vwhere}: no volume named {vm['name']!r}")
            if vm.get("subPath"):
                sub = vm["subPath"]
                if sub.startswith("/") or ".." in sub.split("/"):
                    raise Refused("CreateContainerConfigError", f"{vwhere}: subPath {sub!r} escapes the volume")
                src = src / sub
                if not src.exists():
                    src.mkdir(parents=True)
            opts = ["rbind", "nosuid", "nodev", "ro" if vm.get("readOnly") else "rw"]
            mounts.append({"destination": vm["mountPath"], "type": "bind", "source": str(src), "options": opts})

        # ---- resources
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        linux_res: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
        if limits.get("memory"):
            linux_res["memory"] = {"limit": int(parse_quantity(limits["memory"]))}
        cpu: dict[str, Any] = {}
        if limits.get("cpu"):
            cpu.update(period=100000, quota=max(1000, int(parse_quantity(limits["cpu"]) * 100000)))
        if requests.get("cpu"):
            cpu["shares"] = max(2, int(parse_quantity(requests["cpu"]) * 1024))
        if cpu:
            linux_res["cpu"] = cpu
        if requests.get("memory"):
            not_enforced.append(f"{where}: resources.requests.memory (scheduling only)")
        for k in ("ephemeral-storage",):
            if limits.get(k) or requests.get(k):
                not_enforced.append(f"{where}: resources {k}")
        for k in ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle"):
            if c.get(k):
                not_enforced.append(f"{where}: {k} (not run)")

        cid = f"{md['uid'][:13]}-{name}"[:64]
        bdir = pdir / "runc" / name
        config = {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False,
                "user": {"uid": uid, "gid": gid, "additionalGids": groups},
                "args": argv,
                "env": [f"{k}={v}" for k, v in env.items()],
                "cwd": c.get("workingDir") or img.config.get("WorkingDir") or "/",
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps,
                                 "inheritable": [], "ambient": []},
                "noNewPrivileges": sc.get("allowPrivilegeEscalation") is False,
                # no rlimits: this sandbox may not raise them (no CAP_SYS_RESOURCE); inherited instead
            },
            "root": {"path": "rootfs", "readonly": bool(sc.get("readOnlyRootFilesystem"))},
            "hostname": md["name"][:63],
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
                "resources": linux_res,
                "cgroupsPath": f"/agentrun/{cid}",
                "maskedPaths": list(MASKED_PATHS),
                "readonlyPaths": list(READONLY_PATHS),
            },
        }
        if seccomp is not None:
            config["linux"]["seccomp"] = seccomp
        return Bundle(id=cid, dir=bdir, lower=img.rootfs, config=config, not_enforced=not_enforced)

    # ------------------------------------------------------------------ cleanup (kubelet side)
    def cleanup(self, bundle_dir: str | os.PathLike) -> None:
        """After the supervisor exited (also when it was SIGKILLed): no container, no mount left."""
        cleanup_bundle(Path(bundle_dir), self.runc, str(self.state_root))


# ---------------------------------------------------------------------- supervisor + cleanup


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _mounted(path: Path) -> bool:
    p = str(path.resolve())
    try:
        with open("/proc/self/mountinfo") as f:
            return any(ln.split()[4] == p for ln in f)
    except OSError:
        return False


def cleanup_bundle(bdir: Path, runc: str, state_root: str) -> None:
    try:
        meta = json.loads((bdir / "bundle.json").read_text())
    except (OSError, ValueError):
        return
    cid = meta["id"]
    if (Path(state_root) / cid).exists():
        _run([runc, "--root", state_root, "kill", cid, "KILL"])
        for _ in range(50):
            st = _run([runc, "--root", state_root, "state", cid])
            if st.returncode != 0 or '"status": "stopped"' in st.stdout:
                break
            time.sleep(0.1)
        _run([runc, "--root", state_root, "delete", "--force", cid])
    rootfs = bdir / "rootfs"
    for _ in range(20):
        if not _mounted(rootfs):
            break
        _run(["umount", str(rootfs)])
        if _mounted(rootfs):
            time.sleep(0.1)
    else:
        _run(["umount", "-l", str(rootfs)])


def cleanup_all(base_dir: str | os.PathLike) -> int:
    """Delete every runc container and unmount every container root of a (previous) kubelet in base_dir."""
    base = Path(base_dir).resolve()
    runc = os.environ.get(RUNC_ENV) or shutil.which("runc")
    n = 0
    for bj in sorted(base.glob("pods/*/runc/*/bundle.json")):
        if runc:
            cleanup_bundle(bj.parent, runc, str(base / "runc"))
        elif _mounted(bj.parent / "rootfs"):
            _run(["umount", "-l", str(bj.parent / "rootfs")])
        n += 1
    return n


def unusable_reason(runc: str | None = None) -> str | None:
    """Why this machine cannot run runc containers at all (None: it can try)."""
    if os.geteuid() != 0:
        return "the runc node needs root (runc, overlay mounts)"
    runc = runc or os.environ.get(RUNC_ENV) or shutil.which("runc")
    if not runc:
        return "runc is not installed (tools/install-image-tools.sh)"
    try:
        if "overlay" not in open("/proc/filesystems").read():
            return "the kernel has no overlay filesystem"
    except OSError:
        return "no /proc/filesystems"
    return None


def run_image(img: image_store.Image, argv: list[str], work: Path, *, minimal: bool = False,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run argv once in the image under runc, outside any pod: the image's user, a read-only root,
    a tmpfs /tmp, no capabilities, no new privileges, the RuntimeDefault seccomp filter (minimal:
    root, writable, none of these: the probe of whether runc works here at all). Output: stdout+stderr."""
    runc = os.environ.get(RUNC_ENV) or shutil.which("runc") or "runc"
    uid, gid, home = lookup_user(img.rootfs, img.user)
    env = list(img.env) + [f"HOME={home}"]
    bdir = work / "bundle"
    process: dict[str, Any] = {"terminal": False, "user": {"uid": 0 if minimal else uid, "gid": 0 if minimal else gid or 0},
                               "args": argv, "env": env, "cwd": img.config.get("WorkingDir") or "/",
                               "noNewPrivileges": not minimal}
    if not minimal:
        process["capabilities"] = {k: [] for k in ("bounding", "effective", "permitted", "inheritable", "ambient")}
    mounts = [dict(m) for m in BASE_MOUNTS] + [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]}]
    config: dict[str, Any] = {
        "ociVersion": "1.0.2", "process": process, "root": {"path": "rootfs", "readonly": not minimal},
        "hostname": "oneshot", "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
                  "maskedPaths": list(MASKED_PATHS), "readonlyPaths": list(READONLY_PATHS)}}
    if not minimal:
        config["linux"]["seccomp"] = seccomp_runtime_default()
    cid = f"oneshot-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    Bundle(id=cid, dir=bdir, lower=img.rootfs, config=config).write()
    state = work / "runc-state"
    state.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), "run", str(bdir)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), RUNC_ENV: runc,
                               "AGENTRUN_RUNC_ROOT": str(state)})


def supervise(bdir: Path) -> int:
    """``runc_node.py run BUNDLE``: mount the container root, run the container in the foreground,
    clean up. Exit status: the container's (128+N when killed by signal N)."""
    meta = json.loads((bdir / "bundle.json").read_text())
    runc, state_root = os.environ.get(RUNC_ENV, "runc"), os.environ["AGENTRUN_RUNC_ROOT"]
    cid, lower = meta["id"], meta["lower"]
    cleanup_bundle(bdir, runc, state_root)  # a previous run of this container (restart)
    for d in ("upper", "work"):
        shutil.rmtree(bdir / d, ignore_errors=True)
        (bdir / d).mkdir(parents=True)
    (bdir / "rootfs").mkdir(exist_ok=True)
    r = _run(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={lower},upperdir={bdir / 'upper'},workdir={bdir / 'work'}", str(bdir / "rootfs")])
    if r.returncode != 0:
        print(f"runc node: cannot mount the container root (overlay): {r.stderr.strip()}", file=sys.stderr)
        return 128
    # The kubelet signals this process group: runc (in it) forwards SIGTERM to the container's
    # process; this supervisor waits for runc. A no-op handler, not SIG_IGN, which runc would inherit.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        child = subprocess.Popen([runc, "--root", state_root, "run", "--bundle", str(bdir), cid],
                                 stdin=subprocess.DEVNULL)
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:
                continue
    finally:
        cleanup_bundle(bdir, runc, state_root)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        sys.exit(supervise(Path(sys.argv[2])))
    print("usage: runc_node.py run BUNDLE_DIR   (started by e2e/proc_kubelet.py)", file=sys.stderr)
    sys.exit(2)
