"""Kopf's event intake against the operator's own, side by side on one event stream (issue 30).

The question: could Kopf (``kopf.on.event``) deliver the AgentRuns, lap Jobs and lap pods to the
controller's work queue in place of its own informers (``agentrun/kube/informer.py``), within the
per-lap budget (operator CPU <= 12 ms per lap at 200 runs, all of it; reconciles and requests are
not touched by the intake)?

On the local control plane (e2e/cluster.py, started without the process kubelet: no pod runs, none
is bound), one namespace, two subprocesses watch it at the same time (``side``):

* **own**: three :class:`~agentrun.kube.informer.Informer` s with the selectors of the operator
  (controller/reconciler.py, controller/cache.py): all AgentRuns; Jobs with the run-uid label; pods
  with the run-uid label and ``status.phase=Succeeded``; each with its transform (``strip``,
  ``slim_job``, ``slim_pod``). Their sink is the controller's :class:`~agentrun.controller.cache.Cache`,
  whose ``on_change`` adds the run key to a :class:`~agentrun.kube.queue.WorkQueue` that a task
  drains (``get``/``done``), as the operator's workers do.
* **kopf**: a Kopf operator (``kopf.run``) in its best configuration for this, not its default
  (:func:`kopf_settings`): ``standalone`` (no peering), no namespace/CRD scanning, Event posting off,
  progress and diff-base storages that neither read nor write anything (so no annotation, status
  field or finalizer is written, and no per-event deep copy of the body for a diff; the benchmark
  checks that no ``kopf.zalando.org`` annotation or finalizer appears), the same label and field
  selectors server-side (``settings.watching.label_selectors`` / ``field_selectors``), watch
  timeouts as the operator's, Kopf's loggers at WARNING, uvloop. Three ``@kopf.on.event`` async
  handlers (no ``@kopf.index``: the cache keeps the run -> Jobs -> pods index in both, so the two
  differ only by the intake) hand the same transformed object to the same Cache and WorkQueue.

Both sides run on uvloop (the operator's default) and stamp every event they hand to the cache
(wall clock, after the cache applied it and enqueued what it enqueues).

The stream (this process, :class:`Writer`; raw HTTP on keep-alive connections, 8 threads), per run:
the AgentRun created, then per lap, in order: a status patch (lap starts), the lap Job created
(``suspend: true``, so the Job controller starts no pod; it adds its ``Suspended`` condition: one
more Job event), two metadata patches of the Job (stand-ins for the Job controller's status updates
of a real lap: active, then done), the lap pod created (the run-uid and job-name labels, unbound:
no kubelet), its status patched to Running and then Succeeded (container terminated, exit 0), and a
status patch of the run (lap recorded). The laps start at ``--rate`` per second, lap 1 of every
run, then lap 2, ... Per lap both sides are sent 7 events (2 run, 4 Job, 1 pod: the two earlier
pod versions do not match the field selector), about what the operator's watches deliver per lap
(1,376 events for 200 laps in bench/analysis.md).

Measured per side, over the stream (from its first write until both sides saw the end marker, a
last patch of a sentinel run, plus 3 s): CPU time (the scheduler's run time of all its threads,
``/proc/PID/task/TID/schedstat``), less its idle rate measured over ``--idle`` seconds before;
per delivered event, per run and per lap; RSS (VmRSS after, VmHWM); events delivered; run keys
enqueued and reconciled by the drain; and the delay from each write of this process (the time it
sent the request) to the side's stamp of the event with that write's resourceVersion, p50/p99, over
the writes both sides are sent. ``--rounds`` repeats it in a new namespace with the two sides
started in the other order.

    python bench/bench_kopf_intake.py [--runs 200] [--laps 3] [--rate 10] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "operator"))

from benchlib import cpu_between, load_average, markdown_table, proc_status_kb, proc_thread_cpu, summary  # noqa: E402

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
LABEL_RUN_UID = "agentrun.dev/run-uid"  # agentrun.api.contract.LABEL_RUN_UID (checked by the own side's import)
SIDES = ("own", "kopf")
SENTINEL = "sentinel"
END_ANNOTATION = "bench.agentrun.dev/end"
#: The watch timeout of both sides (the operator's default AGENTRUN_WATCH_TIMEOUT_SECONDS).
WATCH_SECONDS = 120
#: Kopf's settings.queueing.idle_timeout for the kopf side (``--kopf-worker-idle``).
WORKER_IDLE_ENV = "BENCH_KOPF_WORKER_IDLE"


# ---------------------------------------------------------------------------------------- the sides


class Recorder:
    """The side's sink in front of the Cache: applies every event to it and stamps it."""

    def __init__(self, cache: Any, out: Path) -> None:
        self.cache, self.out = cache, out
        self.stamps: list[tuple[str, str, str, str, float]] = []  # (kind, type, name, rv, t)
        self.ready_written = self.end_written = False

    def replace(self, kind: str, scope: str | None, items: list[dict[str, Any]]) -> None:
        self.cache.replace(kind, scope, items)
        for obj in items:
            self._stamp(kind, "LISTED", obj)

    def refused(self, kind: str, status: int, scope: str | None = None) -> None:
        self.cache.refused(kind, status, scope)

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        self.cache.event(kind, type_, obj)
        self._stamp(kind, type_, obj)

    def _stamp(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        self.stamps.append((kind, type_, name, meta.get("resourceVersion") or "", time.time()))
        if kind == "runs" and name == SENTINEL:
            if not self.ready_written:
                self.ready_written = True
                self.out.with_suffix(".ready").write_text("1")
            if END_ANNOTATION in (meta.get("annotations") or {}) and not self.end_written:
                self.end_written = True
                self.out.with_suffix(".end").write_text("1")

    def dump(self, extra: dict[str, Any]) -> None:
        self.out.write_text(json.dumps({"stamps": self.stamps, "causes": self.cache.causes, **extra}))


def new_cache(out: Path) -> tuple[Any, Recorder, Any]:
    from agentrun.controller.cache import Cache
    from agentrun.kube.queue import WorkQueue

    queue: WorkQueue[tuple[str, str]] = WorkQueue()
    cache = Cache(on_change=queue.add)
    return queue, Recorder(cache, out), cache


async def drain(queue: Any, counts: dict[str, int]) -> None:
    """The workers' side of the queue: take each key and mark it done at once."""
    while True:
        key = await queue.get()
        if key is None:
            return
        counts["reconciled"] = counts.get("reconciled", 0) + 1
        queue.done(key)


def on_term(dump: Any) -> None:
    def handler(*_: Any) -> None:
        dump()
        os._exit(0)

    signal.signal(signal.SIGUSR1, handler)  # not SIGTERM: Kopf handles that one itself


async def own_side(ns: str, out: Path) -> None:
    from agentrun.api.contract import LABEL_RUN_UID as CONTRACT_LABEL
    from agentrun.controller.cache import POD_EXITED, RESOURCES, TRANSFORMS
    from agentrun.kube.client import Client, load_api_client
    from agentrun.kube.informer import Informer, strip

    assert CONTRACT_LABEL == LABEL_RUN_UID
    queue, rec, _ = new_cache(out)
    counts: dict[str, int] = {}
    on_term(lambda: rec.dump({"counts": counts}))
    loop = asyncio.get_running_loop()
    kube = Client(load_api_client(), 8)
    informers = [
        Informer(kube, "runs", ns, None, rec, loop, resource=RESOURCES["runs"], transform=strip,
                 watch_seconds=WATCH_SECONDS),
        Informer(kube, "jobs", ns, LABEL_RUN_UID, rec, loop, resource=RESOURCES["jobs"], transform=TRANSFORMS["jobs"],
                 watch_seconds=WATCH_SECONDS),
        Informer(kube, "pods", ns, LABEL_RUN_UID, rec, loop, resource=RESOURCES["pods"], transform=TRANSFORMS["pods"],
                 optional=True, field_selector=POD_EXITED, watch_seconds=WATCH_SECONDS),
    ]
    for inf in informers:
        inf.start()
    await drain(queue, counts)


def kopf_settings(kopf: Any) -> Any:
    """Kopf's best configuration for a pure event intake (see the module docstring)."""
    from agentrun.controller.cache import POD_EXITED

    class NoProgress(kopf.ProgressStorage):  # type: ignore[misc,name-defined]
        def fetch(self, **_: Any) -> None:
            return None

        def store(self, **_: Any) -> None:
            pass

        def purge(self, **_: Any) -> None:
            pass

        def touch(self, **_: Any) -> None:
            pass

        def clear(self, *, essence: Any) -> Any:
            return essence

    class NoDiffBase(kopf.DiffBaseStorage):  # type: ignore[misc,name-defined]
        def build(self, **_: Any) -> None:  # no essence: no deep copy of the body per event
            return None

        def fetch(self, **_: Any) -> None:
            return None

        def store(self, **_: Any) -> None:
            pass

    s = kopf.OperatorSettings()
    s.scanning.disabled = True  # no namespace/CRD watches: the namespace is given
    s.posting.enabled = False  # no k8s Events from Kopf's log lines
    s.persistence.progress_storage = NoProgress()
    s.persistence.diffbase_storage = NoDiffBase()
    s.watching.server_timeout = WATCH_SECONDS  # as the operator's watches
    s.watching.client_timeout = WATCH_SECONDS + 30
    # a per-object worker task lives this long after its last event (Kopf's default 5 s); longer
    # keeps the workers of a run's objects between its laps instead of starting new ones
    s.queueing.idle_timeout = float(os.environ.get(WORKER_IDLE_ENV, "5.0"))
    s.watching.label_selectors[("batch", "v1", "jobs")] = LABEL_RUN_UID
    s.watching.label_selectors[("", "v1", "pods")] = LABEL_RUN_UID
    s.watching.field_selectors[("", "v1", "pods")] = POD_EXITED
    return s


def kopf_side(ns: str, out: Path) -> None:
    import kopf

    from agentrun.controller.cache import TRANSFORMS
    from agentrun.controller.eventloop import operator_loop

    for name in ("kopf", "kopf.objects", "kopf.activities", "kopf.reactor", "kopf._core", "kopf._cogs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    queue, rec, _ = new_cache(out)
    counts: dict[str, int] = {}
    on_term(lambda: rec.dump({"counts": counts}))
    registry = kopf.OperatorRegistry()
    slim_job, slim_pod = TRANSFORMS["jobs"], TRANSFORMS["pods"]

    def stripped(raw: dict[str, Any]) -> dict[str, Any]:
        # the informer's strip() pops managedFields in place; Kopf keeps the raw body, so a copy
        meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k != "managedFields"}
        return {**raw, "metadata": meta}

    def typ(event: dict[str, Any]) -> str:
        return event.get("type") or "ADDED"  # None: seen by Kopf's initial listing

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> Any:  # a registry of its own has none of Kopf's default ones
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def _start(**_: Any) -> None:
        asyncio.get_running_loop().create_task(drain(queue, counts))

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def _runs(event: dict[str, Any], **_: Any) -> None:
        rec.event("runs", typ(event), stripped(event["object"]))

    @kopf.on.event("batch", "v1", "jobs", registry=registry)
    async def _jobs(event: dict[str, Any], **_: Any) -> None:
        rec.event("jobs", typ(event), slim_job(event["object"]))

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def _pods(event: dict[str, Any], **_: Any) -> None:
        rec.event("pods", typ(event), slim_pod(event["object"]))

    with operator_loop("uvloop") as (loop, _what):
        kopf.run(loop=loop, registry=registry, settings=kopf_settings(kopf), standalone=True, clusterwide=False,
                 namespaces=[ns])


def side_main(kind: str, ns: str, out: Path) -> None:
    logging.basicConfig(level=logging.WARNING)
    import gc

    gc.set_threshold(20_000)  # as `agentrun operator` does after its imports (both sides alike)
    if kind == "own":
        from agentrun.controller.eventloop import operator_loop

        with operator_loop("uvloop") as (loop, _what):
            assert loop is not None, "uvloop is not installed"
            loop.run_until_complete(own_side(ns, out))
    else:
        kopf_side(ns, out)


# ---------------------------------------------------------------------------------------- the stream


class Writer:
    """The API writes of the stream, on keep-alive HTTP connections (one per thread). Every write
    is logged as (kind, name, resourceVersion of the answer, time sent, what)."""

    def __init__(self, server: str, token: str, ca_file: str, ns: str) -> None:
        self.server, self.ns = server, ns
        self.headers = {"Authorization": f"Bearer {token}"}
        self.ca_file = ca_file
        self.local = threading.local()
        self.lock = threading.Lock()
        self.writes: list[tuple[str, str, str, float, str]] = []

    def _client(self) -> Any:
        import httpx

        c = getattr(self.local, "client", None)
        if c is None:
            c = self.local.client = httpx.Client(base_url=self.server, headers=self.headers, verify=self.ca_file,
                                                 timeout=60)
        return c

    def _send(self, kind: str, what: str, method: str, path: str, body: dict[str, Any],
              content_type: str = "application/json") -> dict[str, Any]:
        t = time.time()
        r = self._client().request(method, path, content=json.dumps(body),
                                   headers={"Content-Type": content_type})
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        doc: dict[str, Any] = r.json()
        meta = doc["metadata"]
        with self.lock:
            self.writes.append((kind, meta["name"], meta["resourceVersion"], t, what))
        return doc

    def runs_path(self, name: str | None = None, sub: str = "") -> str:
        p = f"/apis/{GROUP}/{VERSION}/namespaces/{self.ns}/{PLURAL}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create_run(self, name: str) -> dict[str, Any]:
        return self._send("runs", "create", "POST", self.runs_path(), run_doc(name))

    def patch_run_status(self, name: str, status: dict[str, Any], what: str) -> dict[str, Any]:
        return self._send("runs", what, "PATCH", self.runs_path(name, "status"), {"status": status},
                          "application/merge-patch+json")

    def annotate_run(self, name: str, key: str, value: str) -> dict[str, Any]:
        return self._send("runs", "annotate", "PATCH", self.runs_path(name),
                          {"metadata": {"annotations": {key: value}}}, "application/merge-patch+json")

    def lap(self, run: dict[str, Any], lap: int) -> None:
        """The writes of one lap of ``run`` (see the module docstring), in order."""
        name, uid = run["metadata"]["name"], run["metadata"]["uid"]
        job_name = f"{name}-l{lap}-a1"
        jobs = f"/apis/batch/v1/namespaces/{self.ns}/jobs"
        pods = f"/api/v1/namespaces/{self.ns}/pods"
        self.patch_run_status(name, run_status(lap, job_name), "lap start")
        self._send("jobs", "create", "POST", jobs, job_doc(job_name, run, lap))
        for step in ("active", "done"):
            self._send("jobs", step, "PATCH", f"{jobs}/{job_name}",
                       {"metadata": {"annotations": {"bench.agentrun.dev/step": step}}}, "application/merge-patch+json")
        pod = f"{job_name}-x{uuid.uuid4().hex[:5]}"
        self._send("pods", "create", "POST", pods, pod_doc(pod, job_name, uid))
        self._send("pods", "running", "PATCH", f"{pods}/{pod}/status", {"status": pod_status("Running")},
                   "application/merge-patch+json")
        self._send("pods", "succeeded", "PATCH", f"{pods}/{pod}/status", {"status": pod_status("Succeeded")},
                   "application/merge-patch+json")
        self.patch_run_status(name, run_status(lap, job_name, recorded=True), "lap recorded")


def run_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}, "spec": {
        "task": f"bench {name}",
        "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "done"}]},
                  "tools": [{"name": "note", "http": {"url": "http://127.0.0.1:9/note", "timeout": "20s"}}]},
        "budget": {"maxLaps": 1000}, "lapTimeout": "1800s",
        "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s", "factor": 2}}}}


def run_status(lap: int, job: str, recorded: bool = False) -> dict[str, Any]:
    """The run's status as the operator writes it when lap ``lap`` starts (its Job active) and when
    it is recorded (its checkpoint read: ``lap`` counted, no active Job); a merge patch."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if not recorded:
        return {"observedGeneration": 1, "phase": "Running", "lap": lap - 1,
                "activeJob": {"name": job, "lap": lap, "attempt": 1, "agentVersion": "v1", "startedAt": ts}}
    return {"lap": lap, "activeJob": None, "lastCheckpointTime": ts,
            "cost": {"usd": f"{0.004 * lap:.6f}", "inputTokens": 1000 * lap, "outputTokens": 100 * lap}}


def job_doc(name: str, run: dict[str, Any], lap: int) -> dict[str, Any]:
    """A lap Job of about the operator's size (its env carries the spec and the store), suspended."""
    meta = run["metadata"]
    labels = {"agentrun.dev/run": meta["name"], LABEL_RUN_UID: meta["uid"], "agentrun.dev/lap": str(lap),
              "agentrun.dev/attempt": "1", "app.kubernetes.io/managed-by": "agentrun"}
    env = [{"name": f"AGENTRUN_{k}", "value": v} for k, v in (
        ("RUN", meta["name"]), ("RUN_UID", meta["uid"]), ("NAMESPACE", meta["namespace"]), ("LAP", str(lap)),
        ("ATTEMPT", "1"), ("AGENT_VERSION", "v1"), ("CHECKPOINT_URI", f"s3://agentrun/bench/{meta['uid']}/"),
        ("S3_ENDPOINT", "http://127.0.0.1:9000"), ("S3_REGION", "us-east-1"), ("S3_PATH_STYLE", "true"),
        ("SPEC", json.dumps(run["spec"])), ("OTEL_SERVICE_NAME", "agentrun-lap"), ("LOG_FORMAT", "json"))]
    env += [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}},
            {"name": "AWS_SECRET_ACCESS_KEY",
             "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}}}]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": name, "labels": labels, "annotations": {"agentrun.dev/spec-hash": uuid.uuid4().hex},
        "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "name": meta["name"],
                             "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"suspend": True, "backoffLimit": 0, "activeDeadlineSeconds": 1800, "template": {
            "metadata": {"labels": labels}, "spec": {
                "restartPolicy": "Never", "serviceAccountName": "default", "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "lap", "image": "ghcr.io/agentrun/agentrun:bench",
                                "command": ["agentrun", "lap"], "env": env,
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                              "limits": {"memory": "512Mi"}},
                                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                    "capabilities": {"drop": ["ALL"]}}}]}}}}


def pod_doc(name: str, job: str, run_uid: str) -> dict[str, Any]:
    labels = {LABEL_RUN_UID: run_uid, "job-name": job, "batch.kubernetes.io/job-name": job}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "containers": [{"name": "lap", "image": "ghcr.io/agentrun/agentrun:bench", "command": ["agentrun", "lap"],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def pod_status(phase: str) -> dict[str, Any]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if phase == "Running":
        state: dict[str, Any] = {"running": {"startedAt": ts}}
    else:
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}}
    ready = "True" if phase == "Running" else "False"
    return {"phase": phase, "startTime": ts,
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": ts}],
            "containerStatuses": [{"name": "lap", "image": "ghcr.io/agentrun/agentrun:bench", "imageID": "",
                                   "ready": phase == "Running", "restartCount": 0, "started": phase == "Running",
                                   "state": state}]}


# ---------------------------------------------------------------------------------------- figures


def delays(writes: list[tuple[str, str, str, float, str]], stamps: list[list[Any]]) -> dict[tuple[str, str, str], float]:
    """(kind, name, resourceVersion) of each write -> seconds from its request sent to the side's
    stamp of the event with that version (writes the side was not sent, or missed, are absent)."""
    seen: dict[tuple[str, str, str], float] = {}
    for kind, _type, name, rv, t in stamps:
        seen.setdefault((kind, name, rv), t)
    return {(k, n, rv): seen[(k, n, rv)] - t for k, n, rv, t, _what in writes if (k, n, rv) in seen}


def side_figures(cpu: float, idle_rate: float, seconds: float, events: int, runs: int, laps: int,
                 rss_kb: int | None, hwm_kb: int | None, delay: list[float]) -> dict[str, Any]:
    """The figures of one side over one stream; CPU less its idle rate over the window."""
    net = max(0.0, cpu - idle_rate * seconds)
    out: dict[str, Any] = {
        "cpu_s": cpu, "idle_cpu_per_s": idle_rate, "cpu_net_s": net, "events": events,
        "cpu_per_event_us": net / events * 1e6 if events else None,
        "cpu_per_run_ms": net / runs * 1e3, "cpu_per_lap_ms": net / (runs * laps) * 1e3,
        "rss_mb": rss_kb / 1024 if rss_kb else None, "hwm_mb": hwm_kb / 1024 if hwm_kb else None,
    }
    if delay:
        s = summary(delay)
        out.update({"delay_p50_ms": s["p50"] * 1e3, "delay_p99_ms": s["p99"] * 1e3, "delay_n": s["n"]})
    return out


# ---------------------------------------------------------------------------------------- the run


def start_side(kind: str, ns: str, out: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "side", kind, ns, str(out)], env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_files(paths: list[Path], procs: list[subprocess.Popen[bytes]], timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not all(p.exists() for p in paths):
        if time.time() > end or any(p.poll() is not None for p in procs):
            raise SystemExit(f"{what}: not all sides got there ({[str(p) for p in paths if not p.exists()]})")
        time.sleep(0.1)


def kopf_marks(items: list[dict[str, Any]]) -> int:
    """Objects carrying anything of Kopf's (an annotation or finalizer of kopf.zalando.org)."""
    n = 0
    for obj in items:
        meta = obj.get("metadata") or {}
        if any("kopf.zalando.org" in k for k in meta.get("annotations") or {}) or \
                any("kopf.zalando.org" in f for f in meta.get("finalizers") or []):
            n += 1
    return n


def one_round(cluster: Any, workdir: Path, order: tuple[str, ...], runs: int, laps: int, rate: float,
              idle: float) -> dict[str, Any]:
    from e2e.cluster import Cluster

    assert isinstance(cluster, Cluster)
    ns = f"intake-{uuid.uuid4().hex[:5]}"
    cluster.kubectl_run("create", "namespace", ns)
    env = cluster.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT), env.get("PYTHONPATH", "")])
    outs = {k: workdir / f"{ns}-{k}.json" for k in order}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    writer = Writer(cluster.server, cluster.admin_token, cluster.ca_file, ns)
    try:
        for k in order:
            procs[k] = start_side(k, ns, outs[k], env, workdir / f"{ns}-{k}.log")
        time.sleep(5)  # both started their watches (the sentinel proves it below)
        writer.create_run(SENTINEL)
        wait_files([o.with_suffix(".ready") for o in outs.values()], list(procs.values()), 60, "sentinel")
        time.sleep(2)
        c0 = {k: proc_thread_cpu(p.pid) for k, p in procs.items()}
        t0 = time.time()
        time.sleep(idle)
        c1 = {k: proc_thread_cpu(p.pid) for k, p in procs.items()}
        idle_rate = {k: (cpu_between(c0[k], c1[k]) or 0.0) / (time.time() - t0) for k in procs}
        load_before = load_average()
        t_start = time.time()
        with cf.ThreadPoolExecutor(8) as pool:
            created = list(pool.map(writer.create_run, [f"r{i:04d}" for i in range(runs)]))
            futures = []
            period = 1.0 / rate
            nxt = time.time()
            for lap in range(1, laps + 1):
                for run in created:
                    nxt += period
                    wait = nxt - time.time()
                    if wait > 0:
                        time.sleep(wait)
                    futures.append(pool.submit(writer.lap, run, lap))
            for f in futures:
                f.result()
        t_written = time.time()
        writer.annotate_run(SENTINEL, END_ANNOTATION, "1")
        wait_files([o.with_suffix(".end") for o in outs.values()], list(procs.values()), 300, "end marker")
        time.sleep(3)
        c2 = {k: proc_thread_cpu(p.pid) for k, p in procs.items()}
        seconds = time.time() - t_start
        load_after = load_average()
        rss = {k: (proc_status_kb(p.pid), proc_status_kb(p.pid, "VmHWM")) for k, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGUSR1)  # dump and exit
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    marks = 0
    for res in (f"{GROUP}/{VERSION}/{PLURAL}", "batch/v1/jobs", "v1/pods"):
        prefix = "/api" if res.startswith("v1/") else "/apis"
        group_version, plural = res.rsplit("/", 1)
        doc = json.loads(cluster.kubectl_run("get", "--raw", f"{prefix}/{group_version}/namespaces/{ns}/{plural}").stdout)
        marks += kopf_marks(doc.get("items") or [])
    cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
    data = {k: json.loads(outs[k].read_text()) for k in order}
    writes = [w for w in writer.writes if w[1] != SENTINEL]
    # the writes both sides are sent: not the pods' create and Running (outside the field selector)
    common = [w for w in writes if not (w[0] == "pods" and w[4] in ("create", "running"))]
    result: dict[str, Any] = {"namespace": ns, "order": list(order), "runs": runs, "laps": laps, "rate": rate,
                              "writes": len(writes), "writes_sent_to_both": len(common),
                              "stream_seconds": t_written - t_start, "window_seconds": seconds,
                              "load_before": load_before, "load_after": load_after, "kopf_marked_objects": marks}
    for k in order:
        stamps = [s for s in data[k]["stamps"] if s[2] != SENTINEL and s[1] != "LISTED"]
        d = delays(common, stamps)
        cpu = cpu_between(c1[k], c2[k])
        fig = side_figures(cpu if cpu is not None else float("nan"), idle_rate[k], seconds, len(stamps), runs, laps,
                           rss[k][0], rss[k][1], list(d.values()))
        by_kind: dict[str, int] = {}
        for s in stamps:
            by_kind[s[0]] = by_kind.get(s[0], 0) + 1
        missed: dict[str, int] = {}
        for w in common:
            if (w[0], w[1], w[2]) not in d:
                missed[f"{w[0]} {w[4]}"] = missed.get(f"{w[0]} {w[4]}", 0) + 1
        fig.update({"events_by_kind": by_kind, "missed_by_write": missed, "events_per_lap": len(stamps) / (runs * laps),
                    "missed_writes": len({(w[0], w[1], w[2]) for w in common}) - len(d),
                    "writes_without_change": len(common) - len({(w[0], w[1], w[2]) for w in common}), "enqueue_causes": data[k]["causes"],
                    "reconciled": data[k]["counts"].get("reconciled", 0)})
        result[k] = fig
    return result


def table(rounds: list[dict[str, Any]]) -> str:
    rows = []
    for i, r in enumerate(rounds, 1):
        for k in SIDES:
            f = r[k]
            rows.append([i, k, f"{f['events']} ({f['events_per_lap']:.2f}/lap)", f"{f['cpu_per_event_us']:.0f} µs",
                         f"{f['cpu_per_run_ms']:.2f} ms", f"{f['cpu_per_lap_ms']:.2f} ms",
                         f"{f.get('delay_p50_ms', float('nan')):.1f} / {f.get('delay_p99_ms', float('nan')):.1f}",
                         f"{f['rss_mb']:.0f} / {f['hwm_mb']:.0f} MB", f["reconciled"], f["missed_writes"]])
    return markdown_table(["round", "side", "events", "CPU / event", "CPU / run", "CPU / lap",
                           "write → enqueue p50 / p99 ms", "RSS / peak", "keys reconciled", "writes missed"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    side = sub.add_parser("side", help="(internal) one side, until SIGTERM")
    side.add_argument("kind", choices=SIDES)
    side.add_argument("namespace")
    side.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--laps", type=int, default=3)
    ap.add_argument("--rate", type=float, default=10.0, help="laps started per second")
    ap.add_argument("--rounds", type=int, default=2, help="each in a new namespace, the sides' start order swapped")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured before the stream")
    ap.add_argument("--kopf-worker-idle", type=float, default=5.0,
                    help="Kopf's settings.queueing.idle_timeout (seconds a per-object worker outlives its last event)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "side":
        side_main(args.kind, args.namespace, args.out)
        return
    from e2e.cluster import start_cluster

    os.environ[WORKER_IDLE_ENV] = str(args.kopf_worker_idle)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="bench-kopf-intake-"))
    workdir.mkdir(parents=True, exist_ok=True)
    import kopf

    print(f"kopf {getattr(kopf, '__version__', '?')}; load before {load_average()}; dir {workdir}", flush=True)
    cluster = start_cluster(workdir / "kube", kubelet=False)
    rounds = []
    try:
        cluster.kubectl_run("apply", "-f", str(ROOT / "crds" / "agentrun.dev_agentruns.yaml"))
        cluster.kubectl_run("wait", "--for=condition=Established", "crd/agentruns.agentrun.dev", "--timeout=60s")
        for i in range(args.rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            r = one_round(cluster, workdir, order, args.runs, args.laps, args.rate, args.idle)
            rounds.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in SIDES}), flush=True)
            for k in SIDES:
                print(k, json.dumps(r[k]), flush=True)
    finally:
        cluster.stop()
    print(table(rounds))
    if args.json:
        args.json.write_text(json.dumps({"kopf": getattr(kopf, "__version__", None),
                                         "kopf_worker_idle": args.kopf_worker_idle, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
