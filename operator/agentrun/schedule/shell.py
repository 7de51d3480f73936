"""The schedule controller's shell: AgentSchedules watched, :func:`core.plan` asked, its actions done.

It lives in the operator's process beside the run controller and uses the same parts: the one
API-server client, :class:`~agentrun.kube.informer.Informer` for the AgentSchedules (optional: an
operator without the CRD or its RBAC keeps running runs, and lists again every minute), a
:class:`~agentrun.kube.queue.WorkQueue` of schedule keys, and the run controller's watch cache for
the runs (read, never written: a schedule's runs are the cached runs its label and owner reference
name). A change of one of its runs queues the schedule (:meth:`ScheduleController.run_changed`,
hooked into the cache's change callback by :func:`attach`). It acts only while this replica holds
the Lease (``is_leader``); on becoming leader, it queues every schedule.

Each reconcile is due again at the schedule's next time (a delayed add). A refused run (an
admission policy, a quota) sets the Ready condition with one Event and is tried again with the
queue's exponential backoff; any other failure is retried with the same backoff.

The clock is injectable; in a source checkout the test-only ``AGENTRUN_TEST_CLOCK_FILE``
(:mod:`agentrun.testfault.clock`, not in the image) lets an end-to-end test move it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agentrun.api.approval import ANN_CREATED_BY
from agentrun.api.crdgen import GROUP, VERSION
from agentrun.api.lifecycle import ANN_CANCELLED_BY
from agentrun.api.reasons import ScheduleReason as R
from agentrun.api.schedule import KIND, LABEL_SCHEDULE, PLURAL
from agentrun.kube.client import EVENTS, Client, path
from agentrun.kube.informer import Informer
from agentrun.kube.queue import WorkQueue

from .core import CancelRun, CreateRun, DeleteRun, Event, Plan, Schedule, plan, refused

log = logging.getLogger("agentrun.schedule")

Key = tuple[str, str]
SCHEDULES = (f"/apis/{GROUP}/{VERSION}", PLURAL)
RUNS = (f"/apis/{GROUP}/{VERSION}", "agentruns")
SELF_SUBJECT_REVIEWS = ("/apis/authentication.k8s.io/v1", "selfsubjectreviews")
#: Concurrent reconciles of schedules (of different schedules).
WORKERS = 4
#: How often leadership is looked at (a new leader queues every schedule).
LEADER_CHECK_SECONDS = 1.0
#: With the test clock, a reconcile is due at least this often (the test moves the time, not the loop).
TEST_CLOCK_POLL_SECONDS = 1.0
#: Refusals of a create that are the run's, not the operator's: the Ready condition says them.
REFUSED_STATUSES = frozenset({400, 403, 422})


def default_clock() -> tuple[Callable[[], datetime], bool]:
    """(the clock, whether it is the test clock): the test clock where agentrun.testfault is present
    and AGENTRUN_TEST_CLOCK_FILE is set, else the real time."""
    try:
        from agentrun.testfault.clock import file_clock
    except ImportError:  # the image: the package is not there
        return (lambda: datetime.now(UTC)), False
    test = file_clock()
    return (test, True) if test is not None else ((lambda: datetime.now(UTC)), False)


class ScheduleController:
    def __init__(self, kube: Client, runs: Mapping[Key, dict[str, Any]], is_leader: Callable[[], bool],
                 namespaces: list[str | None], allowed: Callable[[str], bool], identity: str,
                 clock: Callable[[], datetime] | None = None, poll_seconds: float | None = None,
                 watch_seconds: int = 120, resync_seconds: float = 300.0) -> None:
        self.kube, self.runs, self.is_leader = kube, runs, is_leader
        self.namespaces, self.allowed, self.identity = namespaces, allowed, identity
        if clock is None:
            clock, test = default_clock()
            if test:
                poll_seconds = TEST_CLOCK_POLL_SECONDS
                log.warning("schedules: the test clock of AGENTRUN_TEST_CLOCK_FILE is in use (tests only)")
        self.clock, self.poll_seconds = clock, poll_seconds
        self.watch_seconds, self.resync_seconds = watch_seconds, resync_seconds
        self.schedules: dict[Key, dict[str, Any]] = {}
        self.queue: WorkQueue[Key] = WorkQueue()
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._run_schedule: dict[Key, Key] = {}  # run -> its schedule (for a deleted run)
        self._username: str | None = None
        self._refused_logged = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for ns in self.namespaces:
            self.informers.append(Informer(self.kube, "agentschedules", ns, None, self, loop, resource=SCHEDULES,
                                           optional=True, watch_seconds=self.watch_seconds))
        for inf in self.informers:
            inf.start()
        self._tasks.append(asyncio.create_task(self._leadership(), name="schedules-leadership"))
        self._tasks += [asyncio.create_task(self._worker(), name=f"schedules-worker-{i}") for i in range(WORKERS)]

    async def stop(self) -> None:
        self.queue.shut_down()
        for inf in self.informers:
            inf.stop()
        for inf in self.informers:
            await inf.stopped()
        for t in self._tasks:
            t.cancel()

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers)

    async def _leadership(self) -> None:
        leading, since_resync = False, 0.0
        while True:
            now_leading = self.is_leader() and self.synced
            since_resync += LEADER_CHECK_SECONDS
            if now_leading and (not leading or since_resync >= self.resync_seconds):
                since_resync = 0.0
                for key in list(self.schedules):
                    self.queue.add(key)
            leading = now_leading
            await asyncio.sleep(LEADER_CHECK_SECONDS)

    # ------------------------------------------------------------------ the informer's sink

    def replace(self, kind: str, scope: str | None, items: list[dict[str, Any]]) -> None:
        fresh = {_key(o): o for o in items if self.allowed(_key(o)[0])}
        for key in [k for k in self.schedules if (scope is None or k[0] == scope) and k not in fresh]:
            del self.schedules[key]
            self.queue.discard(key)
        self.schedules.update(fresh)
        for key in fresh:
            self.queue.add(key)

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if not self.allowed(key[0]):
            return
        if type_ == "DELETED":
            self.schedules.pop(key, None)
            self.queue.discard(key)
            return
        if _rv(obj) >= _rv(self.schedules.get(key)):  # not older than a status this replica wrote
            self.schedules[key] = obj
        self.queue.add(key)

    def refused(self, kind: str, status: int, scope: str | None) -> None:
        if not self._refused_logged:
            self._refused_logged = True
            log.warning("schedules: cannot list AgentSchedules in %s (%s): the AgentSchedule CRD or the operator's "
                        "RBAC for it is missing; no schedule starts runs (listed again every minute)",
                        scope or "all namespaces", status)

    # ------------------------------------------------------------------ the runs' feed

    def run_changed(self, key: Key) -> None:
        """A run changed in the watch cache: queue its schedule, if a schedule created it."""
        body = self.runs.get(key)
        name = (((body or {}).get("metadata") or {}).get("labels") or {}).get(LABEL_SCHEDULE)
        if not name:
            return
        skey = (key[0], str(name))
        self._run_schedule[key] = skey
        if skey in self.schedules:
            self.queue.add(skey)

    def run_deleted(self, key: Key) -> None:
        skey = self._run_schedule.pop(key, None)
        if skey is not None and skey in self.schedules:
            self.queue.add(skey)

    # ------------------------------------------------------------------ reconciles

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            if key is None:
                return
            try:
                await self.reconcile(key)
                self.queue.forget(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one schedule's failure never stops the worker
                delay = self.queue.add_rate_limited(key)
                log.warning("schedule %s/%s: reconcile failed (%s); again in %.1f s", *key,
                            str(exc)[:300] or type(exc).__name__, delay)
            finally:
                self.queue.done(key)

    def owned(self, sched: Schedule) -> list[dict[str, Any]]:
        """The cached runs of ``sched`` (its label and owner reference)."""
        return [r for (ns, _), r in list(self.runs.items()) if ns == sched.namespace and sched.owns(r)]

    async def reconcile(self, key: Key) -> None:
        if not (self.is_leader() and self.synced):
            return  # queued again on becoming leader
        body = self.schedules.get(key)
        if body is None:
            return
        sched = Schedule.of(body)
        p = plan(self.clock(), sched, self.owned(sched))
        await self.execute(key, sched, p)

    async def execute(self, key: Key, sched: Schedule, p: Plan) -> None:
        ns, existed = sched.namespace, False
        for a in p.actions:
            if isinstance(a, DeleteRun):
                await self._delete_run(ns, a)
            elif isinstance(a, CancelRun):
                await self._cancel_run(ns, a)
            elif isinstance(a, CreateRun):
                existed, problem = await self._create_run(ns, a)
                if problem is not None:
                    r = refused(self.clock(), sched, a.name, problem)
                    await self._post_events(sched, r.actions)
                    await self._write_status(key, sched, r.status)
                    delay = self.queue.add_rate_limited(key)
                    log.warning("schedule %s/%s: run %s refused (%s); tried again in %.1f s", *key, a.name,
                                problem[:300], delay)
                    return
            elif isinstance(a, Event) and not (existed and a.reason == R.RUN_CREATED):
                await self._event(sched, a)
        await self._write_status(key, sched, p.status)
        if p.requeue_after is not None:
            delay = p.requeue_after if self.poll_seconds is None else min(p.requeue_after, self.poll_seconds)
            self.queue.add_after(key, delay)
        elif self.poll_seconds is not None:
            self.queue.add_after(key, self.poll_seconds)

    async def _post_events(self, sched: Schedule, actions: tuple[Any, ...]) -> None:
        for a in actions:
            if isinstance(a, Event):
                await self._event(sched, a)

    async def _create_run(self, ns: str, a: CreateRun) -> tuple[bool, str | None]:
        """Create the run: (whether it existed already: 409 is that time done, the API server's
        refusal or None)."""
        from kubernetes.client.exceptions import ApiException

        body = a.body
        user = await self._whoami()
        if user:  # who created the run (agentrun-approvals; stamped over by the API server where it can)
            meta = body["metadata"]
            body = {**body, "metadata": {**meta, "annotations": {**meta.get("annotations", {}), ANN_CREATED_BY: user}}}
        try:
            await self.kube.request("POST", path(RUNS, ns), body=body)
            log.info("schedule: created run %s/%s for %s", ns, a.name, a.scheduled.isoformat())
        except ApiException as exc:
            if exc.status == 409:
                log.info("schedule: run %s/%s exists already (created before)", ns, a.name)
                return True, None
            if exc.status in REFUSED_STATUSES:
                return False, _api_message(exc)
            raise
        return False, None

    async def _cancel_run(self, ns: str, a: CancelRun) -> None:
        from kubernetes.client.exceptions import ApiException

        patch: dict[str, Any] = {"metadata": {"uid": a.uid}, "spec": {"cancel": {"reason": a.reason}}}
        user = await self._whoami()
        if user:  # the API server records who cancels (agentrun-lifecycle); stamped over where it can
            patch["metadata"]["annotations"] = {ANN_CANCELLED_BY: user}
        try:
            await self.kube.request("PATCH", path(RUNS, ns, a.name), body=patch,
                                    content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or another run of that name: nothing to cancel
                raise

    async def _delete_run(self, ns: str, a: DeleteRun) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                "preconditions": {"uid": a.uid}}
        try:
            await self.kube.request("DELETE", path(RUNS, ns, a.name), body=body)
            log.info("schedule: deleted run %s/%s (history limit)", ns, a.name)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    async def _whoami(self) -> str | None:
        """The operator's user name as the API server authenticates it (a SelfSubjectReview, once)."""
        if self._username is None:
            from kubernetes.client.exceptions import ApiException

            try:
                doc = await self.kube.request("POST", path(SELF_SUBJECT_REVIEWS), body={
                    "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
            except ApiException as exc:
                log.warning("schedule: cannot ask the API server who the operator is (%s %s)", exc.status, exc.reason)
                return None
            self._username = str(((doc or {}).get("status") or {}).get("userInfo", {}).get("username") or "")
        return self._username or None

    async def _write_status(self, key: Key, sched: Schedule, status: dict[str, Any] | None) -> None:
        if status is None:
            return
        patch = {**{k: None for k in sched.status if k not in status}, **status}
        doc = await self.kube.request("PATCH", path(SCHEDULES, sched.namespace, sched.name, "status"),
                                      body={"metadata": {"uid": sched.uid}, "status": patch},
                                      content_type="application/merge-patch+json")
        if isinstance(doc, dict) and key in self.schedules:
            self.schedules[key] = doc  # write-through: the next reconcile reads what was written

    async def _event(self, sched: Schedule, a: Event) -> None:
        from kubernetes.client.exceptions import ApiException

        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{sched.name[:200]}.{secrets.token_hex(8)}", "namespace": sched.namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": sched.name,
                               "namespace": sched.namespace, "uid": sched.uid},
            "reason": a.reason,
            "message": a.message[:1024],
            "type": a.type,
            "source": {"component": "agentrun-operator"},
            "reportingComponent": "agentrun.dev/operator",
            "reportingInstance": self.identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.request("POST", path(EVENTS, sched.namespace), body=body)
        except ApiException as exc:  # events are best effort
            log.warning("schedule: cannot post event %s: %s", a.reason, exc.reason)


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: dict[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _api_message(exc: Any) -> str:
    """The API server's message of a refusal (its Status body), bounded later by the core."""
    import json

    try:
        doc = json.loads(exc.body or "")
        msg = doc.get("message") if isinstance(doc, dict) else None
    except ValueError:
        msg = None
    return str(msg or f"{exc.status} {exc.reason}")[:2048]


def attach(controller: Any, namespaces: list[str | None], allowed: Callable[[str], bool]) -> ScheduleController:
    """Start the schedule controller beside the run controller ``controller`` (started): its client,
    its cache's runs and its Lease; the cache's change callbacks also feed the schedules."""
    cfg = controller.config
    sc = ScheduleController(controller.kube, controller.cache.runs, lambda: controller.is_leader, namespaces, allowed,
                            cfg.identity, watch_seconds=cfg.watch_timeout_seconds, resync_seconds=cfg.resync_seconds)
    cache = controller.cache
    on_change, on_deleted = cache.on_change, cache.on_deleted

    def changed(key: Key) -> None:
        on_change(key)
        sc.run_changed(key)

    def deleted(key: Key) -> None:
        if on_deleted is not None:
            on_deleted(key)
        sc.run_deleted(key)

    cache.on_change, cache.on_deleted = changed, deleted
    sc.start()
    return sc
