"""The lifecycle contract of a run: retry in place, cancel, the run deadline, outcome notifications.

Imported by every side that touches them: the operator's ``decide()``, the admission policies'
generator (``api/admission.py``: crds/ and the chart), the CLI (``agentrun retry``, ``agentrun
cancel``, ``agentrun wait``) and the tests. Nothing here does I/O.

* **Retry in place** (issue 31): a person sets the annotation :data:`ANN_RETRY` on a run in one of
  :data:`RETRYABLE_PHASES`, its value the retry number they expect (``status.lifecycle.retries + 1``,
  :func:`retry_request_value`), so a stale or duplicated request is detected, never applied twice.
  Optional :data:`ANN_RETRY_FROM_LAP` rewinds to a checkpointed lap. Setting either needs the custom
  RBAC verb :data:`RETRY_VERB` on ``agentruns`` (checked by the API server's ValidatingAdmissionPolicy
  with the CEL authorizer, like ``approve``); the API server stamps the requester into
  :data:`ANN_RETRY_REQUESTED_BY`. The operator consumes (removes) all of :data:`RETRY_ANNOTATIONS`
  and records the retry in ``status.lifecycle``. The run keeps its uid and its idempotency keys.
* **Cancel**: ``spec.cancel: {reason: ...}`` (declarative: present means cancelled). ``patch`` on the
  run suffices (the author may cancel her run); the API server stamps who into
  :data:`ANN_CANCELLED_BY`. A retry of a Cancelled run removes ``spec.cancel`` in the same patch.
* **Deadline**: ``spec.activeDeadline`` (a duration) counted from ``status.startedAt``.
* **Outcome notifications**: ``spec.notify.outcomes`` lists which of :data:`OUTCOMES` the operator's
  webhooks announce, once per outcome (``status.lifecycle.notified``).
"""

from __future__ import annotations

from typing import Final, Literal

# --- annotations a person (or `agentrun retry`) writes ----------------------------------------
ANN_RETRY: Final = "agentrun.dev/retry"
"""Request a retry in place. Value: the retry number the requester expects, i.e.
``status.lifecycle.retries + 1`` as a decimal (``agentrun retry`` reads the run and sets it). A value
that is not that number is refused (stale or duplicated), never applied."""
ANN_RETRY_FROM_LAP: Final = "agentrun.dev/retry-from-lap"
"""Optional with :data:`ANN_RETRY`: rewind to this checkpointed lap (``"N"``) and continue at lap
N+1, refused when a side-effecting call after lap N has executed (naming the first such call)."""

# --- annotations only admission writes ---------------------------------------------------------
ANN_RETRY_REQUESTED_BY: Final = "agentrun.dev/retry-requested-by"
"""The authenticated user who set :data:`ANN_RETRY`, stamped by the MutatingAdmissionPolicy (a
client's value is overwritten; on clusters without it, the ValidatingAdmissionPolicy requires it to
equal the requesting user)."""
ANN_CANCELLED_BY: Final = "agentrun.dev/cancelled-by"
"""The authenticated user who set ``spec.cancel``, stamped by the MutatingAdmissionPolicy when
``spec.cancel`` appears (validated to equal the requester where not stamped). Copied by the
operator into ``status.lifecycle.cancelledBy``."""

RETRY_ANNOTATIONS: Final = (ANN_RETRY, ANN_RETRY_FROM_LAP, ANN_RETRY_REQUESTED_BY)
"""Every annotation of a retry request: consumed (removed) together by the operator."""

# --- authorization -------------------------------------------------------------------------------
RETRY_VERB: Final = "retry"
"""The custom RBAC verb on ``agentruns`` (group agentrun.dev) a retry request needs, checked by the
admission policy's ``authorizer``. A retry re-opens a finished run and may spend again (a top-up),
so ``patch`` alone does not allow it. The chart grants it in the ClusterRole
:data:`RETRIER_CLUSTERROLE` (bind it per namespace)."""
RETRIER_CLUSTERROLE: Final = "agentrun-retrier"

# --- phases ------------------------------------------------------------------------------------------
PHASE_CANCELLED: Final = "Cancelled"
PHASE_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
RETRYABLE_PHASES: Final = ("Failed", "BudgetExceeded", PHASE_CANCELLED, PHASE_DEADLINE_EXCEEDED)
"""Terminal phases a retry in place continues from (Succeeded is final: fork it instead)."""

Outcome = Literal["Succeeded", "Failed", "BudgetExceeded", "Cancelled", "DeadlineExceeded"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("Succeeded", "Failed", "BudgetExceeded", "Cancelled", "DeadlineExceeded")
"""The terminal phases, each an outcome the webhooks may announce (``spec.notify.outcomes``)."""

APPROVAL_WITHDRAWN: Final = "Withdrawn"
"""``status.approval.state`` of a request withdrawn because the run was cancelled (or its deadline passed)."""

# --- bounds of values a person writes ------------------------------------------------------------
MAX_CANCEL_REASON_CHARS: Final = 1024
MAX_USER_CHARS: Final = 256
MAX_RETRY_VALUE_CHARS: Final = 16
MAX_RETRIES: Final = 1000
"""Most retries in place of one run (a runaway retry loop stops; fork for a new history)."""

CANCEL_GRACE_SECONDS: Final = 30
"""gracePeriodSeconds of the DELETE of a lap Job stopped by a cancel or a passed deadline. Its pod is
then deleted by the garbage collector with the pod's own terminationGracePeriodSeconds (30 s by
default): SIGTERM, the lap finishes the journal write in flight and exits
:data:`~agentrun.api.contract.ExitCode.TERMINATED`, SIGKILL past the grace."""


def retry_request_value(retries_so_far: int) -> str:
    """The :data:`ANN_RETRY` value of the next retry of a run with ``status.lifecycle.retries`` so far."""
    return str(retries_so_far + 1)


def parse_retry_value(value: str) -> int | None:
    """The retry number of an :data:`ANN_RETRY` value, or None when it is not a positive decimal."""
    v = value.strip()
    if not v.isdigit() or len(v) > MAX_RETRY_VALUE_CHARS:
        return None
    n = int(v)
    return n if n >= 1 else None


def parse_from_lap(value: str) -> int | None:
    """The lap of an :data:`ANN_RETRY_FROM_LAP` value, or None when it is not a decimal >= 0."""
    v = value.strip()
    if not v.isdigit() or len(v) > MAX_RETRY_VALUE_CHARS:
        return None
    return int(v)
