"""The reconcile decision, pure: ``decide(observed) -> Decision``.

Everything the operator knows about a run is passed in (:class:`Observed`: the spec, the status,
annotations, the lap Jobs seen, the result of a checkpoint read, the time); everything it does is
returned as a list of actions. The I/O shell performs them in order. When the decision needs data
first (``ReadCheckpoint`` / ``ReadAttemptFailure`` / ``ForkCheckpoint`` / ``ProbeStore``), that is
the ONLY action returned: the shell reads, adds the result to ``Observed`` and calls ``decide`` again.

One module per concern: ``observe`` (the cache's JSON -> ``Observed``), ``observed`` (the input),
``actions`` (the output), ``jobs`` (the lap Job's manifest), ``outcomes`` (``decide_after``: what the
run does when a write of its decision did not go through), ``context`` (the status
being built, conditions per type), ``store`` (pinning, probing, outages), ``approvals``, ``laps``
(the Job in flight, its checkpoint, the next attempt), ``retries``, ``fork``, ``finish`` (a lap's
outcome, a finished run's ttl), ``text`` (bounds of user input, the cause of a failed lap), and
``core`` (the order of them all). The spec is checked once, up front: everything past that reads
``Ctx.spec``, never None.

Invariants (tested with hypothesis in tests/controller):
* at most one ``CreateJob`` per decision, never for a lap attempt whose Job exists or is in
  ``status.activeJob``; applying the decision's status and calling ``decide`` again creates nothing;
* a lost status write is repaired, never repeated: a Job of the next attempt that exists although
  the status does not name it is adopted (its decision and store checked), and the stray-Job fence
  spares the attempts a pass may have started once the active one ended (``laps.successors``);
* no Job while AwaitingApproval (undecided), Suspended, or terminal;
* no first lap (nor fork snapshot) before the store probe said the store honours conditional
  writes (``ProbeStore``); a finished run is deleted (``DeleteRun``) only past its ttl;
* attempts of a lap never exceed ``spec.retry.attemptsPerLap``;
* terminal phases do nothing (except removing a stray approval annotation and a leftover Job);
* write-ahead: a ``CreateJob`` happens only when the OBSERVED status (what the API server stored)
  already holds what the Job executes: the pinned store (``status.store``) and, for a lap that
  resumes after an approval, the decision (``status.approval`` Approved/Rejected/TimedOut). The
  decision that first records either returns the status change alone (and ``RequeueAfter(0)``);
  the Job follows on the next pass, so the status never shows a call pending once a Job resolving
  it exists;
* a decision (annotations) bound to another call (``agentrun.dev/call-id``,
  ``agentrun.dev/arguments-sha256``) or with a malformed field is refused: one Warning Event, the
  annotations removed, the run keeps waiting. Every value copied from annotations is bounded first;
* an approved call is executed only for the target it was approved for (``status.approval.targetSha256``:
  the tool's definition, the effective image, the arguments digest): a target that changed under a
  pending or approved call is asked again (ONE ``ApprovalStale`` Event), never executed; with
  ``spec.approval.approvers: N`` only N distinct approvers approve, one rejection rejects;
* a decision that is not recorded (stray, refused, stale) leaves the annotations BEFORE the status
  is written (``Decision.writes``), so a failed removal never approves the next request;
* a write of the decision that does not go through is reported back by the shell as a typed
  setback (``outcomes``: ``Refused``, ``Conflict``, ``Invalid``, ``NotStored``, ``StoreFailed``) and
  ``decide_after`` owns what follows: a conflict is decided again, any other refusal is an error
  with the run's backoff (``Backoff``) and ONE Warning Event per streak (``Observed.refusal``),
  never a hot loop; only a lap Job refused for good fails the run;
* every condition type carries its own reason and message; every failed attempt carries its cause
  (``status.retries[].lastReason``, ``status.message``, the Warning Event); every ``LapRetried`` /
  ``LapFinished`` carries a typed reason / outcome (``agentrun.api.reasons``).
"""

from __future__ import annotations

from agentrun.api.text import escape_controls, truncate

from .actions import (
    FINALIZER,
    Action,
    AddFinalizer,
    Backoff,
    CreateJob,
    Decision,
    DeleteCheckpoints,
    DeleteJob,
    DeleteRun,
    Event,
    ForkCheckpoint,
    LapFinished,
    LapRetried,
    PatchStatus,
    ProbeStore,
    ReadAttemptFailure,
    ReadCheckpoint,
    ReadRewind,
    RemoveAnnotations,
    RemoveFinalizer,
    RequeueAfter,
    StoreAgent,
)
from .approvals import adoption_mismatch, approval_env
from .context import CONDITION_TYPES, Ctx, StatusWriter, conditions_for, deferred_status, failed_status
from .core import decide
from .jobs import ApprovalEnv, job_name
from .laps import POD_CONFIG_ERRORS, pod_config_problem
from .observed import (
    AdmissionProblem,
    AttemptFailureRead,
    CheckpointRead,
    ForkRead,
    JobState,
    Observed,
    ObservedJob,
    PinnedAgentRead,
    QueueSlot,
    RewindRead,
    SentCall,
    StoreProbeRead,
    WorkloadRead,
)
from .outcomes import Conflict, Invalid, NotStored, Refused, Setback, StoreFailed, decide_after
from .retries import MAX_RETRY_ENTRIES, backoff_seconds, classify_failure, next_lap_attempt
from .store import pinned_store, store_uri_of_checkpoint
from .text import MAX_CAUSE_CHARS, bounded_decider, bounded_reason, lap_cause, redact_secrets, shown

# Names of the single-module decide.py that callers used; kept so they keep working.
_Ctx = StatusWriter
_approval_env = approval_env
_adoption_mismatch = adoption_mismatch
_truncate = truncate

__all__ = [
    "CONDITION_TYPES", "FINALIZER", "MAX_CAUSE_CHARS", "MAX_RETRY_ENTRIES", "POD_CONFIG_ERRORS",
    "Action", "AddFinalizer", "Backoff", "Conflict", "Invalid", "NotStored", "Refused", "Setback", "StoreFailed", "AdmissionProblem", "ApprovalEnv", "AttemptFailureRead", "CheckpointRead", "CreateJob", "Ctx", "Decision",
    "DeleteCheckpoints", "DeleteJob", "DeleteRun", "Event", "ForkCheckpoint", "ForkRead", "JobState", "LapFinished",
    "LapRetried", "Observed", "ObservedJob", "PatchStatus", "ProbeStore", "ReadAttemptFailure", "ReadCheckpoint",
    "ReadRewind", "RewindRead", "SentCall",
    "PinnedAgentRead", "QueueSlot", "RemoveAnnotations", "RemoveFinalizer", "RequeueAfter", "StatusWriter", "StoreAgent",
    "StoreProbeRead", "WorkloadRead",
    "adoption_mismatch", "approval_env", "backoff_seconds", "bounded_decider", "bounded_reason", "classify_failure",
    "conditions_for", "decide", "decide_after", "deferred_status", "escape_controls", "failed_status", "job_name", "lap_cause",
    "next_lap_attempt",
    "pinned_store", "pod_config_problem", "redact_secrets", "shown", "store_uri_of_checkpoint", "truncate",
]
