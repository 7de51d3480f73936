"""Where a checkpointed lap leaves the run (its outcome: on, done, failed, awaiting approval), and
the end of a finished run (its ttl)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from agentrun.api.approval import arguments_sha256
from agentrun.api.reasons import Reason
from agentrun.api.status import ApprovalStatus, CheckpointRef, CostStatus
from agentrun.api.text import truncate
from agentrun.api.types import format_usd, parse_duration
from agentrun.checkpoint.schema import Outcome, PendingApproval, Totals

from .actions import DeleteRun, RequeueAfter
from .approvals import current_target
from .context import Ctx, StatusWriter

MAX_ARGUMENTS_CHARS = 4096


def record_checkpoint(c: Ctx, lap: int, ref: CheckpointRef, totals: Totals) -> str:
    """The run now stands at lap ``lap`` (a lap record read, or a fork snapshot written): its
    checkpoint, version, time and cost. Returns the cost so far (USD text)."""
    o, st = c.o, c.st
    st.lap = lap
    st.agent_version = ref.agent_version
    st.checkpoint = ref
    st.last_checkpoint_time = ref.written_at or o.now
    try:
        usd = format_usd(Decimal(totals.cost_usd))
    except (InvalidOperation, ValueError):
        usd = st.cost.usd
    st.cost = CostStatus(usd=usd, input_tokens=totals.input_tokens, output_tokens=totals.output_tokens)
    return usd


def apply_outcome(c: Ctx, lap: int, outcome: Outcome, pa: PendingApproval | None,
                  requested_at: datetime | None = None) -> None:
    """The phase after lap ``lap`` ended with ``outcome``. ``requested_at`` overrides the time of a
    pending approval (a fork asks again when it is created, with a fresh deadline)."""
    o, st, spec = c.o, c.st, c.spec
    if outcome.type == "done":
        c.phase("Succeeded", Reason.AGENT_DONE, outcome.message or f"the agent finished after {lap} lap(s)")
        c.event("Normal", Reason.SUCCEEDED, st.message or "")
    elif outcome.type == "failed":
        c.phase("Failed", Reason.AGENT_FAILED, f"lap {lap}: {outcome.message or 'the agent reported failure'}")
        c.event("Warning", Reason.AGENT_FAILED, st.message or "")
    elif outcome.type == "awaiting-approval":
        if pa is None:
            c.phase("Failed", Reason.CHECKPOINT_UNREADABLE, f"lap {lap} awaits approval but names no pending call")
            c.event("Warning", Reason.CHECKPOINT_UNREADABLE, st.message or "")
            return
        requested = requested_at or pa.requested_at
        deadline = requested + timedelta(seconds=parse_duration(spec.approval.timeout))
        args = json.dumps(pa.arguments, sort_keys=True)
        args_digest = arguments_sha256(pa.arguments)
        st.approval = ApprovalStatus(
            state="Pending", lap=lap, tool=pa.tool, call_id=pa.call_id, idempotency_key=pa.idempotency_key,
            arguments=truncate(args, MAX_ARGUMENTS_CHARS), arguments_sha256=args_digest,
            arguments_truncated=len(args) > MAX_ARGUMENTS_CHARS, owner=spec.approval.owner,
            requested_at=requested, deadline=deadline, approvals_required=spec.approval.approvers,
        )
        # The target the person is shown and the decision is bound to: the current spec's (the Job
        # that executes the call gets this spec). When the lap ran with another one, say so.
        target, digest = current_target(c, st.approval, args_digest)
        st.approval.target, st.approval.target_sha256 = target, digest
        st.waiting_on = spec.approval.owner
        shown_target = f" {target.method} {target.url}" if target.url else ""
        msg = (f"lap {lap}: tool {pa.tool}{shown_target} (call {pa.call_id}) waits for {spec.approval.owner} until "
               f"{deadline.isoformat()}; decide with `kubectl annotate agentrun {o.name} approved=true|false`")
        if spec.approval.approvers > 1:
            msg += f" ({spec.approval.approvers} distinct approvers needed)"
        c.phase("AwaitingApproval", Reason.APPROVAL_REQUESTED, msg)
        c.event("Normal", Reason.APPROVAL_REQUESTED, msg)
        if pa.target_sha256 is not None and pa.target_sha256 != digest:
            c.event("Warning", Reason.APPROVAL_STALE,
                    f"the spec changed while lap {lap} ran: call {pa.call_id} of tool {pa.tool} was requested for "
                    "another target (tool definition or image) than the current spec's; the request shows, and "
                    "binds the decision to, the current one")


def expire(c: StatusWriter) -> None:
    """A finished run with spec.ttlSecondsAfterFinished: delete it once that long has passed
    since status.completedAt, else come back then."""
    o, st, spec = c.o, c.st, c.o.spec
    if spec is None or spec.ttl_seconds_after_finished is None or st.completed_at is None:
        return
    ttl = spec.ttl_seconds_after_finished
    left = (st.completed_at + timedelta(seconds=ttl) - o.now).total_seconds()
    if left > 0:
        c.act(RequeueAfter(max(0.5, left)))
        return
    kept = "deleted with it" if spec.checkpoint.retention == "Delete" else "kept"
    c.event("Normal", Reason.TTL_EXPIRED, f"deleting the finished run: spec.ttlSecondsAfterFinished={ttl}s passed "
            f"since it finished at {st.completed_at.isoformat()}; its checkpoints are {kept} "
            f"(spec.checkpoint.retention {spec.checkpoint.retention})")
    c.act(DeleteRun(ttl))
