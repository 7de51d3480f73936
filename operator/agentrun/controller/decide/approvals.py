"""Approvals: the decision on a pending tool call (annotations or a status patch), bound to the
call and bounded before it is recorded; the deadline; the decision a resuming lap's Job carries."""

from __future__ import annotations

from datetime import timedelta

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_CREATED_BY,
    ANN_DECIDED_BY,
    ANN_REASON,
    ANN_REASON_SHORT,
    ANN_TARGET_SHA256,
    DECISION_ANNOTATIONS,
    MAX_CALL_ID_CHARS,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    SHA256_HEX_CHARS,
    arguments_sha256,
    call_target,
    target_changes,
    target_sha256,
)
from agentrun.api.contract import CALL_ID_PATTERN
from agentrun.api.mcp import find_mcp_tool
from agentrun.api.reasons import Reason
from agentrun.api.status import AgentRunStatus, ApprovalStatus, ApprovalTarget, ApprovalVote
from agentrun.api.text import escape_controls, truncate
from agentrun.api.types import parse_duration

from .actions import Decision, ReadCheckpoint, RemoveAnnotations
from .context import Ctx, StatusWriter
from .jobs import ApprovalEnv, approval_annotation
from .observed import ObservedJob
from .text import _SHA256, bounded_decider, bounded_reason, shown


def take_decision(c: Ctx) -> tuple[Decision | None, bool]:
    """Apply the approval deadline, then the target binding (a pending call whose target changed
    under it is asked again), then a decision (the ``approved`` annotation, or
    status.approval.decision set by a status patch) to a pending approval, counting distinct
    approvers (``spec.approval.approvers``); remove a stray annotation from a run that is not
    waiting. Returns (a Decision to stop with, or None; whether the run still waits)."""
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
    # The target next: a decision is only ever applied to the target status shows now.
    read = bind_target(c, ap)
    if read is not None:
        return read, True
    if st.approval is not ap:  # asked again: any decision on the old target is void
        return None, True
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
    if not count_decision(c, ap):
        return None, True
    ap.state = "Approved" if ap.decision == "approved" else "Rejected"
    ap.decided_at = ap.decided_at or o.now
    by = f" by {ap.decided_by}" if ap.decided_by else ""
    if ap.state == "Approved" and (ap.approvals_required or 1) > 1:
        by = f" by {', '.join(v.user for v in ap.approved_by)} ({len(ap.approved_by)} of {ap.approvals_required})"
    why = f": {ap.reason}" if ap.reason else ""
    c.event("Normal", Reason.APPROVAL_DECIDED,
            f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) {ap.decision}{by}{why}")
    return None, False


# ----------------------------------------------------------------------------- the target


def effective_image(c: Ctx) -> str:
    """The image the lap that sends the call runs: spec.agent.image, else the operator's default."""
    return c.spec.agent.image or c.o.lap_image


def current_target(c: Ctx, ap: ApprovalStatus, args_digest: str) -> tuple[ApprovalTarget, str]:
    """(the shown target, the target digest) of ``ap``'s call under the current spec."""
    tool = c.spec.tool(ap.tool) or find_mcp_tool(c.spec.agent, ap.tool)
    image = effective_image(c)
    return ApprovalTarget.model_validate(call_target(tool, image)), target_sha256(tool, image, args_digest)


def full_arguments_digest(c: StatusWriter, ap: ApprovalStatus) -> tuple[str | None, Decision | None, str | None]:
    """(the digest of the pending call's full arguments, a read to do first, why there is none):
    from status, else (an approval requested by an earlier release) from the call's lap record."""
    if ap.arguments_sha256 is not None:
        return ap.arguments_sha256, None, None
    cp = c.o.checkpoint
    if cp is None or cp.lap != ap.lap:
        return None, Decision([ReadCheckpoint(ap.lap)]), None
    pa = cp.record.pending_approval if cp.kind == "ok" and cp.record is not None else None
    if pa is not None and pa.call_id == ap.call_id:
        ap.arguments_sha256 = arguments_sha256(pa.arguments)
        return ap.arguments_sha256, None, None
    return None, None, (f"the arguments of call {ap.call_id} cannot be digested from its lap record "
                        f"({cp.kind}{': ' + truncate(cp.error, 200) if cp.error else ''})")


def bind_target(c: Ctx, ap: ApprovalStatus) -> Decision | None:
    """Bind ``ap`` (Pending, or Approved and not executed yet) to its call's target under the current
    spec: record it when status has none (an approval of an earlier release); ask again when it
    changed (:func:`ask_again`). Returns a read to do first, else None."""
    digest, read, _ = full_arguments_digest(c, ap)
    if read is not None:
        return read
    if digest is None:  # cannot be bound: leave it as an earlier release recorded it
        return None
    target, current = current_target(c, ap, digest)
    if ap.target_sha256 is None:
        ap.target, ap.target_sha256 = target, current
        ap.approvals_required = ap.approvals_required or c.spec.approval.approvers
    elif ap.target_sha256 != current:
        ask_again(c, ap, target, current)
    return None


def ask_again(c: Ctx, ap: ApprovalStatus, target: ApprovalTarget, digest: str) -> None:
    """The target of ``ap``'s call changed since it was requested (or approved): the call is not
    executed; ONE Warning Event ApprovalStale names what changed, and a new Pending request with the
    new target replaces it (a new requestedAt and deadline, no approvals yet; the notifier announces
    it as a new request). A decision waiting in the annotations was for the old target: removed
    BEFORE the new status is written, so it cannot approve the new request."""
    o, st, spec = c.o, c.st, c.spec
    old = ap.target.model_dump(by_alias=True) if ap.target is not None else None
    changes = target_changes(old, target.model_dump(by_alias=True))
    if c.spec.tool(ap.tool) is None and find_mcp_tool(c.spec.agent, ap.tool) is None:
        changes.insert(0, f"tool {ap.tool} is no longer declared")
    if not changes:
        changes = ["the tool's definition (parameters, timeout, maxResultBytes, sideEffects, requiresApproval "
                   "or the hidden part of its URL)"]
    was = ("approved" if ap.state == "Approved" else
           f"pending ({len(ap.approved_by)} of {ap.approvals_required or 1} approvals)" if ap.approved_by else "pending")
    dropped = ""
    if ap.state == "Pending" and ap.decision is not None:
        dropped = f"; the decision {ap.decision} in status was for the old target and was discarded"
    if ANN_APPROVED in o.annotations:
        remove_annotation_keys(c, before_status=True)
        dropped = (f"; the decision {ANN_APPROVED}={shown(o.annotations[ANN_APPROVED], 8)} in the annotations was for "
                   "the old target and was removed")
    now = o.now
    deadline = now + timedelta(seconds=parse_duration(spec.approval.timeout))
    st.approval = ApprovalStatus(
        state="Pending", lap=ap.lap, tool=ap.tool, call_id=ap.call_id, idempotency_key=ap.idempotency_key,
        arguments=ap.arguments, arguments_sha256=ap.arguments_sha256, arguments_truncated=ap.arguments_truncated,
        owner=spec.approval.owner, requested_at=now, deadline=deadline, target=target, target_sha256=digest,
        approvals_required=max(ap.approvals_required or 1, spec.approval.approvers),
    )
    st.waiting_on = spec.approval.owner
    c.event("Warning", Reason.APPROVAL_STALE,
            f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) was {was} for another target and was not executed: "
            f"{'; '.join(changes)}{dropped}. Asked again: decide on the new target")
    msg = (f"lap {ap.lap}: tool {ap.tool} (call {ap.call_id}) asked again after its target changed; waits for "
           f"{spec.approval.owner} until {deadline.isoformat()}")
    c.phase("AwaitingApproval", Reason.APPROVAL_STALE, msg)


# ----------------------------------------------------------------------------- four eyes


def _void(ap: ApprovalStatus) -> None:
    ap.decision, ap.reason, ap.decided_by, ap.decided_at = None, None, None, None


def count_decision(c: Ctx, ap: ApprovalStatus) -> bool:
    """Check the decision in ``ap`` (either route) against spec.approval (the creator, distinct
    approvers) and count it. Returns True when it decides the approval (a rejection, or the last
    approval needed), False when the run keeps waiting (the decision refused with ONE Warning Event,
    or one approval of several recorded in approvedBy); then the decision fields are cleared so the
    next approver can decide (the annotations are removed already)."""
    spec = c.spec.approval
    who = ap.decided_by
    creator = c.o.annotations.get(ANN_CREATED_BY) or None
    where = f"call {ap.call_id} of tool {ap.tool} (lap {ap.lap})"
    if spec.distinct_from_creator and (who is None or who == creator):
        why = (f"{who} created the run ({ANN_CREATED_BY})" if who is not None else
               f"it names no decider ({ANN_DECIDED_BY}), so it cannot be told from the creator's")
        c.event("Warning", Reason.APPROVAL_CREATOR_REFUSED,
                f"decision {ap.decision} refused and removed: {why} and spec.approval.distinctFromCreator is true. "
                f"The run still waits for {where}; another approver must decide")
        _void(ap)
        return False
    if ap.decision != "approved":
        return True
    required = max(ap.approvals_required or 1, spec.approvers)
    ap.approvals_required = required
    if who is None:
        if required == 1:
            return True
        c.event("Warning", Reason.APPROVAL_INVALID,
                f"approval refused and removed: it names no approver ({ANN_DECIDED_BY}, stamped by the API server), "
                f"so {required} distinct approvers cannot be counted. The run still waits for {where}")
        _void(ap)
        return False
    users = [v.user for v in ap.approved_by]
    if who in users:
        c.event("Warning", Reason.APPROVAL_DUPLICATE_APPROVER,
                f"approval by {who} refused and removed: {where} is already approved by {who}; needs a different "
                f"approver ({len(users)} of {required})")
        _void(ap)
        return False
    ap.approved_by = [*ap.approved_by, ApprovalVote(user=who, at=c.o.now, reason=ap.reason)][-required:]
    if len(ap.approved_by) >= required:
        return True
    left = required - len(ap.approved_by)
    c.event("Normal", Reason.APPROVAL_RECORDED,
            f"{where} approved by {who} ({len(ap.approved_by)} of {required}); waits for {left} more distinct "
            f"approver{'s' if left > 1 else ''}")
    _void(ap)
    c.phase("AwaitingApproval", Reason.APPROVAL_REQUESTED,
            f"lap {ap.lap}: tool {ap.tool} (call {ap.call_id}) approved by {', '.join(v.user for v in ap.approved_by)} "
            f"({len(ap.approved_by)} of {required}); waits for {left} more of {ap.owner} until {ap.deadline.isoformat()}")
    return False


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


def remove_annotation_keys(c: StatusWriter, before_status: bool = False) -> None:
    """Remove the decision's annotations; ``before_status``: before the decision's status is written
    (a decision that is NOT recorded: a stray, refused or stale one), so a failed removal can never
    leave it to approve the request that status asks next. A decision that IS recorded is removed
    after its status (write-ahead: a failed status write keeps it to be read again)."""
    keys = [k for k in DECISION_ANNOTATIONS if k in c.o.annotations]
    c.act(RemoveAnnotations(tuple(keys), before_status=before_status))


def consume_annotation(c: StatusWriter, why: str) -> None:
    if ANN_APPROVED not in c.o.annotations:
        return
    if any(isinstance(a, RemoveAnnotations) for a in c.actions):
        return  # consumed already in this decision (one Warning per annotation)
    remove_annotation_keys(c, before_status=True)
    c.event(
        "Warning",
        Reason.APPROVAL_IGNORED,
        f"annotation {ANN_APPROVED}={shown(c.o.annotations[ANN_APPROVED])} ignored and removed: {why} "
        "(it cannot approve a future request in advance)",
    )


def refuse_decision(c: StatusWriter, ap: ApprovalStatus, reason: Reason, problems: list[str]) -> None:
    """A decision that cannot be applied: ONE Warning Event naming the fields, its annotations
    removed (so it is not read again), the run keeps waiting for the pending call."""
    remove_annotation_keys(c, before_status=True)
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
    target = ann.get(ANN_TARGET_SHA256)
    if target is not None:
        target = target.strip().lower()
        if not _SHA256.match(target):
            problems.append(f"{ANN_TARGET_SHA256}={shown(target, 40)} is not a sha256 "
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
    if target is not None and not mismatches and target != ap.target_sha256:
        mismatches.append(f"{ANN_TARGET_SHA256} is {target} but the target of the pending call {ap.call_id} has "
                          f"{ap.target_sha256 or '(none recorded)'}: the target changed since it was shown")
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
                       decided_by=bounded_decider(ap.decided_by), arguments_sha256=ap.arguments_sha256,
                       target_sha256=ap.target_sha256 if ap.state == "Approved" else None, decided_at=ap.decided_at)


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
