"""The Agent resource (``agentrun.dev/v1alpha1``, kind ``Agent``): an agent declared once, run by
name (an AgentRun's ``spec.agentRef``) with typed parameters.

Pure: the models (the CRD's schema is generated from them, ``api/crdgen.py``), and what turns an
Agent plus a run into the run's effective spec:

* :func:`check_parameters`: the run's ``spec.parameters`` (strings) against the Agent's declared
  parameters: every required one set (or defaulted), none undeclared, each parsed as its type;
* :func:`render_task`: ``spec.task`` as a template over them. ``{{ name }}`` (spaces optional) is
  replaced by the value as written; ``\\{{`` is a literal ``{{``; any other ``{{`` is an error. No
  expressions, no filters, no code: a value is inserted as text and never rendered again;
* :func:`resolve`: the resolved copy (:class:`ResolvedAgent`): the Agent's definition, the rendered
  task, the typed parameters and the effective budget/approval/retry. The run's field wins where
  the run SET it: a field present in the run's manifest (the API server applies no defaults, so an
  absent field is unset), field by field (``spec.budget.maxLaps`` alone overrides only that);
* :func:`effective_spec`: the :class:`~agentrun.api.spec.AgentRunSpec` the operator acts on and the
  lap receives (``AGENTRUN_SPEC``), from the run and its pinned copy.

The pinned copy is stored content-addressed (``agents/<sha256>.json`` under the run's prefix,
:func:`agentrun.api.contract.agent_object`) and its digest recorded in ``status.agent``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from .reasons import Reason
from .spec import (
    MAX_PARAMETERS,
    PARAMETER_NAME_PATTERN,
    AgentRunManifestSpec,
    AgentRunSpec,
    AgentSpec,
    ApprovalSpec,
    BudgetSpec,
    RetrySpec,
)
from .types import APIModel

KIND = "Agent"
ParameterType = Literal["string", "integer", "number", "boolean"]
Rollout = Literal["Pinned", "FollowLatest"]
MAX_TASK_CHARS = 65536
RESOLVED_KIND = "ResolvedAgent"
MAX_DEFAULT_CHARS = 1024


class ParameterSpec(APIModel):
    """A parameter of the Agent: a run sets it in spec.parameters, its task names it as {{ name }}."""

    name: str = Field(pattern=PARAMETER_NAME_PATTERN, max_length=63,
                      description="Name of the parameter: letters, digits and _, not starting with a digit.")
    type: ParameterType = Field(
        default="string",
        description="Type of the value: a run's value (a string) must parse as it (integer: digits; number: a "
        "decimal; boolean: true or false).",
    )
    required: bool = Field(default=False, description="Whether every run must set it (a default makes it optional).")
    default: str | None = Field(
        default=None, max_length=MAX_DEFAULT_CHARS,
        description="Value when a run does not set it, as a string of the parameter's type.",
    )
    description: str = Field(default="", max_length=1024, description="What the parameter means, for people.")

    @model_validator(mode="after")
    def _default_typed(self) -> ParameterSpec:
        if self.default is not None:
            try:
                coerce(self.type, self.default)
            except ValueError as exc:
                raise ValueError(f"spec.parameters[{self.name}].default: {exc}") from None
        return self


class AgentDefinitionSpec(AgentSpec):
    """Desired state of an Agent: the agent (version, image, model, window, tools), the default task and
    policies of its runs, its parameters and how its runs follow its edits."""

    task: str | None = Field(
        default=None, min_length=1, max_length=MAX_TASK_CHARS,
        description="Task template of a run that sets no spec.task: {{ name }} names a parameter, \\{{ is a "
        "literal {{ (docs/concepts.md#agents).",
    )

    budget: BudgetSpec | None = Field(default=None, description="Default limits of its runs (a run's own fields win).")
    approval: ApprovalSpec | None = Field(
        default=None, description="Default approval policy of its runs (a run's own fields win)."
    )
    retry: RetrySpec | None = Field(default=None, description="Default retry policy of its runs (a run's own fields win).")
    parameters: list[ParameterSpec] = Field(
        default_factory=list, max_length=MAX_PARAMETERS,
        description="Parameters a run sets in spec.parameters and its task names as {{ name }}.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    rollout: Rollout = Field(
        default="Pinned",
        description=(
            "How runs follow edits of this Agent. Pinned: a run keeps the definition it resolved at its first lap "
            "(status.agent.digest). FollowLatest: a run takes the current definition at its next lap boundary "
            "(no lap in flight, no approval pending), recorded in status.agent and in every lap's agent version."
        ),
    )

    @model_validator(mode="after")
    def _names_unique(self) -> AgentDefinitionSpec:
        for what, names in (("tools", [t.name for t in self.tools]), ("parameters", [p.name for p in self.parameters])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"spec.{what}: duplicate name(s) {', '.join(dup)}")
        return self

    def agent(self) -> AgentSpec:
        """The agent part of the definition (what an inline spec.agent holds: no task, policies,
        parameters or rollout)."""
        return AgentSpec.model_validate(self.model_dump(by_alias=True, exclude_unset=True, include=set(AgentSpec.model_fields)))


ParameterValue = str | int | float | bool


class ResolvedAgent(APIModel):
    """The resolved copy of a run's Agent, stored content-addressed in the run's checkpoint prefix
    (``agents/<digest>.json``) and named by ``status.agent.digest``: everything of the run that came
    from the Agent and its parameters."""

    kind: Literal["ResolvedAgent"] = Field(default="ResolvedAgent", description="Kind of the stored document.")
    name: str = Field(description="Name of the Agent it was resolved from.")
    generation: int | None = Field(default=None, description="metadata.generation of the Agent then.")
    uid: str | None = Field(
        default=None, max_length=128,
        description="metadata.uid of the Agent then: a FollowLatest run follows only that object, not an Agent "
        "deleted and created again under the same name.",
    )
    rollout: Rollout = Field(description="The Agent's rollout then.")
    agent: AgentSpec = Field(description="The agent.")
    task: str = Field(description="The rendered task.")
    parameters: dict[str, ParameterValue] = Field(default_factory=dict, description="The typed parameters.")
    budget: BudgetSpec = Field(description="The effective budget.")
    approval: ApprovalSpec = Field(description="The effective approval policy.")
    retry: RetrySpec = Field(description="The effective retry policy.")

    @property
    def version(self) -> str:
        return self.agent.version

    def canonical(self) -> bytes:
        """The bytes the digest is of: canonical JSON (sorted keys, compact, UTF-8)."""
        return json.dumps(self.to_api(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()


@dataclass(frozen=True)
class AgentProblem:
    """Why a run's Agent cannot be resolved: ``reason`` (AgentNotFound, AgentInvalid, InvalidParameters),
    ``message`` naming the field."""

    reason: str
    message: str


class ResolveError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.problem = AgentProblem(reason, message)


_INT = re.compile(r"^[-+]?[0-9]{1,18}$")
_NUM = re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,3})?$")


def coerce(type_: str, raw: str) -> ParameterValue:
    """``raw`` parsed as ``type_``; ValueError saying what is wrong (the value shown bounded)."""
    shown = json.dumps(raw[:64] + ("..." if len(raw) > 64 else ""))
    if type_ == "integer":
        if not _INT.match(raw):
            raise ValueError(f"{shown} is not an integer")
        return int(raw)
    if type_ == "number":
        if not _NUM.match(raw) or not math.isfinite(float(raw)):
            raise ValueError(f"{shown} is not a number")
        return float(raw)
    if type_ == "boolean":
        if raw not in ("true", "false"):
            raise ValueError(f"{shown} is not a boolean (true or false)")
        return raw == "true"
    return raw


def check_parameters(agent_name: str, declared: list[ParameterSpec], given: dict[str, str] | None
                     ) -> tuple[dict[str, ParameterValue], dict[str, str]]:
    """(typed values, values as text) of every declared parameter that has one; ResolveError
    (InvalidParameters) naming the first wrong ``spec.parameters.<name>``, in declared order, then
    the undeclared ones."""
    given = dict(given or {})
    typed: dict[str, ParameterValue] = {}
    text: dict[str, str] = {}
    names = [p.name for p in declared]
    for extra in sorted(set(given) - set(names)):
        raise ResolveError(Reason.INVALID_PARAMETERS, f"spec.parameters.{extra}: not declared by Agent {agent_name} "
                           f"(declared: {', '.join(names) or 'none'})")
    for p in declared:
        raw = given.get(p.name, p.default)
        if raw is None:
            if p.required:
                raise ResolveError(Reason.INVALID_PARAMETERS, f"spec.parameters.{p.name}: required by Agent "
                                   f"{agent_name} and not set")
            continue
        try:
            typed[p.name] = coerce(p.type, raw)
        except ValueError as exc:
            raise ResolveError(Reason.INVALID_PARAMETERS, f"spec.parameters.{p.name}: {exc} (Agent {agent_name} "
                               f"declares it {p.type})") from None
        text[p.name] = raw
    return typed, text


_TOKEN = re.compile(r"\\\{\{|\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}|\{\{")


def render_task(template: str, values: dict[str, str], declared: list[str] | None = None) -> str:
    """The task with each ``{{ name }}`` replaced by ``values[name]`` (verbatim; never rendered
    again), each ``\\{{`` by ``{{``. ValueError naming ``spec.task`` for a placeholder of no
    declared parameter, one of a parameter without a value, or a ``{{`` that opens none."""
    known = set(values) if declared is None else set(declared)

    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "\\{{":
            return "{{"
        name = m.group(1)
        if name is None:
            raise ValueError(f"spec.task: '{{{{' at character {m.start()} opens no {{{{ name }}}} placeholder "
                             "(write \\{{ for a literal {{)")
        if name not in known:
            raise ValueError(f"spec.task: {{{{ {name} }}}} names no declared parameter "
                             f"(declared: {', '.join(sorted(known)) or 'none'})")
        if name not in values:
            raise ValueError(f"spec.task: {{{{ {name} }}}} names parameter {name}, which has no value "
                             f"(set spec.parameters.{name} or give it a default)")
        return values[name]

    out = _TOKEN.sub(sub, template)
    if len(out) > MAX_TASK_CHARS:
        raise ValueError(f"spec.task: the rendered task has {len(out)} characters, more than {MAX_TASK_CHARS}")
    return out


M = TypeVar("M", bound=BaseModel)


def overlay(base: M, over: M) -> M:
    """``base`` with every field ``over`` SET (``model_fields_set``: present in the manifest)
    replacing it, nested models field by field; validated again (e.g. backoff max >= initial)."""
    update: dict[str, Any] = {}
    for f in over.model_fields_set:
        mine, theirs = getattr(over, f), getattr(base, f)
        update[f] = overlay(theirs, mine) if isinstance(mine, BaseModel) and isinstance(theirs, BaseModel) else mine
    merged = base.model_copy(update=update)
    return type(base).model_validate(merged.model_dump(by_alias=True, exclude_none=True))


def _effective(default: M | None, run: M, run_set: bool, empty: type[M]) -> M:
    base = default if default is not None else empty()
    return overlay(base, run) if run_set else base


def resolve(name: str, definition: AgentDefinitionSpec, run: AgentRunManifestSpec,
            generation: int | None = None, uid: str | None = None) -> ResolvedAgent:
    """The resolved copy of ``run``'s Agent ``name``; ResolveError (InvalidParameters) when its
    parameters or task template do not fit the Agent."""
    typed, text = check_parameters(name, definition.parameters, run.parameters)
    template = run.task if run.task is not None else definition.task
    if template is None:
        raise ResolveError(Reason.INVALID_PARAMETERS, f"spec.task: not set, and Agent {name} has no spec.task")
    try:
        task = render_task(template, text, [p.name for p in definition.parameters])
    except ValueError as exc:
        raise ResolveError(Reason.INVALID_PARAMETERS, str(exc)) from None
    try:
        fields = run.model_fields_set
        return ResolvedAgent(
            name=name, generation=generation, uid=uid, rollout=definition.rollout, agent=definition.agent(), task=task,
            parameters=typed,
            budget=_effective(definition.budget, run.budget, "budget" in fields, BudgetSpec),
            approval=_effective(definition.approval, run.approval, "approval" in fields, ApprovalSpec),
            retry=_effective(definition.retry, run.retry, "retry" in fields, RetrySpec),
        )
    except ValidationError as exc:  # the merged policies do not validate
        err = exc.errors()[0]
        raise ResolveError(Reason.INVALID_PARAMETERS, f"spec: the run's policies over Agent {name}'s do not "
                           f"validate: {err.get('msg')}") from None


def effective_spec(run: AgentRunManifestSpec, resolved: ResolvedAgent) -> AgentRunSpec:
    """The spec the operator acts on and the lap receives: the run's own fields, with the agent,
    task and policies of its resolved copy."""
    doc = run.model_dump(by_alias=True, exclude_none=True, mode="json",
                         exclude={"agent", "agent_ref", "parameters", "task", "budget", "approval", "retry"})
    doc.update(agent=resolved.agent.to_api(), task=resolved.task, budget=resolved.budget.to_api(),
               approval=resolved.approval.to_api(), retry=resolved.retry.to_api())
    return AgentRunSpec.model_validate(doc)

