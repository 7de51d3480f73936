"""The controller's watch cache: AgentRuns and their lap Jobs, in memory, and the few pods the
reconciler read.

Runs and Jobs are listed once and then watched (:class:`Informer`, one per kind and namespace: a
task on the event loop, reading over aiohttp, or through a thread over
:class:`~agentrun.controller.kube.Kube` where aiohttp cannot reproduce the client's configuration);
a watch that expires (410 Gone) lists again.
Every change is applied on the event loop (:class:`Cache`), which is where reconciles read, so a
reconcile sees one consistent state and makes no read request of its own. A thread hands its
events to the loop in batches (one wake-up of the loop for all the events that arrived while it was
busy). ``metadata.managedFields`` (never read) is dropped before an object reaches the cache.

Pods are not watched (a lap pod's watch events were most of the operator's CPU per lap, and a
reconcile needs a pod only in two rare cases): the reconciler reads the pods of one Job on demand
(:meth:`Cache.put_pods`) -- a failed Job's, for its exit, and an active Job's that is not ready
after ``pod_config_grace_seconds``, for a configuration error -- and they are dropped with their Job.

What enqueues a run (``on_change``):

- the run itself changed (a newer ``resourceVersion`` than the cache holds). The operator's own
  writes are put into the cache from their responses (:meth:`Cache.put`), so their watch events
  carry no newer version and are skipped;
- one of its Jobs appeared, disappeared, or changed *state* (active/succeeded/failed and its
  reason), not on every status update of the Job;
- a Job whose pods the reconciler read because it was not ready (:attr:`Cache.pod_checked`)
  became ready or not ready (a missing Secret created: the lap starts).

``resourceVersion``s are compared as the integers the API server hands out (etcd revisions); an
event older than the cached object is stale and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from agentrun.api.contract import LABEL_RUN_UID
from agentrun.notify.plan import outcome_due

from .kube import JOBS, PODS, RUNS, Kube, path
from .observe import job_state

if TYPE_CHECKING:
    from .akube import AsyncKube

log = logging.getLogger("agentrun.controller")

Key = tuple[str, str]  # (namespace, name)
#: Server-side timeout of a watch (the default of AGENTRUN_WATCH_TIMEOUT_SECONDS), and how much longer
#: than it the client waits on a silent watch connection before it drops it (the read timeout is the
#: informer's watch timeout plus this margin).
WATCH_SECONDS, WATCH_READ_MARGIN_SECONDS = 120, 30.0
LIST_PAGE = 500
#: Longest wait between two tries of a failing list/watch (the API server restarting): the cache
#: lags the API server by at most this much once it is back.
WATCH_RETRY_MAX = 5.0
#: Wait before listing again a kind an optional informer may not read (403: no RBAC; 404: not served).
REFUSED_RETRY = 60.0
#: The resource of each kind of the cache.
RESOURCES = {"runs": RUNS, "jobs": JOBS, "pods": PODS}
AWAITING = "AwaitingApproval"


def rv_int(obj: dict[str, Any] | None) -> int | None:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")
    except (TypeError, ValueError):
        return None


def is_newer(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """True when ``new`` is a later version than ``old`` (or there is no ``old``)."""
    if old is None:
        return True
    a, b = rv_int(new), rv_int(old)
    if a is None or b is None:
        return ((new.get("metadata") or {}).get("resourceVersion")
                != (old.get("metadata") or {}).get("resourceVersion"))
    return a > b


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def job_ready(job: dict[str, Any]) -> bool:
    """A pod of the Job is ready (``status.ready``: its container started)."""
    return bool((job.get("status") or {}).get("ready"))


def job_signature(job: dict[str, Any] | None, ready: bool = False) -> tuple[Any, ...] | None:
    """What of a Job a reconcile reacts to: its state (active, succeeded, failed and why), and with
    ``ready`` whether its pod is ready (for a Job whose pod was seen not starting). Not every status
    update of the Job (its pod created, started, ready)."""
    if job is None:
        return None
    return (*job_state(job), job_ready(job)) if ready else job_state(job)


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what no reconcile reads (``metadata.managedFields``: memory and copies)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


#: What of a Job's metadata the controller reads (observe, the cache's index, resourceVersions).
JOB_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations",
                "creationTimestamp", "deletionTimestamp")


def slim_job(job: dict[str, Any]) -> dict[str, Any]:
    """A lap Job as the cache keeps it: its metadata that is read, its status, and the environment
    of its container (the store it was given, :func:`jobs.store_of_env`); not the rest of its pod
    template (most of its bytes)."""
    meta = job.get("metadata") or {}
    out: dict[str, Any] = {"metadata": {k: meta[k] for k in JOB_METADATA if k in meta}}
    if "status" in job:
        out["status"] = job["status"]
    containers = ((((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
    if containers and isinstance(containers[0], dict) and "env" in containers[0]:
        out["spec"] = {"template": {"spec": {"containers": [{"env": containers[0]["env"]}]}}}
    return out


#: What each kind of the cache keeps of an object (its own writes' responses and watch events alike).
TRANSFORMS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"jobs": slim_job}


class Cache:
    """The in-memory state, mutated only on the event loop."""

    def __init__(self, on_change: Callable[[Key], None], on_deleted: Callable[[Key], None] | None = None,
                 on_awaiting: Callable[[Key], None] | None = None,
                 on_job_gone: Callable[[Key], None] | None = None) -> None:
        self.on_change = on_change
        self.on_deleted = on_deleted
        self.on_awaiting = on_awaiting  # a run started waiting on a new approval (the notifier's wake-up)
        self.on_job_gone = on_job_gone  # a Job left the cache (deleted, or not listed again): drop what is kept of it
        #: The runs waiting on an approval (phase AwaitingApproval, state Pending): key -> callId.
        self.awaiting: dict[Key, str] = {}
        #: The runs whose outcome is due to be announced (agentrun.notify.plan.outcome_due): key -> its idempotency key.
        self.outcomes_due: dict[Key, str] = {}
        #: The notifier's default outcomes (its Settings.outcomes); None: no notifier, nothing indexed.
        self.notify_outcomes: tuple[str, ...] | None = None
        self.runs: dict[Key, dict[str, Any]] = {}
        self.jobs: dict[Key, dict[str, Any]] = {}
        self.pods: dict[Key, dict[str, Any]] = {}
        self._run_by_uid: dict[str, Key] = {}
        self._jobs_by_uid: dict[str, set[Key]] = {}
        self._pods_by_job: dict[Key, set[Key]] = {}
        #: Jobs whose pods the reconciler read while the Job was not ready: their readiness enqueues.
        self.pod_checked: set[Key] = set()
        self.skipped = 0  # events that changed nothing a reconcile reads (own writes, stale, Job noise)
        self.causes: dict[str, int] = {}  # enqueues by cause (logged when the controller stops)
        self.events: dict[str, int] = {}  # watch events applied, by kind (logged when the controller stops)
        self._writing: dict[tuple[str, Key], int] = {}  # own writes in flight, per object
        self._deferred: dict[tuple[str, Key], list[tuple[dict[str, Any], dict[str, Any] | None, bool]]] = {}

    def enqueue(self, key: Key, cause: str) -> None:
        self.causes[cause] = self.causes.get(cause, 0) + 1
        self.on_change(key)

    # ------------------------------------------------------------------ reads (reconciles)

    def run(self, key: Key) -> dict[str, Any] | None:
        return self.runs.get(key)

    def jobs_of(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [self.jobs[k] for k in sorted(self._jobs_by_uid.get(uid, ())) if k in self.jobs and k[0] == namespace]

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [self.pods[k] for k in sorted(self._pods_by_job.get((namespace, job), ())) if k in self.pods]

    def put_pods(self, namespace: str, job: str, items: list[dict[str, Any]]) -> None:
        """The pods of ``job`` as just read from the API server (they are not watched): the cached
        ones not listed are gone."""
        listed = {key_of(strip(o)) for o in items}
        for key in [k for k in self._pods_by_job.get((namespace, job), ()) if k not in listed]:
            self._drop_pod(key)
        for obj in items:
            self._apply("pods", "MODIFIED", obj, notify=False)

    def _drop_pod(self, key: Key) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._unindex("pods", key, old)

    def awaiting_runs(self) -> list[dict[str, Any]]:
        """The runs waiting on an approval, by key. The dicts are the cached ones: a change
        replaces a cached object, never mutates it, so another thread may read them."""
        return [self.runs[k] for k in sorted(self.awaiting) if k in self.runs]

    def notifiable_runs(self) -> list[dict[str, Any]]:
        """The runs the notifier has something to announce about: waiting on an approval, or an
        outcome due (same sharing rule as :meth:`awaiting_runs`)."""
        keys = sorted(set(self.awaiting) | set(self.outcomes_due))
        return [self.runs[k] for k in keys if k in self.runs]

    # ------------------------------------------------------------------ write-through (own writes)

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """Store the response of the operator's own write, without enqueueing: its watch event
        then carries no newer version and is skipped."""
        self._apply(kind, "MODIFIED", obj, notify=False)

    def begin_write(self, kind: str, key: Key) -> None:
        """The operator starts a write of this object. Until :meth:`end_write`, its watch events are
        applied but their notification is held: the echo of the write may arrive before its
        response."""
        self._writing[(kind, key)] = self._writing.get((kind, key), 0) + 1

    def end_write(self, kind: str, key: Key, response: dict[str, Any] | None) -> None:
        """The write ended (``response``: the stored object, None when it failed). The held events
        that are not its echo (a later version than the response) notify now; on a failure, all."""
        if response is not None:
            self.put(kind, response)
        n = self._writing.get((kind, key), 1) - 1
        if n > 0:
            self._writing[(kind, key)] = n
            return
        self._writing.pop((kind, key), None)
        written = rv_int(response) if response is not None else None
        for obj, old, relist in self._deferred.pop((kind, key), []):
            got = rv_int(obj)
            if written is None or got is None or got > written:
                self._notify(kind, key, obj, old, relist)
            else:
                self.skipped += 1

    # ------------------------------------------------------------------ informer callbacks

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1
        self._apply(kind, type_, obj, notify=True)

    def replace(self, kind: str, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """A (re)list of ``kind`` in ``namespace`` (None: everywhere): objects no longer listed were
        deleted meanwhile."""
        store = self._store(kind)
        listed = {key_of(o) for o in items}
        for key in [k for k in store if (namespace is None or k[0] == namespace) and k not in listed]:
            self._apply(kind, "DELETED", store[key], notify=True)
        for obj in items:
            self._apply(kind, "ADDED", obj, notify=True, relist=True)

    def _store(self, kind: str) -> dict[Key, dict[str, Any]]:
        return {"runs": self.runs, "jobs": self.jobs, "pods": self.pods}[kind]

    def _apply(self, kind: str, type_: str, obj: dict[str, Any], *, notify: bool, relist: bool = False) -> None:
        obj = TRANSFORMS.get(kind, strip)(obj)
        key = key_of(obj)
        store = self._store(kind)
        old = store.get(key)
        if type_ == "DELETED":
            if old is None:
                return
            if not is_newer(obj, old) and rv_int(obj) is not None and rv_int(obj) != rv_int(old):
                return  # an old deletion event after a newer object (cannot happen for one name, but be safe)
            del store[key]
            self._unindex(kind, key, old)
            if notify:
                self._notify_deleted(kind, key, old)
            return
        if not is_newer(obj, old):
            if relist and kind == "runs" and notify:
                self.enqueue(key, "run listed")  # a relist reconciles every run (also the initial one)
            else:
                self.skipped += 1
            return
        store[key] = obj
        self._index(kind, key, obj, old)
        if notify:
            if (kind, key) in self._writing:
                self._deferred.setdefault((kind, key), []).append((obj, old, relist))
                return
            self._notify(kind, key, obj, old, relist)

    def _index(self, kind: str, key: Key, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        if kind == "runs":
            if meta.get("uid"):
                self._run_by_uid[meta["uid"]] = key
            st = obj.get("status") or {}
            ap = st.get("approval") or {}
            if st.get("phase") == AWAITING and ap.get("state") == "Pending" and ap.get("callId"):
                before = self.awaiting.get(key)
                self.awaiting[key] = str(ap["callId"])
                if before != self.awaiting[key] and self.on_awaiting is not None:
                    self.on_awaiting(key)
            else:
                self.awaiting.pop(key, None)
            due = outcome_due(obj, self.notify_outcomes) if self.notify_outcomes is not None else None
            if due is not None:
                before = self.outcomes_due.get(key)
                self.outcomes_due[key] = due.idempotency_key
                if before != due.idempotency_key and self.on_awaiting is not None:
                    self.on_awaiting(key)
            else:
                self.outcomes_due.pop(key, None)
        elif kind == "jobs":
            uid = (meta.get("labels") or {}).get(LABEL_RUN_UID)
            if uid:
                self._jobs_by_uid.setdefault(uid, set()).add(key)
        else:
            job = (meta.get("labels") or {}).get("job-name")
            if job:
                self._pods_by_job.setdefault((key[0], job), set()).add(key)

    def _unindex(self, kind: str, key: Key, old: dict[str, Any]) -> None:
        meta = old.get("metadata") or {}
        if kind == "runs":
            if self._run_by_uid.get(meta.get("uid", "")) == key:
                del self._run_by_uid[meta["uid"]]
            self.awaiting.pop(key, None)
            self.outcomes_due.pop(key, None)
        elif kind == "jobs":
            uid = (meta.get("labels") or {}).get(LABEL_RUN_UID)
            keys = self._jobs_by_uid.get(uid or "")
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._jobs_by_uid[uid or ""]
            self.pod_checked.discard(key)
            if self.on_job_gone is not None:
                self.on_job_gone(key)
            for pod in list(self._pods_by_job.get(key, ())):  # pods are not watched: they go with their Job
                self._drop_pod(pod)
        else:
            job = (meta.get("labels") or {}).get("job-name")
            keys = self._pods_by_job.get((key[0], job or ""))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._pods_by_job[(key[0], job or "")]

    def _owner(self, obj: dict[str, Any]) -> Key | None:
        uid = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN_UID)
        return self._run_by_uid.get(uid or "")

    def _notify(self, kind: str, key: Key, obj: dict[str, Any], old: dict[str, Any] | None, relist: bool) -> None:
        if kind == "runs":
            self.enqueue(key, "run listed" if relist else "run changed")
            return
        owner = self._owner(obj)
        if owner is None:
            return
        if kind == "jobs":
            ready = key in self.pod_checked
            if old is None or job_signature(obj, ready) != job_signature(old, ready):
                self.enqueue(owner, "job added" if old is None else "job state")
            else:
                self.skipped += 1
            return
        self.skipped += 1  # pods: only the reconciler's own reads, which enqueue nothing

    def _notify_deleted(self, kind: str, key: Key, old: dict[str, Any]) -> None:
        if kind == "runs":
            if self.on_deleted is not None:
                self.on_deleted(key)
            return
        if kind == "jobs":
            owner = self._owner(old)
            if owner is not None:
                self.enqueue(owner, "job deleted")


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Informer:
    """List, then watch, one kind in one namespace (None: cluster-wide); every change is handed to
    ``cache`` on ``loop``. ``synced`` is set after the first list is applied.

    One list-and-watch loop, a task on the loop that applies each event as it is read, over one of
    two transports: with ``akube`` (:class:`~agentrun.controller.akube.AsyncKube`) the list and the
    watch are read on the loop (no thread, no hand-off: a watch event wakes only the loop); without
    it (a client configuration aiohttp does not reproduce) the list is a :class:`Kube` request in a
    worker thread and the watch is read by a daemon thread that hands its events to the loop in
    batches (:func:`in_thread`). ``start`` is called on the loop.

    ``cache`` is any sink with ``replace(kind, namespace, items)`` and ``event(kind, type, obj)``
    (the :class:`Cache`, or the tenancy re-check's ``PolicyStore``); ``resource`` the
    (prefix, plural) of ``kind`` when it is not one of :data:`RESOURCES`; ``field_selector`` narrows
    the list and watch (``metadata.name=X``: one object, which RBAC can grant by ``resourceNames``),
    and ``scope`` is then what a relist replaces (passed to ``replace`` instead of the namespace). An
    ``optional`` informer whose first list is refused (403, or 404: not served) tells the sink
    (``refused(kind, status, scope)``), counts as synced and lists again every :data:`REFUSED_RETRY`
    seconds; once it has listed, a refusal is an error like any other (retried with backoff, the
    sink keeps what it was told last)."""

    def __init__(self, kube: Kube, kind: str, namespace: str | None, selector: str | None,
                 cache: Any, loop: asyncio.AbstractEventLoop, resource: tuple[str, str] | None = None,
                 optional: bool = False, field_selector: str | None = None, scope: str | None = None,
                 akube: AsyncKube | None = None, watch_seconds: int = WATCH_SECONDS) -> None:
        self.kube, self.akube, self.kind, self.namespace, self.selector = kube, akube, kind, namespace, selector
        #: The server ends each watch after this long (the informer watches again from its
        #: resourceVersion); the client drops a watch silent for WATCH_READ_MARGIN_SECONDS more.
        self.watch_seconds = watch_seconds
        self.field_selector, self.scope = field_selector, (namespace if scope is None else scope)
        self._listed = False
        self._failures = 0
        self.last_error: str | None = None  # the last list/watch error (status and reason)
        #: Since when (monotonic) the API server has refused this informer's list or watch (401,
        #: 403) after it had listed: its part of the cache no longer moves. None once it lists again.
        self.refused_since: float | None = None
        self.cache, self.loop, self.optional = cache, loop, optional
        self.synced = asyncio.Event()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self.path = path(resource or RESOURCES[kind], namespace)
        #: Applied to every object before it reaches the cache (client-go's transform).
        self.transform = TRANSFORMS.get(kind, strip) if resource is None else strip

    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name=f"informer-{self.kind}-{self.namespace or 'all'}")

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)

    async def stopped(self) -> None:
        """Wait for the task of a stopped informer to end (its watch closed; a watch read in a
        thread is left to end with its next event, its timeout or the process)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ what a list or watch means

    def _list_query(self, cont: str | None) -> dict[str, Any]:
        return {"labelSelector": self.selector, "fieldSelector": self.field_selector, "limit": LIST_PAGE,
                "continue": cont}

    def _watch_query(self, rv: str) -> dict[str, Any]:
        return {"labelSelector": self.selector, "fieldSelector": self.field_selector, "resourceVersion": rv,
                "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_seconds}

    def _listed_all(self, items: list[dict[str, Any]]) -> None:
        self._apply(self.cache.replace, self.kind, self.scope, [self.transform(o) for o in items])
        self._listed = True
        self.refused_since = None
        self.synced.set()

    def _event(self, ev: dict[str, Any], rv: str) -> str:
        """Apply one watch event; the resourceVersion to resume from. :class:`_Expired` on a 410."""
        from kubernetes.client.exceptions import ApiException

        type_, obj = ev.get("type"), ev.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ApiException(status=obj.get("code") or 0, reason=str(obj.get("message")))
        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
        if type_ in ("ADDED", "MODIFIED", "DELETED"):
            self._apply(self.cache.event, self.kind, type_, self.transform(obj))
        return rv

    def _failed(self, exc: Exception) -> tuple[float, bool]:
        """(seconds to wait, list again) after a list or watch ended with ``exc``."""
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, _Expired):
            return 0.0, True
        if isinstance(exc, ApiException):
            if exc.status == 410:
                return 0.0, True
            if self.optional and not self._listed and exc.status in (403, 404):
                self._apply(self.cache.refused, self.kind, exc.status, self.scope)
                self.synced.set()
                return REFUSED_RETRY, True
            self._failures += 1
            self.last_error = f"{exc.status} {exc.reason}"  # the controller's "not synced" warning names it
            (log.warning if self._failures % 60 == 1 else log.debug)(  # rate-limited: the first, then ~every 5 min
                "watch of %s in %s failed: %s %s", self.kind, self.namespace or "all namespaces",
                exc.status, exc.reason)
            wait = min(WATCH_RETRY_MAX, 0.5 * 2 ** min(self._failures, 6))
            if exc.status in (401, 403) and self._listed:
                # its access was taken away after it listed: list again (only a list proves it is back)
                if self.refused_since is None:
                    self.refused_since = time.monotonic()
                return wait, True
            return wait, False
        self._failures += 1  # connection dropped, timed out: watch again from rv
        log.info("watch of %s in %s interrupted (%s); resuming", self.kind, self.namespace or "all namespaces",
                 str(exc) or type(exc).__name__)
        return min(WATCH_RETRY_MAX, 0.2 * 2 ** min(self._failures, 7)), False

    # ------------------------------------------------------------------ the two transports

    async def _get(self, query: dict[str, Any]) -> Any:
        if self.akube is not None:
            return await self.akube.request("GET", self.path, query=query, timeout=(10.0, 120.0))
        return await asyncio.to_thread(self.kube.request, "GET", self.path, query=query, timeout=(10.0, 120.0))

    def _watch(self, rv: str) -> AsyncGenerator[dict[str, Any], None]:
        timeout = (10.0, self.watch_seconds + WATCH_READ_MARGIN_SECONDS)
        if self.akube is not None:
            return self.akube.stream(self.path, self._watch_query(rv), timeout)
        return in_thread(lambda: self.kube.stream(self.path, self._watch_query(rv), timeout=timeout), self.loop,
                         f"informer-{self.kind}-{self.namespace or 'all'}")

    # ------------------------------------------------------------------ the loop

    def _apply(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a bad object never stops the informer
            log.exception("watch cache: cannot apply a %s event", self.kind)

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont = None
        while True:
            doc = await self._get(self._list_query(cont))
            items += doc.get("items") or []
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items, doc["metadata"]["resourceVersion"]

    async def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    items, rv = await self._list()
                    self._listed_all(items)
                async with contextlib.aclosing(self._watch(rv)) as events:
                    async for ev in events:
                        try:
                            rv = self._event(ev, rv)
                        except _Expired:
                            rv = None
                            break
                self._failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an informer never stops but by stop()
                wait, relist = self._failed(exc)
                if relist:
                    rv = None
                if wait:
                    await asyncio.sleep(wait)


class _Ended:
    """What :func:`in_thread`'s reader hands over last: the end of its iterator, or its error."""

    def __init__(self, exc: BaseException | None = None) -> None:
        self.exc = exc


async def in_thread(make: Callable[[], Iterator[dict[str, Any]]], loop: asyncio.AbstractEventLoop,
                    name: str) -> AsyncGenerator[dict[str, Any], None]:
    """The documents of a blocking iterator (:meth:`Kube.stream`, for a client configuration
    aiohttp does not reproduce) read in a daemon thread and handed to ``loop`` in batches: one
    wake-up of the loop for all the documents that arrived while it was busy. Its error is raised
    here. Closed early, the thread stops at its next document (or the watch's timeout)."""
    inbox: list[dict[str, Any] | _Ended] = []
    lock = threading.Lock()
    ready = asyncio.Event()
    closed = threading.Event()
    scheduled = False  # a wake-up of the loop is on its way and the inbox was not taken since

    def deliver(item: dict[str, Any] | _Ended) -> None:
        nonlocal scheduled
        with lock:
            inbox.append(item)
            if scheduled:
                return
            scheduled = True
        loop.call_soon_threadsafe(ready.set)

    def read() -> None:
        try:
            for doc in make():
                if closed.is_set():
                    return
                deliver(doc)
            deliver(_Ended())
        except BaseException as exc:  # noqa: BLE001 - raised on the loop
            deliver(_Ended(exc))

    threading.Thread(target=read, name=name, daemon=True).start()
    try:
        while True:
            await ready.wait()
            with lock:
                batch = inbox[:]
                inbox.clear()
                scheduled = False
                ready.clear()
            for item in batch:
                if isinstance(item, _Ended):
                    if item.exc is not None:
                        raise item.exc
                    return
                yield item
    finally:
        closed.set()
