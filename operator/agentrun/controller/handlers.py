"""Kopf handlers: a thin I/O shell around :func:`agentrun.controller.decide.decide`.

Design: level-based and timer/daemon-free. Kopf's watches only *enqueue* a run:
``@kopf.on.event`` for AgentRuns and for the lap Jobs (mapped to their owner). A reconcile reads
the run fresh from the API server, lists its Jobs (deterministic names, so a Job that finished
while the operator was down is found), asks ``decide`` what to do, performs the actions, and
schedules itself again for backoffs and approval deadlines (``RequeueAfter``). A periodic resync
reconciles every run as a safety net. No state is kept in memory: an operator restart resumes
every run from its status. Only the holder of the Lease (``lease.py``) acts.

Kopf keeps no progress/diff-base state for these handlers (no on.create/update handlers), and it
is configured to store any it would need in annotations, never in the pruned status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn

import kopf
import pydantic

from agentrun import metrics
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, StoreLocation
from agentrun.api.types import parse_time
from agentrun.checkpoint.schema import RunRef

from . import decide as d
from .config import OperatorConfig
from .jobs import (
    ANNOTATION_AGENT_VERSION,
    ANNOTATION_APPROVAL,
    LABEL_ATTEMPT,
    LABEL_LAP,
    LABEL_RUN_UID,
    RunIdentity,
    build_job,
    effective_endpoint,
    job_name,
    resolve_store,
    store_of_env,
)
from .lease import LeaseElector
from .logs import run_logger

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
#: Threads for the blocking API-server and S3 calls of reconciles (the loop's default executor).
RECONCILE_THREADS = 32
#: Per-run exponential backoff after a failed reconcile or a refused status write: first, cap.
ERROR_BACKOFF_SECONDS = (5.0, 300.0)
log = logging.getLogger("agentrun.controller")


def _now() -> datetime:
    return datetime.now(UTC)


def spec_error_text(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"spec.{loc}: {err.get('msg')}" if loc else f"spec: {err.get('msg')}")
    return "; ".join(parts)


def _job_state(job: dict[str, Any]) -> tuple[str, str | None]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return "succeeded", None
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return "failed", cond.get("reason")
    return "active", None


def _pod_exit(pods: list[dict[str, Any]]) -> tuple[int | None, str | None]:
    """Exit code and reason of the (newest) finished pod of a Job."""
    pods = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    for pod in reversed(pods):
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term:
                reason = status.get("reason") or term.get("reason")
                return term.get("exitCode"), reason
        if status.get("reason"):
            return None, status.get("reason")
    return None, None


def _newest_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Job's most recently created pod (the attempt's pod, when the Job made more than one)."""
    return max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", default=None)


def _pod_failure_message(pods: list[dict[str, Any]], limit: int = 600) -> str | None:
    """The lap runner's own failure message from the newest pod's termination message (the
    log tail, terminationMessagePolicy FallbackToLogsOnError): the ``error`` of its last "lap failed"
    / "lap configuration refused" JSON line. Already redacted by the runner. It names the failure
    when the runner could not write its attempt report (e.g. the store refused its credentials)."""
    pod = _newest_pod(pods)
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        for line in reversed(str(term.get("message") or "").splitlines()):
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") in ("lap failed", "lap configuration refused") and entry.get("error"):
                text = str(entry["error"])
                return text if len(text) <= limit else text[: limit - 1] + "…"
    return None


def _pod_waiting(pods: list[dict[str, Any]]) -> tuple[str | None, str | None, str | None]:
    """(waiting reason, message, pod creationTimestamp) of the newest pod of a Job whose container
    has not started, else (None, None, None). The messages name Secrets and keys, never values."""
    pod = _newest_pod(pods)
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            created = ((pod or {}).get("metadata") or {}).get("creationTimestamp")
            return waiting["reason"], waiting.get("message"), created
    return None, None, None


class StatusRefused(Exception):
    """The API server refused a status write for good: the reconcile failed (backoff, one Event)."""


def status_refusal(status: int, body: str | bytes | None) -> str | None:
    """Why the API server refused a status write for good (validation, admission, authorization),
    naming the fields from its error; None for a conflict (409, or the 422 of a failed json-patch
    ``test`` of the resourceVersion, which carries no details): then the run changed, read again."""
    if status == 409:
        return None
    try:
        doc = json.loads(body or "{}")
    except (TypeError, ValueError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    details = doc.get("details") or {}
    if status == 422 and not details:
        return None
    causes = [c for c in details.get("causes") or [] if isinstance(c, dict) and c.get("field") not in (None, "<nil>")]
    if causes:
        text = "; ".join(f"{c.get('field')}: {c.get('message') or c.get('reason')}" for c in causes[:4])
    else:
        text = str(doc.get("message") or f"HTTP {status}")
    return d.shown(text, 600)[1:-1]


def pruned_field(sent: Any, stored: Any, path: str = "status") -> str | None:
    """The first field of ``sent`` that the API server did not store (a CRD older than the operator
    prunes unknown fields silently), else None."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return path
        for k, v in sent.items():
            if k not in stored:
                return f"{path}.{k}"
            found = pruned_field(v, stored[k], f"{path}.{k}")
            if found:
                return found
    return None


@dataclass
class Controller:
    config: OperatorConfig
    elector: LeaseElector | None = None

    def __post_init__(self) -> None:
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._timer_due: dict[tuple[str, str], float] = {}
        self._running: dict[tuple[str, str], asyncio.Task] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._stores: dict[tuple, Any] = {}
        self._failures: dict[tuple[str, str], int] = {}
        """Consecutive failed reconciles (errors, refused status writes) per run: the backoff."""
        self._refusals: dict[tuple[str, str], str] = {}
        """The last refused status write per run (its message): ONE Warning Event per refusal."""
        self._tasks: list[asyncio.Task] = []
        self.ready = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        from kubernetes import config as kconfig

        try:
            kconfig.load_incluster_config()
        except kconfig.ConfigException:
            kconfig.load_kube_config()
        from kubernetes import client

        # Reconciles block in threads on API-server and S3 calls: size the pool for that I/O, not
        # for the CPUs (asyncio's default, min(32, CPUs + 4), is 6 threads on 2 CPUs, and 50 busy
        # runs queued for tens of seconds behind them).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=RECONCILE_THREADS, thread_name_prefix="reconcile"))
        # One API client, one connection pool (as large as the thread pool), for every call of this
        # process: an API object created without one builds its own client, i.e. a new TLS
        # connection per call.
        conf = client.Configuration.get_default_copy()
        conf.connection_pool_maxsize = RECONCILE_THREADS
        client.ApiClient.set_default(client.ApiClient(conf))
        cfg = self.config
        if self.elector is None:
            self.elector = LeaseElector(cfg.lease_name, cfg.lease_namespace, cfg.identity,
                                        cfg.lease_duration_seconds, on_acquire=self.resync,
                                        on_lose=metrics.clear_runs)
        self._tasks.append(asyncio.create_task(self.elector.run()))
        self._tasks.append(asyncio.create_task(self._resync_loop()))
        self.ready = True

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for h in self._timers.values():
            h.cancel()
        if self.elector is not None:
            await self.elector.release()

    @property
    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            try:
                await self.resync()
            except Exception as exc:
                log.warning("resync failed: %s", exc)

    async def resync(self) -> None:
        """Reconcile every run (on becoming leader, and periodically)."""
        if not self.is_leader:
            return
        from kubernetes import client

        api = client.CustomObjectsApi()
        items: list[dict[str, Any]] = []
        if self.config.namespaces:
            for ns in self.config.namespaces:
                items += (await asyncio.to_thread(api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL))["items"]
        else:
            items = (await asyncio.to_thread(api.list_cluster_custom_object, GROUP, VERSION, PLURAL))["items"]
        for it in items:
            self.enqueue(it["metadata"]["namespace"], it["metadata"]["name"])

    # ---------------------------------------------------------------- scheduling

    def enqueue(self, namespace: str, name: str, delay: float = 0.0) -> None:
        key = (namespace, name)
        loop = asyncio.get_running_loop()
        if delay > 0:
            due = loop.time() + delay
            if key in self._timers and self._timer_due[key] <= due:
                return
            if key in self._timers:
                self._timers[key].cancel()
            self._timers[key] = loop.call_later(delay, self._fire, key)
            self._timer_due[key] = due
            return
        if key in self._running:
            self._dirty.add(key)
            return
        self._running[key] = asyncio.create_task(self._worker(key))

    def _fire(self, key: tuple[str, str]) -> None:
        self._timers.pop(key, None)
        self._timer_due.pop(key, None)
        self.enqueue(*key)

    def _backoff(self, key: tuple[str, str]) -> float:
        """The delay before the next try after the n-th consecutive failure of ``key``: 5 s doubling,
        capped at 5 min."""
        n = self._failures[key] = self._failures.get(key, 0) + 1
        first, cap = ERROR_BACKOFF_SECONDS
        return min(cap, first * 2 ** min(n - 1, 16))

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self._failures.pop(key, None)
        self._refusals.pop(key, None)
        h = self._timers.pop(key, None)
        self._timer_due.pop(key, None)
        if h:
            h.cancel()

    async def _worker(self, key: tuple[str, str]) -> None:
        try:
            while True:
                self._dirty.discard(key)
                if not self.is_leader:  # a standby does nothing, and counts no reconcile
                    break
                started = time.monotonic()
                result = "success"
                try:
                    delay = await self.reconcile(*key)
                    self._failures.pop(key, None)
                    self._refusals.pop(key, None)
                    if delay is not None:
                        result = "requeue"
                        self.enqueue(*key, delay=delay)
                except StatusRefused:  # one Event was posted; retry with the run's backoff, quietly
                    result = "error"
                    self.enqueue(*key, delay=self._backoff(key))
                except Exception as exc:  # never crash: log, count, retry later (per-run backoff)
                    result = "error"
                    run_logger(*key).error("reconcile failed: %s", exc, exc_info=True)
                    self.enqueue(*key, delay=self._backoff(key))
                metrics.reconcile_finished(result, time.monotonic() - started)
                if key not in self._dirty:
                    break
        finally:
            self._running.pop(key, None)

    # ---------------------------------------------------------------- reconcile

    def _store(self, spec: AgentRunSpec, where: StoreLocation) -> Any:
        """The checkpoint store at the run's pinned location (status.store)."""
        from agentrun.checkpoint.store import CheckpointStore, StoreConfig

        sc = StoreConfig(
            uri=where.uri,
            endpoint_url=effective_endpoint(where, spec, self.config),
            region=where.region,
            path_style=where.path_style,
            snapshot_every=spec.checkpoint.snapshot_every,
        )
        key = (sc.uri, sc.endpoint_url, sc.region, sc.path_style)
        if key not in self._stores:
            self._stores[key] = CheckpointStore(sc)
        return self._stores[key]

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """One reconcile of one run. Returns the requeue delay, if any."""
        if not self.is_leader:
            return None
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        custom = client.CustomObjectsApi()
        try:
            body = await asyncio.to_thread(custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        meta = body["metadata"]
        uid = meta["uid"]
        rlog = run_logger(namespace, name)
        spec, spec_error = None, None
        try:
            spec = AgentRunSpec.model_validate(body.get("spec") or {})
        except pydantic.ValidationError as exc:
            spec_error = spec_error_text(exc)
        try:
            status = AgentRunStatus.model_validate(body.get("status") or {})
        except pydantic.ValidationError as exc:
            rlog.error("status unreadable, starting from an empty status: %s", spec_error_text(exc))
            status = AgentRunStatus()
        # decide() reads exit codes only of the run's current attempt (recorded or about to be
        # adopted): list pods for those alone, so a reconcile's API calls don't grow with the
        # finished Jobs a long run keeps.
        current = {job_name(name, uid, *d.next_lap_attempt(status))}
        if status.active_job is not None:
            current.add(status.active_job.name)
        jobs = await self._observe_jobs(namespace, uid, current)
        resolved, store_error = None, None
        if spec is not None:
            try:
                resolved = resolve_store(spec, self.config)
            except (ValueError, pydantic.ValidationError) as exc:
                store_error = str(exc)
        observed = d.Observed(
            namespace=namespace, name=name, uid=uid, generation=int(meta.get("generation") or 1),
            spec=spec, spec_error=spec_error, status=status, now=_now(),
            pod_config_grace_seconds=self.config.pod_config_grace_seconds,
            resolved_store=resolved, store_error=store_error,
            annotations=dict(meta.get("annotations") or {}), finalizers=tuple(meta.get("finalizers") or ()),
            deleting=bool(meta.get("deletionTimestamp")), jobs=tuple(jobs),
        )
        run = RunRef(namespace=namespace, name=name, uid=uid)
        decision = d.decide(observed)
        for _ in range(3):
            if not decision.needs_read:
                break
            observed = await self._read(observed, decision, run, spec)
            decision = d.decide(observed)
        if decision.needs_read:
            raise RuntimeError("decide kept asking for reads")
        return await self._execute(body, observed, decision, run, spec)

    async def _observe_jobs(self, namespace: str, uid: str, current: set[str]) -> list[d.ObservedJob]:
        from kubernetes import client

        batch, core = client.BatchV1Api(), client.CoreV1Api()
        api_client = client.ApiClient.get_default()

        async def job_pods(job: str) -> list[dict[str, Any]]:
            pods = await asyncio.to_thread(core.list_namespaced_pod, namespace, label_selector=f"job-name={job}")
            return api_client.sanitize_for_serialization(pods)["items"]

        resp = await asyncio.to_thread(batch.list_namespaced_job, namespace, label_selector=f"{LABEL_RUN_UID}={uid}")
        out = []
        for job_obj in resp.items:
            job = api_client.sanitize_for_serialization(job_obj)
            meta = job["metadata"]
            labels = meta.get("labels") or {}
            try:
                lap, attempt = int(labels[LABEL_LAP]), int(labels[LABEL_ATTEMPT])
            except (KeyError, ValueError):
                continue
            state, job_reason = _job_state(job)
            exit_code = reason = message = None
            if state != "active" and meta["name"] in current:
                pod_items = await job_pods(meta["name"])
                exit_code, reason = _pod_exit(pod_items)
                message = _pod_failure_message(pod_items) if exit_code not in (None, 0, 3) else None
                if job_reason == "DeadlineExceeded":
                    reason = "DeadlineExceeded: the lap ran longer than spec.lapTimeout"
                elif reason is None:
                    reason = job_reason if exit_code is None else None
                if exit_code is None and reason == "BackoffLimitExceeded":
                    reason = "PodGone: the lap pod was deleted or lost"
            waiting: tuple[str | None, str | None, Any] = (None, None, None)
            if state == "active" and meta["name"] in current and not (job.get("status") or {}).get("ready"):
                # a pod that does not run yet: is it stuck on its configuration (a missing Secret)?
                waiting = _pod_waiting(await job_pods(meta["name"]))
            started = (job.get("status") or {}).get("startTime") or meta.get("creationTimestamp")
            pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec") or {})
            containers = pod_spec.get("containers") or [{}]
            out.append(d.ObservedJob(
                name=meta["name"], lap=lap, attempt=attempt, state=state, exit_code=exit_code, reason=reason,
                message=message,
                agent_version=(meta.get("annotations") or {}).get(ANNOTATION_AGENT_VERSION),
                started_at=parse_time(started),
                waiting_reason=waiting[0], waiting_message=waiting[1], waiting_since=parse_time(waiting[2]),
                approval=(meta.get("annotations") or {}).get(ANNOTATION_APPROVAL),
                store=store_of_env(containers[0].get("env") or []),
            ))
        return out

    @staticmethod
    def _where(o: d.Observed) -> StoreLocation:
        """The run's store: pinned in status (or, for a run of an earlier release not pinned yet, from
        its records); the current resolution only for a run that never used one."""
        where = d.pinned_store(o.status, o.namespace, o.name, o.uid, o.jobs, o.resolved_store) or o.resolved_store
        if where is None:
            raise ValueError(o.store_error or "the run has no checkpoint store")
        return where

    async def _read(self, o: d.Observed, decision: d.Decision, run: RunRef, spec: AgentRunSpec | None) -> d.Observed:
        from agentrun.checkpoint import errors as ce

        assert spec is not None
        try:
            store = self._store(spec, self._where(o))
        except ValueError as exc:  # no store configured, or an unusable one: say so, do not loop
            if decision.of(d.ProbeStore):
                return replace(o, store_probe=d.StoreProbeRead("invalid", detail=str(exc).splitlines()[-1].strip()))
            raise
        where = _store_location(store.config)
        for a in decision.actions:
            if isinstance(a, d.ReadCheckpoint):
                try:
                    record, stored = await asyncio.to_thread(store.get_lap, run, a.lap)
                    cp = d.CheckpointRead(
                        lap=a.lap, kind="ok", record=record, key=stored.key, sha256=stored.sha256,
                        written_at=stored.written_at, uri=f"s3://{store.config.bucket}/{stored.key}", size=stored.size, **where,
                    )
                except ce.CheckpointNotFound as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="missing", error=str(exc))
                except (ce.CorruptCheckpoint, ce.UnsupportedSchemaVersion) as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="unreadable", error=str(exc))
                except ce.CheckpointError as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="unavailable", error=str(exc))
                o = replace(o, checkpoint=cp)
            elif isinstance(a, d.ProbeStore):
                o = replace(o, store_probe=await asyncio.to_thread(_probe_store, store))
            elif isinstance(a, d.ReadAttemptFailure):
                try:
                    report = await asyncio.to_thread(store.get_attempt_failure, run, a.lap, a.attempt)
                except ce.CheckpointError as exc:
                    report = {"message": f"(failure report unreadable: {exc})"}
                o = replace(o, attempt_failure=d.AttemptFailureRead(a.lap, a.attempt, report))
            elif isinstance(a, d.ForkCheckpoint):
                source = RunRef(namespace=run.namespace, name=a.source_name, uid=a.source_uid)
                try:
                    state, stored = await asyncio.to_thread(store.fork, source, a.lap, run)
                    fr = d.ForkRead(
                        lap=a.lap, kind="ok", state=state, key=stored.key, sha256=stored.sha256,
                        written_at=stored.written_at, uri=f"s3://{store.config.bucket}/{stored.key}", **where,
                    )
                except ce.CheckpointNotFound as exc:
                    fr = d.ForkRead(lap=a.lap, kind="missing", error=str(exc))
                except (ce.CorruptCheckpoint, ce.UnsupportedSchemaVersion) as exc:
                    fr = d.ForkRead(lap=a.lap, kind="unreadable", error=str(exc))
                except ce.CheckpointError as exc:
                    fr = d.ForkRead(lap=a.lap, kind="unavailable", error=str(exc))
                except ValueError as exc:  # a source name/uid that cannot be a key
                    fr = d.ForkRead(lap=a.lap, kind="unreadable", error=str(exc))
                o = replace(o, fork=fr)
        return o

    async def _execute(self, body: dict[str, Any], o: d.Observed, decision: d.Decision, run: RunRef,
                       spec: AgentRunSpec | None) -> float | None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        ns, name = o.namespace, o.name
        batch, custom = client.BatchV1Api(), client.CustomObjectsApi()
        rlog = run_logger(ns, name)
        requeue = decision.requeue_after
        # Jobs first: a lost status write is repaired by adopting the Job (deterministic name).
        for a in decision.of(d.DeleteJob):
            try:
                await asyncio.to_thread(batch.delete_namespaced_job, a.name, ns, propagation_policy="Background")
                rlog.info("deleted stray Job %s", a.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        status = decision.status
        for a in decision.of(d.CreateJob):
            alog = run_logger(ns, name, a.lap, a.attempt)
            assert spec is not None
            try:
                job = build_job(RunIdentity(ns, name, o.uid), spec, a.lap, a.attempt, a.agent_version, self.config,
                                approval=a.approval, store=a.store)
                await asyncio.to_thread(batch.create_namespaced_job, ns, job)
                alog.info("created lap Job %s (agent %s)", a.name, a.agent_version)
            except ApiException as exc:
                if exc.status == 409:
                    alog.info("lap Job %s exists already: adopted", a.name)
                elif exc.status in (400, 403, 422):
                    status = _failed(o, status, "JobRefused", f"the lap Job was refused by the API server: {exc.reason}")
                    decision.actions.append(d.Event("Warning", "JobRefused", status.message or ""))
                else:
                    raise
            except ValueError as exc:
                status = _failed(o, status, "InvalidConfiguration", str(exc))
                decision.actions.append(d.Event("Warning", "InvalidConfiguration", str(exc)))
        if status is not None:
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": body["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/status", "value": status.model_dump(by_alias=True, exclude_none=True, mode="json")},
            ]
            key = (ns, name)
            try:
                stored = await asyncio.to_thread(
                    custom.patch_namespaced_custom_object_status, GROUP, VERSION, ns, PLURAL, name, patch,
                    _content_type="application/json-patch+json")
            except ApiException as exc:
                refusal = status_refusal(exc.status, exc.body) if exc.status in (400, 403, 422) else None
                if refusal is None and exc.status in (409, 422):  # changed since we read it (e.g. a decision): redo
                    rlog.info("run changed while reconciling; reconciling again")
                    return 0.2
                if refusal is None:
                    raise
                return await self._status_refused(body, key, f"the API server refused the status update: {refusal}")
            missing = pruned_field(patch[1]["value"], (stored or {}).get("status") if isinstance(stored, dict) else None)
            if missing is not None:
                return await self._status_refused(
                    body, key, f"the API server did not store {missing}: the AgentRun CRD is older than the "
                    "operator; apply the CRD of this release")
            metrics.observe_run(ns, name, body.get("spec") or {}, status.model_dump(by_alias=True, exclude_none=True, mode="json"))
            if status.phase != o.status.phase:
                rlog.info("phase %s -> %s: %s", o.status.phase, status.phase, status.message)
        for a in decision.of(d.RemoveAnnotations):
            await asyncio.to_thread(custom.patch_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name,
                                    {"metadata": {"annotations": {k: None for k in a.keys}}})
        if decision.of(d.DeleteCheckpoints):
            try:
                assert spec is not None
                n = await asyncio.to_thread(self._store(spec, self._where(o)).delete_run, run)
                rlog.info("retention Delete: deleted %d checkpoint objects", n)
            except Exception as exc:
                rlog.warning("retention Delete: cannot delete checkpoints yet: %s", exc)
                await self._event(body, "Warning", "CheckpointDeleteFailed", f"cannot delete checkpoints yet: {exc}")
                return 10.0
        for a in decision.actions:
            if isinstance(a, (d.AddFinalizer, d.RemoveFinalizer)):
                fins = [f for f in (body["metadata"].get("finalizers") or []) if f != a.name]
                if isinstance(a, d.AddFinalizer):
                    fins.append(a.name)
                await asyncio.to_thread(custom.patch_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name,
                                        {"metadata": {"finalizers": fins}})
        for a in decision.actions:
            if isinstance(a, d.Event):
                await self._event(body, a.type, a.reason, a.message)
                lap = a.lap if a.lap is not None else (status.lap if status else o.status.lap)
                run_logger(ns, name, lap, a.attempt).log(
                    logging.WARNING if a.type == "Warning" else logging.INFO, "%s: %s", a.reason, a.message)
            elif isinstance(a, d.LapFinished):
                metrics.lap_finished(ns, name, a.outcome, a.duration_seconds, a.checkpoint_bytes)
            elif isinstance(a, d.LapRetried):
                metrics.lap_retried(ns, name, a.reason)
        for a in decision.of(d.DeleteRun):  # spec.ttlSecondsAfterFinished passed: after its Event
            try:
                await asyncio.to_thread(custom.delete_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name,
                                        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(
                                            uid=o.uid, resource_version=body["metadata"]["resourceVersion"])))
                rlog.info("deleted the finished run (ttlSecondsAfterFinished=%ds)", a.ttl_seconds)
            except ApiException as exc:
                if exc.status == 409:  # changed since we read it (e.g. a new ttl): decide again
                    return 0.2
                if exc.status != 404:
                    raise
        return requeue

    async def _status_refused(self, body: dict[str, Any], key: tuple[str, str], message: str) -> NoReturn:
        """A status write refused for good (not a conflict): nothing after it is done this pass (no
        annotation removed, no Event of the decision: the status does not hold it), ONE Warning Event
        per distinct refusal, and the worker retries with the run's exponential backoff."""
        rlog = run_logger(*key)
        if self._refusals.get(key) != message:
            self._refusals[key] = message
            rlog.warning("StatusUpdateRefused: %s", message)
            await self._event(body, "Warning", "StatusUpdateRefused", message)
        else:
            rlog.debug("status update refused again: %s", message)
        raise StatusRefused(message)

    async def _event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        meta = body["metadata"]
        now = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name'][:200]}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": "agentrun-operator"},
            "reportingComponent": "agentrun.dev/operator",
            "reportingInstance": self.config.identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await asyncio.to_thread(client.CoreV1Api().create_namespaced_event, meta["namespace"], event)
        except ApiException as exc:  # events are best effort
            log.warning("cannot post event %s: %s", reason, exc.reason)


def _probe_store(store: Any) -> d.StoreProbeRead:
    """The store's conditional-write verdict (checkpoint/probe.py; cached per endpoint and bucket
    for the life of the process, so a run's reconciles do not probe again)."""
    from agentrun.checkpoint.errors import CheckpointError
    from agentrun.checkpoint.probe import PROBES, store_where

    try:
        result = PROBES.check(store)
    except CheckpointError as exc:
        return d.StoreProbeRead("unavailable", store_where(store.config), store.config.bucket, str(exc))
    return d.StoreProbeRead("ok" if result.safe else "unsafe", result.endpoint, result.bucket, result.detail)


def _store_location(config: Any) -> dict[str, Any]:
    """Where the store is, for status.checkpoint (so `agentrun trace` can find it): the endpoint
    only when it carries no credentials in its URL."""
    from urllib.parse import urlsplit

    endpoint = config.endpoint_url
    if endpoint and (urlsplit(endpoint).username or urlsplit(endpoint).password):
        endpoint = None
    return {"endpoint": endpoint, "region": config.region, "path_style": config.path_style}


def _failed(o: d.Observed, status: AgentRunStatus | None, reason: str, message: str) -> AgentRunStatus:
    ctx = d._Ctx(o)
    if status is not None:
        ctx.st = status.model_copy(deep=True)
    ctx.phase("Failed", reason, message)
    ctx.st.observed_generation = o.generation
    return ctx.st


# ---------------------------------------------------------------------------- Kopf wiring


def exact_namespaces(namespaces: tuple[str, ...] | list[str]) -> bool:
    """True when ``namespaces`` is a non-empty list of plain names (no Kopf glob or negation)."""
    return bool(namespaces) and all(
        ns and not ns.startswith("!") and not any(ch in ns for ch in "*?[]") for ns in namespaces)

CONTROLLER: Controller | None = None


def _controller() -> Controller:
    assert CONTROLLER is not None, "the controller was not started"
    return CONTROLLER


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global CONTROLLER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.agentrun.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "kopf.agentrun.dev/finalizer"
    settings.posting.enabled = False  # Events are posted by the controller, with our reasons
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    if CONTROLLER is None:
        CONTROLLER = Controller(OperatorConfig.from_env())
    if exact_namespaces(CONTROLLER.config.namespaces):
        # Exact namespace names: nothing to discover. Without this Kopf lists and watches
        # namespaces (and CRDs) cluster-wide, which a namespaced RBAC does not grant: a string of
        # 403s and ~55 s before the AgentRun watch starts.
        settings.scanning.disabled = True
    await CONTROLLER.start()


@kopf.on.cleanup()
async def _cleanup(**_: Any) -> None:
    if CONTROLLER is not None:
        await CONTROLLER.stop()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def _on_run(type: str | None, name: str, namespace: str, **_: Any) -> None:
    c = _controller()
    if type == "DELETED":
        c.forget(namespace, name)
        metrics.forget_run(namespace, name)
        return
    c.enqueue(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_RUN_UID: kopf.PRESENT})
async def _on_job(body: kopf.Body, namespace: str, **_: Any) -> None:
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == "AgentRun" and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            _controller().enqueue(namespace, ref["name"])
