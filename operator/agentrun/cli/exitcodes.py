"""The exit codes of the ``agentrun`` commands (docs/cli.md "Exit codes"): one typed enum, so a
script can tell "not found" from "forbidden" from "the API server is down", and ``agentrun wait``
(and ``agentrun trace --follow``) can say how a run ended.

``lap`` and ``operator`` keep their own contract (``agentrun.api.contract.ExitCode``)."""

from __future__ import annotations

from enum import IntEnum

from agentrun.api.lifecycle import PHASE_CANCELLED, PHASE_DEADLINE_EXCEEDED


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    """Anything else: a refused write, an unreadable checkpoint store, a lap never checkpointed."""
    USAGE = 2
    """A bad flag or argument (click's usage message)."""
    NOT_FOUND = 3
    """The AgentRun (or another object named) does not exist (HTTP 404)."""
    FORBIDDEN = 4
    """The API server refused the credentials or the request (HTTP 401/403)."""
    CONFLICT = 5
    """The object changed meanwhile or exists already (HTTP 409), or the run is not in a phase the verb needs."""
    UNREACHABLE = 6
    """The API server cannot be reached (connection refused, unknown host, TLS)."""
    TIMEOUT = 7
    """``--request-timeout`` passed, or ``wait --timeout`` passed before the condition held."""
    # how a run ended (`wait`, `trace --follow`): Succeeded is OK
    FAILED = 10
    BUDGET_EXCEEDED = 11
    CANCELLED = 12
    DEADLINE_EXCEEDED = 13


OUTCOME_CODES: dict[str, ExitCode] = {
    "Succeeded": ExitCode.OK,
    "Failed": ExitCode.FAILED,
    "BudgetExceeded": ExitCode.BUDGET_EXCEEDED,
    PHASE_CANCELLED: ExitCode.CANCELLED,
    PHASE_DEADLINE_EXCEEDED: ExitCode.DEADLINE_EXCEEDED,
}
"""The exit code of each terminal phase."""


def outcome_code(phase: str | None) -> ExitCode:
    """The exit code of a run that ended in ``phase`` (ERROR for a phase that is not terminal)."""
    return OUTCOME_CODES.get(phase or "", ExitCode.ERROR)
