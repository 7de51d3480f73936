"""Execute: a :class:`decide.Decision` -> requests to the API server and the checkpoint store.

Reads ``decide`` asks for (checkpoints, attempt reports, the store probe, a fork) go to the store;
writes go to the API server as few, small requests (the Job create, one JSON-patch of the status
guarded by the run's resourceVersion, deletes, Events). Every successful write's response is put
into the watch cache (:meth:`Cache.put`), so the next reconcile sees it and its watch event is
skipped.

The executor performs actions only: a write that does not go through is reported as a typed
setback (``decide.Refused``, ``Conflict``, ``Invalid``, ``NotStored``, ``StoreFailed``) to
:func:`decide.decide_after`, which decides the status, the Event and the backoff; the executor
performs that, and remembers the run's refusal streak (``Observed.refusal``) until a reconcile
succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from agentrun import metrics
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunSpec, RunSpecFields
from agentrun.api.status import StoreLocation
from agentrun.checkpoint.schema import RunRef
from agentrun.kube.client import EVENTS, JOBS, Client, path

from . import decide as d
from .cache import GROUP, RUNS, VERSION, Cache, Key
from .config import OperatorConfig
from .decide.jobs import RunIdentity, build_job, effective_endpoint, spec_json
from .decide.outcomes import pruned_field
from .events import EventBudget
from .logs import run_logger
from .memos import SpecMemo, put_bounded
from .rewinds import survey_rewind
from .tracing import OperatorSpans

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
class _Written:
    """What one execution wrote so far: the run's resourceVersion, whether it wrote the run or its
    Jobs, whether it deleted the run."""

    rv: str
    wrote: bool = False
    deleted: bool = False


@dataclass
class Outcome:
    """What one execution did: the requeue delay, and whether it wrote the run or its Jobs (the
    cache changed under ``decide``: the shell decides again)."""

    requeue: float | None = None
    wrote: bool = False


class Executor:
    def __init__(self, config: OperatorConfig, kube: Client, cache: Cache, specs: SpecMemo | None = None,
                 spans: OperatorSpans | None = None) -> None:
        self.config, self.kube, self.cache = config, kube, cache
        self._stores: dict[tuple[Any, ...], Any] = {}
        self.specs = specs if specs is not None else SpecMemo()  # the controller's parsed specs, their lap JSON
        self._refusals: dict[Key, str] = {}
        """The last refused status write per run (its message): ONE Warning Event per refusal."""
        self.events = EventBudget()  # the routine Events' rate limit per run (events.py)
        self._agents: dict[tuple[str, str], Any] = {}  # (run uid, digest) -> its pinned ResolvedAgent
        self.spans = spans
        """The operator's spans (the reconciler's exporter): the lap spans of killed attempts."""

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
        (:class:`~agentrun.controller.memos.SpecMemo` shares one parsed spec while the run's spec
        JSON is unchanged)."""
        return self.specs.text(key, spec, spec_json)

    async def aclose(self) -> None:
        """Close the checkpoint stores' connections."""
        for store in self._stores.values():
            await asyncio.to_thread(store.close)
        self._stores = {}

    def warm(self) -> None:
        """Load, at start-up and in a thread, what the first checkpoint read loads (botocore, an S3
        client of the configured store, the record models), which the first lap after a restart
        would otherwise wait for. Best effort: a failure here is the first read's to report."""
        try:
            from agentrun.checkpoint.schema import LapRecord
            from agentrun.checkpoint.store import StoreConfig, make_client

            LapRecord.model_rebuild()
            if self.config.checkpoint_uri:
                make_client(StoreConfig(uri=self.config.checkpoint_uri, endpoint_url=self.config.s3_endpoint,
                                        region=self.config.s3_region, path_style=self.config.s3_path_style))
        except Exception as exc:  # noqa: BLE001
            log.debug("warm-up of the checkpoint client skipped: %s", exc)

    def store(self, spec: RunSpecFields, loc: StoreLocation) -> Any:
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
        """``store.get_lap`` (the GET, its verification and decoding) in a worker thread: the
        event loop goes on with every other reconcile, watch and Lease renewal meanwhile."""
        return await asyncio.to_thread(store.get_lap, run, lap)

    async def pinned_agent(self, o: d.Observed, run: RunRef, spec: RunSpecFields) -> d.PinnedAgentRead | None:
        """The run's pinned Agent copy (``status.agent.digest``): from memory, read once per digest
        (and run) from the store after that; None for a run that has none."""
        from agentrun.checkpoint import errors as ce

        pin = o.status.agent
        if pin is None:
            return None
        mkey = (run.uid, pin.digest)
        hit = self._agents.get(mkey)
        if hit is not None:
            return d.PinnedAgentRead(pin.digest, "ok", hit)
        try:
            resolved = await asyncio.to_thread(self.store(spec, where(o)).get_agent, run, pin.digest)
        except (ce.CorruptCheckpoint, ce.CheckpointNotFound, ce.UnsupportedSchemaVersion) as exc:
            return d.PinnedAgentRead(pin.digest, "unreadable", error=str(exc))
        except (ce.CheckpointError, ValueError) as exc:
            return d.PinnedAgentRead(pin.digest, "unavailable", error=str(exc))
        put_bounded(self._agents, mkey, resolved, 10_000)
        return d.PinnedAgentRead(pin.digest, "ok", resolved)

    async def read(self, o: d.Observed, decision: d.Decision, run: RunRef, spec: RunSpecFields | None) -> d.Observed:
        from agentrun.checkpoint import errors as ce

        assert spec is not None
        try:
            store = self.store(spec, where(o))
        except ValueError as exc:  # no store configured, or an unusable one: say so, do not loop
            if decision.of(d.ProbeStore):
                return replace(o, store_probe=d.StoreProbeRead("invalid", detail=str(exc).splitlines()[-1].strip()))
            raise
        loc = store_location(store.config)
        lc = o.status.lifecycle
        store = store.along(lc.rewinds if lc is not None else ())  # each lap in its history (a rewind in place)
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
            elif isinstance(a, d.ReadRewind):
                o = replace(o, rewind=await asyncio.to_thread(survey_rewind, store, run, a, loc))
            elif isinstance(a, d.ProbeStore):
                o = replace(o, store_probe=await asyncio.to_thread(probe_store, store))
            elif isinstance(a, d.StoreAgent):
                try:
                    await asyncio.to_thread(store.put_agent, run, a.resolved)
                    pr = d.PinnedAgentRead(a.digest, "ok", a.resolved)
                    put_bounded(self._agents, (run.uid, a.digest), a.resolved, 10_000)
                except ce.CorruptCheckpoint as exc:
                    pr = d.PinnedAgentRead(a.digest, "unreadable", error=str(exc))
                except ce.CheckpointError as exc:
                    pr = d.PinnedAgentRead(a.digest, "unavailable", error=str(exc))
                o = replace(o, agent_pinned=pr)
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
        """Perform ``decision``; when a write of it does not go through, perform what
        :func:`decide.decide_after` says of that setback (the status, the Event, the backoff)."""
        w = _Written(rv=body["metadata"]["resourceVersion"])
        key = (o.namespace, o.name)
        for _ in range(3):  # a setback's follow-up ends in a requeue, a backoff or what is left of the decision
            setback = await self.perform(body, o, decision, run, spec, w)
            if setback is None:
                return Outcome(requeue=decision.requeue_after, wrote=w.wrote and not w.deleted)
            decision = d.decide_after(replace(o, refusal=self._refusals.get(key)), decision, setback)
            if all(isinstance(a, d.RequeueAfter) for a in decision.actions):
                run_logger(*key).info("run changed while reconciling; reconciling again")
        raise RuntimeError(f"the follow-up of a setback had a setback again: {setback}")

    async def perform(self, body: dict[str, Any], o: d.Observed, decision: d.Decision, run: RunRef,
                      spec: AgentRunSpec | None, w: _Written) -> d.Setback | None:
        """Perform ``decision``'s actions in order, up to the first write the API server or the store
        does not take: that one is returned (the rest not performed), for ``decide_after``. ``w``:
        the run's resourceVersion as written, and whether anything was."""
        from kubernetes.client.exceptions import ApiException

        ns, name = o.namespace, o.name
        key = (ns, name)
        rlog = run_logger(ns, name)
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
        for a in decision.of(d.CreateJob):
            a = testfault.create_job(a) if testfault else a  # tests only: lose-decision
            alog = run_logger(ns, name, a.lap, a.attempt)
            assert spec is not None
            try:
                job = build_job(RunIdentity(ns, name, o.uid), spec, a.lap, a.attempt, a.agent_version, self.config,
                                approval=a.approval, store=a.store, spec_text=self.spec_text(key, spec),
                                address_rules=o.policy_check.rules if o.policy_check is not None else None,
                                queue_name=a.queue_name,
                                rewinds=tuple(o.status.lifecycle.rewinds) if o.status.lifecycle is not None else ())
                await self.write("jobs", (ns, a.name), "POST", path(JOBS, ns), body=job)
                if testfault and (dup := testfault.second_job(job)):  # tests only: double-job
                    await self.write("jobs", (ns, dup["metadata"]["name"]), "POST", path(JOBS, ns), body=dup)
                w.wrote = True
                alog.info("created lap Job %s (agent %s)", a.name, a.agent_version)
            except ApiException as exc:
                if exc.status == 409:
                    alog.info("lap Job %s exists already: adopted", a.name)
                elif exc.status in (400, 403, 422, 429) or (exc.status or 0) >= 500:
                    return d.Refused(a, exc.status, exc.reason, exc.body)
                else:
                    raise
            except ValueError as exc:
                return d.Invalid(a, str(exc))
        # The run's writes in the Decision's order (Decision.writes): a decision that is not recorded
        # (stray, refused, stale) leaves the annotations BEFORE the status asks anything new.
        for wr in decision.writes():
            if isinstance(wr, d.RemoveAnnotations):
                meta: dict[str, Any] = {"annotations": {k: None for k in wr.keys}}
                if wr.before_status:  # guarded: the status that follows was decided on what we read
                    meta["resourceVersion"] = w.rv
                try:
                    stored = await self.write("runs", key, "PATCH", run_path, body={"metadata": meta},
                                               content_type="application/merge-patch+json")
                except ApiException as exc:
                    if exc.status == 409 and wr.before_status:
                        rlog.info("run changed while reconciling; reconciling again")
                        return d.Conflict(wr)
                    raise
                w.rv = self._wrote_run(stored, w.rv)
                w.wrote = True
                continue
            wire = wr.status.model_dump(by_alias=True, exclude_none=True, mode="json")
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": w.rv},
                {"op": "add", "path": "/status", "value": wire},
            ]
            try:
                stored = await self.write("runs", key, "PATCH", path(RUNS, ns, name, "status"), body=patch,
                                           content_type="application/json-patch+json")
            except ApiException as exc:
                if wr.best_effort:  # the Event beside it says the same
                    rlog.info("the status does not say so (HTTP %s): the Event does", exc.status)
                    continue
                if exc.status in (400, 403, 409, 422):  # refused, or changed since we read it
                    return d.Refused(wr, exc.status, exc.reason, exc.body)
                raise
            w.rv = self._wrote_run(stored, w.rv)
            if not wr.best_effort:
                w.wrote = True
                missing = pruned_field(wire, stored.get("status") if isinstance(stored, dict) else None)
                if missing is not None:
                    return d.NotStored(missing)
            # a run of an Agent: its budget and retry are the effective ones (the Agent's, the run's fields over them)
            metrics.observe_run(ns, name, spec.to_api() if o.request is not None and spec is not None
                                else body.get("spec") or {}, wire)
            if wr.status.phase != o.status.phase:
                rlog.info("phase %s -> %s: %s", o.status.phase, wr.status.phase, wr.status.message)
        for a in decision.of(d.DeleteCheckpoints):
            try:
                assert spec is not None
                n = await asyncio.to_thread(self.store(spec, where(o)).delete_run, run)
                rlog.info("retention Delete: deleted %d checkpoint objects", n)
            except Exception as exc:  # the store away: decide_after says what the run does
                return d.StoreFailed(a, str(exc))
        fins = list(body["metadata"].get("finalizers") or [])
        for a in decision.actions:
            if isinstance(a, (d.AddFinalizer, d.RemoveFinalizer)):
                fins = [f for f in fins if f != a.name]
                if isinstance(a, d.AddFinalizer):
                    fins.append(a.name)
                stored = await self.write("runs", key, "PATCH", run_path, body={"metadata": {"finalizers": fins}},
                                           content_type="application/merge-patch+json")
                w.rv = self._wrote_run(stored, w.rv)
                w.wrote = True
        status = decision.status
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
                if a.lost_span is not None and self.spans is not None:  # the attempt did not send its lap span
                    self.spans.lost_lap(o.uid, ns, name, a.lap, a.reason, a.lost_span)
        for a in decision.of(d.DeleteRun):  # spec.ttlSecondsAfterFinished passed: after its Event
            try:
                await self.call("DELETE", run_path, body={
                    "kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"uid": o.uid, "resourceVersion": w.rv}})
                rlog.info("deleted the finished run (ttlSecondsAfterFinished=%ds)", a.ttl_seconds)
            except ApiException as exc:
                if exc.status == 409:  # changed since we read it (e.g. a new ttl): decide again
                    return d.Conflict(a)
                if exc.status != 404:
                    raise
            w.deleted = True  # nothing left to decide about
        for a in decision.of(d.Backoff):
            if self._refusals.get(key) == a.streak:
                rlog.debug("%s again: %s", a.reason, a.message)
            self._refusals[key] = a.streak
            raise (StatusRefused if a.reason == Reason.STATUS_UPDATE_REFUSED else RetryWithBackoff)(a.message)
        return None

    @staticmethod
    def _wrote_run(stored: Any, rv: str) -> str:
        if isinstance(stored, dict):
            return str((stored.get("metadata") or {}).get("resourceVersion", rv))
        return rv

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
