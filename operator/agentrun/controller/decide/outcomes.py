"""What the run does when a write of its decision did not go through: ``decide_after``, pure.

The executor performs a :class:`Decision`'s actions in order and stops at the first one the API
server or the store did not take, reporting it as a typed outcome (:data:`Setback`); everything it
says about that (the status, the Event, the backoff) is decided here, from the outcome and
:attr:`Observed.refusal` (the run's refusal streak, remembered by the shell until a reconcile
succeeds):

* a conflict (the run changed since it was read): decide again soon (``RequeueAfter``);
* a lap Job refused for a quota or a busy API server (403 "exceeded quota", 429, 5xx): the status
  says why it waits (``Progressing`` False, best effort), ONE Warning Event per streak, then the
  run's rate-limited backoff (``Backoff``);
* a lap Job refused for good (422 Invalid, an admission denial) or that cannot be built: the run
  fails naming the field, with the rest of its decision;
* a status write refused for good, or a field of it not stored (a CRD older than the operator):
  ONE ``StatusUpdateRefused`` Event per distinct refusal, nothing else, the backoff;
* a checkpoint delete failing (the store away): ONE ``CheckpointDeleteFailed`` Event per streak,
  the backoff.

A refused write is thus an error with backoff and one Event, never a hot loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrun.api.reasons import Reason
from agentrun.api.status import AgentRunStatus

from .actions import (
    Backoff,
    CreateJob,
    Decision,
    DeleteCheckpoints,
    DeleteJob,
    DeleteRun,
    Event,
    PatchStatus,
    RemoveAnnotations,
    RequeueAfter,
)
from .context import deferred_status, failed_status
from .observed import Observed
from .text import shown

#: Streak markers of :attr:`Observed.refusal` (a refused status write's streak is its message).
JOB_DEFERRED, DELETE_DEFERRED = "\0JobRefused", "\0CheckpointDeleteFailed"
#: How soon a run that changed under a guarded write is decided again.
CONFLICT_RETRY_SECONDS = 0.2


@dataclass(frozen=True)
class Refused:
    """The API server answered ``action``'s request with an error (``status``, its reason phrase
    and body): a conflict, a refusal for good, or one worth retrying; ``decide_after`` tells which."""

    action: CreateJob | PatchStatus
    status: int
    reason: str | None = None
    body: str | bytes | None = None


@dataclass(frozen=True)
class Conflict:
    """A write guarded by the run's resourceVersion or uid (409): the run changed since it was read."""

    action: RemoveAnnotations | DeleteRun


@dataclass(frozen=True)
class Invalid:
    """``action`` cannot be performed as decided (the lap Job cannot be built): ``message`` says why."""

    action: CreateJob
    message: str


@dataclass(frozen=True)
class NotStored:
    """The status was written, but the API server did not store ``field`` (it prunes the fields
    its CRD does not know)."""

    field: str


@dataclass(frozen=True)
class StoreFailed:
    """The store did not take ``action`` (unreachable, refused): ``error`` says what it said."""

    action: DeleteCheckpoints
    error: str


Setback = Refused | Conflict | Invalid | NotStored | StoreFailed


def decide_after(o: Observed, decision: Decision, setback: Setback) -> Decision:
    """What to do after ``decision`` was performed up to ``setback`` (the actions before it done)."""
    if isinstance(setback, Conflict):
        return Decision([RequeueAfter(CONFLICT_RETRY_SECONDS)])
    if isinstance(setback, Invalid):
        return _failed(o, decision, Reason.INVALID_CONFIGURATION, setback.message, setback.message)
    if isinstance(setback, NotStored):
        text = (f"the API server did not store {setback.field}: the AgentRun CRD is older than the operator; "
                "apply the CRD of this release")
        return _streak(o, text, Reason.STATUS_UPDATE_REFUSED, text)
    if isinstance(setback, StoreFailed):
        return _streak(o, DELETE_DEFERRED, Reason.CHECKPOINT_DELETE_FAILED,
                       f"cannot delete checkpoints yet: {shown(setback.error, 600)[1:-1]}")
    if isinstance(setback.action, CreateJob):
        transient, why = job_refusal(setback.status, setback.body, setback.reason)
        if transient:  # a quota, the API server busy: the status says so, one Event per streak
            text = f"the lap Job {setback.action.name} was refused by the API server (retrying with backoff): {why}"
            return _streak(o, JOB_DEFERRED, Reason.JOB_REFUSED, text,
                           status=deferred_status(o, Reason.JOB_REFUSED, text))
        return _failed(o, decision, Reason.JOB_REFUSED, f"the lap Job was refused by the API server: {why}")
    refusal = status_refusal(setback.status, setback.body)
    if refusal is None:  # changed since it was read: decide again
        return Decision([RequeueAfter(CONFLICT_RETRY_SECONDS)])
    text = f"the API server refused the status update: {refusal}"
    return _streak(o, text, Reason.STATUS_UPDATE_REFUSED, text)


def _failed(o: Observed, decision: Decision, reason: str, message: str, event: str | None = None) -> Decision:
    """The rest of ``decision`` (its Jobs done), its status turned Failed with ``reason``, and a
    Warning Event (``event``, else the status's message)."""
    status = failed_status(o, decision.status, reason, message)
    rest = [a for a in decision.actions if not isinstance(a, (DeleteJob, CreateJob, PatchStatus))]
    return Decision([*rest, PatchStatus(status), Event("Warning", reason, event if event is not None
                                                        else status.message or "")])


def _streak(o: Observed, streak: str, reason: str, message: str, status: AgentRunStatus | None = None) -> Decision:
    """The backoff, after ONE Warning Event (and ``status``, best effort) per streak."""
    said: list[Any] = []
    if o.refusal != streak:
        if status is not None:
            said.append(PatchStatus(status, best_effort=True))
        said.append(Event("Warning", reason, message))
    return Decision([*said, Backoff(streak, reason, message)])


def job_refusal(status: int, body: str | bytes | None, reason: str | None) -> tuple[bool, str]:
    """Whether a refused Job create is worth retrying (a ResourceQuota exceeded, the API server
    throttling or failing: 429, 5xx), and what the API server said (bounded, naming the field or
    the quota). Anything else (422 Invalid, an admission policy's denial) refuses the Job itself."""
    text = status_refusal(status, body) if status not in (409,) else None
    if text is None or text == f"HTTP {status}":
        text = shown(f"HTTP {status} {reason or ''}".strip(), 600)[1:-1]
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
    return shown(text, 600)[1:-1]


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
