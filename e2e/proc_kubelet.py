#!/usr/bin/env python3
"""proc_kubelet: a *process* kubelet for agentrun's local test cluster.

It makes a real kube-apiserver + kube-controller-manager (see
e2e/localkube) usable for Jobs without containers, a container runtime or a
scheduler:

* registers one Ready Node (default ``agentrun-local``) with capacity and
  allocatable, keeps its Ready condition heartbeat fresh and renews its Lease
  in ``kube-node-lease``;
* binds every unscheduled pod (``spec.nodeName`` empty) to that node through
  the ``pods/binding`` subresource: it *is* the scheduler;
* runs each container's ``command`` + ``args`` as a local process (one
  process group per container, all containers of a pod in parallel; init
  containers first, one after the other), with the environment resolved like
  the kubelet does: ``env[].value`` (with ``$(VAR)`` expansion),
  ``valueFrom.secretKeyRef`` / ``configMapKeyRef`` / ``fieldRef``
  (metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'],
  metadata.annotations['k'], spec.nodeName, spec.serviceAccountName,
  status.podIP, status.hostIP) / ``resourceFieldRef`` (raw value), and
  ``envFrom`` (secretRef / configMapRef with prefix). ``$(VAR)`` in
  command/args is expanded from the container's env; ``$$`` escapes;
* patches pod status: Pending -> Running (containerStatuses running, podIP
  127.0.0.1, startTime, containerID ``proc://<pid>``) -> Succeeded / Failed
  with exit codes and reasons ``Completed`` / ``Error``; ``DeadlineExceeded``
  when ``activeDeadlineSeconds`` runs out; ``StartError`` (exit 128) when the
  command cannot be executed. With ``terminationMessagePolicy:
  FallbackToLogsOnError`` the tail of the log becomes
  ``state.terminated.message`` of a failed container. So the Job controller
  counts the pods and removes its ``batch.kubernetes.io/job-tracking``
  finalizer;
* ``restartPolicy``: Never = never restarted; OnFailure / Always = the
  container is restarted in place (restartCount++) with a short back-off
  (1s doubling to 10s, not the kubelet's 5 minutes);
* on a pod's ``deletionTimestamp`` it sends SIGTERM to each container's whole
  process group, SIGKILL after the grace period, records the terminal status
  and deletes the pod with grace period 0;
* writes each container's stdout+stderr to
  ``DIR/pods/<namespace>_<pod>_<uid>/<container>.log`` (pid in
  ``<container>.pid``);
* service accounts: unless ``automountServiceAccountToken: false``, it asks
  the TokenRequest API for a token bound to the pod and writes
  ``DIR/pods/.../serviceaccount/{token,ca.crt,namespace}`` plus a
  ``kubeconfig`` there, and sets ``KUBECONFIG`` to it in the process env
  (unless the pod sets KUBECONFIG itself). There is no
  ``/var/run/secrets/kubernetes.io/serviceaccount`` mount and no
  ``KUBERNETES_SERVICE_HOST``: in-cluster config is NOT available, a
  kubeconfig is;
* serves pod logs to the apiserver (``kubectl logs``, also ``-f``) from the
  log files, on a free loopback HTTPS port advertised in the Node's
  ``daemonEndpoints`` (no authentication: loopback only);
* survives restarts: on start it kills leftover processes of a previous
  incarnation (found via the pid files and an env marker) and marks pods bound
  to the node that are ``Running`` but have no process here as Failed with
  reason ``KubeletRestarted``; Pending pods are (re)started;
* watches pods with reconnects (and a periodic full resync); API errors are
  logged and retried, never fatal.

Runc mode: with ``AGENTRUN_NODE=runc``, a pod whose images are in the local image
store runs under runc with its securityContext enforced instead (e2e/runc_node.py).

What it fakes / does not do (host-process mode): images are never pulled (the ``image`` field is
ignored; the command runs on the host, in the Python environment and with the
PATH of the process kubelet itself, so ``agentrun lap`` works when the project
is pip-installed); resource requests/limits, securityContext, volumes and
volumeMounts, probes, lifecycle hooks, ports, hostAliases/DNS and
terminationMessagePath are not enforced or provided; networking is the host's
loopback (podIP = hostIP = 127.0.0.1); sidecar (restartable) init containers
are run like plain init containers; a missing Secret/ConfigMap key keeps the
pod Pending with ``CreateContainerConfigError`` and is retried.

Usage::

    python e2e/proc_kubelet.py --kubeconfig DIR/admin.kubeconfig --dir DIR
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

try:
    from . import runc_node  # type: ignore[no-redef]
except ImportError:  # run as a script: e2e/ is on sys.path
    import runc_node  # type: ignore[no-redef]

log = logging.getLogger("proc_kubelet")

MARKER_ENV = "AGENTRUN_PROCKUBELET_POD_UID"
DIR_ENV = "AGENTRUN_PROCKUBELET_DIR"
POD_IP = "127.0.0.1"
REQ_TIMEOUT = 10
WORKERS = 4  # reconcile threads (pods are reconciled one event at a time each, in parallel across pods)


def now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ConfigError(Exception):
    """A container's env can't be resolved yet (kubelet: CreateContainerConfigError)."""


# --------------------------------------------------------------------- env

_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined vars are replaced, $$ -> $, unknown kept."""

    def rep(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_RE.sub(rep, s)


def _field_path(pod: dict, path: str, node: str) -> str:
    md = pod.get("metadata") or {}
    simple = {
        "metadata.name": md.get("name", ""),
        "metadata.namespace": md.get("namespace", ""),
        "metadata.uid": md.get("uid", ""),
        "spec.nodeName": node,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "") or "",
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIP": POD_IP,
        "status.hostIPs": POD_IP,
    }
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    if path == "metadata.labels":
        return "\n".join(f'{k}="{v}"' for k, v in sorted((md.get("labels") or {}).items()))
    if path == "metadata.annotations":
        return "\n".join(f'{k}="{v}"' for k, v in sorted((md.get("annotations") or {}).items()))
    raise ConfigError(f"unsupported fieldRef {path!r}")


# --------------------------------------------------------------------- state


@dataclass
class ContainerRun:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    pid_path: str
    fallback_logs: bool
    proc: subprocess.Popen | None = None
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    restart_count: int = 0
    waiting_reason: str = ""


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    pod: dict
    dir: str
    containers: list[ContainerRun] = field(default_factory=list)
    start_time: str = ""
    stopping: bool = False  # deletion / deadline / kubelet shutdown in progress
    stop_reason: str = ""
    stop_message: str = ""
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_has_marker(pid: int, uid: str | None = None) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    prefix = (MARKER_ENV + "=").encode()
    for e in env:
        if e.startswith(prefix):
            return uid is None or e[len(prefix):].decode() == uid
    return False


def kill_orphans(base_dir: str, grace: float = 3.0) -> list[int]:
    """Kill process groups left behind by a previous process kubelet in base_dir.

    Finds ``pods/*/*.pid`` files and kills those whose process still carries
    the pod-uid env marker. Returns the pids it signalled.
    """
    pods_dir = os.path.join(base_dir, "pods")
    victims: list[int] = []
    if not os.path.isdir(pods_dir):
        return victims
    for d in os.listdir(pods_dir):
        uid = d.rsplit("_", 1)[-1]
        pdir = os.path.join(pods_dir, d)
        if not os.path.isdir(pdir):
            continue
        for fn in os.listdir(pdir):
            if not fn.endswith(".pid"):
                continue
            try:
                pid = int(open(os.path.join(pdir, fn)).read().strip())
            except (OSError, ValueError):
                continue
            if pid_has_marker(pid, uid):
                victims.append(pid)
                kill_group(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while victims and time.time() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and pid_has_marker(p) for p in victims):
            break
        time.sleep(0.1)
    for p in victims:
        if pid_has_marker(p):
            kill_group(p, signal.SIGKILL)
    runc_node.cleanup_all(base_dir)  # runc containers (own sessions) and their root mounts
    return victims


# --------------------------------------------------------------------- kubelet


class ProcKubelet:
    def __init__(self, kubeconfig: str, base_dir: str, node_name: str = "agentrun-local",
                 heartbeat: float = 10.0, resync: float = 5.0):
        self.base_dir = os.path.abspath(base_dir)
        self.pods_dir = os.path.join(self.base_dir, "pods")
        os.makedirs(self.pods_dir, exist_ok=True)
        self.node = node_name
        self.heartbeat_period = heartbeat
        self.resync_period = resync
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.server = self.api_client.configuration.host
        self.ca_file = self.api_client.configuration.ssl_ca_cert
        self.v1 = client.CoreV1Api(self.api_client)
        self.coord = client.CoordinationV1Api(self.api_client)
        self.runs: dict[str, PodRun] = {}  # uid -> PodRun
        self.finished: set[str] = set()  # uids we ran to completion
        self.lock = threading.RLock()
        self.queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self.stop_event = threading.Event()
        self.started = time.time()
        self.watch_timeout = 120  # seconds of one pod watch request (then a new one from the last resourceVersion)
        self.busy: set[tuple[str, str]] = set()  # (ns, name) a worker is reconciling
        self.parked: dict[tuple[str, str], tuple] = {}  # the newest event for a busy pod
        self.unsynced: dict[str, tuple[int, dict, dict]] = {}  # uid -> (seq, pod, status) not yet patched
        self._status_seq = 0
        # AGENTRUN_NODE=runc: pods whose images are in the local image store run under runc (e2e/runc_node.py)
        self.runc = runc_node.RuncNode(self, sys.modules[__name__]) if runc_node.RuncNode.enabled() else None
        if self.runc is not None:
            self.runc.check()

    # ---------------------------------------------------------------- node
    def register_node(self) -> None:
        cpu = str(os.cpu_count() or 1)
        try:
            mem_kb = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1])
        except Exception:  # noqa: BLE001
            mem_kb = 8 * 1024 * 1024
        cap = {"cpu": cpu, "memory": f"{mem_kb}Ki", "pods": "250", "ephemeral-storage": "100Gi"}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "agentrun.dev/process-kubelet": "true",
                },
            },
        }
        try:
            self.v1.create_node(body, _request_timeout=REQ_TIMEOUT)
            log.info("registered node %s", self.node)
        except ApiException as e:
            if e.status != 409:
                raise
        self.node_status = {
            "capacity": cap,
            "allocatable": cap,
            # no Hostname address: the apiserver would try to resolve it to reach the logs endpoint
            "addresses": [{"type": "InternalIP", "address": POD_IP}],
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "proc-kubelet",
                "kubeProxyVersion": "", "containerRuntimeVersion": "proc://0", "osImage": "host",
                "kernelVersion": os.uname().release, "machineID": "", "systemUUID": "", "bootID": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs_port}},
        }
        self.heartbeat()

    def heartbeat(self) -> None:
        t = now()
        conds = [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "process kubelet is posting ready status",
             "lastHeartbeatTime": t, "lastTransitionTime": getattr(self, "_ready_since", t)},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "",
             "lastHeartbeatTime": t, "lastTransitionTime": getattr(self, "_ready_since", t)},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "",
             "lastHeartbeatTime": t, "lastTransitionTime": getattr(self, "_ready_since", t)},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "message": "",
             "lastHeartbeatTime": t, "lastTransitionTime": getattr(self, "_ready_since", t)},
        ]
        self._ready_since = getattr(self, "_ready_since", t)
        status = dict(self.node_status, conditions=conds)
        self.v1.patch_node_status(self.node, {"status": status}, _request_timeout=REQ_TIMEOUT)
        self.renew_lease()

    def renew_lease(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": now_micro()},
        }
        try:
            self.coord.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": body["spec"]},
                                              _request_timeout=REQ_TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                self.coord.create_namespaced_lease("kube-node-lease", body, _request_timeout=REQ_TIMEOUT)
            else:
                raise

    def heartbeat_loop(self) -> None:
        while not self.stop_event.wait(self.heartbeat_period):
            try:
                self.heartbeat()
            except Exception as e:  # noqa: BLE001
                log.warning("node heartbeat failed: %s", e)

    # ---------------------------------------------------------------- watch
    def watch_loop(self) -> None:
        backoff = 0.5
        rv = None
        while not self.stop_event.is_set():
            try:
                if rv is None:
                    lst = self.v1.list_pod_for_all_namespaces(_request_timeout=REQ_TIMEOUT)
                    rv = lst.metadata.resource_version
                    for p in lst.items:
                        self.enqueue(p)
                w = watch.Watch()
                for ev in w.stream(self.v1.list_pod_for_all_namespaces, resource_version=rv,
                                   timeout_seconds=self.watch_timeout, allow_watch_bookmarks=True,
                                   _request_timeout=self.watch_timeout + 30):
                    if self.stop_event.is_set():
                        w.stop()
                        return
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    if ev["type"] == "BOOKMARK":
                        # the kubernetes client leaves a bookmark's object a dict (it may be
                        # incomplete): reading .metadata failed, so every watch ended in an error,
                        # a full relist and a back-off growing to 10 s with pod events waiting
                        rv = ((obj or {}).get("metadata") or {}).get("resourceVersion") or rv
                        continue
                    rv = obj.metadata.resource_version
                    self.enqueue(obj, deleted=ev["type"] == "DELETED")
                backoff = 0.5
            except ApiException as e:
                if e.status == 410:
                    rv = None
                    continue
                log.warning("pod watch failed (%s), reconnecting in %.1fs", e.status, backoff)
                rv = None
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 10)
            except Exception as e:  # noqa: BLE001
                log.warning("pod watch failed (%s), reconnecting in %.1fs", e, backoff)
                rv = None
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 10)

    def resync_loop(self) -> None:
        while not self.stop_event.wait(self.resync_period):
            self.retry_unsynced()
            try:
                lst = self.v1.list_pod_for_all_namespaces(_request_timeout=REQ_TIMEOUT)
                for p in lst.items:
                    self.enqueue(p)
            except Exception as e:  # noqa: BLE001
                log.warning("resync list failed: %s", e)

    def enqueue(self, pod_obj: Any, deleted: bool = False) -> None:
        d = self.api_client.sanitize_for_serialization(pod_obj)
        self.queue.put((d["metadata"]["namespace"], d["metadata"]["name"], d, deleted))

    def worker_loop(self) -> None:
        """One of WORKERS reconcile threads. A pod is reconciled by one worker at a time: an event for
        a pod another worker is busy with is parked (the newest one wins) and handled by that worker
        right after, so events of one pod stay in order while different pods start in parallel
        (each start costs a few API calls: with one worker, 100 pods created at once waited ~20 s
        for the last one to start)."""
        while True:
            item = self.queue.get()
            if item is None:
                self.queue.put(None)  # wake the next worker: all stop
                return
            key = (item[0], item[1])
            with self.lock:
                if key in self.busy:
                    self.parked[key] = item
                    continue
                self.busy.add(key)
            while item is not None:
                self.handle(item)
                with self.lock:
                    item = self.parked.pop(key, None)
                    if item is None:
                        self.busy.discard(key)

    def handle(self, item: tuple) -> None:
        ns, name, obj, deleted = item
        try:
            if deleted:
                self.forget(obj)
            else:
                self.reconcile(ns, name, obj)
        except Exception:  # noqa: BLE001
            log.exception("reconcile %s/%s failed", ns, name)

    # ---------------------------------------------------------------- reconcile
    def get_pod(self, ns: str, name: str) -> dict | None:
        try:
            resp = self.v1.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=REQ_TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        import json
        return json.loads(resp.data)

    def forget(self, pod: dict) -> None:
        """The pod object is gone (e.g. force-deleted): make sure its processes are too."""
        with self.lock:
            run = self.runs.get(pod["metadata"]["uid"])
        if run is not None and not run.stopping:
            log.info("pod %s/%s deleted from the API while running: killing it", run.namespace, run.name)
            self.stop_pod(run, 2.0, reason="Deleted", message="pod object deleted")

    def reconcile(self, ns: str, name: str, pod: dict | None = None) -> None:
        if pod is None:
            pod = self.get_pod(ns, name)
        if pod is None:
            return
        md, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        uid = md["uid"]
        node = spec.get("nodeName") or ""
        deleting = bool(md.get("deletionTimestamp"))
        phase = status.get("phase") or "Pending"

        if not node:
            if deleting or phase in ("Succeeded", "Failed"):
                return
            self.bind(pod)
            return
        if node != self.node:
            return

        with self.lock:
            run = self.runs.get(uid)
        if deleting:
            if run is not None:
                if not run.stopping:
                    grace = md.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = spec.get("terminationGracePeriodSeconds", 30)
                    self.stop_pod(run, float(grace), reason="", message="")
                return  # the pod's thread deletes it once processes are gone
            if phase not in ("Succeeded", "Failed"):
                self.patch_status(pod, {"phase": "Failed", "reason": "Terminated",
                                        "message": "pod deleted before it ran"}, quiet=True)
            self.delete_pod(pod)
            return
        if run is not None or uid in self.finished:
            return
        if phase in ("Succeeded", "Failed"):
            return
        if phase == "Running" or status.get("startTime"):
            # Running (or started) before we came up: its processes are gone.
            self.patch_status(pod, self.terminal_status(pod, "Failed", "KubeletRestarted",
                                                        "the process kubelet restarted; the pod's processes are gone"))
            self.finished.add(uid)
            return
        self.start_pod(pod)

    def bind(self, pod: dict) -> None:
        md = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": md["name"], "namespace": md["namespace"], "uid": md["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        try:
            self.v1.create_namespaced_pod_binding(md["name"], md["namespace"], body,
                                                  _preload_content=False, _request_timeout=REQ_TIMEOUT)
            log.info("bound %s/%s to %s", md["namespace"], md["name"], self.node)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        self.queue.put((md["namespace"], md["name"], None, False))

    def delete_pod(self, pod: dict) -> None:
        md = pod["metadata"]
        try:
            self.v1.delete_namespaced_pod(md["name"], md["namespace"], grace_period_seconds=0,
                                          body={"preconditions": {"uid": md["uid"]}, "gracePeriodSeconds": 0},
                                          _request_timeout=REQ_TIMEOUT)
            log.info("deleted %s/%s", md["namespace"], md["name"])
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def patch_status(self, pod: dict, status: dict, quiet: bool = False) -> bool:
        """Patch the pod's status. A patch that fails for any reason but 404 (e.g. the apiserver is
        restarting) is kept and retried by the resync loop until it lands or a newer status of the
        pod does, like the kubelet's status manager: a pod that ended while the apiserver was down
        must not stay Running in the API forever."""
        md = pod["metadata"]
        uid = md["uid"]
        with self.lock:
            self._status_seq += 1
            seq = self._status_seq
        try:
            self.v1.patch_namespaced_pod_status(md["name"], md["namespace"], {"status": status},
                                                _request_timeout=REQ_TIMEOUT)
            self._status_synced(uid, seq)
            return True
        except ApiException as e:
            if e.status == 404:
                self._status_synced(uid, seq)
                return False
            if not quiet:
                log.warning("patch status %s/%s: %s %s (will retry)", md["namespace"], md["name"], e.status, e.reason)
        except Exception as e:  # noqa: BLE001
            if not quiet:
                log.warning("patch status %s/%s: %s (will retry)", md["namespace"], md["name"], e)
        with self.lock:
            old = self.unsynced.get(uid)
            if old is None or old[0] < seq:
                self.unsynced[uid] = (seq, pod, status)
        return False

    def _status_synced(self, uid: str, seq: int) -> None:
        with self.lock:
            old = self.unsynced.get(uid)
            if old is not None and old[0] <= seq:
                del self.unsynced[uid]

    def retry_unsynced(self) -> None:
        """Re-send the latest status of every pod whose status patch failed."""
        with self.lock:
            pending = list(self.unsynced.values())
        for seq, pod, status in pending:
            md = pod["metadata"]
            try:
                self.v1.patch_namespaced_pod_status(md["name"], md["namespace"], {"status": status},
                                                    _request_timeout=REQ_TIMEOUT)
                log.info("status of %s/%s synced after an earlier failure (phase %s)", md["namespace"],
                         md["name"], status.get("phase"))
            except ApiException as e:
                if e.status != 404:
                    continue
            except Exception:  # noqa: BLE001
                continue
            self._status_synced(md["uid"], seq)

    # ---------------------------------------------------------------- env
    def resolve_env(self, pod: dict, c: dict) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                ref = src["configMapRef"]
                data = self._configmap(ns, ref["name"], ref.get("optional", False))
                for k, v in (data or {}).items():
                    env[prefix + k] = v
            elif "secretRef" in src:
                ref = src["secretRef"]
                data = self._secret(ns, ref["name"], ref.get("optional", False))
                for k, v in (data or {}).items():
                    env[prefix + k] = v
        for e in c.get("env") or []:
            name = e["name"]
            if "valueFrom" not in e or e.get("valueFrom") is None:
                env[name] = expand(e.get("value") or "", env)
                continue
            vf = e["valueFrom"]
            if vf.get("secretKeyRef"):
                ref = vf["secretKeyRef"]
                data = self._secret(ns, ref["name"], ref.get("optional", False))
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}")
                env[name] = data[ref["key"]]
            elif vf.get("configMapKeyRef"):
                ref = vf["configMapKeyRef"]
                data = self._configmap(ns, ref["name"], ref.get("optional", False))
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"couldn't find key {ref['key']} in ConfigMap {ns}/{ref['name']}")
                env[name] = data[ref["key"]]
            elif vf.get("fieldRef"):
                env[name] = _field_path(pod, vf["fieldRef"]["fieldPath"], self.node)
            elif vf.get("resourceFieldRef"):
                ref = vf["resourceFieldRef"]
                kind, _, res = ref["resource"].partition(".")
                val = ((c.get("resources") or {}).get(kind) or {}).get(res)
                if val is None:
                    val = self.node_status["allocatable"].get(res, "0") if res in ("cpu", "memory") else "0"
                env[name] = str(val)
        return env

    def _secret(self, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        try:
            s = self.v1.read_namespaced_secret(name, ns, _request_timeout=REQ_TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise ConfigError(f'secret "{name}" not found') from None
            raise
        return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (s.data or {}).items()}

    def _configmap(self, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        try:
            cm = self.v1.read_namespaced_config_map(name, ns, _request_timeout=REQ_TIMEOUT)
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise ConfigError(f'configmap "{name}" not found') from None
            raise
        data = dict(cm.data or {})
        for k, v in (cm.binary_data or {}).items():
            data[k] = base64.b64decode(v).decode("utf-8", "replace")
        return data

    def service_account_env(self, pod: dict, pdir: str) -> dict[str, str]:
        spec = pod.get("spec") or {}
        if spec.get("automountServiceAccountToken") is False:
            return {}
        sa = spec.get("serviceAccountName") or "default"
        md = pod["metadata"]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 86400,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}}}
        try:
            resp = self.v1.create_namespaced_service_account_token(sa, md["namespace"], body,
                                                                    _request_timeout=REQ_TIMEOUT)
        except ApiException as e:
            raise ConfigError(f"token request for serviceaccount {md['namespace']}/{sa}: {e.status} {e.reason}") from None
        token = resp.status.token
        sadir = os.path.join(pdir, "serviceaccount")
        os.makedirs(sadir, exist_ok=True)
        with open(os.path.join(sadir, "token"), "w") as f:
            f.write(token)
        with open(os.path.join(sadir, "namespace"), "w") as f:
            f.write(md["namespace"])
        ca = open(self.ca_file).read() if self.ca_file else ""
        with open(os.path.join(sadir, "ca.crt"), "w") as f:
            f.write(ca)
        kc = os.path.join(sadir, "kubeconfig")
        with open(kc, "w") as f:
            f.write(make_kubeconfig(self.server, ca, f"system:serviceaccount:{md['namespace']}:{sa}", token,
                                    md["namespace"]))
        return {"KUBECONFIG": kc}

    # ---------------------------------------------------------------- run
    def start_pod(self, pod: dict) -> None:
        md, spec = pod["metadata"], pod.get("spec") or {}
        uid = md["uid"]
        pdir = os.path.join(self.pods_dir, f"{md['namespace']}_{md['name']}_{uid}")
        os.makedirs(pdir, exist_ok=True)
        base_env = dict(os.environ)
        base_env.pop("KUBECONFIG", None)  # never leak the admin kubeconfig into pods
        base_env[MARKER_ENV] = uid
        base_env[DIR_ENV] = self.base_dir
        try:
            images = self.runc.images(pod) if self.runc is not None else None  # runc: the pod's local images
            sa_env = self.service_account_env(pod, pdir) if not images else {}
            runs: list[ContainerRun] = []
            for kind in ("initContainers", "containers"):
                for c in spec.get(kind) or []:
                    cenv = self.resolve_env(pod, c)
                    env = dict(base_env)
                    env.update(sa_env)
                    env.update(cenv)
                    argv = [expand(a, cenv) for a in (c.get("command") or [])] + \
                           [expand(a, cenv) for a in (c.get("args") or [])]
                    wd = c.get("workingDir")
                    cwd = wd if wd and os.path.isdir(wd) else pdir
                    cr = ContainerRun(
                        name=c["name"], argv=argv, env=env, cwd=cwd,
                        log_path=os.path.join(pdir, f"{c['name']}.log"),
                        pid_path=os.path.join(pdir, f"{c['name']}.pid"),
                        fallback_logs=c.get("terminationMessagePolicy") == "FallbackToLogsOnError",
                    )
                    cr.init = kind == "initContainers"  # type: ignore[attr-defined]
                    cr.kube_env = cenv  # type: ignore[attr-defined]
                    runs.append(cr)
            if images:
                not_enforced = self.runc.adopt(pod, pdir, images, runs, {MARKER_ENV: uid, DIR_ENV: self.base_dir})
                log.info("pod %s/%s runs under runc; not enforced: %s", md["namespace"], md["name"], "; ".join(not_enforced))
                self.runc.event(pod, "Warning", "NotEnforced", "runc node: not enforced: " + "; ".join(not_enforced))
        except runc_node.Refused as e:
            log.info("pod %s/%s refused by the runc node: %s", md["namespace"], md["name"], e.message)
            self.patch_status(pod, self.terminal_status(pod, "Failed", e.reason, e.message))
            self.runc.event(pod, "Warning", e.reason, e.message)
            self.finished.add(uid)
            return
        except ConfigError as e:
            statuses = [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                         "imageID": "", "started": False,
                         "state": {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}}
                        for c in spec.get("containers") or []]
            self.patch_status(pod, {"phase": "Pending", "hostIP": POD_IP, "containerStatuses": statuses,
                                    "conditions": [{"type": "PodScheduled", "status": "True"}]})
            log.info("pod %s/%s: %s (will retry)", md["namespace"], md["name"], e)
            return
        run = PodRun(uid=uid, namespace=md["namespace"], name=md["name"], pod=pod, dir=pdir, containers=runs,
                     start_time=now())
        with self.lock:
            self.runs[uid] = run
        threading.Thread(target=self.pod_thread, args=(run,), name=f"pod-{md['name']}", daemon=True).start()

    def spawn(self, run: PodRun, c: ContainerRun) -> None:
        c.exit_code = None
        c.reason = c.message = ""
        c.started_at = now()
        if not c.argv:
            c.exit_code, c.reason = 128, "StartError"
            c.message = "process kubelet: container has no command/args (images are not run)"
            c.finished_at = now()
            return
        logf = open(c.log_path, "ab")
        try:
            c.proc = subprocess.Popen(c.argv, env=c.env, cwd=c.cwd, stdin=subprocess.DEVNULL, stdout=logf,
                                      stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        except OSError as e:
            c.proc = None
            c.exit_code, c.reason, c.message = 128, "StartError", f"failed to start {c.argv[0]!r}: {e}"
            c.finished_at = now()
            logf.write(f"process kubelet: {c.message}\n".encode())
            return
        finally:
            logf.close()
        with open(c.pid_path, "w") as f:
            f.write(str(c.proc.pid))
        log.info("pod %s/%s container %s: started pid %d: %s", run.namespace, run.name, c.name,
                 c.proc.pid, c.argv)

    def pod_thread(self, run: PodRun) -> None:
        try:
            self._pod_thread(run)
        except Exception:  # noqa: BLE001
            log.exception("pod %s/%s thread crashed", run.namespace, run.name)
            self.kill_all(run, 1)
        finally:
            run.done = True
            with self.lock:
                self.runs.pop(run.uid, None)
                self.finished.add(run.uid)
            if run.stopping and run.stop_reason == "":
                # deletion: processes are gone, let the object go away
                self.delete_pod(run.pod)

    def _pod_thread(self, run: PodRun) -> None:
        spec = run.pod.get("spec") or {}
        policy = spec.get("restartPolicy") or "Always"
        deadline = spec.get("activeDeadlineSeconds")
        t0 = time.time()
        deadline_at = t0 + float(deadline) if deadline else None
        inits = [c for c in run.containers if getattr(c, "init", False)]
        mains = [c for c in run.containers if not getattr(c, "init", False)]

        # init containers, one after another
        for c in inits:
            while True:
                self.spawn(run, c)
                self.publish(run, "Pending", inits, mains)
                if not self.wait_containers(run, [c], deadline_at):
                    return self.finish_stopped(run, inits, mains)
                if c.exit_code == 0:
                    break
                if policy == "Never":
                    self.publish(run, "Failed", inits, mains)
                    return
                c.restart_count += 1
                time.sleep(min(10, 2 ** min(c.restart_count, 4) / 2))

        for c in mains:
            self.spawn(run, c)
        self.publish(run, "Running", inits, mains)
        backoff: dict[str, float] = {}
        while True:
            if not self.wait_containers(run, [c for c in mains if c.exit_code is None], deadline_at, any_exit=True):
                return self.finish_stopped(run, inits, mains)
            restarted = False
            for c in mains:
                if c.exit_code is None or getattr(c, "final", False):
                    continue
                if policy == "Always" or (policy == "OnFailure" and c.exit_code != 0):
                    c.restart_count += 1
                    delay = backoff.get(c.name, 1.0)
                    backoff[c.name] = min(delay * 2, 10.0)
                    self.publish(run, "Running", inits, mains)
                    if run.wake.wait(delay) or run.stopping:
                        return self.finish_stopped(run, inits, mains)
                    self.spawn(run, c)
                    restarted = True
                else:
                    c.final = True  # type: ignore[attr-defined]
            if all(getattr(c, "final", False) for c in mains):
                phase = "Succeeded" if all(c.exit_code == 0 for c in mains) else "Failed"
                self.publish(run, phase, inits, mains)
                return
            self.publish(run, "Running", inits, mains)
            if not restarted:
                continue

    def wait_containers(self, run: PodRun, cs: list[ContainerRun], deadline_at: float | None,
                        any_exit: bool = False) -> bool:
        """Wait until all (or any, with any_exit) of cs exited. False if the pod is being stopped."""
        while True:
            exited = []
            for c in cs:
                if c.exit_code is not None:
                    exited.append(c)
                    continue
                if c.proc is not None and c.proc.poll() is not None:
                    self.record_exit(c)
                    exited.append(c)
            if cs and ((any_exit and exited) or len(exited) == len(cs)):
                return True
            if not cs:
                return True
            if run.stopping:
                return False
            if deadline_at is not None and time.time() >= deadline_at:
                self.stop_pod(run, float((run.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)),
                              reason="DeadlineExceeded",
                              message="Pod was active on the node longer than the specified deadline")
                return False
            run.wake.wait(0.2)

    def record_exit(self, c: ContainerRun) -> None:
        if getattr(c, "bundle", None):  # runc: no container or mount left, also after a SIGKILL
            self.runc.cleanup(c.bundle)
        rc = c.proc.returncode
        c.exit_code = rc if rc >= 0 else 128 - rc  # killed by signal N -> 128+N
        c.finished_at = now()
        c.reason = "Completed" if c.exit_code == 0 else "Error"
        if c.exit_code != 0 and c.fallback_logs:
            c.message = tail_file(c.log_path, lines=80, max_bytes=4096)

    def stop_pod(self, run: PodRun, grace: float, reason: str, message: str) -> None:
        """Kill the pod's processes in the background (SIGTERM, SIGKILL after grace)."""
        with run.lock:
            if run.stopping:
                return
            run.stopping = True
            run.stop_reason, run.stop_message = reason, message
        run.wake.set()
        threading.Thread(target=self.kill_all, args=(run, grace), daemon=True).start()

    def kill_all(self, run: PodRun, grace: float) -> None:
        procs = [c.proc for c in run.containers if c.proc is not None and c.proc.poll() is None]
        for p in procs:
            kill_group(p.pid, signal.SIGTERM)
        end = time.time() + max(grace, 0)
        while time.time() < end and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for p in procs:
            kill_group(p.pid, signal.SIGKILL)  # also any children left in the group
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("pid %d did not die", p.pid)

    def finish_stopped(self, run: PodRun, inits: list[ContainerRun], mains: list[ContainerRun]) -> None:
        # wait for the killer thread to finish
        for c in run.containers:
            if c.proc is not None:
                try:
                    c.proc.wait(timeout=max(60, float((run.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)) + 10))
                except subprocess.TimeoutExpired:
                    kill_group(c.proc.pid, signal.SIGKILL)
                    c.proc.wait()
                if c.exit_code is None:
                    self.record_exit(c)
        self.publish(run, "Failed" if run.stop_reason or any((c.exit_code or 0) != 0 for c in mains) else "Succeeded",
                     inits, mains, reason=run.stop_reason, message=run.stop_message)

    def cstatus(self, c: ContainerRun, spec_c: dict) -> dict:
        st: dict[str, Any] = {"name": c.name, "image": spec_c.get("image", ""), "imageID": "",
                              "restartCount": c.restart_count}
        cid = f"proc://{c.proc.pid}" if c.proc is not None else ""
        if cid:
            st["containerID"] = cid
        if c.exit_code is None and c.proc is not None:
            st.update(ready=True, started=True, state={"running": {"startedAt": c.started_at}})
        elif c.exit_code is not None:
            term = {"exitCode": c.exit_code, "reason": c.reason, "startedAt": c.started_at or now(),
                    "finishedAt": c.finished_at or now()}
            if c.message:
                term["message"] = c.message
            if cid:
                term["containerID"] = cid
            st.update(ready=False, started=False, state={"terminated": term})
        else:
            st.update(ready=False, started=False, state={"waiting": {"reason": "PodInitializing"}})
        return st

    def publish(self, run: PodRun, phase: str, inits: list[ContainerRun], mains: list[ContainerRun],
                reason: str = "", message: str = "") -> None:
        spec = run.pod.get("spec") or {}
        by_name = {c["name"]: c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
        t = now()
        ready = phase == "Running" and all(c.exit_code is None for c in mains)
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}],
            "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
            "startTime": run.start_time,
            # status.qosClass is immutable (set by the apiserver from the resources): keep it
            "qosClass": (run.pod.get("status") or {}).get("qosClass") or "BestEffort",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": run.start_time},
                {"type": "Initialized", "status": "True" if phase != "Pending" else "False", "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "True" if ready else "False", "lastTransitionTime": t},
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": t},
            ],
            "containerStatuses": [self.cstatus(c, by_name.get(c.name, {})) for c in mains],
        }
        if inits:
            status["initContainerStatuses"] = [self.cstatus(c, by_name.get(c.name, {})) for c in inits]
        if reason:
            status["reason"] = reason
        if message:
            status["message"] = message
        self.patch_status(run.pod, status)
        if phase in ("Succeeded", "Failed"):
            log.info("pod %s/%s %s%s", run.namespace, run.name, phase, f" ({reason})" if reason else "")

    def terminal_status(self, pod: dict, phase: str, reason: str, message: str) -> dict:
        spec = pod.get("spec") or {}
        t = now()
        old = {c.get("name"): c for c in ((pod.get("status") or {}).get("containerStatuses") or [])}
        cs = []
        for c in spec.get("containers") or []:
            prev = old.get(c["name"], {})
            started = ((prev.get("state") or {}).get("running") or {}).get("startedAt") or t
            cs.append({"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                       "started": False, "restartCount": prev.get("restartCount", 0),
                       "state": {"terminated": {"exitCode": 137, "reason": "Error", "message": message,
                                                "startedAt": started, "finishedAt": t}}})
        return {"phase": phase, "reason": reason, "message": message, "containerStatuses": cs,
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": t},
                               {"type": "ContainersReady", "status": "False", "lastTransitionTime": t}]}

    # ---------------------------------------------------------------- lifecycle
    # ---------------------------------------------------------------- logs endpoint
    def start_logs_server(self) -> None:
        """Serve GET /containerLogs/<ns>/<pod>/<container> over HTTPS on 127.0.0.1 so that
        `kubectl logs` / read_namespaced_pod_log work through the apiserver (which connects to
        the node's InternalIP and kubeletEndpoint port, not verifying the cert and presenting no
        client cert in this setup: the endpoint does not authenticate; loopback only)."""
        import http.server
        import ssl
        import urllib.parse

        self.logs_port = 0
        crt, key = os.path.join(self.base_dir, "pki", "apiserver.crt"), os.path.join(self.base_dir, "pki", "apiserver.key")
        if not (os.path.exists(crt) and os.path.exists(key)):
            log.info("no %s: pod logs endpoint disabled", crt)
            return
        kubelet = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:  # noqa: D102
                log.debug("logs endpoint: " + fmt, *args)

            def do_GET(self) -> None:  # noqa: N802
                u = urllib.parse.urlsplit(self.path)
                parts = u.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                _, ns, name, container = parts
                q = urllib.parse.parse_qs(u.query)
                path = kubelet.log_path(ns, name, container)
                if path is None:
                    self.send_error(404, f"no logs for {ns}/{name}/{container}")
                    return
                data = open(path, "rb").read()
                if "tailLines" in q:
                    n = int(q["tailLines"][0])
                    lines = data.splitlines(keepends=True)
                    data = b"".join(lines[-n:]) if n > 0 else b""
                if "limitBytes" in q:
                    data = data[: int(q["limitBytes"][0])]
                follow = q.get("follow", ["false"])[0] == "true"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                if not follow:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                pos = os.path.getsize(path)
                try:
                    self._chunk(data)
                    while True:
                        with open(path, "rb") as f:
                            f.seek(pos)
                            more = f.read()
                        pos += len(more)
                        if more:
                            self._chunk(more)
                        elif not kubelet.is_running(ns, name):
                            break
                        else:
                            time.sleep(0.2)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, b: bytes) -> None:
                if b:
                    self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                    self.wfile.flush()

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        self.logs_port = srv.server_address[1]
        threading.Thread(target=srv.serve_forever, name="logs-server", daemon=True).start()
        log.info("pod logs endpoint on https://127.0.0.1:%d", self.logs_port)

    def log_path(self, ns: str, name: str, container: str) -> str | None:
        prefix = f"{ns}_{name}_"
        best = None
        for d in os.listdir(self.pods_dir):
            if d.startswith(prefix) and "_" not in d[len(prefix):]:
                p = os.path.join(self.pods_dir, d, f"{container}.log")
                if os.path.exists(p) and (best is None or os.path.getmtime(p) > os.path.getmtime(best)):
                    best = p
        return best

    def is_running(self, ns: str, name: str) -> bool:
        with self.lock:
            return any(r.namespace == ns and r.name == name and not r.done for r in self.runs.values())

    def run_forever(self) -> None:
        try:
            self.start_logs_server()
        except Exception as e:  # noqa: BLE001
            log.warning("pod logs endpoint disabled: %s", e)
            self.logs_port = 0
        killed = kill_orphans(self.base_dir)
        if killed:
            log.info("killed %d leftover process group(s) from a previous run", len(killed))
        backoff = 0.5
        while True:
            try:
                self.register_node()
                break
            except Exception as e:  # noqa: BLE001
                if self.stop_event.is_set():
                    return
                log.warning("node registration failed: %s; retrying in %.1fs", e, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 5)
        threads = [threading.Thread(target=f, name=f.__name__, daemon=True)
                   for f in (self.heartbeat_loop, self.watch_loop, self.resync_loop)]
        threads += [threading.Thread(target=self.worker_loop, name=f"worker_loop-{i}", daemon=True)
                    for i in range(WORKERS)]
        for t in threads:
            t.start()
        log.info("process kubelet for node %s running (pods dir %s)", self.node, self.pods_dir)
        with open(os.path.join(self.base_dir, "kubelet.ready"), "w") as f:
            f.write(now() + "\n")
        while not self.stop_event.wait(1.0):
            pass

    def shutdown(self) -> None:
        """Stop: kill every pod process (SIGTERM, then SIGKILL after 5s), mark pods Failed."""
        self.stop_event.set()
        self.queue.put(None)
        with self.lock:
            runs = list(self.runs.values())
        for r in runs:
            self.stop_pod(r, 5.0, reason="KubeletStopped", message="the process kubelet was stopped")
        deadline = time.time() + 15
        while time.time() < deadline and any(not r.done for r in runs):
            time.sleep(0.1)
        for r in runs:
            for c in r.containers:
                if c.proc is not None and c.proc.poll() is None:
                    kill_group(c.proc.pid, signal.SIGKILL)
        try:
            os.unlink(os.path.join(self.base_dir, "kubelet.ready"))
        except OSError:
            pass


def tail_file(path: str, lines: int = 80, max_bytes: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def make_kubeconfig(server: str, ca_pem: str, user: str, token: str, namespace: str = "default") -> str:
    ca_b64 = base64.b64encode(ca_pem.encode()).decode()
    return f"""apiVersion: v1
kind: Config
clusters:
- name: localkube
  cluster:
    server: {server}
    certificate-authority-data: {ca_b64}
users:
- name: "{user}"
  user:
    token: {token}
contexts:
- name: localkube
  context:
    cluster: localkube
    user: "{user}"
    namespace: {namespace}
current-context: localkube
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    ap.add_argument("--dir", required=True, help="base dir; pod logs go to DIR/pods/")
    ap.add_argument("--node-name", default="agentrun-local")
    ap.add_argument("--heartbeat", type=float, default=10.0)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if not a.kubeconfig:
        ap.error("--kubeconfig (or $KUBECONFIG) is required")
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(threadName)s %(message)s", stream=sys.stderr)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    kl = ProcKubelet(a.kubeconfig, a.dir, a.node_name, heartbeat=a.heartbeat)

    def on_signal(signum, _frame):
        log.info("got signal %d, stopping pods and exiting", signum)
        kl.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(os.path.join(kl.base_dir, "kubelet.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    kl.run_forever()
    kl.shutdown()
    log.info("process kubelet stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
