"""Faults injected into the product on purpose, for the chaos suite's negative control (issue 36,
docs/chaos.md, "Negative control"). TESTS ONLY.

This package is not part of the product: pyproject.toml excludes it from the wheel, so the image
(``make image``, the Dockerfile: both install the wheel) does not contain it, and every hook is
inert there. Each hook site imports it under ``try: ... except ImportError`` and does nothing when
it is absent. Where it is present (a source checkout, an editable install), a fault is active only
when ``AGENTRUN_TEST_FAULT`` names it as well: both markers, the module and the variable, are needed.

``AGENTRUN_TEST_FAULT`` is a comma-separated list of fault names (:class:`Fault`); an unknown name
is an error naming the variable and the choices, never ignored. Each fault breaks one promise that
the chaos invariants (``e2e/chaos/invariants.py``) must then catch:

- ``rekey`` (the lap): a retried attempt (``AGENTRUN_ATTEMPT`` > 1) sends its tool calls with
  another idempotency key than the first attempt (the attempt appended), as a key derived from
  anything but the run, the lap and the call would: the tool executes the call again.
- ``skip-journal`` (the lap): tool results are not journaled before the checkpoint; a retried
  attempt sends every call of its lap again, including the ones an earlier attempt had answered.
- ``double-job`` (the operator): every lap Job is created twice, the second under another name,
  two Jobs for one lap attempt.
- ``lose-decision`` (the operator): the lap Job that resumes after an approval is created without
  the decision; the lap refuses to run (it has a pending approval and no decision) and the run fails.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from collections.abc import Mapping
from typing import Any

ENV = "AGENTRUN_TEST_FAULT"
"""The test-only switch: a comma-separated list of :class:`Fault` names."""


class Fault(enum.StrEnum):
    REKEY = "rekey"
    SKIP_JOURNAL = "skip-journal"
    DOUBLE_JOB = "double-job"
    LOSE_DECISION = "lose-decision"


@functools.lru_cache(maxsize=8)
def parse(value: str) -> frozenset[Fault]:
    """The faults named by ``value``; ValueError naming the variable and the choices otherwise."""
    out: set[Fault] = set()
    for name in (n.strip() for n in value.split(",")):
        if not name:
            continue
        try:
            out.add(Fault(name))
        except ValueError:
            raise ValueError(f"{ENV}: unknown fault {name[:64]!r}; choose from "
                             f"{', '.join(f.value for f in Fault)}") from None
    return frozenset(out)


def active(fault: Fault, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``fault`` is switched on (``AGENTRUN_TEST_FAULT`` names it)."""
    return fault in parse((os.environ if env is None else env).get(ENV, ""))


# ---------------------------------------------------------------------------------- the lap
class _RekeyedTools:
    """``rekey``: the tool runner of attempt ``attempt`` > 1 sends another key than attempt 1."""

    def __init__(self, tools: Any, attempt: int) -> None:
        self._tools, self._attempt = tools, attempt

    def call(self, tool: Any, arguments: dict[str, Any], idempotency_key: str) -> Any:
        return self._tools.call(tool, arguments, f"{idempotency_key}-a{self._attempt}")

    def __getattr__(self, name: str) -> Any:  # secrets() and the like
        return getattr(self._tools, name)


def lap_tools(tools: Any, attempt: int) -> Any:
    """The lap's tool runner, rekeyed on a retried attempt when ``rekey`` is on."""
    return _RekeyedTools(tools, attempt) if attempt > 1 and active(Fault.REKEY) else tools


def skip_journal(name: str) -> bool:
    """``skip-journal``: whether the lap must NOT journal the entry ``name`` (every tool result;
    the model response is still journaled)."""
    return name.startswith("tool-") and active(Fault.SKIP_JOURNAL)


# ---------------------------------------------------------------------------------- the operator
def second_job(job: dict[str, Any]) -> dict[str, Any] | None:
    """``double-job``: a second Job for the lap attempt of ``job`` (another name, the same labels,
    owner and pod), or None when the fault is off."""
    if not active(Fault.DOUBLE_JOB):
        return None
    name = str(job["metadata"]["name"])
    return {**job, "metadata": {**job["metadata"], "name": name[:59].rstrip("-.") + "-dup"}}


def create_job(action: Any) -> Any:
    """``lose-decision``: the CreateJob action without its approval decision when the fault is on."""
    if getattr(action, "approval", None) is not None and active(Fault.LOSE_DECISION):
        return dataclasses.replace(action, approval=None)
    return action
