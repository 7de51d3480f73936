"""Observe: the watch cache's objects (a run, its Jobs, their pods) -> :class:`Observed`.

Pure functions of plain dicts (the API server's JSON), no I/O: the shell hands them what its cache
holds (and keeps the memos, ``controller/memos.py``). Pod details (exit code, termination
message, waiting reason) are read only for the run's current attempt, the only one ``decide``
looks at.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import pydantic

from agentrun.api.contract import LABEL_ATTEMPT, LABEL_LAP
from agentrun.api.kueue import QUEUE_NAME_LABEL
from agentrun.api.spec import AgentRunManifestSpec, AgentRunSpec
from agentrun.api.status import AgentRunStatus
from agentrun.api.types import parse_time

from ..config import OperatorConfig
from ..logs import run_logger
from .jobs import ANNOTATION_AGENT_VERSION, ANNOTATION_APPROVAL, job_name, resolve_store, store_of_env
from .observed import Observed, ObservedJob
from .retries import next_lap_attempt

#: A run's spec as parsed: the effective spec of an inline ``spec.agent``, or the manifest of a run
#: of an Agent (``spec.agentRef``: resolved by ``decide``, ``decide/agents.py``).
RunSpec = AgentRunSpec | AgentRunManifestSpec
Parsed = tuple[RunSpec | None, str | None, AgentRunStatus]


class SpecParser(Protocol):
    """The shell's memo of :func:`parse_spec` per run (``controller/memos.py``: ``SpecMemo``)."""

    def parse(self, key: tuple[str, str], raw: Any) -> tuple[RunSpec | None, str | None]: ...


class JobObserver(Protocol):
    """The shell's memo of :func:`observed_job` (observed without pods) per cached Job object."""

    def observed(self, job: dict[str, Any]) -> ObservedJob | None: ...


def job_state(job: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> tuple[str, str | None]:
    """("active" | "succeeded" | "failed", the failed condition's reason).

    A Job whose pod exited 0 (``pods``: its cached pods, one in phase Succeeded) has succeeded,
    whatever its conditions say: kube-controller-manager's Job controller marks it Complete about a
    second later (it batches the pod's update), and the lap need not wait for that. The pod is the
    lap: a lap Job runs one pod (``backoffLimit: 0``, one completion), so a pod that exited 0 is its
    last, and a Failed condition set after it (a deadline passing meanwhile) does not undo what the
    lap wrote. The checkpoint decides the lap's outcome (docs/concepts.md, "When a lap is over")."""
    if pods and pod_succeeded(pods, (job.get("metadata") or {}).get("uid")):
        return "succeeded", None
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return "succeeded", None
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return "failed", cond.get("reason")
    return "active", None


def pod_succeeded(pods: list[dict[str, Any]], job_uid: str | None = None) -> bool:
    """A pod of the Job exited 0 (phase Succeeded: every container terminated with exit 0). With
    ``job_uid``, only a pod the Job controls counts (its controller ownerReference names the Job's
    uid): a pod someone else made with the Job's ``job-name`` label does not end the lap."""
    return any((p.get("status") or {}).get("phase") == "Succeeded"
               and (job_uid is None or any(ref.get("controller") and ref.get("uid") == job_uid
                                           for ref in (p.get("metadata") or {}).get("ownerReferences") or []))
               for p in pods)


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
    current = {job_name(name, uid, *next_lap_attempt(status))}
    if status.active_job is not None:
        current.add(status.active_job.name)
    return current


def observed_job(job: dict[str, Any], pods: list[dict[str, Any]] | None) -> ObservedJob | None:
    """One lap Job as ``decide`` sees it; ``pods`` only for a current Job (None: not read)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        lap, attempt = int(labels[LABEL_LAP]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    state, job_reason = job_state(job, pods)
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
    # raw: decide bounds and redacts it
    term = termination_message(pods) if state != "active" and pods is not None else None
    started = (job.get("status") or {}).get("startTime") or meta.get("creationTimestamp")
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec") or {})
    containers = pod_spec.get("containers") or [{}]
    return ObservedJob(
        name=meta["name"], lap=lap, attempt=attempt, state=state,  # type: ignore[arg-type]
        suspended=(job.get("spec") or {}).get("suspend") is True, queue_name=labels.get(QUEUE_NAME_LABEL),
        uid=meta.get("uid"),
        exit_code=exit_code, reason=reason, message=message,
        agent_version=(meta.get("annotations") or {}).get(ANNOTATION_AGENT_VERSION),
        started_at=parse_time(started),
        waiting_reason=waiting[0], waiting_message=waiting[1], waiting_since=parse_time(waiting[2]),
        approval=(meta.get("annotations") or {}).get(ANNOTATION_APPROVAL),
        store=store_of_env(containers[0].get("env") or []), termination_message=term,
    )


def needs_pod_read(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """A failed Job whose pods the cache has not seen terminate yet (the Job's watch event came
    first, or the pod is gone): the shell reads its pods from the API server once. A Job that
    succeeded needs no pod: its exit is 0 and the checkpoint tells the rest."""
    if job_state(job)[0] != "failed":
        return False
    return pod_exit(pods) == (None, None)


def pod_check_due(job: dict[str, Any], now: datetime, grace: float,
                  pods: list[dict[str, Any]] | None = None) -> float | None:
    """Seconds until the pods of an active Job should be read for a configuration error (0: now),
    None when they need not be: the Job finished (or its pod exited 0: ``pods``), or its pod is
    ready. Only pods that exited 0 are watched: a pod that cannot start (a missing Secret: CreateContainerConfigError) shows as a Job that stays
    active and not ready; it is looked at once the Job is ``grace`` seconds old (a lap that starts
    within the grace costs no read)."""
    if job_state(job, pods)[0] != "active" or (job.get("status") or {}).get("ready") \
            or (job.get("spec") or {}).get("suspend") is True:  # a suspended Job has no pod (Kueue holds it)
        return None
    # since it started (a Job Kueue held started when it was admitted), else since its creation
    created = parse_time((job.get("status") or {}).get("startTime")
                         or (job.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return 0.0
    return max(0.0, grace - (now - created).total_seconds())


def parse_spec(raw: Any) -> tuple[RunSpec | None, str | None]:
    """The run's spec, or why it cannot be used: an inline ``spec.agent`` parsed as the effective
    spec (as before Agents existed), a ``spec.agentRef`` as the manifest."""
    try:
        if isinstance(raw, dict) and ("agentRef" in raw or "parameters" in raw):
            return AgentRunManifestSpec.model_validate(raw), None
        return AgentRunSpec.model_validate(raw or {}), None
    except pydantic.ValidationError as exc:
        return None, spec_error_text(exc)


def parse_run(body: dict[str, Any], specs: SpecParser | None = None) -> Parsed:
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
            job_memo: JobObserver | None = None) -> Observed:
    """The run as ``decide`` sees it: ``body`` is the cached AgentRun, ``jobs`` its lap Jobs,
    ``pods_of(job name)`` the cached pods of a Job; ``parsed``: ``parse_run(body)`` when the caller
    has it already; ``job_memo``: the Jobs other than the current ones observed through it."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    parsed_spec, spec_error, status = parsed if parsed is not None else parse_run(body)
    spec = parsed_spec if isinstance(parsed_spec, AgentRunSpec) else None
    request = parsed_spec if isinstance(parsed_spec, AgentRunManifestSpec) else None
    current = current_jobs(name, uid, status)
    observed_jobs = []
    for job in jobs:
        jname = (job.get("metadata") or {}).get("name")
        if jname in current:
            oj = observed_job(job, pods_of(jname))
        else:
            oj = job_memo.observed(job) if job_memo is not None else observed_job(job, None)
            if oj is not None and oj.state == "active":  # a Job the Job controller has not marked yet
                pods = pods_of(oj.name)
                if pods and pod_succeeded(pods, oj.uid):
                    oj = dataclasses.replace(oj, state="succeeded")
        if oj is not None:
            observed_jobs.append(oj)
    resolved, store_error = None, None
    if parsed_spec is not None:
        try:
            resolved = resolve_store(parsed_spec, config)
        except (ValueError, pydantic.ValidationError) as exc:
            store_error = str(exc)
    return Observed(
        namespace=namespace, name=name, uid=uid, generation=int(meta.get("generation") or 1),
        spec=spec, request=request, spec_error=spec_error, status=status, now=now,
        pod_config_grace_seconds=config.pod_config_grace_seconds, lap_image=config.lap_image,
        tracing=config.tracing,
        resolved_store=resolved, store_error=store_error,
        annotations=dict(meta.get("annotations") or {}), finalizers=tuple(meta.get("finalizers") or ()),
        deleting=bool(meta.get("deletionTimestamp")), jobs=tuple(observed_jobs),
        store_retry_seconds=config.store_retry_seconds,
    )
