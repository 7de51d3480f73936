"""The run's checkpoint store: pinned in status before anything touches it, probed for
conditional writes before the first lap, and what an outage looks like."""

from __future__ import annotations

import re

from agentrun.api.reasons import ConditionType, Reason
from agentrun.api.status import AgentRunStatus, StoreLocation

from .actions import Decision, ProbeStore, RequeueAfter
from .context import Ctx, StatusWriter, condition
from .observed import ObservedJob

_STORE_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")


def store_uri_of_checkpoint(object_uri: str, namespace: str, name: str, uid: str) -> str | None:
    """``s3://bucket/prefix`` of a run from the full URI of one of its objects
    (``s3://bucket/prefix/<namespace>/<name>/<uid>/laps/...``), or None."""
    i = object_uri.find(f"/{namespace}/{name}/{uid}/")
    base = object_uri[:i] if i > 0 else ""
    return base if _STORE_URI.match(base) else None


def pinned_store(status: AgentRunStatus, namespace: str, name: str, uid: str,
                 jobs: tuple[ObservedJob, ...] = (), resolved: StoreLocation | None = None) -> StoreLocation | None:
    """The store a run already uses: ``status.store``; for a run started by an earlier release
    (no status.store), the location of its last checkpoint (status.checkpoint: uri, endpoint,
    region, pathStyle), else the store its active Job was given. Never the operator's current
    default for a run that has written anything; None for a run that has not started."""
    if status.store is not None:
        return status.store
    job_store = None
    if status.active_job is not None:
        job_store = next((j.store for j in jobs if j.name == status.active_job.name and j.store), None)
    cp = status.checkpoint
    base = store_uri_of_checkpoint(cp.uri, namespace, name, uid) if cp is not None and cp.uri else None
    if cp is not None and base is not None:
        if cp.path_style is not None:  # the release that wrote it recorded where the store is
            return StoreLocation(uri=base, endpoint=cp.endpoint, region=cp.region, path_style=cp.path_style)
        where = job_store or resolved
        return StoreLocation(uri=base, endpoint=where.endpoint if where else None,
                             region=where.region if where else None, path_style=bool(where and where.path_style))
    return job_store


def pin_store(c: StatusWriter) -> Decision:
    """Fix the run's store in status.store; nothing else this pass (the next pass, once the status is
    stored, goes on)."""
    o, st = c.o, c.st
    pinned = pinned_store(o.status, o.namespace, o.name, o.uid, o.jobs, o.resolved_store)
    if pinned is not None:
        c.event("Normal", Reason.STORE_PINNED, f"checkpoint store pinned from the run's own records (it started "
                f"under an earlier release): {pinned.uri}")
    else:
        pinned = o.resolved_store
        if pinned is not None and o.status.checkpoint is not None:  # written before, but where cannot be told
            c.event("Warning", Reason.STORE_PINNED, f"the run's earlier checkpoint location cannot be read from "
                    f"status.checkpoint; pinned the operator's current default {pinned.uri}")
    if pinned is None:
        return c.fail(Reason.INVALID_CONFIGURATION, o.store_error or "no checkpoint store: spec.checkpoint.uri is "
                      "not set and the operator has no default (AGENTRUN_CHECKPOINT_URI)")
    st.store = pinned
    c.act(RequeueAfter(0.0))
    return c.finish()


def store_unavailable(c: Ctx, phase: str, prefix: str, error: str | None,
                      lap: int | None = None, attempt: int | None = None) -> Decision:
    """The store cannot be reached: say so once (the Progressing condition remembers it: one Warning
    Event per outage and step, not one per requeue) and come back in ``Observed.store_retry_seconds``."""
    progressing = condition(c.st, ConditionType.PROGRESSING)
    if not (progressing is not None and progressing.reason == Reason.STORE_UNAVAILABLE
            and progressing.message.startswith(prefix)):
        msg = f"{prefix}{error}"
        c.phase(phase, Reason.STORE_UNAVAILABLE, msg)
        c.event("Warning", Reason.STORE_UNAVAILABLE, msg, lap, attempt)
    c.act(RequeueAfter(max(0.5, c.o.store_retry_seconds)))
    return c.finish()


def check_store_probe(c: Ctx) -> Decision | None:
    """Before the first lap (or fork): the store must honour conditional writes. Returns a
    Decision to stop (ask for the probe, fail, or wait for the store), or None to go on."""
    pr = c.o.store_probe
    if pr is None:
        return Decision([ProbeStore()])
    if pr.kind == "invalid":
        return c.fail(Reason.INVALID_CONFIGURATION, f"the checkpoint store cannot be used: {pr.detail}")
    if pr.kind == "unsafe":
        return c.fail(
            Reason.STORE_UNSAFE,
            f"the checkpoint store at {pr.endpoint} (bucket {pr.bucket}) does not honour conditional writes "
            f"(If-None-Match: *): {pr.detail}. Lap fencing depends on them, so no lap was started; use a store "
            "that honours them (see docs/operations.md, Store requirements) and recreate the run",
        )
    if pr.kind == "unavailable":
        return store_unavailable(c, "Pending", f"cannot probe the checkpoint store at {pr.endpoint} (bucket "
                                 f"{pr.bucket}) for conditional writes yet (retrying): ", pr.detail)
    return None
