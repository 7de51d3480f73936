"""The operator's admission policies are not in place (``Observed.admission``, the shell's check in
``controller/policycheck.py``): no lap starts, and no approval decision is taken, since the API
server did not check who made it (docs/operations.md#admission-policies)."""

from __future__ import annotations

from agentrun.api.approval import ANN_APPROVED
from agentrun.api.reasons import ConditionType, Reason
from agentrun.api.text import one_line

from .actions import Decision
from .approvals import remove_annotation_keys
from .context import MAX_CONDITION_MESSAGE_CHARS, Ctx, condition, hold


def hold_lap(c: Ctx, lap: int, attempt: int) -> Decision:
    """Instead of starting ``lap``/``attempt``: the Progressing condition False with the problem's
    reason and message (the phase as it is), and ONE Warning Event per problem (the condition
    remembers it). No requeue: the shell queues every live run when its check's verdict changes."""
    problem = c.o.admission
    assert problem is not None
    message = f"lap {lap} attempt {attempt} not started: {problem.message}"
    old = condition(c.st, ConditionType.PROGRESSING)
    if old is None or old.status != "False" or old.reason != problem.reason \
            or old.message != one_line(message, MAX_CONDITION_MESSAGE_CHARS):
        hold(c, problem.reason, message)
        c.event("Warning", problem.reason, message, lap, attempt)
    return c.finish()


def hold_decision(c: Ctx) -> Decision | None:
    """A run waiting on an approval while the policies are not in place: a decision in its
    annotations or in ``status.approval`` is not taken but removed, with ONE Warning Event (anyone
    who may patch the run could have written it). Returns the Decision when there was one, else
    None (the run goes on waiting; its deadline still applies)."""
    problem = c.o.admission
    ap = c.st.approval
    if problem is None or c.st.phase != "AwaitingApproval" or ap is None or ap.state != "Pending":
        return None
    by_annotation, by_status = ANN_APPROVED in c.o.annotations, ap.decision is not None
    if not (by_annotation or by_status):
        return None
    if by_annotation:
        remove_annotation_keys(c)
    if by_status:
        ap.decision = ap.reason = ap.decided_by = None
    c.event("Warning", Reason.APPROVAL_IGNORED,
            f"decision on call {ap.call_id} of tool {ap.tool} (lap {ap.lap}) not taken and removed: "
            f"{problem.message}; the API server did not check who made it. The run still waits: decide "
            "again once the operator's admission policies are in place")
    return c.finish()
