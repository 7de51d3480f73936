"""Execute: a :class:`decide.Decision` -> requests to the API server and the checkpoint store.

Reads ``decide`` asks for (checkpoints, attempt reports, the store probe, a fork) go to the store;
writes go to the API server as few, small requests (the Job create, one JSON-patch of the status
guarded by the run's resourceVersion, deletes, Events). Every successful write's response is put
into the watch cache (:meth:`Cache.put`), so the next reconcile sees it and its watch event is
skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn

from agentrun import metrics
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, StoreLocation
from agentrun.checkpoint.s3get import Got
from agentrun.checkpoint.schema import RunRef
from agentrun.kube.client import EVENTS, JOBS, Client, path

from . import decide as d
from .as3 import AsyncS3Get
from .cache import GROUP, RUNS, VERSION, Cache, Key
from .config import OperatorConfig
from .events import EventBudget
from .jobs import RunIdentity, build_job, effective_endpoint, spec_json
from .logs import run_logger
from .observe import SpecMemo

try:  # the test-fault switch (docs/chaos.md, "Negative control"): not in the wheel, so absent from the image
    from agentrun import testfault
except ImportError:  # the product: every hook below is inert
    testfault = None  # type: ignore[assignment]

log = logging.getLogger("agentrun.controller")


class RetryWithBackoff(Exception):
    """The reconcile cannot go on now (a write refused, the store away): the run is retried with
    its rate-limited backoff, quietly (the Event, if any, was posted once)."""


class StatusRefused(RetryWithBackoff):
    """The API server refused a status write for good: the reconcile failed (backoff, one Event)."""


#: Streak markers kept in ``Executor._refusals`` (a refused status write keeps its message there).
JOB_DEFERRED, DELETE_DEFERRED = "\0JobRefused", "\0CheckpointDeleteFailed"
#: Stored bytes of a lap record the operator decodes on its event loop; a bigger one is decoded in a
#: worker thread (a typical record is a few kB; the store's bound is hundreds of MB).
INLINE_DECODE_BYTES = 256 * 1024


def job_refusal(status: int, body: str | bytes | None, reason: str | None) -> tuple[bool, str]:
    """Whether a refused Job create is worth retrying (a ResourceQuota exceeded, the API server
    throttling or failing: 429, 5xx), and what the API server said (bounded, naming the field or
    the quota). Anything else (422 Invalid, an admission policy's denial) refuses the Job itself."""
    text = status_refusal(status, body) if status not in (409,) else None
    if text is None or text == f"HTTP {status}":
        text = d.shown(f"HTTP {status} {reason or ''}".strip(), 600)[1:-1]
    # the ResourceQuota admission's refusals: over the quota, or its usage not computed yet (a new quota)
    quota = status == 403 and ("exceeded quota" in text or "status unknown for quota" in text)
    transient = status == 429 or status >= 500 or quota
    return transient, text


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


def pruned_field(sent: Any, stored: Any, path_: str = "status") -> str | None:
    """The first field of ``sent`` that the API server did not store (a CRD older than the operator
    prunes unknown fields silently), else None."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return path_
        for k, v in sent.items():
            if k not in stored:
                return f"{path_}.{k}"
            found = pruned_field(v, stored[k], f"{path_}.{k}")
            if found:
                return found
    return None


def probe_store(store: Any) -> d.StoreProbeRead:
    """The store's conditional-write verdict (checkpoint/probe.py; cached per endpoint and bucket
    for the life of the process, so a run's reconciles do not probe again)."""
    from agentrun.checkpoint.errors import CheckpointError
    from agentrun.checkpoint.probe import PROBES, store_where

    try:
        result = PROBES.check(store)
    except CheckpointError as exc:
        return d.StoreProbeRead("unavailable", store_where(store.config), store.config.bucket, str(exc))
    return d.StoreProbeRead("ok" if result.safe else "unsafe", result.endpoint, result.bucket, result.detail)


def store_location(config: Any) -> dict[str, Any]:
    """Where the store is, for status.checkpoint (so `agentrun trace` can find it): the endpoint
    only when it carries no credentials in its URL."""
    from urllib.parse import urlsplit

    endpoint = config.endpoint_url
    if endpoint and (urlsplit(endpoint).username or urlsplit(endpoint).password):
        endpoint = None
    return {"endpoint": endpoint, "region": config.region, "path_style": config.path_style}


def where(o: d.Observed) -> StoreLocation:
    """The run's store: pinned in status (or, for a run of an earlier release not pinned yet, from
    its records); the current resolution only for a run that never used one."""
    loc = d.pinned_store(o.status, o.namespace, o.name, o.uid, o.jobs, o.resolved_store) or o.resolved_store
    if loc is None:
        raise ValueError(o.store_error or "the run has no checkpoint store")
    return loc


@dataclass
class Outcome:
    """What one execution did: the requeue delay, and whether it wrote the run or its Jobs (the
    cache changed under ``decide``: the shell decides again)."""

    requeue: float | None = None
    wrote: bool = False


class Executor:
    def __init__(self, config: OperatorConfig, kube: Client, cache: Cache, specs: SpecMemo | None = None) -> None:
        self.config, self.kube, self.cache = config, kube, cache
        self.s3 = AsyncS3Get()  # the lap record's GET on the event loop
        self._stores: dict[tuple[Any, ...], Any] = {}
        self.specs = specs if specs is not None else SpecMemo()  # the controller's parsed specs, their lap JSON
        self._refusals: dict[Key, str] = {}
        """The last refused status write per run (its message): ONE Warning Event per refusal."""
        self.events = EventBudget()  # the routine Events' rate limit per run (events.py)

    def forget(self, key: Key) -> None:
        self._refusals.pop(key, None)
        self.specs.forget(key)
        self.events.forget(key)

    def succeeded(self, key: Key) -> None:
        self._refusals.pop(key, None)

    async def call(self, method: str, path_: str, **kw: Any) -> Any:
        """One request to the API server."""
        return await self.kube.request(method, path_, **kw)

    async def write(self, kind: str, key: Key, method: str, path_: str, **kw: Any) -> Any:
        """A write of one cached object: its response goes into the cache, and the watch event of
        the write (its echo, possibly arriving before the response) enqueues nothing."""
        self.cache.begin_write(kind, key)
        stored = None
        try:
            stored = await self.call(method, path_, **kw)
        finally:
            self.cache.end_write(kind, key, stored if isinstance(stored, dict) else None)
        return stored

    # ---------------------------------------------------------------- store reads

    def spec_text(self, key: Key, spec: AgentRunSpec) -> str:
        """``jobs.spec_json(spec)``, made again only when the run's parsed spec is another object
        (:class:`~agentrun.controller.observe.SpecMemo` shares one parsed spec while the run's spec
        JSON is unchanged)."""
        return self.specs.text(key, spec, spec_json)

    async def aclose(self) -> None:
        await self.s3.close()

    def warm(self) -> None:
        """Load, at start-up and in a thread, what the first checkpoint read loads (botocore, an S3
        client of the configured store, the record models): ~0.1 s of CPU the first lap after a
        restart would otherwise wait for. Best effort: a failure here is the first read's to report."""
        try:
            from agentrun.checkpoint.schema import LapRecord
            from agentrun.checkpoint.store import StoreConfig, make_client

            LapRecord.model_rebuild()
            if self.config.checkpoint_uri:
                make_client(StoreConfig(uri=self.config.checkpoint_uri, endpoint_url=self.config.s3_endpoint,
                                        region=self.config.s3_region, path_style=self.config.s3_path_style))
        except Exception as exc:  # noqa: BLE001
            log.debug("warm-up of the checkpoint client skipped: %s", exc)

    def store(self, spec: AgentRunSpec, loc: StoreLocation) -> Any:
        """The checkpoint store at the run's pinned location (status.store)."""
        from agentrun.checkpoint.store import CheckpointStore, StoreConfig

        endpoint = effective_endpoint(loc, spec, self.config)
        key = (loc.uri, endpoint, loc.region, loc.path_style)
        store = self._stores.get(key)
        if store is None:  # the config is validated (pydantic) once per store, not per reconcile
            store = self._stores[key] = CheckpointStore(StoreConfig(
                uri=loc.uri, endpoint_url=endpoint, region=loc.region, path_style=loc.path_style,
                snapshot_every=spec.checkpoint.snapshot_every))
        return store

    async def _get_lap(self, store: Any, run: RunRef, lap: int) -> Any:
        """``store.get_lap``: its lean GET on the loop (:class:`AsyncS3Get`) where the store has
        one, the record then decoded here; else, or when that GET leaves the request to botocore,
        the whole read in a worker thread."""
        lean = getattr(store, "lean_get", None)
        if lean is None:
            return await asyncio.to_thread(store.get_lap, run, lap)
        fetched = await self.s3.get(lean, store.lap_key(run, lap))
        if fetched is None:
            return await asyncio.to_thread(store.get_lap, run, lap, lean=False)
        if isinstance(fetched, Got) and len(fetched.body) > INLINE_DECODE_BYTES:
            # a big record (up to the store's bound) is decoded and validated in a thread: on the
            # loop it would hold up every reconcile, watch and Lease renewal meanwhile
            return await asyncio.to_thread(store.get_lap, run, lap, fetched=fetched)
        return store.get_lap(run, lap, fetched=fetched)

    async def read(self, o: d.Observed, decision: d.Decision, run: RunRef, spec: AgentRunSpec | None) -> d.Observed:
        from agentrun.checkpoint import errors as ce

        assert spec is not None
        try:
            store = self.store(spec, where(o))
        except ValueError as exc:  # no store configured, or an unusable one: say so, do not loop
            if decision.of(d.ProbeStore):
                return replace(o, store_probe=d.StoreProbeRead("invalid", detail=str(exc).splitlines()[-1].strip()))
            raise
        loc = store_location(store.config)
        for a in decision.actions:
            if isinstance(a, d.ReadCheckpoint):
                try:
                    record, stored = await self._get_lap(store, run, a.lap)
                    cp = d.CheckpointRead(
                        lap=a.lap, kind="ok", record=record, key=stored.key, sha256=stored.sha256,
                        written_at=stored.written_at, uri=f"s3://{store.config.bucket}/{stored.key}", size=stored.size,
                        **loc,
                    )
                except ce.CheckpointNotFound as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="missing", error=str(exc))
                except (ce.CorruptCheckpoint, ce.UnsupportedSchemaVersion) as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="unreadable", error=str(exc))
                except ce.CheckpointError as exc:
                    cp = d.CheckpointRead(lap=a.lap, kind="unavailable", error=str(exc))
                o = replace(o, checkpoint=cp)
            elif isinstance(a, d.ProbeStore):
                o = replace(o, store_probe=await asyncio.to_thread(probe_store, store))
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
                        written_at=stored.written_at, uri=f"s3://{store.config.bucket}/{stored.key}", **loc,
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

    # ---------------------------------------------------------------- writes

    async def execute(self, body: dict[str, Any], o: d.Observed, decision: d.Decision, run: RunRef,
                      spec: AgentRunSpec | None) -> Outcome:
        from kubernetes.client.exceptions import ApiException

        ns, name = o.namespace, o.name
        key = (ns, name)
        rlog = run_logger(ns, name)
        out = Outcome(requeue=decision.requeue_after)
        rv = body["metadata"]["resourceVersion"]
        run_path = path(RUNS, ns, name)
        # Jobs first: a lost status write is repaired by adopting the Job (deterministic name).
        for a in decision.of(d.DeleteJob):
            try:
                opts: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
                if a.grace_seconds is not None:
                    opts["gracePeriodSeconds"] = a.grace_seconds
                await self.call("DELETE", path(JOBS, ns, a.name), body=opts)
                rlog.info("deleted stray Job %s", a.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        status = decision.status
        for a in decision.of(d.CreateJob):
            a = testfault.create_job(a) if testfault else a  # tests only: lose-decision
            alog = run_logger(ns, name, a.lap, a.attempt)
            assert spec is not None
            try:
                job = build_job(RunIdentity(ns, name, o.uid), spec, a.lap, a.attempt, a.agent_version, self.config,
                                approval=a.approval, store=a.store, spec_text=self.spec_text(key, spec),
                                address_rules=o.policy_check.rules if o.policy_check is not None else None)
                await self.write("jobs", (ns, a.name), "POST", path(JOBS, ns), body=job)
                if testfault and (dup := testfault.second_job(job)):  # tests only: double-job
                    await self.write("jobs", (ns, dup["metadata"]["name"]), "POST", path(JOBS, ns), body=dup)
                out.wrote = True
                alog.info("created lap Job %s (agent %s)", a.name, a.agent_version)
            except ApiException as exc:
                if exc.status == 409:
                    alog.info("lap Job %s exists already: adopted", a.name)
                elif exc.status in (400, 403, 422, 429) or (exc.status or 0) >= 500:
                    transient, why = job_refusal(exc.status, exc.body, exc.reason)
                    if transient:  # a quota, the API server busy: retry with the run's backoff; the
                        # status says so and one Event, once per streak
                        text = f"the lap Job {a.name} was refused by the API server (retrying with backoff): {why}"
                        await self._deferred(body, key, JOB_DEFERRED, Reason.JOB_REFUSED, text,
                                             status=d.deferred_status(o, Reason.JOB_REFUSED, text))
                    status = d.failed_status(o, status, Reason.JOB_REFUSED,
                                             f"the lap Job was refused by the API server: {why}")
                    decision.actions.append(d.Event("Warning", Reason.JOB_REFUSED, status.message or ""))
                else:
                    raise
            except ValueError as exc:
                status = d.failed_status(o, status, Reason.INVALID_CONFIGURATION, str(exc))
                decision.actions.append(d.Event("Warning", Reason.INVALID_CONFIGURATION, str(exc)))
        # The run's writes in the Decision's order (Decision.writes): a decision that is not recorded
        # (stray, refused, stale) leaves the annotations BEFORE the status asks anything new.
        writes = decision.writes()
        if status is not None and not decision.of(d.PatchStatus):  # the shell's own (a refused Job)
            writes.insert(sum(1 for w in writes if isinstance(w, d.RemoveAnnotations) and w.before_status),
                          d.PatchStatus(status))
        for w in writes:
            if isinstance(w, d.RemoveAnnotations):
                meta: dict[str, Any] = {"annotations": {k: None for k in w.keys}}
                if w.before_status:  # guarded: the status that follows was decided on what we read
                    meta["resourceVersion"] = rv
                try:
                    stored = await self.write("runs", key, "PATCH", run_path, body={"metadata": meta},
                                               content_type="application/merge-patch+json")
                except ApiException as exc:
                    if exc.status == 409 and w.before_status:
                        rlog.info("run changed while reconciling; reconciling again")
                        return Outcome(requeue=0.2, wrote=out.wrote)
                    raise
                rv = self._wrote_run(stored, rv)
                out.wrote = True
                continue
            assert status is not None
            wire = status.model_dump(by_alias=True, exclude_none=True, mode="json")
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": "/status", "value": wire},
            ]
            try:
                stored = await self.write("runs", key, "PATCH", path(RUNS, ns, name, "status"), body=patch,
                                           content_type="application/json-patch+json")
            except ApiException as exc:
                refusal = status_refusal(exc.status, exc.body) if exc.status in (400, 403, 422) else None
                if refusal is None and exc.status in (409, 422):  # changed since we read it: decide again
                    rlog.info("run changed while reconciling; reconciling again")
                    return Outcome(requeue=0.2, wrote=out.wrote)
                if refusal is None:
                    raise
                await self._status_refused(body, key, f"the API server refused the status update: {refusal}")
            if isinstance(stored, dict):
                rv = (stored.get("metadata") or {}).get("resourceVersion", rv)
            out.wrote = True
            missing = pruned_field(patch[1]["value"], stored.get("status") if isinstance(stored, dict) else None)
            if missing is not None:
                await self._status_refused(
                    body, key, f"the API server did not store {missing}: the AgentRun CRD is older than the "
                    "operator; apply the CRD of this release")
            metrics.observe_run(ns, name, body.get("spec") or {}, wire)
            if status.phase != o.status.phase:
                rlog.info("phase %s -> %s: %s", o.status.phase, status.phase, status.message)
        if decision.of(d.DeleteCheckpoints):
            try:
                assert spec is not None
                n = await asyncio.to_thread(self.store(spec, where(o)).delete_run, run)
                rlog.info("retention Delete: deleted %d checkpoint objects", n)
            except Exception as exc:  # the store away: one Event per failure streak, the run's backoff
                await self._deferred(body, key, DELETE_DEFERRED, Reason.CHECKPOINT_DELETE_FAILED,
                                     f"cannot delete checkpoints yet: {d.shown(str(exc), 600)[1:-1]}")
        fins = list(body["metadata"].get("finalizers") or [])
        for a in decision.actions:
            if isinstance(a, (d.AddFinalizer, d.RemoveFinalizer)):
                fins = [f for f in fins if f != a.name]
                if isinstance(a, d.AddFinalizer):
                    fins.append(a.name)
                stored = await self.write("runs", key, "PATCH", run_path, body={"metadata": {"finalizers": fins}},
                                           content_type="application/merge-patch+json")
                rv = self._wrote_run(stored, rv)
                out.wrote = True
        for a in decision.actions:
            if isinstance(a, d.Event):
                if self.events.allow(key, a.reason):
                    await self.event(body, a.type, a.reason, a.message)
                else:
                    metrics.event_suppressed(a.reason)
                lap = a.lap if a.lap is not None else (status.lap if status else o.status.lap)
                run_logger(ns, name, lap, a.attempt).log(
                    logging.WARNING if a.type == "Warning" else logging.INFO, "%s: %s", a.reason, a.message)
            elif isinstance(a, d.LapFinished):
                metrics.lap_finished(ns, name, a.outcome, a.duration_seconds, a.checkpoint_bytes)
            elif isinstance(a, d.LapRetried):
                metrics.lap_retried(ns, name, a.reason)
        for a in decision.of(d.DeleteRun):  # spec.ttlSecondsAfterFinished passed: after its Event
            try:
                await self.call("DELETE", run_path, body={
                    "kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"uid": o.uid, "resourceVersion": rv}})
                rlog.info("deleted the finished run (ttlSecondsAfterFinished=%ds)", a.ttl_seconds)
            except ApiException as exc:
                if exc.status == 409:  # changed since we read it (e.g. a new ttl): decide again
                    return Outcome(requeue=0.2, wrote=out.wrote)
                if exc.status != 404:
                    raise
            out.wrote = False  # nothing left to decide about
        return out

    @staticmethod
    def _wrote_run(stored: Any, rv: str) -> str:
        if isinstance(stored, dict):
            return str((stored.get("metadata") or {}).get("resourceVersion", rv))
        return rv

    async def _status_refused(self, body: dict[str, Any], key: Key, message: str) -> NoReturn:
        """A status write refused for good (not a conflict): nothing after it is done this pass (no
        annotation removed, no Event of the decision: the status does not hold it), ONE Warning Event
        per distinct refusal, and the worker retries with the run's exponential backoff."""
        rlog = run_logger(*key)
        if self._refusals.get(key) != message:
            self._refusals[key] = message
            rlog.warning("StatusUpdateRefused: %s", message)
            await self.event(body, "Warning", Reason.STATUS_UPDATE_REFUSED, message)
        else:
            rlog.debug("status update refused again: %s", message)
        raise StatusRefused(message)

    async def _deferred(self, body: dict[str, Any], key: Key, streak: str, reason: str, message: str,
                        status: AgentRunStatus | None = None) -> NoReturn:
        """A write that must wait (a quota, the API server or the store away): nothing after it is
        done this pass, ONE Warning Event (and log line) per failure streak (until the run's next
        successful reconcile), after ``status`` (what the run's status says meanwhile) is written,
        and the worker retries with the run's exponential backoff."""
        rlog = run_logger(*key)
        if self._refusals.get(key) != streak:
            self._refusals[key] = streak
            rlog.warning("%s: %s", reason, message)
            if status is not None:
                await self._say_in_status(body, key, status)
            await self.event(body, "Warning", reason, message)
        else:
            rlog.debug("%s again: %s", reason, message)
        raise RetryWithBackoff(message)

    async def _say_in_status(self, body: dict[str, Any], key: Key, status: AgentRunStatus) -> None:
        """Write ``status`` (the run waits on something outside the decision), guarded by the run's
        resourceVersion; best effort: a refused or conflicting write is logged, the Event says it."""
        from kubernetes.client.exceptions import ApiException

        wire = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": body["metadata"]["resourceVersion"]},
                 {"op": "add", "path": "/status", "value": wire}]
        try:
            await self.write("runs", key, "PATCH", path(RUNS, *key, "status"), body=patch,
                             content_type="application/json-patch+json")
        except ApiException as exc:
            run_logger(*key).info("the status does not say so (HTTP %s): the Event does", exc.status)
            return
        metrics.observe_run(*key, body.get("spec") or {}, wire)

    async def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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
            await self.call("POST", path(EVENTS, meta["namespace"]), body=event)
        except ApiException as exc:  # events are best effort
            log.warning("cannot post event %s: %s", reason, exc.reason)
