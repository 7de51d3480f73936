"""The approval contract: annotation names, the call binding and the bounds of what a human writes.

Imported by every side that touches a decision: the admission policies' generator (crds/ and
the chart), the operator's ``decide()``, the CLI and the tests. Nothing here does I/O.

A decision reaches a run in one of two ways:

* annotations on the AgentRun (``kubectl annotate agentrun NAME approved=true``, or
  ``agentrun approve``), optionally bound to the call the person saw with
  :data:`ANN_CALL_ID` and :data:`ANN_ARGUMENTS_SHA256`;
* a status patch of ``status.approval.decision``.

Either way the API server, not the client, records who decided (admission stamps
``request.userInfo.username`` into :data:`ANN_DECIDED_BY` / ``status.approval.decidedBy``), and the
API server checks the :data:`APPROVE_VERB` permission on ``agentruns`` before it accepts one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

# --- annotations a person (or `agentrun approve`) writes -------------------------------------
ANN_APPROVED: Final = "approved"
"""``true`` or ``false``: the decision itself (kept short so it can be typed by hand)."""
ANN_REASON: Final = "agentrun.dev/reason"
ANN_REASON_SHORT: Final = "reason"
"""The reason given with a decision (either key; the long one wins)."""
ANN_CALL_ID: Final = "agentrun.dev/call-id"
"""Optional binding: the id of the pending call the decision is for."""
ANN_ARGUMENTS_SHA256: Final = "agentrun.dev/arguments-sha256"
"""Optional binding: :func:`arguments_sha256` of the full arguments the person saw."""

# --- annotations only admission writes --------------------------------------------------------
ANN_DECIDED_BY: Final = "agentrun.dev/decided-by"
"""The authenticated user who set :data:`ANN_APPROVED`, stamped by the MutatingAdmissionPolicy
(a value sent by a client is overwritten; on clusters without it, a ValidatingAdmissionPolicy
requires it to equal the requesting user)."""

ANN_CREATED_BY: Final = "agentrun.dev/created-by"
"""The authenticated user who created the run, stamped at CREATE by the MutatingAdmissionPolicy
(a value sent by a client is overwritten; on clusters without it, a ValidatingAdmissionPolicy
requires it to equal the requesting user). Nobody may add, change or remove it afterwards. With
``spec.approval.distinctFromCreator: true`` that user may not decide the run's approvals. Not a
decision annotation: the operator never removes it."""

DECISION_ANNOTATIONS: Final = (
    ANN_APPROVED, ANN_REASON, ANN_REASON_SHORT, ANN_CALL_ID, ANN_ARGUMENTS_SHA256, ANN_DECIDED_BY,
)
"""Every annotation of a decision: consumed (removed) together by the operator."""

# --- authorization ----------------------------------------------------------------------------
APPROVE_VERB: Final = "approve"
"""The custom RBAC verb on ``agentruns`` (group agentrun.dev) that deciding needs, checked by
the admission policy's ``authorizer`` (like ``approve`` on ``signers`` for CSRs). ``patch`` on
``agentruns`` alone does not let anyone decide."""

# --- bounds of values a person writes (checked before anything reaches status, logs or Events) --
MAX_REASON_CHARS: Final = 1024
MAX_DECIDED_BY_CHARS: Final = 256
MAX_CALL_ID_CHARS: Final = 64
SHA256_HEX_CHARS: Final = 64


def canonical_arguments(arguments: dict[str, Any]) -> bytes:
    """The bytes a call's arguments are digested over: JSON with sorted keys, no spaces, UTF-8."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def arguments_sha256(arguments: dict[str, Any]) -> str:
    """sha256 (hex) of :func:`canonical_arguments`: what binds a decision to the call it approves."""
    return hashlib.sha256(canonical_arguments(arguments)).hexdigest()
