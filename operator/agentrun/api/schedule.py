"""The AgentSchedule: AgentRuns started on a cron schedule, modelled on Kubernetes' CronJob.

These pydantic models are the source of truth of the AgentSchedule CRD (``agentrun crd --schedule``,
``make crds``), as :mod:`.spec` is of the AgentRun's. The run template's ``spec`` *is* an
:class:`~agentrun.api.spec.AgentRunManifestSpec` (an inline agent, or an Agent by name with parameters), so every field a run has (and every field it gains) is
there too. The operator's schedule controller (``agentrun.schedule``) reads them; docs/scheduling.md
says how the times are chosen.

The names and labels the schedule gives its runs are typed values here, imported by the operator
and the tests alike.
"""

from __future__ import annotations

import copy
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from .crdgen import CEL_RULES as RUN_CEL_RULES
from .crdgen import GROUP, VERSION, _Dumper, structural
from .spec import AgentRunManifestSpec
from .status import Condition
from .types import APIModel

KIND = "AgentSchedule"
PLURAL = "agentschedules"
SINGULAR = "agentschedule"
SHORT_NAMES = ["asched"]
CATEGORIES = ["all"]  # as CronJob; not "agentrun": `kubectl get agentrun NAME` expands that category
CRD_NAME = f"{PLURAL}.{GROUP}"

#: Label of every run a schedule created: the schedule's name (runs are also owned by it).
LABEL_SCHEDULE = "agentrun.dev/schedule"
#: Annotation of every run a schedule created: the scheduled time it was started for (RFC 3339, UTC).
ANN_SCHEDULED_AT = "agentrun.dev/scheduled-at"
#: An AgentSchedule's name is at most this long, so its runs' names (``<name>-<unix minutes>``, the
#: minutes 8 digits now and at most 10 for millennia) are DNS labels of at most 63 characters and
#: the name fits the schedule label's value (as CronJob's 52).
MAX_NAME_CHARS = 52
#: Annotation and label keys under this prefix are agentrun's own: a template may not set them.
RESERVED_PREFIX = "agentrun.dev/"

#: The descriptors a schedule may use instead of five fields (CronJob's), as the fields they mean.
MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: The shape of spec.schedule the API server checks at apply (five fields of cron's characters, or a
#: descriptor). What the shape lets through but cron refuses ("99 * * * *") the operator refuses
#: (condition Ready False, reason InvalidSchedule, one Event).
SCHEDULE_PATTERN = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[-0-9A-Za-z*/,?#]+( +[-0-9A-Za-z*/,?#]+){4})$"
#: The shape of an IANA time zone name (checked against the zone database by the operator).
TIME_ZONE_PATTERN = r"^[A-Za-z][-A-Za-z0-9_+]*(/[-A-Za-z0-9_+]+)*$"
_LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]


def run_name(schedule: str, scheduled: datetime) -> str:
    """The run of ``schedule`` for the scheduled time ``scheduled``: ``<schedule>-<unix minutes>``
    (CronJob's Job names), the same on every replica and after every restart."""
    return f"{schedule}-{int(scheduled.timestamp()) // 60}"


class RunTemplateMetadata(APIModel):
    """Labels and annotations of every run the schedule creates."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels of each run (the operator adds " + LABEL_SCHEDULE + ": the schedule's name). "
        "Keys under " + RESERVED_PREFIX + " are agentrun's own and refused.",
        json_schema_extra={"additionalProperties": {"type": "string", "maxLength": 63,
                                                    "pattern": _LABEL_VALUE_PATTERN}},
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations of each run (the operator adds " + ANN_SCHEDULED_AT + ": the scheduled time). "
        "Keys under " + RESERVED_PREFIX + " are agentrun's own and refused.",
        json_schema_extra={"additionalProperties": {"type": "string", "maxLength": 4096}},
    )


class RunTemplate(APIModel):
    """The AgentRun each scheduled time starts."""

    metadata: RunTemplateMetadata = Field(
        default_factory=RunTemplateMetadata, description="Labels and annotations of each run."
    )
    spec: AgentRunManifestSpec = Field(
        description="The spec of each run: an AgentRun's spec, with an inline agent or an Agent's name and "
        "parameters (docs/crd-reference.md).")


class AgentScheduleSpec(APIModel):
    """Desired state of an AgentSchedule: when to start a run, which run, and what to keep."""

    schedule: str = Field(
        min_length=1,
        max_length=128,
        pattern=SCHEDULE_PATTERN,
        description="When to start a run: a cron expression of five fields (minute hour day-of-month month "
        "day-of-week), e.g. \"0 3 * * *\", or @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly.",
    )
    time_zone: str | None = Field(
        default=None,
        max_length=64,
        pattern=TIME_ZONE_PATTERN,
        description="IANA time zone the schedule is read in, e.g. \"Europe/Berlin\". Unset: UTC.",
    )
    run_template: RunTemplate = Field(description="The AgentRun to start at each scheduled time.")
    concurrency_policy: ConcurrencyPolicy = Field(
        default="Allow",
        description="What happens when a scheduled time comes while a run of this schedule is still active: "
        "\"Allow\" starts the new run beside it; \"Forbid\" skips the time (as CronJob, a skipped time is "
        "started once the active run ends if startingDeadlineSeconds still allows it); \"Replace\" cancels "
        "the active run (spec.cancel) and starts the new one.",
    )
    starting_deadline_seconds: int | None = Field(
        default=None,
        ge=0,
        le=2147483647,
        description="Most seconds after a scheduled time the run may still start (after operator downtime, "
        "or a time skipped by Forbid); a later time is not started. Unset: no deadline (only the most "
        "recent missed time is started, as CronJob).",
    )
    successful_runs_history_limit: int = Field(
        default=3, ge=0, le=1000, description="Succeeded runs to keep; older ones are deleted."
    )
    failed_runs_history_limit: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Runs that ended otherwise (Failed, BudgetExceeded, Cancelled, DeadlineExceeded) to keep; "
        "older ones are deleted.",
    )
    suspend: bool = Field(
        default=False,
        description="Start no new runs while true (active runs go on). Times passed while suspended count "
        "as missed when it is set false again.",
    )


class ScheduledRunRef(APIModel):
    """A run the schedule started."""

    name: str = Field(description="Name of the AgentRun.")
    uid: str | None = Field(default=None, description="UID of the AgentRun.")
    scheduled_time: datetime | None = Field(default=None, description="The scheduled time it was started for.")


class LastRun(APIModel):
    """The newest run of the schedule that has ended."""

    name: str = Field(description="Name of the AgentRun.")
    phase: str = Field(description="Its terminal phase: Succeeded, Failed, BudgetExceeded, Cancelled, DeadlineExceeded.")
    scheduled_time: datetime | None = Field(default=None, description="The scheduled time it was started for.")
    completion_time: datetime | None = Field(default=None, description="When it ended (its status.completedAt).")


class SkippedTime(APIModel):
    """The last scheduled time that started no run, and why."""

    time: datetime = Field(description="The scheduled time.")
    reason: str = Field(description="Why: RunAlreadyActive (Forbid), StartingDeadlineExceeded.")


class AgentScheduleStatus(APIModel):
    """Observed state of an AgentSchedule, written by the operator."""

    observed_generation: int | None = Field(default=None, description="The metadata.generation last acted on.")
    last_schedule_time: datetime | None = Field(
        default=None, description="The last scheduled time a run was started for."
    )
    last_successful_time: datetime | None = Field(
        default=None, description="When the last run that Succeeded ended."
    )
    active: list[ScheduledRunRef] = Field(
        default_factory=list, description="The schedule's runs that have not ended."
    )
    active_count: int = Field(default=0, description="How many runs of the schedule have not ended (the Active column).")
    last_run: LastRun | None = Field(default=None, description="The newest run that has ended, and how.")
    last_skipped: SkippedTime | None = Field(
        default=None, description="The last scheduled time that started no run, and why."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready: True while the schedule starts runs; False with reason Suspended, InvalidSchedule, "
        "InvalidTimeZone or RunRefused (the API server refused the run; the message says why).",
    )


# ------------------------------------------------------------------------------------- the CRD

_RUN_SPEC = "spec.runTemplate.spec"


def _for_template(message: str) -> str:
    return re.sub(r"\bspec\.", _RUN_SPEC + ".", message)


def _cel_rules() -> dict[str, list[dict[str, str]]]:
    """The schedule's CEL rules: its own, and the AgentRun's rules that are not transition rules,
    on the run template's spec (messages naming the template's fields)."""
    rules: dict[str, list[dict[str, str]]] = {
        "": [{
            "rule": f"self.metadata.name.size() <= {MAX_NAME_CHARS}",
            "message": f"metadata.name: an AgentSchedule's name is at most {MAX_NAME_CHARS} characters (its runs "
            "are named <name>-<scheduled unix minutes>, at most 63)",
        }],
        "spec.runTemplate.metadata.labels": [{
            "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
            "message": f"spec.runTemplate.metadata.labels: keys under {RESERVED_PREFIX} are set by agentrun, "
            "not by a template",
        }],
        "spec.runTemplate.metadata.annotations": [{
            "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
            "message": f"spec.runTemplate.metadata.annotations: keys under {RESERVED_PREFIX} are set by agentrun, "
            "not by a template",
        }],
        _RUN_SPEC: [
            {"rule": "!has(self.cancel)",
             "message": f"{_RUN_SPEC}.cancel cannot be set in a template: cancel a run, or suspend the schedule"},
            {"rule": "!has(self.forkFrom)",
             "message": f"{_RUN_SPEC}.forkFrom cannot be set in a template: a schedule starts new runs"},
        ],
    }
    for path, run_rules in RUN_CEL_RULES.items():
        for r in run_rules:
            if "oldSelf" in r["rule"]:
                continue  # the template is not the run: it may change
            rules.setdefault(_RUN_SPEC + path[len("spec"):], []).append(
                {"rule": r["rule"], "message": _for_template(r["message"])})
    return rules


CEL_RULES = _cel_rules()

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule", "description": "The cron schedule."},
    {"name": "Timezone", "type": "string", "jsonPath": ".spec.timeZone", "description": "Its time zone (empty: UTC)."},
    {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend", "description": "Whether new runs are held."},
    {"name": "Active", "type": "integer", "jsonPath": ".status.activeCount",
     "description": "Runs of the schedule that have not ended."},
    {"name": "Last-Schedule", "type": "date", "jsonPath": ".status.lastScheduleTime",
     "description": "The last scheduled time a run was started for."},
    {"name": "Last-Outcome", "type": "string", "jsonPath": ".status.lastRun.phase",
     "description": "How the newest ended run ended."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Policy", "type": "string", "priority": 1, "jsonPath": ".spec.concurrencyPolicy",
     "description": "Concurrency policy."},
    {"name": "Ready", "type": "string", "priority": 1, "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason",
     "description": "Why the schedule is (not) ready."},
]


def _attach(schema: dict[str, Any], path: str, rules: list[dict[str, str]]) -> None:
    node = schema
    for part in filter(None, path.split(".")):
        node = node["properties"][part]
    node["x-kubernetes-validations"] = copy.deepcopy(rules)


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the AgentSchedule resource."""
    spec = AgentScheduleSpec.model_json_schema(by_alias=True, mode="validation")
    status = AgentScheduleStatus.model_json_schema(by_alias=True, mode="serialization")
    spec_s = structural(spec, spec.get("$defs", {}))
    status_s = structural(status, status.get("$defs", {}))
    status_s.pop("required", None)
    root: dict[str, Any] = {
        "type": "object",
        "description": "An AgentSchedule: AgentRuns started on a cron schedule (like a CronJob's Jobs), "
        "each named after its scheduled time and owned by the schedule.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object: agentrun.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of the object: AgentSchedule."},
            "metadata": {"type": "object"},
            "spec": spec_s,
            "status": status_s,
        },
    }
    for path, rules in CEL_RULES.items():
        _attach(root, path, rules)
    return root


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of AgentSchedule."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {"agentrun.dev/generated-by": "agentrun crd --schedule (operator/agentrun/api/schedule.py)"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": CATEGORIES},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": openapi_schema()},
            }],
        },
    }


def render_crd() -> str:
    """The CRD as YAML text (what ``crds/agentrun.dev_agentschedules.yaml`` holds)."""
    import yaml

    header = "# GENERATED by `agentrun crd --schedule` from operator/agentrun/api/schedule.py: do not edit.\n"
    return header + "---\n" + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
