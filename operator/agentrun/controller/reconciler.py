"""The reconciler: watch cache -> work queue -> (observe, decide, execute) per run, only on the
holder of the Lease.

Level-based: a reconcile reads the run and its Jobs from the watch cache (no request), asks
:func:`decide.decide` what to do, and executes it. When the execution wrote the run or created
a Job, the new state is already in the cache (write-through) and ``decide`` is asked again in the
same reconcile, until nothing is written (at most :data:`MAX_PASSES`): the events of those writes
are skipped by the cache. Backoffs and deadlines come back as delayed adds; errors and refused
status writes as rate-limited adds (per-run exponential backoff). A periodic resync re-queues every
cached run as a safety net. An operator restart resumes every run from its status.

Of the pods, only the lap pods that exited 0 are watched (the lap is over: ``cache.py``). A
reconcile reads the pods of a failed current Job (its exit code and
termination message name the cause). A pod stuck on its configuration (a missing Secret) shows as a
Job that stays active and not ready: a timer per active Job (:class:`PodCheck`) reads its pods once
``pod_config_grace_seconds`` have passed since its creation and the Job is still not ready, then
again after a delay doubling from the grace while it stays so (every grace, at most 15 s, while a
configuration problem shows), and queues the run only when what the pods show changed. The checks
come due on a 5-second grid and the reads due together go out as one LIST per namespace
(``podreads.PodReads``). A lap that starts within the grace costs no read and no reconcile; the Job
becoming ready queues the run (the cache watches that Job's readiness once its pods were read).

Two more parts read watches, not the API: the tenancy re-check (``tenancy.PolicyStore``, fed by
informers of namespaces, admission bindings and AgentRunPolicies; a change queues the live runs it
applies to) and the notifier (``agentrun.notify``), which takes the runs waiting on an approval or
with an outcome to announce from the cache (a snapshot taken on the event loop), the outcomes a
namespace's AgentRunPolicies choose from the PolicyStore (a policy's change indexes its namespaces'
finished runs again), and records its deliveries through the cache's own-write path, so their
watch echoes queue no reconcile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic

from agentrun import metrics
from agentrun.api.agent import AgentDefinitionSpec, AgentProblem, ResolvedAgent, ResolveError, effective_spec, resolve
from agentrun.api.contract import LABEL_RUN_UID
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunManifestSpec, AgentRunSpec
from agentrun.api.status import TERMINAL_PHASES, AgentRunStatus
from agentrun.api.types import parse_time
from agentrun.checkpoint.schema import RunRef
from agentrun.kube.client import JOBS, PODS, Client, load_api_client, path
from agentrun.kube.informer import Informer, rv_int, strip
from agentrun.kube.lease import KubeLeaseAPI, LeaseElector
from agentrun.kube.queue import WorkQueue
from agentrun.notify.plan import namespace_outcomes
from agentrun.notify.sender import from_env as notify_from_env

from . import decide as d
from .cache import POD_EXITED, RESOURCES, RUNS, TRANSFORMS, Cache, Key
from .config import OperatorConfig
from .decide.kueue import is_held
from .decide.observe import (
    current_jobs,
    job_state,
    needs_pod_read,
    observe,
    parse_run,
    pod_check_due,
    pod_waiting,
    spec_error_text,
)
from .decide.queue import NO_GROUP, Group, Limits, group_of, order_key, place, slot_state
from .execute import Executor, Outcome, RetryWithBackoff
from .kueueview import WorkloadView
from .logs import run_logger
from .memos import JobMemo, SpecMemo, put_bounded
from .podreads import PodReads
from .podreads import selector as pod_selector
from .policycheck import PolicyCheck, wanted
from .tenancy import KINDS as TENANCY_KINDS
from .tenancy import NAMESPACES, PolicyStore
from .tracing import OperatorSpans, pass_attributes, spans_from_env

log = logging.getLogger("agentrun.controller")

#: Threads for the blocking S3 calls of reconciles (the loop's default executor).
RECONCILE_THREADS = 32
#: Concurrent reconciles (of different runs: one run is never reconciled twice at once).
WORKERS = 32
#: Decide/execute passes of one reconcile while each pass writes (then the key is queued again).
MAX_PASSES = 4
#: How long the notifier thread waits for the event loop (a snapshot of the cache, a status write).
NOTIFIER_LOOP_TIMEOUT = 60.0
#: How often a replica whose watch cache has not synced says which lists fail.
UNSYNCED_WARNING_SECONDS = 30.0
#: How long the API server may refuse (401, 403) the list or watch of runs or Jobs of a replica
#: whose cache had listed before it steps down from the Lease (its cache no longer moves; a standby
#: with its access acts) and stops campaigning until it lists again.
REFUSED_STEP_DOWN_SECONDS = 30.0
#: Longest wait between two pod reads of an active Job that stays not ready past the grace (the
#: delay doubles from the grace; at least :data:`POD_CHECK_MIN_SECONDS`), and the longest while its
#: pod shows a configuration problem (to follow the kubelet's message: another Secret or key).
POD_CHECK_MAX_SECONDS, POD_CHECK_MIN_SECONDS, POD_PROBLEM_CHECK_SECONDS = 300.0, 1.0, 15.0
#: Pod checks come due on this grid of the loop's clock, and the reads asked for within
#: :data:`POD_READ_WINDOW_SECONDS` of each other go out as one LIST per namespace (``podreads``).
POD_CHECK_GRID_SECONDS, POD_READ_WINDOW_SECONDS = 5.0, 0.2
#: How often the keys dropped while not acting are looked at (queued again once this replica acts);
#: only while there are such keys (an idle operator sets no timer for them).
NOT_LEADER_RECHECK_SECONDS = 1.0


@dataclass
class PodCheck:
    """The pod checks of one active Job that is not ready (see the module docstring)."""

    run: Key
    reads: int = 0  # reads that showed no configuration problem (the backoff)
    problem: tuple[str | None, str | None] | None = None  # (waiting reason, message) last shown
    pending: asyncio.TimerHandle | asyncio.Task[None] | None = None


def namespace_matcher(patterns: tuple[str, ...] | list[str]) -> Any:
    """Kopf's namespace patterns: globs, ``!glob`` excludes; none: every namespace."""
    incl = [p for p in patterns if not p.startswith("!")]
    excl = [p[1:] for p in patterns if p.startswith("!")]

    def allowed(ns: str) -> bool:
        if incl and not any(fnmatch.fnmatchcase(ns, p) for p in incl):
            return False
        return not any(fnmatch.fnmatchcase(ns, p) for p in excl)

    return allowed


def exact_namespaces(namespaces: tuple[str, ...] | list[str]) -> bool:
    """True when ``namespaces`` is a non-empty list of plain names (no Kopf glob or negation)."""
    return bool(namespaces) and all(
        ns and not ns.startswith("!") and not any(ch in ns for ch in "*?[]") for ns in namespaces)


@dataclass
class Controller:
    config: OperatorConfig
    elector: LeaseElector | None = None
    #: Called once the watch cache has listed everything (the process's garbage-collector freeze,
    #: gcpolicy.after_sync, set by ``agentrun operator``; tests leave it None).
    on_synced: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.queue: WorkQueue[Key] = WorkQueue(observer=metrics.WORKQUEUE)
        metrics.WORKQUEUE.watch(lambda: self.queue.depth, lambda: self.queue.delayed)
        allowed = self._allowed = namespace_matcher(self.config.namespaces)
        self._observed_jobs = JobMemo()  # each Job as decide sees it while the cache holds the same object
        self.cache = Cache(on_change=lambda k: self.queue.add(k) if allowed(k[0]) else None,
                           on_deleted=self.forget, on_awaiting=self._approval_pending,
                           on_job_gone=self._observed_jobs.forget)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.kube: Client | None = None  # the API-server client (made in start)
        self.executor: Executor | None = None
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._synced = asyncio.Event()
        self._pod_reads: dict[Key, int | None] = {}  # Job -> its version whose pods were read
        self._job_reads: dict[Key, int | None] = {}  # Job -> run version for which it was looked up
        self._pod_checks: dict[Key, PodCheck] = {}  # active Job not ready -> its pod checks
        self.pod_reads = PodReads(self._list_pods, POD_READ_WINDOW_SECONDS)  # the checks' reads, batched
        self._reconciled_at: dict[Key, float] = {}  # monotonic time of each run's last reconcile
        self._placing: dict[str, asyncio.Lock] = {}  # namespace -> its placement lock (see _pass)
        self._specs = SpecMemo()  # each run's parsed spec while its JSON is unchanged, and its lap JSON
        self._resolutions: dict[Key, Any] = {}  # a run of an Agent: its Agent's resolution, per Agent version
        self._not_leader: set[Key] = set()  # keys taken from the queue while not acting (see process)
        self._not_leader_timer: asyncio.TimerHandle | None = None  # their recheck, while there are some
        self.policies: PolicyStore | None = None  # the tenancy re-check's watched policies (None: off)
        self.notifier: Any = None  # approval notifications (agentrun.notify), when configured
        self.admission: PolicyCheck | None = None  # the check of the admission policies (made in start)
        self.workloads: WorkloadView | None = None  # the Workloads of the lap Jobs Kueue holds (made in start)
        self.spans: OperatorSpans | None = None  # the operator's spans, when tracing is on (made in start)
        self.ready = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.ready:  # Kopf retries a failed startup handler: never start twice
            return
        # what a failed earlier try appended (none started: informers start after the notifier)
        self.informers.clear()
        cfg = self.config
        watch_ns: list[str | None] = list(cfg.namespaces) if exact_namespaces(cfg.namespaces) else [None]
        # Reconciles block in threads on S3 calls: size the pool for that I/O.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=RECONCILE_THREADS, thread_name_prefix="reconcile"))
        # One API client, one connection pool for every request and watch of this process (the
        # watches hold one connection each).
        tenancy_watches = 2 + len(watch_ns) if cfg.tenancy_recheck else 0
        admission_watches = len(wanted(cfg.admission_policies))  # one per policy and binding (policycheck.py)
        # the schedule controller (agentrun.schedule.shell, started by process.py on this client): one
        # AgentSchedule watch per namespace and its 4 workers
        schedule_share = len(watch_ns) + 4
        kube = self.kube = Client(load_api_client(), WORKERS + 4 * len(watch_ns) + tenancy_watches
                                  + admission_watches + schedule_share + 2, metrics.kube_request)
        self.spans = spans_from_env(dict(cfg.lap_otel_env)) if cfg.tracing else None
        self.executor = Executor(cfg, kube, self.cache, self._specs, self.spans)
        self.workloads = WorkloadView(lambda p, q: kube.request("GET", p, query=q), time.monotonic)
        loop = self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.ensure_future(loop.run_in_executor(None, self.executor.warm)))
        # the admission policies: listed and watched (policycheck.py); no lap before the first verdict
        self.admission = PolicyCheck(cfg.admission_policies, cfg.allow_missing_policies, kube,
                                     on_change=self._admission_changed, watch_seconds=cfg.watch_timeout_seconds)
        self._tasks.append(asyncio.create_task(self.admission.run(cfg.resync_seconds)))
        if cfg.tenancy_recheck:
            self.policies = policies = PolicyStore(on_change=self._tenancy_changed)
            self.cache.limited = lambda namespace: policies.limits(namespace) is not None
            for kind, resource in TENANCY_KINDS.items():
                # namespaces: with exact watched namespaces, each by name (the chart's role names them)
                names: list[str | None] = list(cfg.namespaces) if kind == "namespaces" and watch_ns != [None] else [None]
                for name in names:
                    self.informers.append(Informer(
                        kube, kind, None, None, self.policies, loop, resource=resource, optional=True,
                        field_selector=f"metadata.name={name}" if name else None, scope=name,
                        watch_seconds=cfg.watch_timeout_seconds))
        self.notifier = notify_from_env(active=lambda: self.is_leader, runs=self._notifier_runs,
                                        patch_status=self._notifier_patch,
                                        outcomes=self._notifier_outcomes if self.policies is not None else None)
        if self.notifier is not None:
            self.cache.notify_outcomes = self._notify_outcomes  # before the informers fill the cache
            self.notifier.start()
        for ns in watch_ns:
            for kind, selector in (("runs", None), ("jobs", LABEL_RUN_UID)):
                self.informers.append(Informer(kube, kind, ns, selector, self.cache, loop, resource=RESOURCES[kind],
                                               transform=TRANSFORMS.get(kind, strip),
                                               watch_seconds=cfg.watch_timeout_seconds))
            # the lap pods that exited 0 (a lap ends there: cache.py); other pods are read on demand.
            # Optional: without the RBAC to watch pods (a role older than the operator), a lap ends
            # at its Job's Complete, as the Job controller marks it
            self.informers.append(Informer(kube, "pods", ns, LABEL_RUN_UID, self.cache, loop, resource=RESOURCES["pods"],
                                           transform=TRANSFORMS["pods"], optional=True, field_selector=POD_EXITED,
                                           watch_seconds=cfg.watch_timeout_seconds))
            # Agents (a run's spec.agentRef): optional, so a cluster without the Agent CRD (a chart
            # upgrade does not upgrade CRDs) or without the RBAC still runs its inline runs
            self.informers.append(Informer(kube, "agents", ns, None, self.cache, loop, resource=RESOURCES["agents"],
                                           optional=True, watch_seconds=cfg.watch_timeout_seconds))
        for inf in self.informers:
            inf.start()
        if self.elector is None:
            self.elector = LeaseElector(cfg.lease_name, cfg.lease_namespace, cfg.identity,
                                        cfg.lease_duration_seconds, on_acquire=self.resync,
                                        on_lose=metrics.clear_runs, api=KubeLeaseAPI(kube),
                                        eligible=self._eligible)
        self._tasks.append(asyncio.create_task(self._wait_synced()))
        self._tasks.append(asyncio.create_task(self._elect()))
        self._tasks.append(asyncio.create_task(self._resync_loop()))
        self._tasks += [asyncio.create_task(self._worker()) for _ in range(WORKERS)]
        self.ready = True

    async def _elect(self) -> None:
        """Campaign for the Lease only once the watch cache has listed everything: a replica whose
        informer cannot list (RBAC without ``watch``) never holds it, so a standby can act."""
        await self._synced.wait()
        assert self.elector is not None
        await self.elector.run()

    @property
    def synced(self) -> bool:
        """Every informer has listed once (read by /readyz, from another thread)."""
        return self._synced.is_set()

    async def _wait_synced(self) -> None:
        for i, inf in enumerate(self.informers):
            metrics.informer_synced(_resource_of(inf), inf.synced.is_set(), i)
        pending = [inf for inf in self.informers if not inf.synced.is_set()]
        while pending:
            _, rest = await asyncio.wait([asyncio.ensure_future(inf.synced.wait()) for inf in pending],
                                         timeout=UNSYNCED_WARNING_SECONDS)
            for fut in rest:
                fut.cancel()
            pending = [inf for inf in pending if not inf.synced.is_set()]
            for i, inf in enumerate(self.informers):
                metrics.informer_synced(_resource_of(inf), inf.synced.is_set(), i)
            if pending:
                log.warning("watch cache not synced: cannot list %s; this replica does not campaign for the "
                            "Lease and /readyz fails until it does (check the operator's RBAC: list and watch)",
                            ", ".join(f"{_resource_of(inf)} in {inf.namespace or 'all namespaces'}"
                                      + (f" ({inf.last_error})" if getattr(inf, "last_error", None) else "")
                                      for inf in pending))
        log.info("watch cache synced: %d runs, %d Jobs, %d pods", len(self.cache.runs), len(self.cache.jobs),
                 len(self.cache.pods))
        if self.on_synced is not None:
            self.on_synced()
        self._synced.set()

    def cannot_lead(self) -> str | None:
        """None while this replica may hold the Lease; else why not: the API server has refused the
        list or watch of runs or Jobs for :data:`REFUSED_STEP_DOWN_SECONDS` after the cache had
        listed (RBAC taken away: the cache no longer moves, and acting on it is acting blind). Read
        by /readyz too."""
        now = time.monotonic()
        for inf in self.informers:
            since = inf.refused_since
            if not inf.optional and since is not None and now - since >= REFUSED_STEP_DOWN_SECONDS:
                return (f"the API server has refused to list {_resource_of(inf)} in "
                        f"{inf.namespace or 'all namespaces'} for {now - since:.0f} s ({inf.last_error}): "
                        "check the operator's RBAC (list and watch)")
        return None

    def _eligible(self) -> str | None:
        """The elector's question every round; ``agentrun_informer_synced`` says 0 for a refused watch."""
        for i, inf in enumerate(self.informers):
            metrics.informer_synced(_resource_of(inf), inf.synced.is_set() and inf.refused_since is None, i)
        return self.cannot_lead()

    async def stop(self) -> None:
        log.info("watch cache: reconciles queued by cause %s; watch events by kind %s, skipped %d",
                 self.cache.causes, self.cache.events, self.cache.skipped)
        self.queue.shut_down()
        if self._not_leader_timer is not None:
            self._not_leader_timer.cancel()
        for check in self._pod_checks.values():
            if check.pending is not None:
                check.pending.cancel()
        self._pod_checks.clear()
        for inf in self.informers:
            inf.stop()
        for inf in self.informers:
            await inf.stopped()
        for t in self._tasks:
            t.cancel()
        if self.notifier is not None:
            await asyncio.to_thread(self.notifier.stop)
        if self.spans is not None:
            await asyncio.to_thread(self.spans.close)
        if self.elector is not None:
            await self.elector.release()
        if self.executor is not None:
            await self.executor.aclose()
        if self.kube is not None:
            await self.kube.close()

    @property
    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_seconds / 2)
            try:
                await self.resync(full=False)
            except Exception as exc:  # noqa: BLE001
                log.warning("resync failed: %s", exc)

    def requeue_not_leader(self) -> None:
        """Queue again the keys dropped while this replica did not act, once it acts; while some
        wait, look again in :data:`NOT_LEADER_RECHECK_SECONDS`."""
        self._not_leader_timer = None
        if self._not_leader and self.is_leader:
            keys, self._not_leader = self._not_leader, set()
            for key in sorted(keys):
                self.cache.enqueue(key, "leader again")
        if self._not_leader and self._loop is not None and not self.queue.shutting_down:
            self._not_leader_timer = self._loop.call_later(NOT_LEADER_RECHECK_SECONDS, self.requeue_not_leader)

    async def resync(self, full: bool = True) -> None:
        """Queue every cached run (on becoming leader), or periodically (``full=False``) every run not
        reconciled within half the resync period: looked at every half period, no run waits longer
        than the period, and a run reconciled in the last half period is not queued. No request."""
        if not self.is_leader:
            return
        if full:
            self._not_leader.clear()  # every run is queued below
        horizon = time.monotonic() - self.config.resync_seconds / 2
        for key in list(self.cache.runs):
            if full or self._reconciled_at.get(key, float("-inf")) < horizon:
                self.cache.enqueue(key, "resync")

    def enqueue(self, namespace: str, name: str, delay: float = 0.0) -> None:
        self.queue.add_after((namespace, name), delay)

    # ---------------------------------------------------------------- tenancy and notifier feeds

    def _policies_changed(self, namespaces: set[str] | None) -> None:
        """What applies to ``namespaces`` (None: all) changed: re-check their live runs now."""
        for key, run in list(self.cache.runs.items()):
            if (namespaces is None or key[0] in namespaces) \
                    and ((run.get("status") or {}).get("phase")) not in TERMINAL_PHASES:
                self.cache.enqueue(key, "policy changed")

    def _tenancy_changed(self, namespaces: set[str] | None) -> None:
        """The AgentRunPolicies of ``namespaces`` (None: all) changed: re-check their live runs, and
        index their finished runs' outcomes again (notifications.outcomes)."""
        self._policies_changed(namespaces)
        if self.cache.notify_outcomes is not None:
            self.cache.reindex_outcomes(namespaces)

    def _admission_changed(self) -> None:
        """The admission policies' verdict changed: every live run is looked at again (a lap held
        back starts; a run about to start one says why it does not)."""
        self._policies_changed(None)

    @property
    def admission_ready(self) -> bool:
        """For /readyz: the admission policies were checked and are in place (or allowed to be missing)."""
        return self.admission is not None and self.admission.ready

    def _approval_pending(self, key: Key) -> None:
        if self.notifier is not None and self._allowed(key[0]):
            self.notifier.wake()

    def _on_loop(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` (a coroutine function) on the event loop from another thread; its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(NOTIFIER_LOOP_TIMEOUT)

    def _notifier_runs(self) -> list[dict[str, Any]]:
        """The notifier's source (called in its thread): the cached runs waiting on an approval or
        with an outcome to announce."""
        async def snapshot() -> list[dict[str, Any]]:
            return [r for r in self.cache.notifiable_runs() if self._allowed(r["metadata"]["namespace"])]
        return self._on_loop(snapshot)  # type: ignore[no-any-return]

    def _notify_outcomes(self, namespace: str) -> tuple[str, ...]:
        """The outcomes announced in ``namespace`` for runs without spec.notify (on the event loop):
        its AgentRunPolicies' notifications.outcomes, else the chart's (notify.plan.namespace_outcomes)."""
        assert self.notifier is not None
        policies = self.policies.policies_for(namespace) if self.policies is not None else None
        return namespace_outcomes(policies, self.notifier.settings.outcomes)

    def _notifier_outcomes(self, namespace: str) -> tuple[str, ...]:
        """:meth:`_notify_outcomes` for the notifier's thread (the policies are read on the loop)."""
        async def chosen() -> tuple[str, ...]:
            return self._notify_outcomes(namespace)
        return self._on_loop(chosen)  # type: ignore[no-any-return]

    def _notifier_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """The notifier's status write (called in its thread): an own write of the cache."""
        async def write() -> None:
            assert self.executor is not None
            await self.executor.write("runs", (namespace, name), "PATCH", path(RUNS, namespace, name, "status"),
                                      body=patch, content_type="application/merge-patch+json")
        self._on_loop(write)

    async def _tenancy_check(self, ns: str, spec: dict[str, Any]) -> Any:
        """The re-check's verdict from the watched policies; the run's namespace is read once when
        its watch event has not arrived yet (a namespace created just before the run)."""
        assert self.policies is not None and self.executor is not None
        if not self.policies.knows(ns) and not self.policies.not_enforced(ns):
            doc = await self.executor.call("GET", path(NAMESPACES, None, ns))
            if isinstance(doc, dict):
                self.policies.put_namespace(doc)
        return self.policies.check(ns, spec)

    def forget(self, key: Key) -> None:
        """The run is gone: drop its queue state, refusals and metrics."""
        self.queue.discard(key)
        self._reconciled_at.pop(key, None)
        self._specs.forget(key)
        self._resolutions.pop(key, None)
        if self.executor is not None:
            self.executor.forget(key)
        metrics.forget_run(*key)

    # ---------------------------------------------------------------- workers

    async def _worker(self) -> None:
        await self._synced.wait()
        if self.admission is not None:
            await self.admission.checked.wait()
        while True:
            key = await self.queue.get()
            if key is None:
                return
            try:
                await self.process(key)
            finally:
                self.queue.done(key)

    async def process(self, key: Key) -> None:
        """One reconcile of ``key`` with its bookkeeping: requeue, backoff, metrics."""
        if not self.is_leader:  # a standby does nothing, and counts no reconcile
            # but remembers it: a leader whose renewal came late (is_leader expired for a moment,
            # with no new acquire and so no resync) reconciles it once it acts again
            # (a replica that never led does not: taking the Lease queues every run)
            if self.elector is not None and self.elector.holds and len(self._not_leader) < 100_000:
                self._not_leader.add(key)
                if self._not_leader_timer is None and self._loop is not None:
                    self._not_leader_timer = self._loop.call_later(NOT_LEADER_RECHECK_SECONDS,
                                                                   self.requeue_not_leader)
            return
        started = time.monotonic()
        self._reconciled_at[key] = started
        result = "success"
        try:
            delay = await self.reconcile(key)
            self.queue.forget(key)
            if self.executor is not None:
                self.executor.succeeded(key)
            if delay is not None:
                result = "requeue"
                self.queue.add_after(key, delay)
        except RetryWithBackoff:  # a refused write, a deferred one (one Event), no convergence: backoff
            result = "error"
            self.queue.add_rate_limited(key)
        except Exception as exc:  # never crash: log, count, retry later (per-run backoff)
            result = "error"
            run_logger(*key).error("reconcile failed: %s", exc, exc_info=True)
            self.queue.add_rate_limited(key)
        metrics.reconcile_finished(result, time.monotonic() - started)

    # ---------------------------------------------------------------- reconcile

    async def reconcile(self, key: Key) -> float | None:
        """One reconcile of one run from the cache. Returns the requeue delay, if any."""
        try:
            return await self._reconcile(key)
        finally:
            self._schedule_pod_check(key)

    async def _reconcile(self, key: Key) -> float | None:
        assert self.executor is not None
        requeue: float | None = None
        for _ in range(MAX_PASSES):
            body = self.cache.run(key)
            if body is None or not self.is_leader:
                return None
            ns = body["metadata"]["namespace"]
            limits = self.policies.limits(ns) if self.policies is not None and slot_state(body) == "waits" else None
            if limits is None:
                out = await self._pass(body, None)
            else:  # placements in a namespace one at a time: each sees the admissions before it (see _pass)
                async with self._placing.setdefault(ns, asyncio.Lock()):
                    body = self.cache.run(key)
                    if body is None or not self.is_leader:
                        return None
                    out = await self._pass(body, limits if slot_state(body) == "waits" else None)
            requeue = out.requeue
            if not out.wrote:
                return requeue
        # still writing after MAX_PASSES: a decision that does not converge; retry with the run's backoff
        run_logger(*key).warning("reconcile still writing after %d passes: retrying with backoff", MAX_PASSES)
        raise RetryWithBackoff(f"no convergence after {MAX_PASSES} passes")

    async def _pass(self, body: dict[str, Any], limits: Limits | None) -> Outcome:
        """One pass of a run's reconcile: observe, decide (with its reads), execute. A run that waits
        for a slot (``limits``) is placed from the cache while its namespace's placement lock is held
        (by the caller): the status write of a run admitted before it is in the cache by then, so a
        run may skip the ones its Agent's or model's limit holds back without two runs ever taking
        one slot (docs/scheduling.md#concurrency-limits)."""
        assert self.executor is not None
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        parsed = parse_run(body, self._specs)
        await self._read_missing(body, parsed[2])
        o = observe(body, self.cache.jobs_of(ns, uid), lambda job: self.cache.pods_of(ns, job),
                    self.config, datetime.now(UTC), parsed, self._observed_jobs)
        run = RunRef(namespace=ns, name=name, uid=uid)
        if o.request is not None and not o.deleting:
            o = await self._agent_facts(o, run)
        if self.policies is not None and o.spec is not None and not o.deleting \
                and o.status.phase not in TERMINAL_PHASES:
            check = await self._tenancy_check(ns, body.get("spec") or {})
            o = dataclasses.replace(o, policy_check=check)
        elif self.policies is not None and o.request is not None and not o.deleting \
                and o.status.phase not in TERMINAL_PHASES:
            effective = _effective_of(o)  # a run of an Agent: the re-check of what it runs
            if effective is not None:
                o = dataclasses.replace(o, policy_check=await self._tenancy_check(ns, effective.to_api()))
        if limits is not None and not o.deleting:
            group = self._grouper(ns, limits)
            o = dataclasses.replace(o, queue=place(order_key(body), group(body), self.cache.waiting_groups(ns, group),
                                                   self.cache.holding_groups(ns, group), limits))
        if self.policies is not None and o.spec is not None and o.spec.queue_name is None \
                and o.status.phase not in TERMINAL_PHASES:
            o = dataclasses.replace(o, default_queue_name=self.policies.default_queue_name(ns))
        o = await self._kueue_facts(o)
        held = self.admission.blocking if self.admission is not None else None
        if held is not None:  # rare: no copy of Observed while the policies are in place
            o = dataclasses.replace(o, admission=held)
        decision = d.decide(o)
        for _ in range(3):
            if not decision.needs_read:
                break
            o = await self.executor.read(o, decision, run, o.spec or o.request)
            decision = d.decide(o)
        if decision.needs_read:
            raise RuntimeError("decide kept asking for reads")
        out = await self.executor.execute(body, o, decision, run, decision.spec or o.spec)
        if self.spans is not None and out.wrote:
            self._trace_pass(o, decision, body)
        return out

    def _trace_pass(self, o: d.Observed, decision: d.Decision, body: dict[str, Any]) -> None:
        """The pass's ``reconcile`` span; and the run's root span when the run just finished."""
        assert self.spans is not None
        now = datetime.now(UTC)
        attrs = pass_attributes(o, decision)
        self.spans.reconcile(o.uid, o.now, now, attrs)
        st = decision.status
        if st is not None and st.phase in TERMINAL_PHASES and o.status.phase not in TERMINAL_PHASES:
            created = parse_time((body.get("metadata") or {}).get("creationTimestamp")) or o.now
            self.spans.run(o.uid, o.name, created, now, {
                "agentrun.run.namespace": o.namespace, "agentrun.run.name": o.name, "agentrun.run.uid": o.uid,
                "agentrun.phase": st.phase, "agentrun.lap": st.lap, "agentrun.cost.usd": st.cost.usd,
                "agentrun.retries": st.total_retries})

    def _grouper(self, namespace: str, limits: Limits) -> Callable[[dict[str, Any]], Group]:
        """How the runs of ``namespace`` are grouped for ``limits``: by Agent and model (the Agent's
        model from the watch cache) where a per-Agent or per-model limit applies, else not at all."""
        if not limits.per_group:
            return lambda run: NO_GROUP

        def model_of_agent(name: str) -> str | None:
            model = ((self.cache.agent(namespace, name) or {}).get("spec") or {}).get("model")
            return model.get("name", "scripted") if isinstance(model, dict) else None
        return lambda run: group_of(run, model_of_agent)

    async def _agent_facts(self, o: d.Observed, run: RunRef) -> d.Observed:
        """A run of an Agent: its Agent from the watch cache, resolved with the run's parameters
        (or why not), and its pinned copy (``status.agent``), read once per digest."""
        assert self.executor is not None and o.request is not None and o.request.agent_ref is not None
        name = o.request.agent_ref.name
        doc = self.cache.agent(o.namespace, name)
        unreadable = self.cache.unreadable.get("agents")
        # resolved again only when the Agent (its resourceVersion) or the run's parsed spec changed
        memo = (rv_int(doc), unreadable)
        hit = self._resolutions.get((o.namespace, o.name))
        if hit is not None and hit[0] == memo and hit[1] is o.request:
            current = hit[2]
        else:
            current = resolve_current(doc, name, o.request, unreadable)
            put_bounded(self._resolutions, (o.namespace, o.name), (memo, o.request, current), 100_000)
        pinned = await self.executor.pinned_agent(o, run, o.request)
        return dataclasses.replace(o, agent_current=current, agent_pinned=pinned)

    async def _kueue_facts(self, o: d.Observed) -> d.Observed:
        """Of a run whose active Job Kueue holds: the Workload Kueue made of it (``kueueview.py``).
        Looked at only while ``status.kueue`` says a Job is held (a pass with no Kueue hold scans
        nothing); the pass that sees the Job admitted forgets its Workload."""
        aj = o.status.active_job
        if o.status.kueue is None or aj is None:  # held Jobs are in status.kueue from the pass that saw them
            return o
        job = next((j for j in o.jobs if j.name == aj.name), None)
        if job is None or job.uid is None or self.workloads is None:
            return o
        if not is_held(job):
            self.workloads.forget(o.namespace, job.uid)
            return o
        return dataclasses.replace(o, workload=await self.workloads.read(o.namespace, job.name, job.uid))

    async def _read_missing(self, body: dict[str, Any], status: AgentRunStatus | None = None) -> None:
        """The rare reads the cache cannot answer: the recorded Job missing from it (deleted, or the
        watch lags behind), and the pods of a failed current Job whose exit the cache has not seen.
        Each is read once per version, then the cache (and the watch) answer. (The pods of an active
        Job: :meth:`_check_pods`.)"""
        assert self.executor is not None
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        status = _status_of(body) if status is None else status
        if status is None:
            return
        for jname in current_jobs(name, uid, status):
            jkey = (ns, jname)
            job = self.cache.jobs.get(jkey)
            if job is None:
                if status.active_job is None or jname != status.active_job.name:
                    continue
                if self._job_reads.get(jkey) == rv_int(body):
                    continue
                self._job_reads[jkey] = rv_int(body)
                doc = await self.executor.call("GET", path(JOBS, ns), query={
                    "labelSelector": f"{LABEL_RUN_UID}={uid}", "fieldSelector": f"metadata.name={jname}"})
                for item in (doc or {}).get("items") or []:
                    self.cache.put("jobs", item)
                job = self.cache.jobs.get(jkey)
                if job is None:
                    continue
            if job_state(job)[0] == "active" or not needs_pod_read(job, self.cache.pods_of(ns, jname)):
                continue
            if self._pod_reads.get(jkey) == rv_int(job):
                continue
            self._pod_reads[jkey] = rv_int(job)
            await self._read_pods(ns, jname)
        if len(self._pod_reads) > 4096:
            self._pod_reads.clear()
        if len(self._job_reads) > 4096:
            self._job_reads.clear()

    async def _read_pods(self, ns: str, job: str) -> None:
        self.cache.put_pods(ns, job, await self._list_pods(ns, pod_selector([job])))

    async def _list_pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        assert self.executor is not None
        doc = await self.executor.call("GET", path(PODS, ns), query={"labelSelector": selector})
        return list((doc or {}).get("items") or [])

    def _call_on_grid(self, delay: float, callback: Callable[[Key], None], jkey: Key) -> asyncio.TimerHandle:
        """``callback(jkey)`` at the first whole multiple of :data:`POD_CHECK_GRID_SECONDS` of the
        loop's clock at least ``delay`` from now: the checks due within one grid step meet in one
        batch of :attr:`pod_reads`."""
        assert self._loop is not None
        at = math.ceil((self._loop.time() + delay) / POD_CHECK_GRID_SECONDS) * POD_CHECK_GRID_SECONDS
        return self._loop.call_at(at, callback, jkey)

    def _schedule_pod_check(self, key: Key) -> None:
        """After a reconcile: when the run's active Job is not ready, start its pod checks (unless
        they run already): the first when its grace is over (now, when it is over already)."""
        body = self.cache.run(key)
        if body is None or self._loop is None:
            return
        active = ((body.get("status") or {}).get("activeJob") or {}).get("name")
        if not isinstance(active, str):
            return
        jkey = (key[0], active)
        job = self.cache.jobs.get(jkey)
        due = None if job is None else pod_check_due(job, datetime.now(UTC), self.config.pod_config_grace_seconds,
                                                      self.cache.pods_of(*jkey))
        if due is None or jkey in self._pod_checks:
            return
        check = self._pod_checks[jkey] = PodCheck(run=key)
        # past the grace by then, also for the pod (created after its Job)
        check.pending = self._call_on_grid(due + POD_CHECK_MIN_SECONDS if due > 0 else 0.0, self._pod_check_due, jkey)

    def _pod_check_due(self, jkey: Key) -> None:
        check = self._pod_checks.get(jkey)
        if check is not None:
            check.pending = asyncio.ensure_future(self._check_pods(jkey))

    async def _check_pods(self, jkey: Key) -> None:
        """One pod check of an active Job: while it is still active and not ready past its grace,
        read its pods; queue its run when their configuration problem appeared, changed or went;
        the next check after the backoff. The checks end when the Job is ready, finished or gone."""
        check = self._pod_checks.get(jkey)
        if check is None or self._loop is None:
            return
        grace = self.config.pod_config_grace_seconds
        job = self.cache.jobs.get(jkey)
        due = None if job is None or not self.is_leader else pod_check_due(job, datetime.now(UTC), grace,
                                                                            self.cache.pods_of(*jkey))
        if due is None:
            del self._pod_checks[jkey]
            return
        if due > 0:
            check.pending = self._call_on_grid(due + POD_CHECK_MIN_SECONDS, self._pod_check_due, jkey)
            return
        problem = check.problem
        try:
            self.cache.put_pods(*jkey, await self.pod_reads.read(*jkey))
        except Exception as exc:  # noqa: BLE001 - the next check tries again
            log.info("cannot read the pods of Job %s/%s: %s", jkey[0], jkey[1], exc)
        else:
            reason, message, _ = pod_waiting(self.cache.pods_of(*jkey))
            problem = (reason, message) if d.pod_config_problem(reason, message) else None
            if problem is not None:
                # the run shows it: the Job's readiness must queue the run to clear it. A pod that is
                # only slow to start shows nothing, and its readiness queues nothing (200 runs on
                # 2 cores: most lap pods are slower than the grace, and each such lap cost a reconcile)
                self.cache.pod_checked.add(jkey)
            if problem != check.problem:
                check.problem = problem
                self.cache.enqueue(check.run, "pod config")
        if self._pod_checks.get(jkey) is not check:
            return  # stopped meanwhile
        if problem is not None:
            delay = max(POD_CHECK_MIN_SECONDS, min(grace, POD_PROBLEM_CHECK_SECONDS))
            check.reads = 0
        else:
            delay = min(POD_CHECK_MAX_SECONDS, max(grace, POD_CHECK_MIN_SECONDS) * 2 ** min(check.reads, 16))
            check.reads += 1
        check.pending = self._call_on_grid(delay, self._pod_check_due, jkey)


def _resource_of(inf: Informer) -> str:
    """The plural resource an informer lists (the ``resource`` label of its metric)."""
    return inf.path.rsplit("/", 1)[-1]


def resolve_current(doc: dict[str, Any] | None, name: str, request: AgentRunManifestSpec,
                    unreadable: int | None = None) -> ResolvedAgent | AgentProblem:
    """The cached Agent ``name`` resolved with the run (``agentrun.api.agent.resolve``), or why it
    cannot be: not found (or Agents not readable: ``unreadable``, the HTTP status of the refused
    list), its spec invalid, the run's parameters or task not fitting it."""
    if doc is None and unreadable is not None:
        return AgentProblem(Reason.AGENT_NOT_FOUND, f"spec.agentRef.name: Agent {name} cannot be read: the operator "
                            f"may not list and watch agents.agentrun.dev (HTTP {unreadable}: the Agent CRD is not "
                            "installed, or the operator's RBAC predates it)")
    if doc is None:
        return AgentProblem(Reason.AGENT_NOT_FOUND, f"spec.agentRef.name: Agent {name} not found in the run's "
                            "namespace")
    try:
        definition = AgentDefinitionSpec.model_validate(doc.get("spec") or {})
    except pydantic.ValidationError as exc:
        return AgentProblem(Reason.AGENT_INVALID, f"spec.agentRef.name: Agent {name} cannot be used: "
                            + spec_error_text(exc))
    try:
        meta = doc.get("metadata") or {}
        return resolve(name, definition, request, meta.get("generation"), meta.get("uid"))
    except ResolveError as exc:
        return exc.problem


def _effective_of(o: d.Observed) -> AgentRunSpec | None:
    """The effective spec of a run of an Agent from its pinned copy, when read (for the tenancy re-check)."""
    read = o.agent_pinned
    if o.request is None or read is None or read.resolved is None or o.status.agent is None \
            or read.digest != o.status.agent.digest:
        return None
    return effective_spec(o.request, read.resolved)


def _status_of(body: dict[str, Any]) -> AgentRunStatus | None:
    try:
        return AgentRunStatus.model_validate(body.get("status") or {})
    except Exception:  # noqa: BLE001 - observe() reports it
        return None
