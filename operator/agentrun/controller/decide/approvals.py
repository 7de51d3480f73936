"""Approvals: the decision on a pending tool call (annotations or a status patch), bound to the
call and bounded before it is recorded; the deadline; the decision a resuming lap's Job carries."""

from __future__ import annotations

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_REASON,
    ANN_REASON_SHORT,
    DECISION_ANNOTATIONS,
    MAX_CALL_ID_CHARS,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    SHA256_HEX_CHARS,
    arguments_sha256,
)
from agentrun.api.contract import CALL_ID_PATTERN
from agentrun.api.reasons import Reason
from agentrun.api.status import AgentRunStatus, ApprovalStatus
from agentrun.api.text import escape_controls, truncate

from ..jobs import ApprovalEnv, approval_annotation
from .actions import Decision, ReadCheckpoint, RemoveAnnotations
from .context import Ctx, StatusWriter
from .observed import ObservedJob
from .text import _SHA256, bounded_decider, bounded_reason, shown


def take_decision(c: Ctx) -> tuple[Decision | None, bool]:
    """Apply the approval deadline, then a decision (the ``approved`` annotation, or
    status.approval.decision set by a status patch) to a pending approval; remove a stray
    annotation from a run that is not waiting. Returns (a Decision to stop with, or None; whether
    the run still waits)."""
    o, st = c.o, c.st
    waiting = st.phase == "AwaitingApproval" and st.approval is not None and st.approval.state == "Pending"
    # The deadline first: a decision that arrives after the deadline is too late.
    if waiting:
        timed_out = apply_timeout(c)
        if timed_out is not None:
            return timed_out, False
    ap = st.approval
    if not (waiting and ap is not None and ap.state == "Pending"):
        if ANN_APPROVED in o.annotations:
            consume_annotation(c, f"the run is not awaiting approval (phase {st.phase})")
        return None, False
    if ANN_APPROVED in o.annotations:
        needs = annotation_decision(c, ap)
        if needs is not None:
            return needs, True
    elif ap.decision is not None:  # the status route: bounded by the CRD; escape what it lets through
        reason, escaped = bounded_reason(ap.reason)
        if escaped:
            c.event("Warning", Reason.APPROVAL_REASON_ESCAPED,
                    f"status.approval.reason held {escaped} control character(s); recorded escaped")
        ap.reason, ap.decided_by = reason, bounded_decider(ap.decided_by)
    if ap.decision is None:
        return None, True
    ap.state = "Approved" if ap.decision == "approved" else "Rejected"
    ap.decided_at = ap.decided_at or o.now
    by = f" by {ap.decided_by}" if ap.decided_by else ""
    why = f": {ap.reason}" if ap.reason else ""
    c.event("Normal", Reason.APPROVAL_DECIDED,
            f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) {ap.decision}{by}{why}")
    return None, False


def apply_timeout(c: Ctx) -> Decision | None:
    """Past the deadline of a pending approval, apply spec.approval.onTimeout.

    Returns the final Decision when the run fails, else None (the approval is TimedOut, or
    still pending before its deadline)."""
    o, st, spec = c.o, c.st, c.spec
    ap = st.approval
    if ap is None or ap.state != "Pending" or o.now < ap.deadline:
        return None
    ap.state = "TimedOut"
    ap.decided_at = o.now
    ap.reason = "approval deadline passed"
    if spec.approval.on_timeout == "fail":
        consume_annotation(c, "the approval deadline passed before it was read")
        return c.fail(
            Reason.APPROVAL_TIMED_OUT,
            f"approval of tool {ap.tool} (call {ap.call_id}, lap {ap.lap}) was not decided by "
            f"{ap.owner} before {ap.deadline.isoformat()}; spec.approval.onTimeout is fail",
        )
    c.event(
        "Warning",
        Reason.APPROVAL_TIMED_OUT,
        f"approval of tool {ap.tool} (call {ap.call_id}, lap {ap.lap}) timed out; the call is "
        "rejected (onTimeout: reject) and the run continues",
    )
    return None


def remove_annotation_keys(c: StatusWriter) -> None:
    keys = [k for k in DECISION_ANNOTATIONS if k in c.o.annotations]
    c.act(RemoveAnnotations(tuple(keys)))


def consume_annotation(c: StatusWriter, why: str) -> None:
    if ANN_APPROVED not in c.o.annotations:
        return
    if any(isinstance(a, RemoveAnnotations) for a in c.actions):
        return  # consumed already in this decision (one Warning per annotation)
    remove_annotation_keys(c)
    c.event(
        "Warning",
        Reason.APPROVAL_IGNORED,
        f"annotation {ANN_APPROVED}={shown(c.o.annotations[ANN_APPROVED])} ignored and removed: {why} "
        "(it cannot approve a future request in advance)",
    )


def refuse_decision(c: StatusWriter, ap: ApprovalStatus, reason: Reason, problems: list[str]) -> None:
    """A decision that cannot be applied: ONE Warning Event naming the fields, its annotations
    removed (so it is not read again), the run keeps waiting for the pending call."""
    remove_annotation_keys(c)
    c.event("Warning", reason, f"decision refused and removed: {'; '.join(problems)}. The run still waits for "
            f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}); decide again")


def annotation_decision(c: StatusWriter, ap: ApprovalStatus) -> Decision | None:
    """Apply the decision in the annotations to the pending approval ``ap`` (in ``c.st``), or refuse
    it. Returns a Decision only when the pending call's record must be read first (a decision
    bound by digest to a call whose digest status does not hold: requested by an earlier release)."""
    o = c.o
    ann = o.annotations
    problems: list[str] = []
    raw = ann[ANN_APPROVED]
    value = raw.strip().lower()
    if value not in ("true", "false"):
        problems.append(f"{ANN_APPROVED}={shown(raw, 40)} is neither true nor false")
    reason_key = ANN_REASON if ann.get(ANN_REASON) else ANN_REASON_SHORT
    reason_raw = ann.get(reason_key) or None
    reason, escaped = None, 0
    if reason_raw is not None:
        reason, escaped = escape_controls(reason_raw)
        if len(reason) > MAX_REASON_CHARS:
            extra = f" ({escaped} control characters escaped)" if escaped else ""
            problems.append(f"{reason_key} is {len(reason)} characters{extra}, at most {MAX_REASON_CHARS}")
    decided_by = ann.get(ANN_DECIDED_BY) or None
    if decided_by is not None:
        if len(decided_by) > MAX_DECIDED_BY_CHARS:
            problems.append(f"{ANN_DECIDED_BY} is {len(decided_by)} characters, at most {MAX_DECIDED_BY_CHARS}")
        elif escape_controls(decided_by)[1]:
            problems.append(f"{ANN_DECIDED_BY}={shown(decided_by)} contains control characters")
    call_id = ann.get(ANN_CALL_ID)
    if call_id is not None:
        call_id = call_id.strip()
        if len(call_id) > MAX_CALL_ID_CHARS or not CALL_ID_PATTERN.match(call_id):
            problems.append(f"{ANN_CALL_ID}={shown(call_id, 40)} is not a call id "
                            f"(letters, digits, _ and -, at most {MAX_CALL_ID_CHARS})")
    digest = ann.get(ANN_ARGUMENTS_SHA256)
    if digest is not None:
        digest = digest.strip().lower()
        if not _SHA256.match(digest):
            problems.append(f"{ANN_ARGUMENTS_SHA256}={shown(digest, 40)} is not a sha256 "
                            f"({SHA256_HEX_CHARS} hex digits)")
    if problems:
        refuse_decision(c, ap, Reason.APPROVAL_INVALID, problems)
        return None

    # The binding: the call the person saw must be the call pending now, with the same arguments.
    mismatches: list[str] = []
    if call_id is not None and call_id != ap.call_id:
        mismatches.append(f"{ANN_CALL_ID} is {call_id!r} but the pending call is {ap.call_id!r}")
    if digest is not None and not mismatches:
        expected = ap.arguments_sha256
        if expected is None:  # requested by an earlier release: digest the record's full arguments
            cp = o.checkpoint
            if cp is None or cp.lap != ap.lap:
                return Decision([ReadCheckpoint(ap.lap)])
            pa = cp.record.pending_approval if cp.kind == "ok" and cp.record is not None else None
            if pa is not None and pa.call_id == ap.call_id:
                expected = ap.arguments_sha256 = arguments_sha256(pa.arguments)
            else:
                mismatches.append(f"the arguments of call {ap.call_id} cannot be digested from its lap record "
                                  f"({cp.kind}{': ' + truncate(cp.error, 200) if cp.error else ''}); decide "
                                  f"without {ANN_ARGUMENTS_SHA256}")
        if expected is not None and digest != expected:
            mismatches.append(f"{ANN_ARGUMENTS_SHA256} is {digest} but the arguments of the pending call "
                              f"{ap.call_id} have {expected}")
    if mismatches:
        refuse_decision(c, ap, Reason.APPROVAL_BINDING_MISMATCH, mismatches)
        return None

    ap.decision = "approved" if value == "true" else "rejected"
    ap.reason = reason
    ap.decided_by = decided_by
    if escaped:
        c.event("Warning", Reason.APPROVAL_REASON_ESCAPED,
                f"{reason_key} held {escaped} control character(s); recorded escaped in status.approval.reason")
    remove_annotation_keys(c)
    return None


def approval_env(status: AgentRunStatus) -> ApprovalEnv | None:
    """The decision the next lap Job of ``status`` must carry: the decided approval of its last lap."""
    ap = status.approval
    if ap is None or ap.lap != status.lap or ap.state not in ("Approved", "Rejected", "TimedOut"):
        return None
    decision = {"Approved": "approved", "Rejected": "rejected", "TimedOut": "timed-out"}[ap.state]
    # bounded again: a status patch may have changed the reason or decider after the decision was recorded
    return ApprovalEnv(decision=decision, call_id=ap.call_id, reason=bounded_reason(ap.reason)[0],
                       decided_by=bounded_decider(ap.decided_by), arguments_sha256=ap.arguments_sha256)


def adoption_mismatch(st: AgentRunStatus, job: ObservedJob) -> str | None:
    """Why a Job found in the cluster (its creation not recorded) must not be adopted, else None: it
    carries another decision or another store than the status. A Job without the annotation was
    created by an earlier release: its decision is not known, it is adopted."""
    if job.approval is not None:
        want = approval_annotation(approval_env(st))
        if job.approval != want:
            return f"it carries the decision {shown(job.approval, 300)} but status says {shown(want, 300)}"
    if job.store is not None and st.store is not None and job.store != st.store:
        return f"it uses the store {job.store.uri} but the run's store is {st.store.uri}"
    return None
