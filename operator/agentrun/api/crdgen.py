"""Generate the AgentRun CRD (and its field reference) from the pydantic models.

``agentrun crd > crds/agentrun.dev_agentruns.yaml`` (or ``make crds``). The pydantic JSON schema
is turned into a *structural* schema (https://kubernetes.io/docs/tasks/extend-kubernetes/
custom-resources/custom-resource-definitions/#specifying-a-structural-schema):

* ``$ref``/``$defs`` are inlined; ``Optional[X]`` (``anyOf: [X, null]``) becomes just ``X``
  (optional = not in ``required``); ``Literal`` becomes ``enum``;
* ``additionalProperties: false`` (pydantic's ``extra="forbid"``) is dropped: the API server
  prunes unknown fields, and ``additionalProperties`` may not sit next to ``properties``;
* ``title`` and ``default`` are dropped: defaults are applied by the models (the operator and
  the lap runner parse the spec with them), and shown in the description instead;
* every property must have a description (:func:`undocumented_fields` finds the ones that don't).

CEL rules (``x-kubernetes-validations``) are attached at fixed paths (:data:`CEL_RULES`).
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import click
import yaml

from .spec import AgentRunManifestSpec
from .status import AgentRunStatus

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
KIND = "AgentRun"
PLURAL = "agentruns"
SINGULAR = "agentrun"
SHORT_NAMES = ["ar"]
CATEGORIES = ["all", "agentrun"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# Path (dotted, from the resource root; "[]" for list items) -> CEL rules with messages that name
# the field. Transition rules (oldSelf) only run on updates, when the field exists in both.
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "spec": [
        {
            "rule": "!has(self.agent) || !has(self.agent.tools) || !self.agent.tools.exists(t, "
            "has(t.requiresApproval) && t.requiresApproval) || (has(self.approval) && has(self.approval.owner))",
            "message": "spec.approval.owner is required when a tool in spec.agent.tools has "
            "requiresApproval: true (someone must own the decision)",
        },
        {
            "rule": "!has(self.agent) || !has(self.agent.mcpServers) || !self.agent.mcpServers.exists(s, "
            "has(s.requiresApproval) && size(s.requiresApproval) > 0) || (has(self.approval) && has(self.approval.owner))",
            "message": "spec.approval.owner is required when a server in spec.agent.mcpServers has "
            "requiresApproval patterns (someone must own the decision)",
        },
        {
            "rule": "has(self.forkFrom) == has(oldSelf.forkFrom) && (!has(self.forkFrom) || "
            "self.forkFrom == oldSelf.forkFrom)",
            "message": "spec.forkFrom is immutable: a run cannot start or stop being a fork",
        },
        {
            "rule": "has(self.agent) != has(self.agentRef)",
            "message": "spec.agent, spec.agentRef: exactly one must be set (the agent inline, or the name of an Agent)",
        },
        {
            "rule": "has(self.task) || has(self.agentRef)",
            "message": "spec.task is required with an inline spec.agent (a run of an Agent may take the Agent's "
            "spec.task)",
        },
        {
            "rule": "has(self.task) == has(oldSelf.task)",
            "message": "spec.task is immutable: it cannot be added or removed after creation",
        },
        {
            "rule": "!has(self.parameters) || has(self.agentRef)",
            "message": "spec.parameters needs spec.agentRef (an inline spec.agent declares no parameters)",
        },
        {
            "rule": "has(self.agentRef) == has(oldSelf.agentRef) && (!has(self.agentRef) || "
            "self.agentRef == oldSelf.agentRef)",
            "message": "spec.agentRef is immutable: a run cannot change the Agent it runs",
        },
        {
            "rule": "has(self.parameters) == has(oldSelf.parameters) && (!has(self.parameters) || "
            "self.parameters == oldSelf.parameters)",
            "message": "spec.parameters is immutable: create a new AgentRun for new parameters",
        },
    ],
    "spec.task": [
        {"rule": "self == oldSelf", "message": "spec.task is immutable: create a new AgentRun for a new task"},
    ],
    "spec.agent.tools": [
        {
            "rule": "self.all(t, self.exists_one(u, u.name == t.name))",
            "message": "spec.agent.tools: tool names must be unique",
        },
    ],
    "spec.agent.model": [
        {
            "rule": "self.provider != 'scripted' || (has(self.script) && size(self.script) > 0)",
            "message": "spec.agent.model.script must not be empty when spec.agent.model.provider is \"scripted\"",
        },
    ],
    "spec.retry.backoff": [
        {
            "rule": "!has(self.initial) || !has(self.max) || duration(self.max) >= duration(self.initial)",
            "message": "spec.retry.backoff.max must not be shorter than spec.retry.backoff.initial",
        },
    ],
}

# spec.checkpoint's location is pinned at creation: adding, removing or changing any of these is
# refused. The rules sit on `spec` (always present on an update), not on the optional
# `spec.checkpoint`, whose transition rules would not run when the block is added or removed.
# retention and snapshotEvery stay mutable (they do not move the checkpoints).
PINNED_CHECKPOINT_FIELDS = ("uri", "endpoint", "region", "pathStyle", "credentialsSecretName")
CEL_RULES["spec"] += [
    {
        # has() and plain equality, not optionals: their cost is bounded by the field's maxLength
        "rule": f"(has(self.checkpoint) && has(self.checkpoint.{f})) == (has(oldSelf.checkpoint) && "
        f"has(oldSelf.checkpoint.{f})) && (!has(self.checkpoint) || !has(self.checkpoint.{f}) || "
        f"self.checkpoint.{f} == oldSelf.checkpoint.{f})",
        "message": f"spec.checkpoint.{f} is immutable (it cannot be added, removed or changed after creation): "
        "a run's checkpoints cannot move",
    }
    for f in PINNED_CHECKPOINT_FIELDS
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Phase of the run."},
    {"name": "Lap", "type": "integer", "jsonPath": ".status.lap", "description": "Last checkpointed lap."},
    {
        "name": "Version",
        "type": "string",
        "jsonPath": ".status.agentVersion",
        "description": "Agent version that wrote the last checkpoint.",
    },
    {"name": "Cost", "type": "string", "jsonPath": ".status.cost.usd", "description": "Cost so far in USD."},
    {
        "name": "Waiting-On",
        "type": "string",
        "jsonPath": ".status.waitingOn",
        "description": "Owner of the pending approval.",
    },
    {
        "name": "Last-Checkpoint",
        "type": "date",
        "jsonPath": ".status.lastCheckpointTime",
        "description": "When the last checkpoint was written.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Queue",
        "type": "integer",
        "priority": 1,
        "jsonPath": ".status.queue.position",
        "description": "Place in the namespace's queue of a Queued run (an AgentRunPolicy's maxActiveRuns).",
    },
    {
        "name": "Retries",
        "type": "integer",
        "priority": 1,
        "jsonPath": ".status.totalRetries",
        "description": "Failed lap attempts over the run.",
    },
    {
        "name": "Spec-Version",
        "type": "string",
        "priority": 1,
        "jsonPath": ".spec.agent.version",
        "description": "Agent version the next lap will run.",
    },
    {
        "name": "Storage",
        "type": "integer",
        "priority": 1,
        "jsonPath": ".status.storage.bytes",
        "description": "Stored bytes of the run's checkpoints so far.",
    },
    {
        "name": "Agent",
        "type": "string",
        "priority": 1,
        "jsonPath": ".spec.agentRef.name",
        "description": "The Agent the run runs (spec.agentRef).",
    },
    {
        "name": "Agent-Digest",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.agent.digest",
        "description": "sha256 of the Agent definition the run has pinned (status.agent).",
    },
    {"name": "Message", "type": "string", "priority": 1, "jsonPath": ".status.message", "description": "Details."},
]

_DROP = {"title", "default", "additionalProperties", "$defs"}


def _fmt_default(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else f'"{value}"'


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Return the structural form of a pydantic JSON-schema node (see the module docstring)."""
    node = dict(node)
    default = node.get("default", None)
    has_default = "default" in node and default not in (None, [], {}) and not isinstance(default, (dict, list))
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items()}}
        return structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a structural schema of a union: {options}")
        merged = {**options[0], **node}
        if "$ref" in options[0]:
            merged = {**defs[options[0]["$ref"].split("/")[-1]], **node}
        return structural(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out["properties"] = {k: structural(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "format" and value == "date-time":
            out["format"] = "date-time"
        else:
            out[key] = value
    if "const" in node and "type" not in out:
        out["type"] = "string"
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    add = node.get("additionalProperties")
    if isinstance(add, dict) and "properties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = structural(add, defs)
    if has_default and "description" in out:
        out["description"] = f"{out['description'].rstrip()} Default: {_fmt_default(default)}."
    return out


def _attach(schema: dict[str, Any], path: str, key: str, value: Any) -> None:
    node = schema
    for part in path.split("."):
        if part == "[]":
            node = node["items"]
        else:
            node = node["properties"][part]
    node[key] = value


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the AgentRun resource."""
    spec = AgentRunManifestSpec.model_json_schema(by_alias=True, mode="validation")
    status = AgentRunStatus.model_json_schema(by_alias=True, mode="serialization")
    spec_s = structural(spec, spec.get("$defs", {}))
    status_s = structural(status, status.get("$defs", {}))
    root: dict[str, Any] = {
        "type": "object",
        "description": "An AgentRun: one durable run of an AI agent, executed one lap (model call plus "
        "tool calls) per Kubernetes Job, with a checkpoint per lap in S3-compatible storage.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object: agentrun.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of the object: AgentRun."},
            "metadata": {"type": "object"},
            "spec": spec_s,
            "status": status_s,
        },
    }
    # Status fields written by the operator are all declared; "required" of the status is not
    # enforced on partial patches, so drop it to keep merge patches simple.
    status_s.pop("required", None)
    wrapped = {"properties": root["properties"]}
    for path, rules in CEL_RULES.items():
        _attach(wrapped, path, "x-kubernetes-validations", copy.deepcopy(rules))
    return root


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of AgentRun."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {"agentrun.dev/generated-by": "agentrun crd (operator/agentrun/api/crdgen.py)"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


# -- the Agent resource (api/agent.py) ----------------------------------------------------------

AGENT_KIND = "Agent"
AGENT_PLURAL = "agents"
AGENT_SINGULAR = "agent"
AGENT_CRD_NAME = f"{AGENT_PLURAL}.{GROUP}"

AGENT_CEL_RULES: dict[str, list[dict[str, str]]] = {
    "spec.model": [
        {
            "rule": "self.provider != 'scripted' || (has(self.script) && size(self.script) > 0)",
            "message": "spec.model.script must not be empty when spec.model.provider is \"scripted\"",
        },
    ],
    "spec.retry.backoff": [
        {
            "rule": "!has(self.initial) || !has(self.max) || duration(self.max) >= duration(self.initial)",
            "message": "spec.retry.backoff.max must not be shorter than spec.retry.backoff.initial",
        },
    ],
    "spec.parameters": [
        {
            "rule": "self.all(p, !has(p.type) || p.type == 'string' || !has(p.default) || "
            "(p.type == 'integer' && p.default.matches('^[-+]?[0-9]{1,18}$')) || "
            "(p.type == 'boolean' && p.default in ['true', 'false']) || "
            "(p.type == 'number' && p.default.matches('^[-+]?([0-9]+(\\\\.[0-9]*)?|\\\\.[0-9]+)([eE][-+]?[0-9]{1,3})?$')))",
            "message": "spec.parameters[].default must be a value of the parameter's type "
            "(integer: digits; number: a decimal; boolean: true or false)",
        },
    ],
}

AGENT_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Version", "type": "string", "jsonPath": ".spec.version", "description": "Version of the agent."},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "description": "Model name."},
    {"name": "Rollout", "type": "string", "jsonPath": ".spec.rollout",
     "description": "How runs follow edits: Pinned (default) or FollowLatest."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Provider", "type": "string", "priority": 1, "jsonPath": ".spec.model.provider",
     "description": "Model provider."},
]


def agent_openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the Agent resource."""
    from .agent import AgentDefinitionSpec

    spec = AgentDefinitionSpec.model_json_schema(by_alias=True, mode="validation")
    root: dict[str, Any] = {
        "type": "object",
        "description": "An Agent: an agent declared once (its model, window, tools, default budget, approval and "
        "retry policies, and typed parameters), run by name from an AgentRun's spec.agentRef. A run pins the "
        "definition it resolved at its first lap (status.agent) unless spec.rollout is FollowLatest.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object: agentrun.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of the object: Agent."},
            "metadata": {"type": "object"},
            "spec": structural(spec, spec.get("$defs", {})),
        },
    }
    wrapped = {"properties": root["properties"]}
    for path, rules in AGENT_CEL_RULES.items():
        _attach(wrapped, path, "x-kubernetes-validations", copy.deepcopy(rules))
    return root


def agent_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of Agent. No categories: "agentrun" names the AgentRun kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": AGENT_CRD_NAME,
            "annotations": {"agentrun.dev/generated-by": "agentrun crd --agent (operator/agentrun/api/crdgen.py)"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": AGENT_KIND, "listKind": f"{AGENT_KIND}List", "plural": AGENT_PLURAL,
                      "singular": AGENT_SINGULAR},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": AGENT_PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": agent_openapi_schema()},
                }
            ],
        },
    }


def undocumented_fields(schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of properties without a non-empty description."""
    missing: list[str] = []
    for name, sub in schema.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        if p == "metadata":
            continue  # the API server forbids anything but name/generateName under metadata
        if not str(sub.get("description", "")).strip():
            missing.append(p)
        missing += undocumented_fields(sub, p)
    if "items" in schema:
        missing += undocumented_fields(schema["items"], path + "[]")
    if isinstance(schema.get("additionalProperties"), dict):
        missing += undocumented_fields(schema["additionalProperties"], path + ".*")
    return missing


class _Dumper(yaml.SafeDumper):
    pass


def _str_repr(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_repr)


def render_crd() -> str:
    """The CRD as YAML text (what ``crds/agentrun.dev_agentruns.yaml`` holds)."""
    header = "# GENERATED by `agentrun crd` from operator/agentrun/api/{spec,status}.py: do not edit.\n"
    return header + "---\n" + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def render_agent_crd() -> str:
    """The Agent CRD as YAML text (what ``crds/agentrun.dev_agents.yaml`` holds)."""
    header = "# GENERATED by `agentrun crd --agent` from operator/agentrun/api/{agent,spec}.py: do not edit.\n"
    return header + "---\n" + yaml.dump(agent_crd(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def _type_of(node: dict[str, Any]) -> str:
    t = node.get("type", "any")
    if t == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if node.get("format") == "date-time":
        return "date-time"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_of(node['additionalProperties'])}"
    return str(t)


def _constraints(node: dict[str, Any], required: bool) -> str:
    parts = ["**required**"] if required else []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, label in (("minimum", "min"), ("maximum", "max"), ("minLength", "minLength"),
                       ("maxLength", "maxLength"), ("maxItems", "maxItems")):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-preserve-unknown-fields"):
        parts.append("free-form")
    if node.get("x-kubernetes-list-type") == "map":
        parts.append("list-map keyed by " + ", ".join(node.get("x-kubernetes-list-map-keys", [])))
    for rule in node.get("x-kubernetes-validations", []):
        parts.append(f"rule: {rule['message']}")
    return "; ".join(parts)


def _rows(node: dict[str, Any], path: str, out: list[str]) -> None:
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        p = f"{path}.{name}"
        desc = str(sub.get("description", "")).replace("|", "\\|").replace("\n", " ")
        cons = _constraints(sub, name in required).replace("|", "\\|")
        out.append(f"| `{p}` | {_type_of(sub)} | {desc} | {cons} |")
        target = sub.get("items", sub) if sub.get("type") == "array" else sub
        _rows(target, p + ("[]" if sub.get("type") == "array" else ""), out)


def render_reference() -> str:
    """docs/crd-reference.md: every field of the AgentRun resource."""
    schema = openapi_schema()
    lines = [
        "<!-- GENERATED by `agentrun crd --reference` from the pydantic models: do not edit. -->",
        "# AgentRun reference (`agentrun.dev/v1alpha1`)",
        "",
        f"Kind `{KIND}`, plural `{PLURAL}`, short name `{SHORT_NAMES[0]}`, categories "
        + ", ".join(f"`{c}`" for c in CATEGORIES) + ". Namespaced, with a status subresource.",
        "Defaults are applied by the operator and the lap runner (the pydantic models), not by the API "
        "server, so `kubectl get -o yaml` shows the spec as written.",
        "",
        "## Validation rules (CEL, checked by the API server)",
        "",
    ]
    for path, rules in CEL_RULES.items():
        for r in rules:
            lines.append(f"- `{path}`: {r['message']} — `{r['rule']}`")
    lines += ["", "## Printer columns", "", "| column | JSONPath | wide only |", "|---|---|---|"]
    for c in PRINTER_COLUMNS:
        lines.append(f"| {c['name']} | `{c['jsonPath']}` | {'yes' if c.get('priority') else ''} |")
    for part in ("spec", "status"):
        lines += ["", f"## {part}", "", "| field | type | description | constraints |", "|---|---|---|---|"]
        _rows(schema["properties"][part], part, lines)
    lines += ["", f"# Agent reference (`{GROUP}/{VERSION}`)", "",
              f"Kind `{AGENT_KIND}`, plural `{AGENT_PLURAL}`. Namespaced; run by an AgentRun's `spec.agentRef` "
              "(docs/concepts.md#agents).", "", "## Validation rules (CEL, checked by the API server)", ""]
    for path, rules in AGENT_CEL_RULES.items():
        for r in rules:
            lines.append(f"- `{path}`: {r['message']} — `{r['rule']}`")
    lines += ["", "## Printer columns", "", "| column | JSONPath | wide only |", "|---|---|---|"]
    for c in AGENT_PRINTER_COLUMNS:
        lines.append(f"| {c['name']} | `{c['jsonPath']}` | {'yes' if c.get('priority') else ''} |")
    lines += ["", "## Agent spec", "", "| field | type | description | constraints |", "|---|---|---|---|"]
    _rows(agent_openapi_schema()["properties"]["spec"], "spec", lines)
    return "\n".join(lines) + "\n"


@click.command("crd", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--reference", is_flag=True, help="Print the Markdown field reference instead of the CRD.")
@click.option("--admission", type=click.Choice(["validating", "mutating"]), default=None,
              help="Print the approval admission policies instead (validating: Kubernetes >= 1.30; "
              "mutating: >= 1.36). See docs/security.md.")
@click.option("--tenancy", type=click.Choice(["crd", "policy", "local"]), default=None,
              help="Print the tenancy guardrails instead: the AgentRunPolicy CRD, the admission policy and its "
              "default binding, or the local control plane's AgentRunPolicy (api/tenancy_admission.py).")
@click.option("--schedule", is_flag=True, help="Print the AgentSchedule CRD instead (api/schedule.py).")
@click.option("--agent", "agent", is_flag=True, help="Print the Agent CRD instead (api/agent.py).")
def crd_command(reference: bool, admission: str | None, tenancy: str | None, schedule: bool = False,
                agent: bool = False) -> None:
    """Print the AgentRun CustomResourceDefinition (YAML), generated from the models."""
    if agent:
        sys.stdout.write(render_agent_crd())
        return
    if schedule:
        from .schedule import render_crd as render_schedule

        sys.stdout.write(render_schedule())
        return
    if tenancy:
        from .tenancy_admission import render as render_tenancy

        sys.stdout.write(render_tenancy(tenancy))
        return
    if admission:
        from .admission import render

        sys.stdout.write(render(admission))
        return
    sys.stdout.write(render_reference() if reference else render_crd())
