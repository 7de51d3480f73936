"""The AgentRun spec: what the user declares with ``kubectl apply -f run.yaml``.

These pydantic models are the source of truth: the CRD's openAPIV3Schema in ``crds/`` is
generated from them (``make crds``), and a test fails when the two drift. The lap runner
receives the same spec (as JSON in ``AGENTRUN_SPEC``) and parses it with these models.
Secrets are referenced by name only; no secret value ever appears in a spec.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, JsonValue, StringConstraints, model_validator
from pydantic.config import JsonDict

from .lifecycle import ANN_CANCELLED_BY, MAX_CANCEL_REASON_CHARS, OUTCOMES, Outcome
from .types import (
    DNS_LABEL_PATTERN,
    QUANTITY_PATTERN,
    SECRET_KEY_PATTERN,
    SECRET_NAME_PATTERN,
    TOOL_NAME_PATTERN,
    USD,
    APIModel,
    Duration,
    parse_duration,
)


class SecretKeyRef(APIModel):
    """A key of a Secret in the AgentRun's namespace."""

    name: str = Field(
        description="Name of the Secret, in the AgentRun's namespace.",
        min_length=1,
        max_length=253,
        pattern=DNS_LABEL_PATTERN.replace("[-a-z0-9]", "[-.a-z0-9]"),
    )
    key: str = Field(
        description="Key within the Secret whose value is used.",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
    )


class ModelPricing(APIModel):
    """Prices of the model, used to compute each lap's cost from its token usage."""

    input_per_million_tokens_usd: USD = Field(
        default="0",
        alias="inputPerMillionTokensUSD",
        description="Price in USD per one million input (prompt) tokens, as a decimal string, e.g. \"2.50\".",
    )
    output_per_million_tokens_usd: USD = Field(
        default="0",
        alias="outputPerMillionTokensUSD",
        description="Price in USD per one million output (completion) tokens, as a decimal string, e.g. \"10.00\".",
    )


class ScriptedToolCall(APIModel):
    """A tool call that the scripted model asks for."""

    name: str = Field(description="Name of the tool to call; should be one of spec.agent.tools.", max_length=64)
    arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the call, a JSON object (validated against the tool's parameters schema).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ScriptedUsage(APIModel):
    """Token usage that the scripted model reports for a response."""

    input_tokens: int = Field(default=0, ge=0, description="Input tokens reported for this response.")
    output_tokens: int = Field(default=0, ge=0, description="Output tokens reported for this response.")


class ScriptedResponse(APIModel):
    """One response of the scripted model, consumed in order, one per lap."""

    content: str | None = Field(
        default=None, max_length=65536, description="Assistant text of this response."
    )
    tool_calls: list[ScriptedToolCall] = Field(
        default_factory=list,
        max_length=64,
        description="Tool calls of this response. A response without tool calls ends the run (done).",
    )
    usage: ScriptedUsage | None = Field(default=None, description="Token usage to report for this response.")


class ModelSpec(APIModel):
    """The model provider and its settings."""

    provider: Literal["openai", "scripted"] = Field(
        description=(
            "Model provider. \"openai\": any OpenAI-compatible chat-completions API (OpenAI, vLLM, "
            "Ollama, LiteLLM) with tool calling. \"scripted\": responses come from spec.agent.model.script "
            "(tests and demos)."
        )
    )
    name: str = Field(
        default="scripted",
        min_length=1,
        max_length=256,
        description="Model name sent to the provider, e.g. \"gpt-4o-mini\".",
    )
    base_url: str | None = Field(
        default=None,
        alias="baseURL",
        max_length=2048,
        pattern=r"^https?://",
        description="Base URL of the OpenAI-compatible API, e.g. \"https://api.openai.com/v1\".",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key; passed to the lap pod as an environment variable, never stored.",
    )
    temperature: str | None = Field(
        default=None,
        pattern=r"^[0-9](\.[0-9]+)?$",
        description="Sampling temperature as a decimal string, e.g. \"0.2\".",
    )
    max_output_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Upper bound of output tokens per model call."
    )
    request_timeout: Duration = Field(
        default="120s", description="Timeout of one model call. A timed-out call is a retryable lap failure."
    )
    pricing: ModelPricing = Field(
        default_factory=ModelPricing, description="Per-token prices used to compute cost."
    )
    script: list[ScriptedResponse] = Field(
        default_factory=list,
        max_length=10000,
        description="Responses of the \"scripted\" provider, one per lap, in order.",
    )


class HTTPToolTarget(APIModel):
    """Where an http tool sends its call. Arguments are sent as the JSON body."""

    url: str = Field(max_length=2048, pattern=r"^https?://", description="URL the call is sent to.")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(
        default="POST",
        description="HTTP method. For GET the arguments are sent as query parameters.",
    )
    timeout: Duration = Field(default="30s", description="Timeout of one call.")
    max_result_bytes: int = Field(
        default=16384,
        ge=1024,
        le=1048576,
        description=(
            "Most bytes of the response body kept as the call's result; the rest is not read and the "
            "result ends with a truncation marker (bounds memory, checkpoints and the context window)."
        ),
    )
    headers_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Optional Secret key holding extra headers as a JSON object (e.g. an Authorization header); "
            "never stored or logged."
        ),
    )


class ToolSpec(APIModel):
    """A tool the model may call."""

    name: str = Field(
        pattern=TOOL_NAME_PATTERN,
        max_length=64,
        description="Tool name shown to the model; never rename a tool under running runs: add a new one.",
    )
    description: str = Field(default="", max_length=4096, description="What the tool does, shown to the model.")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"},
        description="JSON Schema of the arguments; arguments are validated against it before any call.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    http: HTTPToolTarget = Field(description="The HTTP endpoint that performs the call.")
    side_effects: bool = Field(
        default=True,
        description=(
            "Whether the call changes the world. Side-effecting calls carry an Idempotency-Key header "
            "derived from the run, the lap and the call, stable across replays."
        ),
    )
    requires_approval: bool = Field(
        default=False,
        description="Whether a human must approve each call before it runs (see spec.approval).",
    )


MCP_SERVER_NAME_MAX = 24
"""Most characters of ``spec.agent.mcpServers[].name``: the model sees ``<server>__<tool>`` (agentrun.api.mcp),
at most 64 characters as OpenAI-compatible APIs require."""
MCP_TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,38}$"
"""An MCP tool name the lap can offer: letters, digits, ``_`` and ``-``, at most 38 characters."""
MCP_TOOL_GLOB_PATTERN = r"^[A-Za-z0-9_*?\[\]!-]{1,64}$"
"""A tool-name pattern of ``requiresApproval`` / ``sideEffects``: shell-style (``*``, ``?``, ``[...]``)."""

McpToolName = Annotated[str, StringConstraints(pattern=MCP_TOOL_NAME_PATTERN, max_length=38)]
McpToolGlob = Annotated[str, StringConstraints(pattern=MCP_TOOL_GLOB_PATTERN, max_length=64)]


class McpServer(APIModel):
    """An MCP server (streamable HTTP transport) whose tools the model may call (docs/tools.md)."""

    name: str = Field(
        min_length=1,
        max_length=MCP_SERVER_NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "Name of the server (a DNS label, at most 24 characters, unique in spec.agent.mcpServers). The "
            "model sees each tool as \"<name>__<tool>\"; never rename a server under running runs."
        ),
    )
    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="URL of the server's streamable HTTP endpoint, e.g. \"http://ledger.tools:8766/mcp\".",
    )
    headers_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Optional Secret key holding extra headers as a JSON object (e.g. an Authorization header with a "
            "bearer token), sent with every request to the server; never stored or logged."
        ),
    )
    tools: list[McpToolName] | None = Field(
        default=None,
        max_length=128,
        description=(
            "Allow list of the server's tool names the model may call. Unset: every tool the server lists. "
            "A name the server does not list fails the run at discovery, naming this field."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    requires_approval: list[McpToolGlob] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Tool-name patterns (shell-style: *, ?, [...]) whose calls a human must approve before they run "
            "(see spec.approval), e.g. [\"book_*\"]. Empty: none."
        ),
    )
    side_effects: list[McpToolGlob] = Field(
        default_factory=lambda: ["*"],
        max_length=64,
        description=(
            "Tool-name patterns of the tools that change the world; their calls carry the idempotency key. "
            "Default [\"*\"]: every tool has side effects. [] declares every tool read-only."
        ),
    )
    timeout: Duration = Field(default="30s", description="Timeout of one request to the server (a list or a call).")
    max_result_bytes: int = Field(
        default=16384,
        ge=1024,
        le=1048576,
        description=(
            "Most bytes of a call's result text kept as the call's result; the rest is cut and the result ends "
            "with a truncation marker (as spec.agent.tools[].http.maxResultBytes)."
        ),
    )


class WindowSpec(APIModel):
    """How the model's context window is rebuilt from stored messages."""

    max_tokens: int = Field(
        default=16000,
        ge=256,
        le=2_000_000,
        description=(
            "Token budget of the window sent to the model. Older laps beyond it are compacted into a "
            "summary plus pinned facts, stored in the checkpoint."
        ),
    )
    system_prompt: str | None = Field(
        default=None, max_length=65536, description="System prompt placed first in every window."
    )


# --- the lap pod template (spec.agent.podTemplate) ------------------------------------------------

LABEL_NAME_PATTERN = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
"""The name part of a label or annotation key (at most 63 characters)."""
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + LABEL_NAME_PATTERN + "$"
"""A label or annotation key: an optional DNS-subdomain prefix (at most 253 characters) and ``/``, then a name."""
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_LABEL_KEY_CHARS = 253 + 1 + 63
MAX_POD_LABELS = 32
MAX_POD_ANNOTATIONS = 32
MAX_ANNOTATION_VALUE_CHARS = 4096
MAX_NODE_SELECTOR = 16
MAX_AFFINITY_BYTES = 16384
"""Most bytes (compact JSON) of each of spec.agent.podTemplate.affinity's free-form parts."""

RESERVED_LABEL_PREFIXES: tuple[str, ...] = ("agentrun.dev/", "batch.kubernetes.io/")
"""Label keys a lap pod template may not set: the operator's (``agentrun.dev/run``, ``-run-uid``, ``-lap``,
``-attempt``: how it and the CLI find lap pods) and the Job controller's."""
RESERVED_LABEL_KEYS: tuple[str, ...] = ("app.kubernetes.io/managed-by", "job-name", "controller-uid")
RESERVED_ANNOTATION_PREFIXES: tuple[str, ...] = (
    "agentrun.dev/",
    # the lap container's confinement is the operator's (its securityContext): no annotation loosens it
    "container.apparmor.security.beta.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
)


_CEL_KEY_PATTERN = LABEL_KEY_PATTERN.replace("\\", "\\\\")
"""LABEL_KEY_PATTERN inside a CEL string literal (backslashes escaped)."""


def _cel_in(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _key_rules(what: str, prefixes: tuple[str, ...], keys: tuple[str, ...] = ()) -> list[JsonValue]:
    """CEL of a map of label or annotation keys: well-formed, none reserved."""
    reserved = " && ".join([f"!k.startsWith('{p}')" for p in prefixes] + ([f"!(k in {_cel_in(keys)})"] if keys else []))
    names = ", ".join([f"{p}*" for p in prefixes] + list(keys))
    rules: list[JsonValue] = [
        {"rule": f"self.all(k, size(k) <= {MAX_LABEL_KEY_CHARS} && k.matches('{_CEL_KEY_PATTERN}') && "
                 "(!k.contains('/') || k.indexOf('/') <= 253))",
         "message": f"podTemplate.{what}: every key must be a valid label key (an optional DNS-subdomain prefix and "
                    "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)"},
        {"rule": f"self.all(k, {reserved})",
         "message": f"podTemplate.{what}: these keys are set by the operator or Kubernetes and cannot be set here: {names}"},
    ]
    return rules


def _key_problem(key: str, prefixes: tuple[str, ...], keys: tuple[str, ...] = ()) -> str | None:
    if len(key) > MAX_LABEL_KEY_CHARS or not re.fullmatch(LABEL_KEY_PATTERN, key) or \
            ("/" in key and key.index("/") > 253):
        return f"key {key[:80]!r} is not a valid label key"
    if key.startswith(prefixes) or key in keys:
        names = ", ".join([f"{p}*" for p in prefixes] + list(keys))
        return f"key {key!r} is set by the operator or Kubernetes and cannot be set here ({names})"
    return None


LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE_PATTERN, max_length=63)]
AnnotationValue = Annotated[str, StringConstraints(max_length=MAX_ANNOTATION_VALUE_CHARS)]
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_PATTERN, max_length=MAX_LABEL_KEY_CHARS)]
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Toleration(APIModel):
    """A toleration of a node taint (as a Pod's spec.tolerations[])."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
         "message": "podTemplate.tolerations[]: value must be empty when operator is Exists"},
        {"rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
         "message": "podTemplate.tolerations[]: an empty key needs operator Exists (it tolerates every taint)"},
        {"rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         "message": "podTemplate.tolerations[]: tolerationSeconds needs effect NoExecute"},
    ]})

    key: str | None = Field(
        default=None, max_length=MAX_LABEL_KEY_CHARS, pattern=r"^$|" + LABEL_KEY_PATTERN,
        description="Taint key the toleration applies to; empty with operator Exists tolerates every taint.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists (any value) or Equal (the value below). Default: Equal.",
    )
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN,
        description="Taint value the toleration matches (operator Equal); empty with Exists.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty: every effect.",
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=2_147_483_647,
        description="With effect NoExecute: how long the pod stays bound after the taint appears.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("podTemplate.tolerations[]: value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("podTemplate.tolerations[]: an empty key needs operator Exists (it tolerates every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("podTemplate.tolerations[]: tolerationSeconds needs effect NoExecute")
        return self


class LabelSelectorRequirement(APIModel):
    """One requirement of a label selector."""

    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key relates to the values.")
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64,
        description="Values of In and NotIn (non-empty there); empty for Exists and DoesNotExist.",
    )


class LabelSelector(APIModel):
    """A label selector of pods (as a Pod's topologySpreadConstraints[].labelSelector)."""

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=16, description="Labels the pods must have, key to value.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Requirements the pods' labels must meet (all of them).",
    )


class TopologySpreadConstraint(APIModel):
    """How lap pods spread across topology domains (as a Pod's spec.topologySpreadConstraints[])."""

    max_skew: int = Field(ge=1, le=1000, description="Most the number of matching pods may differ between domains.")
    topology_key: LabelKey = Field(description="Node label whose values are the domains, e.g. topology.kubernetes.io/zone.")
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="What the scheduler does when the spread cannot be met.",
    )
    label_selector: LabelSelector | None = Field(
        default=None, description="Which pods are counted (e.g. agentrun.dev/run: NAME for the laps of one run).",
    )
    min_domains: int | None = Field(
        default=None, ge=1, le=1000, description="Least number of eligible domains (with DoNotSchedule only).",
    )
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether the pod's nodeSelector and node affinity limit the domains counted.",
    )
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether node taints limit the domains counted.",
    )
    match_label_keys: list[LabelKey] = Field(
        default_factory=list, max_length=16,
        description="Pod label keys whose values (the lap pod's own) narrow labelSelector.",
    )


_FREE_FORM: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}


class Affinity(APIModel):
    """Scheduling affinity of the lap pod, as a Pod's spec.affinity. The parts are free-form here (Kubernetes'
    schema is large): the API server validates them when the lap Job is created, and a malformed one fails the
    run (reason JobRefused, naming the field)."""

    node_affinity: dict[str, Any] | None = Field(
        default=None, description="Node affinity (requiredDuringSchedulingIgnoredDuringExecution, "
        "preferredDuringSchedulingIgnoredDuringExecution), as a Pod's spec.affinity.nodeAffinity.",
        json_schema_extra=_FREE_FORM,
    )
    pod_affinity: dict[str, Any] | None = Field(
        default=None, description="Pod affinity, as a Pod's spec.affinity.podAffinity.", json_schema_extra=_FREE_FORM,
    )
    pod_anti_affinity: dict[str, Any] | None = Field(
        default=None, description="Pod anti-affinity, as a Pod's spec.affinity.podAntiAffinity.",
        json_schema_extra=_FREE_FORM,
    )

    @model_validator(mode="after")
    def _bounded(self) -> Affinity:
        for name, part in (("nodeAffinity", self.node_affinity), ("podAffinity", self.pod_affinity),
                           ("podAntiAffinity", self.pod_anti_affinity)):
            if part is not None and len(json.dumps(part, separators=(",", ":"))) > MAX_AFFINITY_BYTES:
                raise ValueError(f"podTemplate.affinity.{name}: more than {MAX_AFFINITY_BYTES} bytes of JSON")
        return self


class LapPodTemplate(APIModel):
    """What every lap Job's pod gets besides the operator's own settings: labels, annotations and scheduling.
    The operator's labels and annotations (agentrun.dev/*) and the container's security settings are not
    settable here. An AgentRunPolicy may restrict runtimeClassName, priorityClassName and nodeSelector."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_POD_LABELS,
        description="Labels added to every lap pod. Keys under agentrun.dev/ and batch.kubernetes.io/, "
        "app.kubernetes.io/managed-by, job-name and controller-uid are the operator's and Kubernetes' and refused.",
        json_schema_extra={"x-kubernetes-validations": _key_rules("labels", RESERVED_LABEL_PREFIXES,
                                                                   RESERVED_LABEL_KEYS)},
    )
    annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict, max_length=MAX_POD_ANNOTATIONS,
        description="Annotations added to every lap pod. Keys under agentrun.dev/ and the AppArmor and seccomp "
        "annotations are refused (the lap container's confinement is the operator's).",
        json_schema_extra={"x-kubernetes-validations": _key_rules("annotations", RESERVED_ANNOTATION_PREFIXES)},
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_NODE_SELECTOR,
        description="Node labels a node must have to run lap pods, key to value (a Pod's spec.nodeSelector).",
        json_schema_extra={"x-kubernetes-validations": _key_rules("nodeSelector", ())[:1]},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Node taints lap pods tolerate (a Pod's spec.tolerations).",
    )
    affinity: Affinity | None = Field(default=None, description="Scheduling affinity of lap pods (a Pod's spec.affinity).")
    priority_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=K8S_NAME_PATTERN,
        description="PriorityClass of lap pods (a Pod's spec.priorityClassName).",
    )
    runtime_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=K8S_NAME_PATTERN,
        description="RuntimeClass lap pods run with, e.g. gvisor or kata (a Pod's spec.runtimeClassName); it must exist.",
    )
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=8,
        description="How lap pods spread across nodes or zones (a Pod's spec.topologySpreadConstraints).",
    )

    @model_validator(mode="after")
    def _keys(self) -> LapPodTemplate:
        for what, keys, prefixes, exact in (
                ("labels", self.labels, RESERVED_LABEL_PREFIXES, RESERVED_LABEL_KEYS),
                ("annotations", self.annotations, RESERVED_ANNOTATION_PREFIXES, ()),
                ("nodeSelector", self.node_selector, (), ())):
            for key in sorted(keys):
                problem = _key_problem(key, prefixes, exact)
                if problem:
                    raise ValueError(f"podTemplate.{what}: {problem}")
        return self


class AgentSpec(APIModel):
    """The agent: its version, image, model and tools."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {
            "rule": "!has(self.mcpServers) || !has(self.tools) || "
            "!self.tools.exists(t, self.mcpServers.exists(s, t.name.startsWith(s.name + '__')))",
            "message": "spec.agent.tools: a tool name must not start with \"<server>__\" of a server in "
            "spec.agent.mcpServers (the model sees that server's tools under such names)",
        },
    ]})

    version: str = Field(
        min_length=1,
        max_length=63,
        description=(
            "Agent version, recorded with every checkpoint. A change mid-run takes effect at the next lap."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=1024,
        description="Container image of the lap runner. Defaults to the operator's configured lap image.",
    )
    model: ModelSpec = Field(description="The model provider and its settings.")
    tools: list[ToolSpec] = Field(
        default_factory=list,
        max_length=128,
        description="Tools the model may call.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    window: WindowSpec = Field(default_factory=WindowSpec, description="Context window settings.")
    mcp_servers: list[McpServer] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "MCP servers whose tools the model may call (streamable HTTP), besides spec.agent.tools. Their "
            "tools are listed at the start of each lap and recorded in the checkpoint (docs/tools.md)."
        ),
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(s, self.exists_one(u, u.name == s.name))",
                    "message": "spec.agent.mcpServers: server names must be unique",
                },
            ],
        },
    )


    pod_template: LapPodTemplate | None = Field(
        default=None,
        description=(
            "What every lap Job's pod gets: labels, annotations, nodeSelector, tolerations, affinity, "
            "priorityClassName, runtimeClassName, topologySpreadConstraints (docs/scheduling.md). A change "
            "mid-run takes effect at the next lap's Job."
        ),
    )

    @model_validator(mode="after")
    def _mcp_servers_unique_and_apart(self) -> AgentSpec:
        names = [m.name for m in self.mcp_servers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"spec.agent.mcpServers: duplicate server name(s) {', '.join(dup)}")
        clash = sorted(t.name for t in self.tools if any(t.name.startswith(n + "__") for n in names))
        if clash:
            raise ValueError(f"spec.agent.tools: a tool name must not start with \"<server>__\" of a server in "
                             f"spec.agent.mcpServers (the model sees that server's tools under such names): "
                             f"{', '.join(clash)}")
        return self

class BudgetSpec(APIModel):
    """Limits of the run. The run ends BudgetExceeded before a lap would pass them."""

    max_laps: int = Field(default=100, ge=1, le=1_000_000, description="Most laps the run may take.")
    max_cost_usd: USD | None = Field(
        default=None,
        alias="maxCostUSD", description="Most the run may spend, in USD, as a decimal string, e.g. \"5.00\"."
    )


class ApprovalSpec(APIModel):
    """Policy of human approvals for tools with requiresApproval."""

    owner: str = Field(
        default="unassigned",
        min_length=1,
        max_length=256,
        description=(
            "Who must decide (a person, team or queue); shown in status and `kubectl get`. \"group:NAME\" "
            "names a Kubernetes group: only its members may decide (checked by the API server, besides the "
            "approve verb; docs/security.md)."
        ),
    )
    timeout: Duration = Field(default="72h", description="How long an approval may wait.")
    on_timeout: Literal["reject", "fail"] = Field(
        default="reject",
        description=(
            "What happens past the deadline: \"reject\" continues the run with the call rejected "
            "(recorded as TimedOut, distinct from Rejected); \"fail\" ends the run Failed."
        ),
    )
    approvers: int = Field(
        default=1,
        ge=1,
        le=5,
        description=(
            "Four eyes: how many distinct users must approve each call. Every approval is recorded in "
            "status.approval.approvedBy (\"1 of 2\"); the call runs once that many distinct users approved. "
            "A second approval by the same user is refused; one rejection by anyone rejects."
        ),
    )
    distinct_from_creator: bool = Field(
        default=False,
        description=(
            "Four eyes: when true, the user who created the run (annotation agentrun.dev/created-by, "
            "recorded by the API server) may not decide its approvals; the API server refuses their "
            "decision. Turning it off again needs the approve verb (docs/security.md)."
        ),
    )


class BackoffSpec(APIModel):
    """Exponential backoff between attempts of a lap."""

    initial: Duration = Field(default="10s", description="Delay before the second attempt.")
    max: Duration = Field(default="5m", description="Upper bound of the delay.")
    factor: int = Field(default=2, ge=1, le=10, description="Multiplier of the delay after each failed attempt.")

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> BackoffSpec:
        if parse_duration(self.max) < parse_duration(self.initial):
            raise ValueError("spec.retry.backoff.max must not be shorter than spec.retry.backoff.initial")
        return self


class RetrySpec(APIModel):
    """Retries of a failed lap (pod crash, eviction, retryable exit, lap timeout)."""

    attempts_per_lap: int = Field(
        default=3, ge=1, le=100, description="Attempts of one lap, the first included, before the run fails."
    )
    backoff: BackoffSpec = Field(default_factory=BackoffSpec, description="Delay between attempts.")


DEFAULT_MAX_LAP_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_RUN_BYTES = 1024**3


class CheckpointSpec(APIModel):
    """Where checkpoints are stored. Unset fields take the operator's defaults."""

    uri: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        description="Bucket and prefix, e.g. \"s3://agent-checkpoints/prod\".",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description="S3-compatible endpoint URL (MinIO, Ceph, R2, ...). Empty means AWS.",
    )
    region: str | None = Field(default=None, max_length=64, description="S3 region.")
    path_style: bool | None = Field(default=None, description="Use path-style addressing (most self-hosted S3).")
    credentials_secret_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description=(
            "Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Empty means the standard "
            "credential chain of the lap pod (e.g. IRSA / workload identity)."
        ),
    )
    snapshot_every: int = Field(
        default=10, ge=1, le=1000, description="Write a snapshot every K laps; a resume reads at most K+1 objects."
    )
    retention: Literal["Retain", "Delete"] = Field(
        default="Retain", description="What happens to the checkpoints when the AgentRun is deleted."
    )
    max_lap_bytes: int = Field(
        default=DEFAULT_MAX_LAP_BYTES,
        ge=1024,
        le=1024**3,
        description=(
            "Ceiling of one lap's checkpoint object, in stored (gzip) bytes. A lap whose checkpoint would "
            "pass it ends the run Failed (reason CheckpointTooLarge, naming the lap, the size and the "
            "limit); nothing is written for that lap. Default 8 MiB: the largest model response accepted "
            "(8 MiB) plus tool results at their maxResultBytes compress to well under it, and the operator "
            "reads each lap object whole."
        ),
    )
    max_run_bytes: int = Field(
        default=DEFAULT_MAX_RUN_BYTES,
        ge=1024**2,
        le=1024**4,
        description=(
            "Ceiling of all checkpoint objects of the run (lap records, journal, snapshots), in stored "
            "bytes. The lap that would pass it ends the run Failed (reason CheckpointTooLarge); the store "
            "is left as it is. Default 1 GiB: about a million typical laps (~1 kB each), while a runaway "
            "run stops at a bounded cost. status.storage shows the bytes so far."
        ),
    )


Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)]


class ResourcesSpec(APIModel):
    """Compute resources of a lap pod, as Kubernetes quantities."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Requests, e.g. {cpu: 100m, memory: 256Mi}."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Limits, e.g. {memory: 512Mi}.")


class ForkFromSpec(APIModel):
    """The run and lap this run continues from (time travel). Set by ``agentrun fork``; immutable.

    On its first reconcile the operator copies the source's state through ``lap`` into this run's
    own store prefix (a fork snapshot), so the first Job of this run runs lap ``lap + 1``. The
    source run and its checkpoints are only read, never changed."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the source AgentRun (same namespace).",
    )
    uid: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="UID of the source AgentRun: its checkpoints live under this UID.",
    )
    lap: int = Field(ge=1, description="The source's checkpointed lap to continue from; this run starts at lap+1.")


class CancelSpec(APIModel):
    """A cancel: present means the run is stopped for good (phase Cancelled) until a retry removes it."""

    reason: str = Field(
        default="", max_length=MAX_CANCEL_REASON_CHARS,
        description="Why the run is cancelled; shown in status.lifecycle.cancelReason and the Event (control characters escaped).",
    )


class NotifySpec(APIModel):
    """Which outcomes of the run the operator's webhooks announce (generic, Slack, Teams)."""

    outcomes: list[Outcome] = Field(
        default_factory=list,
        max_length=len(OUTCOMES),
        description=(
            "Terminal phases to announce, each once per outcome (status.lifecycle.notified): any of "
            + ", ".join(OUTCOMES) + ". Empty: none (the operator's values may add a default)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class RunSpecFields(APIModel):
    """The fields an AgentRun's spec has whether it declares its agent inline or names an Agent."""

    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Limits of laps and cost.")
    approval: ApprovalSpec = Field(default_factory=ApprovalSpec, description="Human approval policy.")
    retry: RetrySpec = Field(default_factory=RetrySpec, description="Retry policy of failed laps.")
    lap_timeout: Duration = Field(
        default="10m", description="Most time one lap may take; a lap past it is killed and retried."
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoint store settings.")
    resources: ResourcesSpec | None = Field(
        default=None, description="Resources of lap pods. Defaults to the operator's configuration."
    )
    suspend: bool = Field(default=False, description="Pause the run between laps; set false to resume.")
    priority: int = Field(
        default=0, ge=-1000, le=1000,
        description="Order of admission where an AgentRunPolicy's maxActiveRuns queues runs: higher first, then "
        "creation order. No effect without such a limit.",
    )
    queue_name: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN,
        description="Kueue LocalQueue (in the run's namespace) that admits every lap Job: each Job is created "
        "suspended with the label kueue.x-k8s.io/queue-name, and the run is Queued while Kueue holds it. Unset: "
        "the namespace's AgentRunPolicy defaultQueueName, else no Kueue (docs/scheduling.md#kueue).",
    )
    fork_from: ForkFromSpec | None = Field(
        default=None,
        description=(
            "Continue from a lap of another run of this namespace (set by `agentrun fork`). Immutable: "
            "it cannot be added, changed or removed after creation."
        ),
    )
    cancel: CancelSpec | None = Field(
        default=None,
        description=(
            "Cancel the run: a lap in flight is stopped (its Job deleted with a grace period; the lap "
            "journals what finished), a pending approval is withdrawn, and the phase becomes Cancelled. "
            "Who cancelled is recorded by the API server (annotation " + ANN_CANCELLED_BY + "). "
            "`agentrun retry` removes it and continues the run in place."
        ),
    )
    active_deadline: Duration | None = Field(
        default=None,
        description=(
            "Most wall-clock time the run may take, counted from status.startedAt (approval waits "
            "included); past it the run ends DeadlineExceeded. Unset: no deadline."
        ),
    )
    notify: NotifySpec | None = Field(
        default=None, description="Webhook announcements of the run's outcome (besides approvals).",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=2147483647,
        description=(
            "Seconds after the run finished (a terminal phase; status.completedAt) "
            "when the operator deletes the AgentRun, like a Job's ttlSecondsAfterFinished. "
            "spec.checkpoint.retention then decides whether its checkpoints go too. Unset: never deleted "
            "automatically; 0: deleted as soon as it finished."
        ),
    )



class AgentRunSpec(RunSpecFields):
    """The effective spec of a run: the task and the agent it runs, and the policies of the run. What the
    operator acts on and the lap receives (``AGENTRUN_SPEC``): an inline ``spec.agent`` as written, or a
    run of an Agent resolved against its pinned copy (``agentrun.api.agent.effective_spec``)."""

    task: str = Field(min_length=1, max_length=65536, description="The task given to the agent. Immutable.")
    agent: AgentSpec = Field(description="The agent: version, image, model and tools.")

    @model_validator(mode="after")
    def _tool_names_unique(self) -> AgentRunSpec:
        names = [t.name for t in self.agent.tools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"spec.agent.tools: duplicate tool name(s) {', '.join(dup)}")
        return self

    def tool(self, name: str) -> ToolSpec | None:
        """The declared tool of that name, or None."""
        return next((t for t in self.agent.tools if t.name == name), None)


#: Name of an Agent's parameter, as ``{{ name }}`` in a run's task and a key of spec.parameters.
PARAMETER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
#: Most parameters of an Agent (and of a run), and the longest value of one.
MAX_PARAMETERS = 64
MAX_PARAMETER_VALUE_CHARS = 8192


class AgentRef(APIModel):
    """The Agent (same namespace) a run runs."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the Agent, in the AgentRun's namespace.",
    )


ParameterValue = Annotated[str, StringConstraints(max_length=MAX_PARAMETER_VALUE_CHARS)]


class AgentRunManifestSpec(RunSpecFields):
    """Desired state of an AgentRun as written: the task, the agent (inline, or an Agent by name with
    parameters), and the policies of the run. The CRD's spec schema; the operator turns it into an
    :class:`AgentRunSpec` (inline: as is; spec.agentRef: from the Agent's pinned copy)."""

    task: str | None = Field(
        default=None, min_length=1, max_length=65536,
        description=(
            "The task given to the agent. Immutable. Required with an inline spec.agent (used as written). With "
            "spec.agentRef it may name the Agent's parameters as {{ name }} (\\{{ is a literal {{; "
            "docs/concepts.md#agents); unset, the Agent's spec.task is rendered."
        ),
    )

    agent: AgentSpec | None = Field(
        default=None,
        description="The agent, inline: version, image, model and tools. Exactly one of agent and agentRef.",
    )
    agent_ref: AgentRef | None = Field(
        default=None,
        description=(
            "The Agent of this namespace the run runs (exactly one of agent and agentRef). Its definition is "
            "pinned at the first lap (status.agent); later edits of the Agent reach the run only when the Agent "
            "says rollout: FollowLatest. Its budget, approval and retry are the run's defaults: a field the run "
            "sets itself wins. Immutable."
        ),
    )
    parameters: dict[str, ParameterValue] | None = Field(
        default=None,
        max_length=MAX_PARAMETERS,
        description=(
            "Values of the Agent's declared parameters (spec.agentRef only), as strings: an integer, number or "
            "boolean parameter's value is parsed as one. The task names them as {{ name }}. Immutable."
        ),
    )

    @model_validator(mode="after")
    def _agent_or_ref(self) -> AgentRunManifestSpec:
        if (self.agent is None) == (self.agent_ref is None):
            raise ValueError("spec.agent, spec.agentRef: exactly one must be set (the agent inline, or the name of an Agent)")
        if self.agent is not None and self.task is None:
            raise ValueError("spec.task is required with an inline spec.agent")
        if self.parameters is not None and self.agent_ref is None:
            raise ValueError("spec.parameters needs spec.agentRef (an inline spec.agent declares no parameters)")
        return self
