"""The controller's watch cache: AgentRuns and their lap Jobs, in memory, and the few pods the
reconciler read.

Runs and Jobs are listed once and then watched (:class:`~agentrun.kube.informer.Informer`, one per
kind and namespace, a task on the event loop); a watch that expires (410 Gone) lists again. Every
change is applied on the event loop (:class:`Cache`), which is where reconciles read, so a reconcile
sees one consistent state and makes no read request of its own. ``metadata.managedFields`` (never
read) is dropped before an object reaches the cache (:data:`TRANSFORMS`).

Of the lap pods, only those that exited 0 are watched (field selector ``status.phase=Succeeded``:
about two events per lap, where every pod's start, readiness and exit would be five or more): a
pod's exit 0 ends its lap (``decide/observe.py`` ``job_state``) about a second before the Job
controller marks its Job Complete. The reconciler reads other pods of one Job on demand
(:meth:`Cache.put_pods`) -- a failed Job's, for its exit, and an active Job's that is not ready
after ``pod_config_grace_seconds``, for a configuration error. Pods are kept slimmed
(:func:`slim_pod`) and dropped with their Job.

What enqueues a run (``on_change``):

- the run itself changed (a newer ``resourceVersion`` than the cache holds). The operator's own
  writes are put into the cache from their responses (:meth:`Cache.put`), so their watch events
  carry no newer version and are skipped;
- one of its Jobs appeared, disappeared, or changed *state* (active/succeeded/failed and its
  reason), not on every status update of the Job; a lap pod exited 0 while its Job was active
  (the Job's Complete that follows enqueues nothing: the run saw the lap end already);
- a Job whose pods the reconciler read because it was not ready (:attr:`Cache.pod_checked`)
  became ready or not ready (a missing Secret created: the lap starts);
- the Agent it names (``spec.agentRef``) appeared, disappeared or its spec changed (a new
  ``metadata.generation``): a run held on it starts, a FollowLatest run moves at its next lap.

``resourceVersion``s are compared as the integers the API server hands out (etcd revisions); an
event older than the cached object is stale and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.api.contract import LABEL_RUN_UID
from agentrun.api.lifecycle import OUTCOMES
from agentrun.api.status import Phase
from agentrun.kube.client import JOBS, PODS
from agentrun.kube.informer import is_newer, rv_int, strip
from agentrun.notify.plan import outcome_due

from .decide.observe import job_state, pod_succeeded
from .decide.queue import NO_GROUP, Group, OrderKey, order_key, slot_state

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
#: (group/version prefix, plural) of the AgentRuns.
RUNS = (f"/apis/{GROUP}/{VERSION}", PLURAL)

Key = tuple[str, str]  # (namespace, name)
#: (group/version prefix, plural) of the Agents (a run's spec.agentRef; api/agent.py).
AGENTS = (f"/apis/{GROUP}/{VERSION}", "agents")
#: The resource of each kind of the cache.
RESOURCES = {"runs": RUNS, "jobs": JOBS, "pods": PODS, "agents": AGENTS}
AWAITING: Phase = "AwaitingApproval"  # a Phase (mypy checks the literal against the API's)


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


#: What of a Job's metadata the controller reads (observe, the cache's index, resourceVersions).
JOB_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations",
                "creationTimestamp", "deletionTimestamp")


def slim_job(job: dict[str, Any]) -> dict[str, Any]:
    """A lap Job as the cache keeps it: its metadata that is read, its status, whether it is
    suspended, and the environment of its container (the store it was given,
    :func:`jobs.store_of_env`); not the rest of its pod template (most of its bytes)."""
    meta = job.get("metadata") or {}
    out: dict[str, Any] = {"metadata": {k: meta[k] for k in JOB_METADATA if k in meta}}
    if "status" in job:
        out["status"] = job["status"]
    spec = job.get("spec") or {}
    containers = (((spec.get("template") or {}).get("spec") or {}).get("containers")) or []
    if containers and isinstance(containers[0], dict) and "env" in containers[0]:
        out["spec"] = {"template": {"spec": {"containers": [{"env": containers[0]["env"]}]}}}
    if spec.get("suspend") is True:  # held by Kueue (decide/kueue.py)
        out.setdefault("spec", {})["suspend"] = True
    return out


#: What of a pod's metadata the controller reads (its Job, its run, its age, resourceVersions).
POD_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "creationTimestamp",
                "deletionTimestamp")
#: What of a container's status the controller reads (observe.py: exit, termination message, waiting reason).
CONTAINER_STATUS = ("name", "state", "lastState")


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A lap pod as the cache keeps it: its metadata that is read, its phase and reason, and its
    containers' states (exit code, termination message, waiting reason); not its spec."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    out_status: dict[str, Any] = {k: status[k] for k in ("phase", "reason") if k in status}
    if "containerStatuses" in status:
        out_status["containerStatuses"] = [{k: cs[k] for k in CONTAINER_STATUS if k in cs}
                                           for cs in status.get("containerStatuses") or [] if isinstance(cs, dict)]
    return {"metadata": {k: meta[k] for k in POD_METADATA if k in meta}, "status": out_status}


#: The field selector of the pod watch: the lap pods that exited 0.
POD_EXITED = "status.phase=Succeeded"

#: What each kind of the cache keeps of an object (its own writes' responses and watch events alike).
TRANSFORMS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"jobs": slim_job, "pods": slim_pod}


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
        #: The outcomes announced in a namespace for its runs without spec.notify (the notifier's:
        #: its AgentRunPolicies' choice, else its Settings.outcomes); None: no notifier, nothing indexed.
        #: Called on the event loop; when what it answers changes, :meth:`reindex_outcomes`.
        self.notify_outcomes: Callable[[str], tuple[str, ...]] | None = None
        self.runs: dict[Key, dict[str, Any]] = {}
        self.jobs: dict[Key, dict[str, Any]] = {}
        self.pods: dict[Key, dict[str, Any]] = {}
        self.agents: dict[Key, dict[str, Any]] = {}
        #: Kinds an optional informer may not list (kind -> HTTP status: 403 no RBAC, 404 not served),
        #: until a list of it succeeds: the Agents of a cluster without the Agent CRD or the RBAC.
        self.unreadable: dict[str, int] = {}
        self._runs_by_agent: dict[Key, set[Key]] = {}  # (namespace, Agent name) -> the runs naming it
        #: Whether a concurrency limit applies to a namespace (the reconciler's, from the policies):
        #: only there does a change of the queue wake anyone.
        self.limited: Callable[[str], bool] = lambda namespace: False
        #: Per namespace, the runs that hold a slot of a concurrency limit, and the ones that wait for
        #: one with their admission order (decide/queue.py slot_state, order_key).
        self.holding: dict[str, set[Key]] = {}
        self.waiting: dict[str, dict[Key, OrderKey]] = {}
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

    def agent(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.agents.get((namespace, name))

    def jobs_of(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [self.jobs[k] for k in sorted(self._jobs_by_uid.get(uid, ())) if k in self.jobs and k[0] == namespace]

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [self.pods[k] for k in sorted(self._pods_by_job.get((namespace, job), ())) if k in self.pods]

    def put_pods(self, namespace: str, job: str, items: list[dict[str, Any]]) -> None:
        """The pods of ``job`` as just read from the API server (only the exited ones are watched):
        the cached ones not listed are gone."""
        listed = {key_of(strip(o)) for o in items}
        for key in [k for k in self._pods_by_job.get((namespace, job), ()) if k not in listed]:
            self._drop_pod(key)
        for obj in items:
            self._apply("pods", "MODIFIED", obj, notify=False)

    def _drop_pod(self, key: Key) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._unindex("pods", key, old)

    def waiting_groups(self, namespace: str, group: Callable[[dict[str, Any]], Group]) -> list[tuple[OrderKey, Group]]:
        """The order key and ``group`` of each run of ``namespace`` that waits for a slot."""
        return [(o, group(self.runs[k]) if k in self.runs else NO_GROUP)
                for k, o in self.waiting.get(namespace, {}).items()]

    def holding_groups(self, namespace: str, group: Callable[[dict[str, Any]], Group]) -> list[Group]:
        """The ``group`` of each run of ``namespace`` that holds a slot."""
        return [group(self.runs[k]) if k in self.runs else NO_GROUP for k in self.holding.get(namespace, ())]

    def notifiable_runs(self) -> list[dict[str, Any]]:
        """The runs the notifier has something to announce about, by key: waiting on an approval,
        or an outcome due. The dicts are the cached ones: a change replaces a cached object, never
        mutates it, so another thread may read them."""
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

    def refused(self, kind: str, status: int, scope: str | None = None) -> None:
        """An optional informer's list of ``kind`` was refused (403, 404): it tries again later."""
        self.unreadable[kind] = status

    def replace(self, kind: str, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """A (re)list of ``kind`` in ``namespace`` (None: everywhere): objects no longer listed were
        deleted meanwhile."""
        self.unreadable.pop(kind, None)
        store = self._store(kind)
        listed = {key_of(o) for o in items}
        # the pod watch lists the pods that exited 0: the pods read on demand are not its to drop
        watched: Callable[[dict[str, Any]], bool] = (lambda o: pod_succeeded([o])) if kind == "pods" else (lambda o: True)
        for key in [k for k in store if (namespace is None or k[0] == namespace) and k not in listed
                    and watched(store[k])]:
            self._apply(kind, "DELETED", store[key], notify=True)
        for obj in items:
            self._apply(kind, "ADDED", obj, notify=True, relist=True)

    def _store(self, kind: str) -> dict[Key, dict[str, Any]]:
        return {"runs": self.runs, "jobs": self.jobs, "pods": self.pods, "agents": self.agents}[kind]

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
        if kind == "agents":
            return
        if kind == "runs":
            if meta.get("uid"):
                self._run_by_uid[meta["uid"]] = key
            ref, before_ref = _agent_ref(obj), _agent_ref(old)
            if before_ref is not None and before_ref != ref:
                self._drop_agent_ref(key, before_ref)
            if ref is not None:
                self._runs_by_agent.setdefault((key[0], ref), set()).add(key)
            self._slot(key, slot_state(obj), order_key(obj))
            st = obj.get("status") or {}
            ap = st.get("approval") or {}
            if st.get("phase") == AWAITING and ap.get("state") == "Pending" and ap.get("callId"):
                before = self.awaiting.get(key)
                self.awaiting[key] = str(ap["callId"])
                if before != self.awaiting[key] and self.on_awaiting is not None:
                    self.on_awaiting(key)
            else:
                self.awaiting.pop(key, None)
            self._index_outcome(key, obj)
        elif kind == "jobs":
            uid = (meta.get("labels") or {}).get(LABEL_RUN_UID)
            if uid:
                self._jobs_by_uid.setdefault(uid, set()).add(key)
        else:
            job = (meta.get("labels") or {}).get("job-name")
            if job:
                self._pods_by_job.setdefault((key[0], job), set()).add(key)

    def _index_outcome(self, key: Key, obj: dict[str, Any],
                       chosen: dict[str, tuple[str, ...]] | None = None) -> None:
        """Index the run's outcome when one is due to be announced (a terminal phase: only then are
        its namespace's outcomes asked, once per namespace in ``chosen`` when given); wake the
        notifier for a new one."""
        due = None
        if self.notify_outcomes is not None and (obj.get("status") or {}).get("phase") in OUTCOMES:
            if chosen is None:
                outcomes = self.notify_outcomes(key[0])
            elif key[0] in chosen:
                outcomes = chosen[key[0]]
            else:
                outcomes = chosen[key[0]] = self.notify_outcomes(key[0])
            due = outcome_due(obj, outcomes)
        if due is not None:
            before = self.outcomes_due.get(key)
            self.outcomes_due[key] = due.idempotency_key
            if before != due.idempotency_key and self.on_awaiting is not None:
                self.on_awaiting(key)
        else:
            self.outcomes_due.pop(key, None)

    def reindex_outcomes(self, namespaces: set[str] | None) -> None:
        """The outcomes chosen for ``namespaces`` (None: all) changed (an AgentRunPolicy's
        notifications.outcomes): index their finished runs again; a newly due one wakes the notifier."""
        chosen: dict[str, tuple[str, ...]] = {}
        for key, obj in list(self.runs.items()):
            if namespaces is None or key[0] in namespaces:
                self._index_outcome(key, obj, chosen)

    def _unindex(self, kind: str, key: Key, old: dict[str, Any]) -> None:
        meta = old.get("metadata") or {}
        if kind == "agents":
            return
        if kind == "runs":
            ref = _agent_ref(old)
            if ref is not None:
                self._drop_agent_ref(key, ref)
            if self._run_by_uid.get(meta.get("uid", "")) == key:
                del self._run_by_uid[meta["uid"]]
            self._slot(key, None, None)
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
            for pod in list(self._pods_by_job.get(key, ())):  # pods go with their Job
                self._drop_pod(pod)
        else:
            job = (meta.get("labels") or {}).get("job-name")
            keys = self._pods_by_job.get((key[0], job or ""))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._pods_by_job[(key[0], job or "")]

    def _slot(self, key: Key, state: str | None, order: OrderKey | None) -> None:
        """Index the run by its slot state. What moves a waiting run's place (``status.queue``) wakes it:
        a run that stops holding a slot (finished, deleted) wakes every waiting run of its namespace
        (one of them may be admitted now); a run that joins or leaves the waiting ones (created,
        admitted, deleted, its priority changed) wakes the waiting runs behind it."""
        ns = key[0]
        freed = key in self.holding.get(ns, ()) and state is None
        before = self.waiting.get(ns, {}).get(key)
        after = order if state == "waits" else None
        _member(self.holding, ns, key, state == "holds")
        waiting = self.waiting.setdefault(ns, {})
        if after is not None:
            waiting[key] = after
        else:
            waiting.pop(key, None)
        if not waiting:
            del self.waiting[ns]
        if not (freed or before != after) or not self.limited(ns):
            return
        behind = None if freed else min(o for o in (before, after) if o is not None)
        for run, run_order in sorted(self.waiting.get(ns, {}).items()):
            if run != key and (behind is None or run_order > behind):
                self.enqueue(run, "queue moved")

    def _drop_agent_ref(self, key: Key, ref: str) -> None:
        runs = self._runs_by_agent.get((key[0], ref))
        if runs is not None:
            runs.discard(key)
            if not runs:
                del self._runs_by_agent[(key[0], ref)]

    def _agent_changed(self, key: Key, cause: str) -> None:
        for run in sorted(self._runs_by_agent.get(key, ())):
            self.enqueue(run, cause)

    def _owner(self, obj: dict[str, Any]) -> Key | None:
        uid = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN_UID)
        return self._run_by_uid.get(uid or "")

    def _notify(self, kind: str, key: Key, obj: dict[str, Any], old: dict[str, Any] | None, relist: bool) -> None:
        if kind == "runs":
            self.enqueue(key, "run listed" if relist else "run changed")
            return
        if kind == "agents":
            if old is None or _generation(obj) != _generation(old):
                self._agent_changed(key, "agent changed")
            else:
                self.skipped += 1
            return
        owner = self._owner(obj)
        if owner is None:
            return
        if kind == "jobs":
            ready = key in self.pod_checked
            if old is None or job_signature(obj, ready) != job_signature(old, ready):
                if old is not None and job_state(old, self.pods_of(*key))[0] == job_state(obj)[0] == "succeeded":
                    self.skipped += 1  # Complete after its pod exited 0: the run saw the lap end then
                    return
                self.enqueue(owner, "job added" if old is None else "job state")
            else:
                self.skipped += 1
            return
        job = self.jobs.get((key[0], ((obj.get("metadata") or {}).get("labels") or {}).get("job-name") or ""))
        if job is not None and pod_succeeded([obj], (job.get("metadata") or {}).get("uid")) \
                and not (old is not None and pod_succeeded([old])) and job_state(job)[0] == "active":
            self.enqueue(owner, "pod exited")  # the lap is over (observe.job_state), its Job not marked yet
            return
        self.skipped += 1  # a later update of an exited pod, or the reconciler's own reads

    def _notify_deleted(self, kind: str, key: Key, old: dict[str, Any]) -> None:
        if kind == "agents":
            self._agent_changed(key, "agent deleted")
            return
        if kind == "runs":
            if self.on_deleted is not None:
                self.on_deleted(key)
            return
        if kind == "jobs":
            owner = self._owner(old)
            if owner is not None:
                self.enqueue(owner, "job deleted")


def _member(index: dict[str, set[Key]], ns: str, key: Key, member: bool) -> None:
    """Add ``key`` to (or drop it from) ``index[ns]``; an empty set is removed."""
    keys = index.setdefault(ns, set())
    if member:
        keys.add(key)
    else:
        keys.discard(key)
    if not keys:
        del index[ns]


def _agent_ref(run: dict[str, Any] | None) -> str | None:
    """The Agent a run names (spec.agentRef.name), if any."""
    ref = ((run or {}).get("spec") or {}).get("agentRef")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and name else None


def _generation(obj: dict[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("generation")
