"""Operator benchmarks on the local control plane (etcd + kube-apiserver + kube-controller-manager +
the process kubelet of e2e/cluster.py), the local S3 server, and the operator as a subprocess
(configured like tests/e2e/test_operator_e2e.py's ``Env.operator_env``).

1. Control-plane overhead per lap (``overhead``): R concurrent runs of L laps each (scripted model,
   one call per lap to a local HTTP tool, so a lap continues; real ``agentrun lap`` pods writing real
   checkpoints that the operator verifies in S3 before the next Job). A watch in this process on the
   namespace's Jobs and pods timestamps, at arrival: the lap's pod reaching ``Succeeded``, its Job
   reaching ``Complete``, and the next lap's Job being ``ADDED``. Kubernetes timestamps have
   1-second resolution, so they are not used. Both ends are seen through the same watch path, so its
   delivery latency cancels out to first order. Also: the operator's CPU time per lap (the scheduler's
   exact run time of its threads, ``/proc/PID/task/TID/schedstat``; utime+stime, in 10 ms ticks,
   when a thread ended during the level), its own ``agentrun_reconcile_duration_seconds`` (sum / count: reconciles per lap),
   and its own ``agentrun_kube_requests_total`` (API requests per lap, by verb, resource and code),
   cross-checked with the API server's ``apiserver_request_total`` for the requests only the
   operator makes there (status patches of AgentRuns, Job creations).
   ``BENCH_OPERATOR_PYTHONPATH`` runs the operator of another checkout (before/after); one without
   that counter gets it from ``bench/kube_request_shim`` (kubernetes-client requests only).

2. Operator scale (``scale``): N AgentRuns in one namespace, a realistic mix without Jobs: 60 %
   ``spec.suspend: true`` (driven to phase Suspended by a first operator), 30 % terminal
   (status Succeeded / Failed / BudgetExceeded written through the status subresource, as left by an
   earlier operator), 10 % AwaitingApproval (a pending approval with a deadline in a day). The first
   operator settles them and is stopped (SIGTERM); a second one is started. Resync = from its
   process start until every run has been reconciled once: its ``agentrun_reconcile_total``
   reaches N and stops growing (every run is enqueued at start by the watch's initial listing and by
   the resync on acquiring the Lease, and the queue keeps a run until its reconcile finishes; the
   sampling is every 0.2 s). RSS: VmRSS sampled every 0.2 s, peak (VmHWM) and steady (10 s after).

    python bench/bench_operator_cluster.py overhead --runs 1,50,200 --laps 4 [--json out.json]
    python bench/bench_operator_cluster.py scale --scale-runs 1000 [--json out.json]
    python bench/bench_operator_cluster.py all ...      # both on one cluster

The cluster lives in ``--dir`` (default a temp dir) and is stopped at the end.

The checkpoints are served by versitygw (``--s3 versitygw``, the default: e2e/versitygw_server.py,
built and cached like the tests' second S3), started with ``--keep-alive`` so that it keeps its
connections open between requests as AWS S3, MinIO and Ceph do. ``--s3 moto`` serves them from moto's
server instead, which (like versitygw without that flag) answers every request with
``Connection: close``: each S3 request of the operator and of the laps then pays a new TCP
connection that no S3 service charges (on 2026-12-02 about 1.5-2 ms of the operator's CPU per lap
on this box, the lap record's GET opening its connection).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_lap_run import ToolHandler, free_port  # noqa: E402
from benchlib import (  # noqa: E402
    autogroup_enabled,
    cpu_between,
    lowered,
    proc_cpu_seconds,
    proc_status_kb,
    proc_switches,
    proc_thread_cpu,
    seen_priority,
    stamp_events,
    summary,
    wakeup_price_us,
)
from e2e.cluster import S3Server, operator_env, start_cluster, start_s3  # noqa: E402

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
#: The operator's count of its own API requests (operator/agentrun/metrics/kube.py), per label set too.
KUBE_REQUESTS = "agentrun_kube_requests_total"
KEEP = (KUBE_REQUESTS, "agentrun_reconcile_total")
TERMINAL = ("Succeeded", "Failed", "BudgetExceeded")
#: How long the operator's idle CPU is measured before the runs of an overhead level.
IDLE_SECONDS = 15.0
#: The uncounted first run of each level (``--no-warmup``: none).
WARMUP = "warmup"


@dataclass
class VersityS3(S3Server):
    """versitygw with the bucket made, in the shape of e2e.cluster's S3Server."""

    proc: Any = None

    def stop(self) -> None:
        from e2e.versitygw_server import stop

        stop(self.proc)


def start_versitygw_s3(d: Path) -> VersityS3:
    import boto3
    from botocore.config import Config
    from e2e.versitygw_server import start_versitygw

    s3 = VersityS3(dir=d, endpoint_url="")
    d.mkdir(parents=True, exist_ok=True)
    s3.proc, s3.endpoint_url = start_versitygw(d, s3.access_key, s3.secret_key, region=s3.region, keep_alive=True)
    boto3.client("s3", endpoint_url=s3.endpoint_url, aws_access_key_id=s3.access_key,
                 aws_secret_access_key=s3.secret_key, region_name=s3.region,
                 config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=s3.bucket)
    return s3


def lap_priority(nice: int) -> str:
    """What a process started as the lap processes are (the bench's wrapper, in a session of its own)
    reports of its own priority: its nice and its session's autogroup (``/proc/self/autogroup``), so
    the results show the stand-in took effect."""
    own, group = seen_priority(nice)
    return f"nice {own} / {group}"


class Bench:
    def __init__(self, workdir: Path, profile: str | None = None, s3: str = "versitygw", node: str = "") -> None:
        self.dir = workdir
        self.profile = profile
        self.lap_nice: int | None = None  # --lap-nice
        self.warmup = True  # --no-warmup: count the first run's one-time costs too
        self.lap_cpus: str | None = None  # --lap-cpus: the lap processes pinned to these CPUs (taskset -c)
        self.operator_cpus: str | None = None  # --operator-cpus: the operator pinned to these
        #: added to the operator's environment (bench_lap_gap.py: a variant's settings, the runc node's lap image)
        self.operator_extra_env: dict[str, str] = {}
        #: of the last overhead level: its namespace, the watch's arrival stamps, the Jobs by run and lap
        self.level_detail: dict[str, Any] = {}
        self.cluster = start_cluster(workdir / "kube", node=node)
        self.s3_server = s3
        self.s3: S3Server = start_versitygw_s3(workdir / "s3") if s3 == "versitygw" else start_s3(workdir / "s3")
        from kubernetes import client, config

        config.load_kube_config(self.cluster.kubeconfig)
        client.Configuration._default.connection_pool_maxsize = 32  # type: ignore[attr-defined]
        self.client = client
        self.tools = ThreadingHTTPServer(("127.0.0.1", 0), ToolHandler)
        threading.Thread(target=self.tools.serve_forever, daemon=True).start()
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        self.cluster.kubectl_run("apply", "-f", str(ROOT / "crds" / "agentrun.dev_agentruns.yaml"))
        self.cluster.kubectl_run("wait", "--for=condition=Established", "crd/agentruns.agentrun.dev", "--timeout=60s")

    def close(self) -> None:
        self.tools.shutdown()
        self.s3.stop()
        self.cluster.stop()

    # ------------------------------------------------------------------ plumbing

    def namespace(self, prefix: str) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:5]}"
        c = self.cluster
        c.kubectl_run("create", "namespace", ns)
        c.kubectl_run("create", "serviceaccount", "agentrun-lap", "-n", ns)
        c.kubectl_run("create", "secret", "generic", "s3-creds", "-n", ns,
                      f"--from-literal=AWS_ACCESS_KEY_ID={self.s3.access_key}",
                      f"--from-literal=AWS_SECRET_ACCESS_KEY={self.s3.secret_key}")
        return ns

    def start_operator(self, ns: str, log: Path, resync: str = "300",
                       lap_command: list[str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        env = operator_env(
            self.cluster, self.s3, namespace=ns, prefix=f"bench-{ns}",
            AGENTRUN_LEASE_DURATION="15",  # the default (and the resync: the default, 300 s)
            AGENTRUN_RESYNC_SECONDS=resync, AGENTRUN_JOB_TTL_SECONDS="-1", AGENTRUN_METRICS_PORT=str(port),
            # this cluster has the CRD only, as in the committed results: the operator starts laps without
            # its admission policies (docs/operations.md#admission-policies), the measured setup unchanged
            AGENTRUN_ALLOW_MISSING_POLICIES="true",
        )
        env.update(self.operator_extra_env)
        if lap_command is not None:
            env["AGENTRUN_LAP_COMMAND"] = json.dumps(lap_command)
        if self.lap_nice is not None:  # the lap pods at a lower CPU priority: a stand-in for other nodes
            # (their sessions' autogroups too, benchlib.lowered), except pinned: on this box (2026-12-03)
            # a process whose autogroup was niced and then pinned with taskset ran beside a pinned one at
            # full speed on "the same" CPU, so the two are not combined
            env["AGENTRUN_LAP_COMMAND"] = json.dumps(lowered(json.loads(env["AGENTRUN_LAP_COMMAND"]), self.lap_nice,
                                                             autogroup=self.lap_cpus is None))
        if self.lap_cpus is not None:  # the lap pods pinned away from the operator: the other stand-in
            env["AGENTRUN_LAP_COMMAND"] = json.dumps(["taskset", "-c", self.lap_cpus, *json.loads(env["AGENTRUN_LAP_COMMAND"])])
        if os.environ.get("BENCH_OPERATOR_PYTHONPATH"):  # e.g. an export of an older commit, for before/after
            # the shim counts the kubernetes client's requests of an operator without its own counter
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench" / "kube_request_shim"),
                                                 os.environ["BENCH_OPERATOR_PYTHONPATH"]])
        fh = open(log, "ab")
        pin = ["taskset", "-c", self.operator_cpus] if self.operator_cpus is not None else []
        main = ["-m", "agentrun.cli.main"]
        if os.environ.get("BENCH_OPERATOR_YAPPI"):  # per-function CPU of every thread (bench/yappi_operator.py)
            main = [str(ROOT / "bench" / "yappi_operator.py"), f"{os.environ['BENCH_OPERATOR_YAPPI']}-{port}"]
        if os.environ.get("BENCH_OPERATOR_LOOPPROF"):  # the event loop's CPU by callback (bench/loopprof_operator.py)
            main = [str(ROOT / "bench" / "loopprof_operator.py"), f"{os.environ['BENCH_OPERATOR_LOOPPROF']}-{port}"]
        proc = subprocess.Popen([*pin, sys.executable, *main, "operator"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        return proc, port

    def wait_serving(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        """Until the operator serves its metrics (started, Lease taken); its log if it died."""
        end = time.time() + 120
        while not self.metrics(port):
            if proc.poll() is not None or time.time() > end:
                raise SystemExit(f"operator did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    @staticmethod
    def stop_operator(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    #: Requests only the operator makes in the benchmark's window (nobody else writes AgentRun status
    #: or creates Jobs there): (apiserver verb, resource, subresource) -> the operator's (verb, resource).
    CROSSCHECK = {("PATCH", "agentruns", "status"): ("patch", "agentruns/status"),
                  ("POST", "jobs", ""): ("create", "jobs")}

    def apiserver_requests(self) -> dict[tuple[str, str, str], float]:
        """``apiserver_request_total`` of the API server itself, summed over codes and the other
        labels, for the pairs of :attr:`CROSSCHECK`."""
        text = self.cluster.kubectl_run("get", "--raw", "/metrics").stdout
        out: dict[tuple[str, str, str], float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line.rpartition(" ")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
            key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            if key in self.CROSSCHECK:
                out[key] = out.get(key, 0.0) + float(value)
        return out

    @staticmethod
    def metrics(port: int, keep_labels: tuple[str, ...] = ()) -> dict[str, float]:
        """Sum of each sample name (labels folded) of the operator's /metrics; the samples of the
        names in ``keep_labels`` also under their full ``name{labels}``."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
                if name in keep_labels:
                    out[name_labels] = float(value)
            except ValueError:
                pass
        return out

    def runs(self, ns: str) -> list[dict[str, Any]]:
        return self.client.CustomObjectsApi().list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]

    def create_runs(self, ns: str, docs: list[dict[str, Any]]) -> None:
        api = self.client.CustomObjectsApi()
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda doc: api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc), docs))

    def run_doc(self, name: str, script: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        body = {
            "task": f"bench {name}",
            "agent": {"version": "v1", "model": {"provider": "scripted", "script": script},
                      "tools": [{"name": "note", "http": {"url": f"{self.tool_url}/note", "timeout": "20s"}}]},
            "budget": {"maxLaps": 1000},
            # a Job's deadline runs from its creation: on a starved process kubelet a lap pod can wait
            # minutes before it starts, which is not what this measures
            "lapTimeout": "1800s",
            "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s", "factor": 2}},
            **spec,
        }
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}, "spec": body}

    # ------------------------------------------------------------------ 1. overhead per lap

    def overhead(self, runs: int, laps: int, timeout: float, profile: bool = False) -> dict[str, Any]:
        ns = self.namespace(f"bench-overhead-{runs}")
        log = self.dir / f"operator-{ns}.log"
        events: dict[tuple[str, str], float] = {}  # (kind:name, event) -> first arrival time
        stop = threading.Event()
        watchers = [threading.Thread(target=self._watch, args=(ns, kind, events, stop), daemon=True)
                    for kind in ("job", "pod")]
        for w in watchers:
            w.start()
        proc, port = self.start_operator(ns, log)
        try:
            self.wait_serving(proc, port, log)  # before counting its CPU
            time.sleep(2)
            warm_cpu = None
            if self.warmup:
                # one run of 3 laps first, not counted: what the operator does once (the lazy imports
                # of the first lap's code, the checkpoint client, TLS contexts, the start-up warm-up
                # thread) is not a cost per lap, and at 1 run x 10 laps it was ~20 ms of every "lap"
                w0 = proc_cpu_seconds(proc.pid) or 0.0
                self.create_runs(ns, [self.run_doc(WARMUP, [{"content": "w1", "toolCalls": [
                    {"name": "note", "arguments": {"w": 1}}]}, {"content": "w2", "toolCalls": [
                        {"name": "note", "arguments": {"w": 2}}]}, {"content": "done"}])])
                end = time.time() + timeout
                while time.time() < end and not any(
                        it["metadata"]["name"] == WARMUP and (it.get("status") or {}).get("phase") in TERMINAL
                        for it in self.runs(ns)):
                    time.sleep(1)
                time.sleep(2)
                warm_cpu = (proc_cpu_seconds(proc.pid) or 0.0) - w0
            # its CPU while idle (the Lease held, no run): the part of "CPU per lap" that is not the laps'
            idle0, idle_exact0, idle_t0 = proc_cpu_seconds(proc.pid), proc_thread_cpu(proc.pid), time.monotonic()
            time.sleep(IDLE_SECONDS)
            idle_exact = cpu_between(idle_exact0, proc_thread_cpu(proc.pid))
            idle_cpu = idle_exact if idle_exact is not None else (proc_cpu_seconds(proc.pid) or 0) - (idle0 or 0)
            idle_cpu_per_second = idle_cpu / (time.monotonic() - idle_t0)
            cpu0, m0, a0 = proc_cpu_seconds(proc.pid), self.metrics(port, KEEP), self.apiserver_requests()
            exact0 = proc_thread_cpu(proc.pid)
            sw0 = proc_switches(proc.pid)
            spy = None
            if profile and self.profile and shutil.which("py-spy"):
                # on-CPU samples of the operator (all threads) while the runs go
                spy = subprocess.Popen(["py-spy", "record", "-p", str(proc.pid), "-r", os.environ.get("BENCH_PYSPY_RATE", "50"), "-f", "raw",
                                        *(["--gil"] if os.environ.get("BENCH_PYSPY_GIL") == "1" else []),
                                        "-o", self.profile, "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            script = [{"content": f"step {i}", "toolCalls": [{"name": "note", "arguments": {"i": i}}]}
                      for i in range(1, laps)] + [{"content": "done"}]
            names = [f"r{i:04d}" for i in range(runs)]
            t0 = time.time()
            self.create_runs(ns, [self.run_doc(n, script) for n in names])
            end = t0 + timeout
            incomplete = None
            while True:
                items = [it for it in self.runs(ns) if it["metadata"]["name"] != WARMUP]
                phases = [(it.get("status") or {}).get("phase") for it in items]
                if len(items) == runs and all(p in TERMINAL for p in phases):
                    break
                if time.time() > end:  # report what finished, marked incomplete
                    incomplete = {str(p): phases.count(p) for p in set(phases)}
                    print(f"runs not finished after {timeout}s: {incomplete}", flush=True)
                    break
                time.sleep(2)
            wall = time.time() - t0
            cpu1, exact1 = proc_cpu_seconds(proc.pid), proc_thread_cpu(proc.pid)
            m1, a1 = self.metrics(port, KEEP), self.apiserver_requests()
            sw1 = proc_switches(proc.pid)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            time.sleep(1)
        finally:
            stop.set()
            self.stop_operator(proc)
        failed = [it["metadata"]["name"] for it in items if (it.get("status") or {}).get("phase") in ("Failed", "BudgetExceeded")]
        job_complete, pod_done, gaps_job, gaps_pod, retried = [], [], [], [], 0
        jobs = self.client.BatchV1Api().list_namespaced_job(ns).items
        by_run: dict[str, dict[int, str]] = {}
        for j in jobs:
            lab = j.metadata.labels
            if lab.get("agentrun.dev/run") == WARMUP:
                continue
            if lab.get("agentrun.dev/attempt") != "1":
                retried += 1
                continue
            by_run.setdefault(lab["agentrun.dev/run"], {})[int(lab["agentrun.dev/lap"])] = j.metadata.name
        for _run, laps_of in by_run.items():
            for lap, name in laps_of.items():
                nxt = laps_of.get(lap + 1)
                if nxt is None:
                    continue
                added = events.get((f"job:{nxt}", "ADDED"))
                complete = events.get((f"job:{name}", "Complete"))
                succeeded = events.get((f"pod:{name}", "Succeeded"))
                if added and complete:
                    gaps_job.append(added - complete)
                    job_complete.append(complete)
                if added and succeeded:
                    gaps_pod.append(added - succeeded)
                    pod_done.append(succeeded)
        laps_done = sum(len(v) for v in by_run.values())
        self.level_detail = {"ns": ns, "events": events, "jobs": by_run, "prefix": f"bench-{ns}"}
        # the scheduler's exact run time of its threads when every thread lived through the level,
        # else utime + stime (10 ms ticks: at 1 run x 10 laps, +-1 ms per lap)
        exact = cpu_between(exact0, exact1)
        operator_cpu = exact if exact is not None else (cpu1 or 0) - (cpu0 or 0)
        rc_sum = m1.get("agentrun_reconcile_duration_seconds_sum", 0) - m0.get("agentrun_reconcile_duration_seconds_sum", 0)
        rc_n = m1.get("agentrun_reconcile_duration_seconds_count", 0) - m0.get("agentrun_reconcile_duration_seconds_count", 0)
        requests = m1.get(KUBE_REQUESTS, 0) - m0.get(KUBE_REQUESTS, 0)
        by_kind = {k[len(KUBE_REQUESTS):]: v - m0.get(k, 0) for k, v in m1.items()
                   if k.startswith(KUBE_REQUESTS + "{") and v - m0.get(k, 0) > 0}
        # the operator's own counter against the API server's, for the requests only it makes
        crosscheck = {}
        for key, (verb, resource) in self.CROSSCHECK.items():
            ours = sum(v for k, v in by_kind.items() if f'resource="{resource}"' in k and f'verb="{verb}"' in k)
            crosscheck[f"{verb} {resource}"] = {"operator": ours, "apiserver": a1.get(key, 0.0) - a0.get(key, 0.0)}
        self.cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
        return {
            "apiserver_crosscheck": crosscheck,
            "reconciles_per_lap": rc_n / max(1, laps_done),
            "kube_requests": requests, "kube_requests_per_lap": requests / max(1, laps_done),
            "kube_requests_by_label": by_kind,
            "reconciles_by_result": {k[len("agentrun_reconcile_total"):]: v - m0.get(k, 0) for k, v in m1.items()
                                     if k.startswith("agentrun_reconcile_total{") and v - m0.get(k, 0) > 0},
            "runs": runs, "laps_per_run": laps, "laps_total": laps_done, "failed_runs": failed, "incomplete": incomplete,
            "retried_jobs": retried, "wall_seconds": wall, "load_after": os.getloadavg(),
            "gap_job_complete_to_next_job": gaps_job, "gap_pod_succeeded_to_next_job": gaps_pod,
            "operator_cpu_seconds": operator_cpu,
            "operator_cpu_clock": "schedstat" if exact is not None else "ticks",
            "operator_cpu_seconds_ticks": (cpu1 or 0) - (cpu0 or 0),
            "operator_idle_cpu_per_second": idle_cpu_per_second,
            "operator_warmup_cpu_seconds": warm_cpu,
            "operator_cpu_per_lap": operator_cpu / max(1, laps_done),
            "operator_switches_per_lap": ((sw1 or 0) - (sw0 or 0)) / max(1, laps_done),
            "reconciles": rc_n, "reconcile_seconds_sum": rc_sum,
            "operator_rss_kb": proc_status_kb(proc.pid) if proc.poll() is None else None,
        }

    def _watch(self, ns: str, kind: str, events: dict[tuple[str, str], float], stop: threading.Event) -> None:
        stamp_events(self.client, ns, kind, events, stop)

    # ------------------------------------------------------------------ 2. resync and RSS at scale

    def active(self, runs: int, minutes: float) -> dict[str, Any]:
        """N runs whose laps are always in flight, for M minutes: each lap attempt is a pod that
        sleeps 30-89 s and exits 75 (retryable), so every run cycles through Job Failed -> retry
        recorded -> backoff (1-2 s) -> next attempt's Job, all the time (a lap process that writes a
        real checkpoint is a Python process of ~40 MB: 1,000 of them do not fit this box). Sampled
        every 10 s from the operator's metrics: the work queue's depth and delayed keys, reconciles,
        CPU and RSS. A queue that keeps up stays near 0 and does not grow from the first minutes to
        the last."""
        ns = self.namespace("active")
        log = self.dir / f"operator-{ns}.log"
        # "$$$$": Kubernetes turns "$$" into "$" in a container's command ($(VAR) expansion)
        sleeper = ["sh", "-c", "sleep $(( $$$$ % 60 + 30 )); exit 75"]
        proc, port = self.start_operator(ns, log, lap_command=sleeper)
        samples: list[dict[str, float]] = []
        try:
            self.wait_serving(proc, port, log)
            script = [{"content": "done"}]
            docs = [self.run_doc(f"a{i:04d}", script, retry={"attemptsPerLap": 100, "backoff": {
                "initial": "1s", "max": "2s", "factor": 2}}) for i in range(runs)]
            t0 = time.time()
            self.create_runs(ns, docs)
            created = time.time() - t0
            cpu0 = proc_cpu_seconds(proc.pid) or 0.0
            t_start = time.time()
            while time.time() - t_start < minutes * 60:
                time.sleep(10)
                m = self.metrics(port)
                samples.append({
                    "t": time.time() - t_start, "depth": m.get("agentrun_workqueue_depth", float("nan")),
                    "delayed": m.get("agentrun_workqueue_delayed", float("nan")),
                    "reconciles": m.get("agentrun_reconcile_total", 0.0),
                    "errors": m.get("agentrun_reconcile_errors_total", 0.0),
                    "cpu": (proc_cpu_seconds(proc.pid) or 0.0) - cpu0,
                    "rss_kb": float(proc_status_kb(proc.pid) or 0),
                    "load": os.getloadavg()[0],
                })
                last = samples[-1]
                print(f"  active {last['t']:.0f}s: queue depth {last['depth']:.0f}, delayed {last['delayed']:.0f}, "
                      f"reconciles {last['reconciles']:.0f}, load {last['load']:.1f}", flush=True)
            jobs = self.client.BatchV1Api().list_namespaced_job(ns).items
            running = sum(1 for j in jobs if (j.status.active or 0) > 0)
            phases = [(it.get("status") or {}).get("phase") for it in self.runs(ns)]
        finally:
            self.stop_operator(proc)
        self.cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
        wall = samples[-1]["t"] if samples else 0.0
        return {
            "runs": runs, "minutes": minutes, "create_seconds": created, "samples": samples,
            "jobs_total": len(jobs), "jobs_active_at_end": running,
            "phases_at_end": {str(p): phases.count(p) for p in set(phases)},
            "reconciles_per_second": (samples[-1]["reconciles"] - samples[0]["reconciles"]) / max(1.0, wall - samples[0]["t"])
            if len(samples) > 1 else None,
            "operator_cpu_fraction": samples[-1]["cpu"] / max(1.0, wall) if samples else None,
        }

    def scale(self, runs: int, timeout: float) -> dict[str, Any]:
        ns = self.namespace(f"bench-scale-{runs}")
        n_susp, n_term = int(runs * 0.6), int(runs * 0.3)
        n_wait = runs - n_susp - n_term
        docs = []
        for i in range(runs):
            kind = "suspended" if i < n_susp else "terminal" if i < n_susp + n_term else "waiting"
            doc = self.run_doc(f"{kind[0]}{i:05d}", [{"content": "done"}], suspend=(kind == "suspended"))
            docs.append(doc)
        t = time.time()
        self.create_runs(ns, docs)
        create_seconds = time.time() - t
        now = datetime.now(UTC).replace(microsecond=0)
        api = self.client.CustomObjectsApi()

        def status_of(i: int) -> dict[str, Any]:
            ts = (now - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
            base = {"observedGeneration": 1, "lap": 3, "laps": 3,
                    "cost": {"usd": "0.012000", "inputTokens": 3000, "outputTokens": 300},
                    "startedAt": ts}
            if i < n_susp + n_term:
                phase = TERMINAL[i % 3]
                return {**base, "phase": phase, "finishedAt": ts,
                        "conditions": [{"type": "Complete" if phase == "Succeeded" else "Failed", "status": "True",
                                        "reason": phase, "message": "finished before the restart",
                                        "lastTransitionTime": ts}]}
            deadline = (now + timedelta(days=1)).isoformat().replace("+00:00", "Z")
            return {**base, "phase": "AwaitingApproval", "approval": {
                "state": "Pending", "lap": 3, "tool": "note", "callId": "c1", "idempotencyKey": f"r_x:3:note:c{i}",
                "owner": "bench", "requestedAt": ts, "deadline": deadline}}

        def patch(i: int) -> None:
            name = docs[i]["metadata"]["name"]
            api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, {"status": status_of(i)})

        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(patch, range(n_susp, runs)))
        # operator 1 settles the suspended runs
        log = self.dir / f"operator-{ns}.log"
        # the periodic safety-net resync (default 30 s) stays out of the measured window
        proc, port = self.start_operator(ns, log, resync="3600")
        try:
            end = time.time() + timeout
            while True:
                phases = [(it.get("status") or {}).get("phase") for it in self.runs(ns)]
                counts = {p: phases.count(p) for p in set(phases)}
                if counts.get("Suspended", 0) >= n_susp:
                    break
                if time.time() > end or proc.poll() is not None:
                    raise SystemExit(f"runs not settled: {counts}\n{log.read_text()[-2000:]}")
                time.sleep(2)
            time.sleep(3)
            rss_first = proc_status_kb(proc.pid)
        finally:
            self.stop_operator(proc)
        # operator 2: the restart
        t0 = time.time()
        proc, port = self.start_operator(ns, log, resync="3600")
        samples: list[tuple[float, float, int | None]] = []  # (t, reconciles, rss kB)
        try:
            end = t0 + timeout
            done_at = None
            while time.time() < end:
                m = self.metrics(port)
                n = m.get("agentrun_reconcile_total", 0.0)
                t = time.time() - t0
                samples.append((t, n, proc_status_kb(proc.pid)))
                if done_at is None and n >= runs:
                    done_at = t
                # settled: at least N reconciles and no new one for 3 s
                last_change = max((s[0] for s in samples if s[1] == n), default=t)
                first_at_n = min(s[0] for s in samples if s[1] == n)
                if n >= runs and t - first_at_n >= 3:
                    del last_change
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"operator exited:\n{log.read_text()[-2000:]}")
                time.sleep(0.2)
            else:
                raise SystemExit(f"resync not finished after {timeout}s: {samples[-1]}")
            final_n = samples[-1][1]
            settled_at = min(s[0] for s in samples if s[1] == final_n)
            time.sleep(10)
            rss_steady = proc_status_kb(proc.pid)
            rss_peak = proc_status_kb(proc.pid, "VmHWM")
            m = self.metrics(port)
            phases = [(it.get("status") or {}).get("phase") for it in self.runs(ns)]
        finally:
            self.stop_operator(proc)
        self.cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
        lease_line = next((json.loads(line).get("ts") for line in log.read_text().splitlines()[::-1]
                           if "acquired by" in line), None)
        return {
            "runs": runs, "mix": {"suspended": n_susp, "terminal": n_term, "awaiting_approval": n_wait},
            "create_seconds": create_seconds, "resync_seconds": settled_at, "first_n_reconciles_seconds": done_at,
            "reconciles": final_n, "reconcile_seconds_sum": m.get("agentrun_reconcile_duration_seconds_sum"),
            "rss_kb_first_operator": rss_first, "rss_kb_steady": rss_steady, "rss_kb_peak": rss_peak,
            "rss_kb_max_sampled": max((s[2] or 0) for s in samples),
            "phases_after": {p: phases.count(p) for p in set(phases)}, "samples": samples,
            "lease_acquired_ts": lease_line, "restart_epoch": t0, "load_after": os.getloadavg(),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("overhead", "scale", "all", "active"))
    ap.add_argument("--active-runs", type=int, default=1000, help="active: runs with a lap always in flight")
    ap.add_argument("--minutes", type=float, default=10.0, help="active: how long")
    ap.add_argument("--runs", default=None, help="overhead: comma-separated concurrency levels (default 1,50,200)")
    ap.add_argument("--scale-runs", type=int, default=1000, help="runs of the scale benchmark")
    ap.add_argument("--laps", type=int, default=2, help="laps per run of the overhead benchmark (at least 10 below 10 runs)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--dir", help="working directory (default: a temp dir, removed at the end)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--lap-nice", type=int, default=None,
                    help="overhead: run the lap processes at nice N, their sessions' autogroups too "
                         "(benchlib.lowered; on a real cluster they run on other nodes)")
    ap.add_argument("--lap-cpus", default=None,
                    help="overhead: pin the lap processes to these CPUs (taskset -c LIST), away from the operator")
    ap.add_argument("--operator-cpus", default=None,
                    help="pin the operator to these CPUs (taskset -c LIST); with --lap-cpus on the others")
    ap.add_argument("--no-warmup", action="store_true",
                    help="overhead: no uncounted warm-up run before each level (one-time costs land on the laps)")
    ap.add_argument("--profile", help="py-spy the operator during the highest overhead level; folded stacks here")
    ap.add_argument("--s3", choices=("moto", "versitygw"), default="versitygw",
                    help="the S3 server of the checkpoints (see the module docstring)")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster and the operator on SIGTERM
    tmp = None if args.dir else tempfile.mkdtemp(prefix="agentrun-bench-")
    workdir = Path(args.dir or tmp).resolve()
    out: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "wakeup_price_us": wakeup_price_us()}
    print(f"box: a sleep and wake-up costs {out['wakeup_price_us']:.0f} µs of CPU here "
          "(a few µs on most machines; CPU per lap grows with it)", flush=True)
    bench = Bench(workdir, args.profile, args.s3)
    out["s3_server"] = args.s3
    bench.lap_nice = args.lap_nice
    bench.warmup = not args.no_warmup
    out["warmup"] = bench.warmup
    out["lap_nice"] = args.lap_nice
    out["autogroup"] = autogroup_enabled()
    if args.lap_nice is not None and args.lap_cpus is None:
        out["lap_priority"] = lap_priority(args.lap_nice)
        print(f"lap processes: each in a session of its own (as the process kubelet starts them), "
              f"autogroup {'on' if out['autogroup'] else 'off' if out['autogroup'] is False else 'absent'}; "
              f"as a lap sees itself: {out['lap_priority']}", flush=True)
    bench.lap_cpus, bench.operator_cpus = args.lap_cpus, args.operator_cpus
    out["lap_cpus"], out["operator_cpus"] = args.lap_cpus, args.operator_cpus

    def save() -> None:  # after each part, so a later failure keeps what was measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f)

    try:
        if args.what == "active":
            res = bench.active(args.active_runs, args.minutes)
            out["active"] = res
            save()
            depths = [s["depth"] for s in res["samples"]]
            third = max(1, len(depths) // 3)
            print(f"active, {res['runs']} runs for {res['minutes']:.0f} min (created in {res['create_seconds']:.0f} s): "
                  f"queue depth max {max(depths):.0f}, mean over the first third {sum(depths[:third]) / third:.1f}, "
                  f"over the last third {sum(depths[-third:]) / third:.1f}; reconciles/s "
                  f"{res['reconciles_per_second'] or 0:.1f}; operator CPU {100 * (res['operator_cpu_fraction'] or 0):.0f} % "
                  f"of a core; Jobs {res['jobs_total']} ({res['jobs_active_at_end']} active at the end); "
                  f"phases {res['phases_at_end']}", flush=True)
        if args.what in ("scale", "all"):  # first: the cluster is quiet, no namespace being deleted
            n = args.scale_runs
            res = bench.scale(n, args.timeout)
            out["scale"] = res
            save()
            print(f"scale, {n} runs {res['mix']}: resync {res['resync_seconds']:.1f} s ({res['reconciles']:.0f} reconciles); "
                  f"RSS steady {res['rss_kb_steady'] / 1024:.0f} MB, peak {res['rss_kb_peak'] / 1024:.0f} MB; "
                  f"phases after {res['phases_after']}", flush=True)
        if args.what in ("overhead", "all"):
            levels = [int(x) for x in (args.runs or "1,50,200").split(",")]
            out["overhead"] = []
            for r in levels:
                # a level of few runs gets more laps, so it has samples too
                laps = args.laps if r >= 10 else max(args.laps, 10)
                res = bench.overhead(r, laps, args.timeout, profile=(r == max(levels)))
                out["overhead"].append(res)
                save()
                g, p = res["gap_job_complete_to_next_job"], res["gap_pod_succeeded_to_next_job"]
                gs, ps = summary(g) if g else None, summary(p) if p else None
                print(f"overhead, {r} concurrent runs x {laps} laps: "
                      + (f"Job Complete -> next Job p50 {gs['p50'] * 1000:.0f} ms p99 {gs['p99'] * 1000:.0f} ms (n={gs['n']}); " if gs else "")
                      + (f"pod Succeeded -> next Job p50 {ps['p50'] * 1000:.0f} ms p99 {ps['p99'] * 1000:.0f} ms; " if ps else "")
                      + f"operator CPU {res['operator_cpu_per_lap'] * 1000:.1f} ms/lap "
                        f"({res['operator_cpu_clock']}; idle {res['operator_idle_cpu_per_second'] * 1000:.1f} ms/s before the runs; "
                        f"{res['operator_switches_per_lap']:.1f} context switches/lap"
                        + (f"; warm-up run {res['operator_warmup_cpu_seconds'] * 1000:.0f} ms, not counted"
                           if res.get("operator_warmup_cpu_seconds") is not None else "") + "); "
                        f"reconciles/lap {res['reconciles_per_lap']:.2f}; API requests/lap {res['kube_requests_per_lap']:.2f}; "
                        f"load {os.getloadavg()[0]:.1f}; failed runs {len(res['failed_runs'])}, "
                        f"retried Jobs {res['retried_jobs']}; the operator's counts against the API "
                        "server's: " + ", ".join(f"{k} {v['operator']:.0f}/{v['apiserver']:.0f}"
                                                 for k, v in res["apiserver_crosscheck"].items()), flush=True)
    finally:
        bench.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    save()


if __name__ == "__main__":
    main()
