"""Observe: the watch cache's objects (a run, its Jobs, their pods) -> :class:`decide.Observed`.

Pure functions of plain dicts (the API server's JSON), no I/O: the shell hands them what the cache
holds. Pod details (exit code, termination message, waiting reason) are read only for the run's
current attempt, the only one ``decide`` looks at.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pydantic

from agentrun.api.contract import LABEL_ATTEMPT, LABEL_LAP
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus
from agentrun.api.types import parse_time

from . import decide as d
from .config import OperatorConfig
from .jobs import (
    ANNOTATION_AGENT_VERSION,
    ANNOTATION_APPROVAL,
    job_name,
    resolve_store,
    store_of_env,
)
from .logs import run_logger

log = logging.getLogger("agentrun.controller")
#: Fields the decide side may add (coordinated in the notes of issue 12): filled when present.
_JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(d.ObservedJob))
_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(d.Observed))


def job_state(job: dict[str, Any]) -> tuple[str, str | None]:
    """("active" | "succeeded" | "failed", the failed condition's reason)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return "succeeded", None
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return "failed", cond.get("reason")
    return "active", None


def spec_error_text(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"spec.{loc}: {err.get('msg')}" if loc else f"spec: {err.get('msg')}")
    return "; ".join(parts)


def pod_exit(pods: list[dict[str, Any]]) -> tuple[int | None, str | None]:
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


def newest_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Job's most recently created pod (the attempt's pod, when the Job made more than one)."""
    return max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", default=None)


def termination_message(pods: list[dict[str, Any]]) -> str | None:
    """The raw termination message of the newest pod's container (None when it has none)."""
    pod = newest_pod(pods)
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        if term.get("message"):
            return str(term["message"])
    return None


def pod_failure_message(pods: list[dict[str, Any]], limit: int = 600) -> str | None:
    """The lap runner's own failure message from the newest pod's termination message (the
    log tail, terminationMessagePolicy FallbackToLogsOnError): the ``error`` of its last "lap failed"
    / "lap configuration refused" JSON line. Already redacted by the runner. It names the failure
    when the runner could not write its attempt report (e.g. the store refused its credentials)."""
    for line in reversed((termination_message(pods) or "").splitlines()):
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") in ("lap failed", "lap configuration refused") \
                and entry.get("error"):
            text = str(entry["error"])
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return None


def pod_waiting(pods: list[dict[str, Any]]) -> tuple[str | None, str | None, str | None]:
    """(waiting reason, message, pod creationTimestamp) of the newest pod of a Job whose container
    has not started, else (None, None, None). The messages name Secrets and keys, never values."""
    pod = newest_pod(pods)
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            created = ((pod or {}).get("metadata") or {}).get("creationTimestamp")
            return waiting["reason"], waiting.get("message"), created
    return None, None, None


def current_jobs(name: str, uid: str, status: AgentRunStatus) -> set[str]:
    """The Jobs whose pods ``decide`` reads: the recorded attempt, and the one about to be adopted."""
    current = {job_name(name, uid, *d.next_lap_attempt(status))}
    if status.active_job is not None:
        current.add(status.active_job.name)
    return current


def observed_job(job: dict[str, Any], pods: list[dict[str, Any]] | None) -> d.ObservedJob | None:
    """One lap Job as ``decide`` sees it; ``pods`` only for a current Job (None: not read)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        lap, attempt = int(labels[LABEL_LAP]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    state, job_reason = job_state(job)
    exit_code = reason = message = None
    if state != "active" and pods is not None:
        exit_code, reason = pod_exit(pods)
        message = pod_failure_message(pods) if exit_code not in (None, 0, 3) else None
        if job_reason == "DeadlineExceeded":
            reason = "DeadlineExceeded: the lap ran longer than spec.lapTimeout"
        elif reason is None:
            reason = job_reason if exit_code is None else None
        if exit_code is None and reason == "BackoffLimitExceeded":
            reason = "PodGone: the lap pod was deleted or lost"
    waiting: tuple[str | None, str | None, Any] = (None, None, None)
    if state == "active" and pods is not None and not (job.get("status") or {}).get("ready"):
        # a pod that does not run yet: is it stuck on its configuration (a missing Secret)?
        waiting = pod_waiting(pods)
    extra: dict[str, Any] = {}
    if "termination_message" in _JOB_FIELDS and state != "active" and pods is not None:
        extra["termination_message"] = termination_message(pods)  # raw: decide bounds and redacts
    started = (job.get("status") or {}).get("startTime") or meta.get("creationTimestamp")
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec") or {})
    containers = pod_spec.get("containers") or [{}]
    return d.ObservedJob(
        name=meta["name"], lap=lap, attempt=attempt, state=state,  # type: ignore[arg-type]
        exit_code=exit_code, reason=reason, message=message,
        agent_version=(meta.get("annotations") or {}).get(ANNOTATION_AGENT_VERSION),
        started_at=parse_time(started),
        waiting_reason=waiting[0], waiting_message=waiting[1], waiting_since=parse_time(waiting[2]),
        approval=(meta.get("annotations") or {}).get(ANNOTATION_APPROVAL),
        store=store_of_env(containers[0].get("env") or []), **extra,
    )


def put_bounded(memo: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """``memo[key] = value``; a new key past ``limit`` entries empties the memo first (the memos of
    this module hold only what can be made again)."""
    if len(memo) >= limit and key not in memo:
        memo.clear()
    memo[key] = value


class JobMemo:
    """Each lap Job's :func:`observed_job` (observed without pods) while the cache holds the same
    object for it. The cache replaces a Job's dict on every watch event and never changes one, so an
    unchanged Job is observed once, not on every pass of every reconcile of its run: a run keeps its
    finished Jobs for the Jobs' TTL (an hour by default), hundreds of them for a run of short laps,
    and each pass observed them all (bench/bench_reconcile_growth.py). It holds the cached dicts:
    :meth:`forget` drops a Job the cache dropped (``Cache(on_job_gone=...)``); past ``limit`` Jobs
    it starts again (observing again is only work)."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._memo: dict[tuple[Any, Any], tuple[dict[str, Any], d.ObservedJob | None]] = {}

    def observed(self, job: dict[str, Any]) -> d.ObservedJob | None:
        meta = job.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is job:
            return hit[1]
        oj = observed_job(job, None)
        put_bounded(self._memo, key, (job, oj), self.limit)  # the dict is held: its id is not reused while here
        return oj

    def forget(self, key: tuple[Any, Any]) -> None:
        """The Job ``(namespace, name)`` left the cache."""
        self._memo.pop(key, None)

    def __len__(self) -> int:
        return len(self._memo)


def needs_pod_read(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """A failed Job whose pods the cache has not seen terminate yet (the Job's watch event came
    first, or the pod is gone): the shell reads its pods from the API server once. A Job that
    succeeded needs no pod: its exit is 0 and the checkpoint tells the rest."""
    if job_state(job)[0] != "failed":
        return False
    return pod_exit(pods) == (None, None)


def pod_check_due(job: dict[str, Any], now: datetime, grace: float) -> float | None:
    """Seconds until the pods of an active Job should be read for a configuration error (0: now),
    None when they need not be: the Job finished, or its pod is ready. Pods are not watched: a pod
    that cannot start (a missing Secret: CreateContainerConfigError) shows as a Job that stays
    active and not ready; it is looked at once the Job is ``grace`` seconds old (a lap that starts
    within the grace costs no read)."""
    if job_state(job)[0] != "active" or (job.get("status") or {}).get("ready"):
        return None
    created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return 0.0
    return max(0.0, grace - (now - created).total_seconds())


Parsed = tuple[AgentRunSpec | None, str | None, AgentRunStatus]


class SpecMemo:
    """Per run (by namespace and name): its last parsed spec, reused while its JSON is equal (a spec
    changes rarely, a reconcile parses it once or twice per lap; comparing the dicts costs a few
    microseconds, the parse a few hundred), and the lap's spec JSON made of that parsed spec
    (:meth:`text`: dumping the spec was a twentieth of a lap's CPU). The parsed specs are shared:
    nothing changes a parsed spec."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        # run -> [spec JSON as listed, its parsed spec, why it cannot be used, the lap's spec text]
        self._memo: dict[tuple[str, str], list[Any]] = {}

    def _put(self, key: tuple[str, str], entry: list[Any]) -> None:
        put_bounded(self._memo, key, entry, self.limit)

    def parse(self, key: tuple[str, str], raw: Any) -> tuple[AgentRunSpec | None, str | None]:
        hit = self._memo.get(key)
        if hit is not None and hit[0] is not _UNLISTED and (hit[0] is raw or hit[0] == raw):
            return hit[1], hit[2]
        spec, spec_error = parse_spec(raw)
        self._put(key, [raw, spec, spec_error, None])
        return spec, spec_error

    def text(self, key: tuple[str, str], spec: AgentRunSpec, dump: Callable[[AgentRunSpec], str]) -> str:
        """``dump(spec)``, made again only when ``spec`` is not the parsed spec it was made of."""
        hit = self._memo.get(key)
        if hit is None or hit[1] is not spec:
            hit = [_UNLISTED, spec, None, None]  # a spec not parsed here: kept for its text only
            self._put(key, hit)
        if hit[3] is None:
            hit[3] = dump(spec)
        return str(hit[3])

    def forget(self, key: tuple[str, str]) -> None:
        self._memo.pop(key, None)


#: The "spec JSON" of a memo entry made by :meth:`SpecMemo.text` alone (never equal to a listed one).
_UNLISTED = object()


def parse_spec(raw: Any) -> tuple[AgentRunSpec | None, str | None]:
    """The run's spec, or why it cannot be used."""
    try:
        return AgentRunSpec.model_validate(raw or {}), None
    except pydantic.ValidationError as exc:
        return None, spec_error_text(exc)


def parse_run(body: dict[str, Any], specs: SpecMemo | None = None) -> Parsed:
    """The run's spec (or why it cannot be used) and status (an unreadable one starts empty)."""
    meta = body.get("metadata") or {}
    if specs is not None:
        spec, spec_error = specs.parse((str(meta.get("namespace")), str(meta.get("name"))), body.get("spec"))
    else:
        spec, spec_error = parse_spec(body.get("spec"))
    try:
        status = AgentRunStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError as exc:
        run_logger(meta.get("namespace", ""), meta.get("name", "")).error(
            "status unreadable, starting from an empty status: %s", spec_error_text(exc))
        status = AgentRunStatus()
    return spec, spec_error, status


def observe(body: dict[str, Any], jobs: list[dict[str, Any]], pods_of: Callable[[str], list[dict[str, Any]]],
            config: OperatorConfig, now: datetime, parsed: Parsed | None = None,
            job_memo: JobMemo | None = None) -> d.Observed:
    """The run as ``decide`` sees it: ``body`` is the cached AgentRun, ``jobs`` its lap Jobs,
    ``pods_of(job name)`` the cached pods of a Job; ``parsed``: ``parse_run(body)`` when the caller
    has it already; ``job_memo``: the Jobs other than the current ones observed through it."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    spec, spec_error, status = parsed if parsed is not None else parse_run(body)
    current = current_jobs(name, uid, status)
    observed_jobs = []
    for job in jobs:
        jname = (job.get("metadata") or {}).get("name")
        if jname in current:
            oj = observed_job(job, pods_of(jname))
        else:
            oj = job_memo.observed(job) if job_memo is not None else observed_job(job, None)
        if oj is not None:
            observed_jobs.append(oj)
    resolved, store_error = None, None
    if spec is not None:
        try:
            resolved = resolve_store(spec, config)
        except (ValueError, pydantic.ValidationError) as exc:
            store_error = str(exc)
    extra: dict[str, Any] = {}
    if "store_retry_seconds" in _RUN_FIELDS:
        extra["store_retry_seconds"] = config.store_retry_seconds
    return d.Observed(
        namespace=namespace, name=name, uid=uid, generation=int(meta.get("generation") or 1),
        spec=spec, spec_error=spec_error, status=status, now=now,
        pod_config_grace_seconds=config.pod_config_grace_seconds, lap_image=config.lap_image,
        resolved_store=resolved, store_error=store_error,
        annotations=dict(meta.get("annotations") or {}), finalizers=tuple(meta.get("finalizers") or ()),
        deleting=bool(meta.get("deletionTimestamp")), jobs=tuple(observed_jobs), **extra,
    )
