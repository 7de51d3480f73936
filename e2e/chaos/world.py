"""The chaos suite's world: its own restartable control plane, S3 server behind a cuttable proxy,
recording tool server and operator subprocess, plus the clients the checks use.

Nothing here is shared with the pytest session fixtures: a chaos run restarts the apiserver and cuts
S3, which other tests must never see.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client, config

from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.controller.decide.jobs import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID
from e2e.chaos import rawstore
from e2e.chaos.holds import HoldingRecorder, tool_server  # holds puts examples/ on sys.path for it
from e2e.chaos.invariants import JobFacts, LeaseWrite, StatusWrite, Tick
from e2e.chaos.proxy import CuttableProxy
from e2e.cluster import (
    Cluster,
    install_api,
    leftover_processes,
    operator_env,
    restart_etcd,
    start_restartable_cluster,
    start_s3,
)
from e2e.proc_kubelet import pid_has_marker

ROOT = Path(__file__).resolve().parents[2]

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
PREFIX = "chaos"
REQ_TIMEOUT = 15


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class World:
    def __init__(self, tmp: str | os.PathLike) -> None:
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cluster: Cluster | None = None
        self.s3 = None
        self.proxy: CuttableProxy | None = None
        self.tools = None
        self.operators: dict[str, subprocess.Popen] = {}  # identity -> live replica
        self.operator_log: Path | None = None
        self.operator_ns = ""
        self.operator_n = 0
        self.killed_operators: set[int] = set()
        self.kills: dict[str, float] = {}  # identity -> when it was SIGKILLed

    @property
    def operator(self) -> subprocess.Popen | None:
        return next(iter(self.operators.values()), None)

    # ------------------------------------------------------------------ start / stop
    def start(self) -> None:
        t0 = time.time()
        self.cluster = start_restartable_cluster(self.tmp / "kube")
        say(f"control plane up in {time.time() - t0:.1f}s ({self.cluster.server})")
        self.s3 = start_s3(self.tmp / "s3")
        self.proxy = CuttableProxy(int(self.s3.endpoint_url.rsplit(":", 1)[1]))
        say(f"S3 {self.s3.endpoint_url}, reached by the operator and laps through {self.proxy.url}")
        self.record = self.tmp / "tool-calls.jsonl"
        self.tools = tool_server.serve(0, str(self.record), recorder=tool_server.Recorder())
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        api = config.new_client_from_config(config_file=self.cluster.kubeconfig)
        api.configuration.retries = False
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.api_client = api
        self.s3c = boto3.client("s3", endpoint_url=self.s3.endpoint_url, region_name=self.s3.region,
                                aws_access_key_id=self.s3.access_key, aws_secret_access_key=self.s3.secret_key)
        self.store = CheckpointStore(StoreConfig(uri=f"s3://{self.s3.bucket}/{PREFIX}", endpoint_url=self.s3.endpoint_url,
                                                 region=self.s3.region, path_style=True), client=self.s3c)
        install_api(self.cluster)  # the CRDs and the admission policies: without them the operator starts no lap

    def stop(self) -> list[str]:
        """Stop everything; return problems (processes left behind)."""
        problems: list[str] = []
        self.kill_operators()
        if self.tools is not None:
            self.tools.shutdown()
        if self.proxy is not None:
            self.proxy.close()
        if self.s3 is not None:
            self.s3.stop()
        if self.cluster is not None:
            try:
                self.cluster.stop()
            except Exception as e:  # noqa: BLE001
                problems.append(f"cluster stop: {e}")
        for d in ("kube", "s3"):
            left = leftover_processes(self.tmp / d)
            if left:
                problems.append(f"processes left behind in {self.tmp / d}: {left}")
        return problems

    # ------------------------------------------------------------------ kubectl / namespaces
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        assert self.cluster is not None
        return self.cluster.kubectl_run(*args, check=check, input=input, timeout=120)

    def new_namespace(self, name: str) -> str:
        ns = name
        self.kubectl("create", "namespace", ns)
        self.kubectl("create", "serviceaccount", "agentrun-lap", "-n", ns)
        self.kubectl("create", "secret", "generic", "s3-creds", "-n", ns,
                     f"--from-literal=AWS_ACCESS_KEY_ID={self.s3.access_key}",
                     f"--from-literal=AWS_SECRET_ACCESS_KEY={self.s3.secret_key}")
        end = time.time() + 60
        while self.kubectl("get", "sa", "default", "-n", ns, check=False).returncode != 0:
            if time.time() > end:
                raise RuntimeError(f"default ServiceAccount never appeared in {ns}")
            time.sleep(0.3)
        return ns

    # ------------------------------------------------------------------ operator replicas
    def operator_env(self, ns: str, identity: str) -> dict[str, str]:
        assert self.cluster is not None
        return operator_env(
            self.cluster, self.s3, namespace=ns, prefix=PREFIX, endpoint=self.proxy.url,
            AGENTRUN_LEASE_DURATION="3", AGENTRUN_RESYNC_SECONDS="5", AGENTRUN_STORE_RETRY_SECONDS="3",
            AGENTRUN_JOB_TTL_SECONDS="-1",  # keep finished Jobs: "one Job per lap attempt" is checked
            AGENTRUN_IDENTITY=identity,
        )

    def start_operator(self, ns: str, skew: float = 0.0, *, replace: bool = True) -> str:
        """Start a replica; return its identity. ``replace``: kill the other replicas first (one
        replica scenarios). ``skew``: its Lease elector's wall clock is off by that many seconds
        (``e2e/chaos/skewed_operator.py``)."""
        if replace:
            self.kill_operators()
        self.operator_n += 1
        self.operator_ns = ns
        identity = f"chaos-op-{self.operator_n}"
        self.operator_log = self.tmp / f"operator-{ns}.log"
        cmd = [sys.executable, "-m", "agentrun.cli.main", "operator"]
        if skew:
            cmd = [sys.executable, "-m", "e2e.chaos.skewed_operator", "--offset", str(skew)]
        with open(self.operator_log, "ab") as fh:
            fh.write(f"===== chaos: starting operator {identity} (clock skew {skew}s) at {time.strftime('%H:%M:%S')}\n"
                     .encode())
            fh.flush()
            env = self.operator_env(ns, identity)
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            self.operators[identity] = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                                        start_new_session=True, cwd=ROOT)
        return identity

    def kill_operator(self, identity: str | None = None) -> bool:
        """SIGKILL one replica (default: every one); True if a live process was killed."""
        if identity is None:
            return self.kill_operators()
        p = self.operators.pop(identity, None)
        if p is not None and p.poll() is None:
            self.killed_operators.add(p.pid)
            self.kills[identity] = time.time()
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
            return True
        return False

    def kill_operators(self) -> bool:
        return any([self.kill_operator(i) for i in list(self.operators)])

    def operator_exited_by_itself(self) -> int | None:
        for identity, p in list(self.operators.items()):
            if p.poll() is not None and p.pid not in self.killed_operators:
                del self.operators[identity]
                return p.returncode
        return None

    def lease_holder(self, ns: str) -> str | None:
        lease = self.coord.read_namespaced_lease("agentrun-operator", ns, _request_timeout=REQ_TIMEOUT)
        return lease.spec.holder_identity if lease.spec else None

    # ------------------------------------------------------------------ infrastructure faults
    def restart_etcd(self, down_seconds: float) -> tuple[float, bool]:
        assert self.cluster is not None
        return restart_etcd(self.cluster, down_seconds)

    def restart_kubelet(self, ns: str, down_seconds: float) -> int:
        """SIGKILL the process kubelet (its pod processes survive it), start it again after
        down_seconds; return how many lap processes of ns were alive when it died."""
        assert self.cluster is not None
        alive = len(self.live_lap_processes(ns))
        self.cluster.stop_kubelet(signal.SIGKILL)
        time.sleep(down_seconds)
        self.cluster.start_kubelet(timeout=120)
        return alive

    # ------------------------------------------------------------------ evidence
    def tool_record(self) -> dict:
        return self.tools.recorder.record()

    def new_tool_record(self, holds: set[str] | frozenset[str] = frozenset(), *,
                        count_before_dedup: bool = False) -> None:
        """A fresh record for the next scenario (the previous scenario's runs are gone); the first
        request of each call named in ``holds`` (its ``order`` argument) is held in flight until
        released (holds.HoldingRecorder); ``count_before_dedup``: executions counted at arrival."""
        self.tools.recorder = HoldingRecorder(holds, count_before_dedup=count_before_dedup)

    def raw_laps(self, run: dict) -> list[rawstore.RawLap]:
        """The run's lap objects, raw, from the S3 server itself (not the proxy, not CheckpointStore)."""
        md = run["metadata"]
        return rawstore.list_laps(self.s3c, self.s3.bucket, f"{PREFIX}/{md['namespace']}/{md['name']}/{md['uid']}/")

    def event_reasons(self, ns: str) -> Counter:
        c: Counter = Counter()
        for e in self.core.list_namespaced_event(ns, _request_timeout=REQ_TIMEOUT).items:
            c[e.reason or ""] += e.count or 1
            if e.reason == "LapRetry" and "cannot reach the store" in (e.message or ""):
                c["LapRetry:store"] += e.count or 1  # a lap attempt that met a store outage
        return c

    # ------------------------------------------------------------------ reads
    def list_runs(self, ns: str) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                         _request_timeout=REQ_TIMEOUT)["items"]

    def list_jobs(self, ns: str) -> list[Any]:
        return self.batch.list_namespaced_job(ns, _request_timeout=REQ_TIMEOUT).items

    def list_pods(self, ns: str) -> list[Any]:
        return self.core.list_namespaced_pod(ns, _request_timeout=REQ_TIMEOUT).items

    def executed_calls(self) -> list[dict]:
        rec = self.tools.recorder
        with rec.lock:
            return list(rec.calls)

    def run_ref(self, run: dict) -> RunRef:
        md = run["metadata"]
        return RunRef(namespace=md["namespace"], name=md["name"], uid=md["uid"])

    def pod_pid(self, ns: str, pod: Any) -> int | None:
        assert self.cluster is not None
        f = self.cluster.pods_dir / f"{ns}_{pod.metadata.name}_{pod.metadata.uid}" / "lap.pid"
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_has_marker(pid, pod.metadata.uid) else None

    def live_lap_processes(self, ns: str) -> list[int]:
        """Processes of this namespace's lap pods that are still alive."""
        assert self.cluster is not None
        out = []
        for d in self.cluster.pods_dir.glob(f"{ns}_*"):
            uid = d.name.rsplit("_", 1)[-1]
            for f in d.glob("*.pid"):
                try:
                    pid = int(f.read_text().strip())
                except (OSError, ValueError):
                    continue
                if pid_has_marker(pid, uid):
                    out.append(pid)
        return out


def _md(obj: Any) -> dict:
    """metadata of a typed object or a dict (custom objects, bookmarks), as a dict with camelCase keys."""
    if isinstance(obj, dict):
        return obj.get("metadata") or {}
    m = obj.metadata
    return {"name": m.name, "uid": m.uid, "resourceVersion": m.resource_version, "labels": m.labels or {},
            "ownerReferences": [{"uid": o.uid} for o in (m.owner_references or [])]}


class Watcher:
    """Records, for one namespace, what the invariants need from the API while a scenario runs:
    every AgentRun status write (rv, lap, approval), every Job ever created (name, uid, owner,
    lap/attempt labels: finished Jobs are also kept, this covers a Job deleted and re-created),
    every write of the operator Lease (rv, holder), and a tick every ~0.5 s (a ConfigMap patch:
    time sent, time answered, rv) that ties the etcd revision order to the host clock. Watches
    resume from their last resourceVersion and relist after an error (the apiserver restarts)."""

    def __init__(self, world: World, ns: str) -> None:
        from kubernetes import client as k8s

        self.w, self.ns = world, ns
        self.status_writes: list[StatusWrite] = []
        self.jobs: dict[str, JobFacts] = {}  # by uid
        self.lease_writes: list[LeaseWrite] = []
        self.ticks: list[Tick] = []
        self.errors = Counter()
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._watch, args=(n, fn, on), name=f"watch-{n}", daemon=True)
                        for n, fn, on in (
                            ("agentruns", self._list_runs, self._on_run),
                            ("jobs", world.batch.list_namespaced_job, self._on_job),
                            ("leases", world.coord.list_namespaced_lease, self._on_lease))]
        self.threads.append(threading.Thread(target=self._tick, name="ticker", daemon=True))
        self._k8s = k8s

    def _list_runs(self, ns: str, **kw: Any) -> Any:
        return self.w.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw)

    def start(self) -> None:
        self.w.kubectl("create", "configmap", "chaos-clock", "-n", self.ns, "--from-literal=t=0", check=False)
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(70)

    def _on_run(self, obj: dict) -> None:
        st = obj.get("status") or {}
        md = obj.get("metadata") or {}
        with self._lock:
            self.status_writes.append(StatusWrite(rv=int(md.get("resourceVersion") or 0), run=md.get("name", ""),
                                                  lap=st.get("lap"), approval=st.get("approval")))

    def _on_job(self, obj: Any) -> None:
        md = _md(obj)
        labels = md.get("labels") or {}

        def num(v: Any) -> int | None:
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
        with self._lock:
            self.jobs.setdefault(md["uid"], JobFacts(
                name=md["name"], uid=md["uid"],
                owner_uids=tuple(o["uid"] for o in md.get("ownerReferences") or [])
                or tuple(v for v in [labels.get(LABEL_RUN_UID)] if v),
                lap=num(labels.get(LABEL_LAP)), attempt=num(labels.get(LABEL_ATTEMPT))))

    def _on_lease(self, obj: Any) -> None:
        md = _md(obj)
        if md.get("name") != "agentrun-operator":
            return
        with self._lock:
            self.lease_writes.append(LeaseWrite(rv=int(md.get("resourceVersion") or 0),
                                                holder=obj.spec.holder_identity if obj.spec else None,
                                                duration=float((obj.spec.lease_duration_seconds if obj.spec else 0)
                                                               or 3)))

    def _watch(self, name: str, list_fn: Any, on: Any) -> None:
        from kubernetes import watch

        rv = None
        while not self.stop_event.is_set():
            try:
                if rv is None:
                    lst = list_fn(self.ns, _request_timeout=REQ_TIMEOUT)
                    items = lst["items"] if isinstance(lst, dict) else lst.items
                    for it in items:
                        on(it)
                    rv = lst["metadata"]["resourceVersion"] if isinstance(lst, dict) else lst.metadata.resource_version
                for ev in watch.Watch().stream(list_fn, self.ns, resource_version=rv, timeout_seconds=10,
                                               allow_watch_bookmarks=True, _request_timeout=30):
                    if self.stop_event.is_set():
                        return
                    obj, typ = ev["object"], ev["type"]
                    if typ == "ERROR":
                        rv = None  # 410 Gone: relist
                        break
                    rv = _md(obj).get("resourceVersion") or rv
                    if typ != "BOOKMARK":
                        on(obj)
            except Exception:  # noqa: BLE001  (the apiserver or etcd restarts: that is the point)
                self.errors[name] += 1
                if self.stop_event.wait(1.0):
                    return

    def _tick(self) -> None:
        while not self.stop_event.wait(0.5):
            sent = time.time()
            try:
                cm = self.w.core.patch_namespaced_config_map("chaos-clock", self.ns, {"data": {"t": f"{sent:.3f}"}},
                                                             _request_timeout=5)
            except Exception:  # noqa: BLE001
                self.errors["ticker"] += 1
                continue
            with self._lock:
                self.ticks.append(Tick(sent=sent, answered=time.time(), rv=int(cm.metadata.resource_version)))
