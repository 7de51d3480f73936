"""The lap Job builder: a pure function from (run, lap, attempt, config) to a batch/v1 Job.

The Job name is deterministic, so a lost status write or an operator restart can never create a
second Job for the same lap attempt: creation returns AlreadyExists and the operator adopts it.
No secret value is ever put into the Job: secrets reach the pod through ``secretKeyRef``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from agentrun.api.addresses import AddressRules
from agentrun.api.contract import (
    LABEL_ATTEMPT,
    LABEL_LAP,
    LABEL_RUN,
    LABEL_RUN_UID,
    TERMINATION_MESSAGE_PATH,
    Env,
    format_rewinds,
    mcp_headers_env,
    tool_headers_env,
)
from agentrun.api.kueue import QUEUE_NAME_LABEL
from agentrun.api.spec import AgentRunSpec, LapPodTemplate, RunSpecFields
from agentrun.api.status import StoreLocation
from agentrun.api.types import parse_duration, redact_url

from ..config import OperatorConfig

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_AGENT_VERSION = "agentrun.dev/agent-version"
ANNOTATION_APPROVAL = "agentrun.dev/approval"
"""On every lap Job: the approval decision it executes (:func:`approval_annotation`), so a Job the
operator adopts (its creation was not recorded in status) is compared with status.approval."""
NO_APPROVAL = "none"
CONTAINER_NAME = "lap"


@dataclass(frozen=True)
class RunIdentity:
    """What identifies the AgentRun a Job belongs to."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class ApprovalEnv:
    """The approval decision handed to the lap that resumes after a pause."""

    decision: str  # approved | rejected | timed-out
    call_id: str
    reason: str | None = None
    decided_by: str | None = None
    arguments_sha256: str | None = None
    target_sha256: str | None = None
    """Of an approval: ``status.approval.targetSha256``, what the lap checks before sending the call."""
    decided_at: datetime | None = None
    """``status.approval.decidedAt``: where the lap's span of the approval wait ends."""


def approval_annotation(approval: ApprovalEnv | None) -> str:
    """The value of :data:`ANNOTATION_APPROVAL`: ``none``, or compact JSON of the decision, the call
    id, the digest of the call's full arguments and of an approved call's target (what the decision
    is bound to)."""
    if approval is None:
        return NO_APPROVAL
    doc = {"decision": approval.decision, "callId": approval.call_id,
           "argumentsSha256": approval.arguments_sha256 or ""}
    if approval.target_sha256:
        doc["targetSha256"] = approval.target_sha256
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def resolve_store(spec: RunSpecFields, config: OperatorConfig) -> StoreLocation:
    """The store a NEW run would use: spec.checkpoint, else the operator's defaults. A run uses the
    location pinned in its status.store (this, at its first Job), never a later resolution.
    Raises ValueError when there is no URI at all."""
    ck = spec.checkpoint
    uri = ck.uri or config.checkpoint_uri
    if not uri:
        raise ValueError("spec.checkpoint.uri is not set and the operator has no default (AGENTRUN_CHECKPOINT_URI)")
    endpoint = ck.endpoint or config.s3_endpoint or None
    return StoreLocation(
        uri=uri,
        endpoint=recordable_endpoint(endpoint),
        region=ck.region or config.s3_region or None,
        path_style=config.s3_path_style if ck.path_style is None else ck.path_style,
    )


def recordable_endpoint(endpoint: str | None) -> str | None:
    """An endpoint as status may hold it: without user info (credentials), query or fragment."""
    if not endpoint:
        return None
    parts = urlsplit(endpoint)
    if parts.username or parts.password or parts.query or parts.fragment:
        return redact_url(endpoint)
    return endpoint


def effective_endpoint(pinned: StoreLocation, spec: RunSpecFields, config: OperatorConfig) -> str | None:
    """The endpoint to connect to for a pinned store: the pinned one, or the configured one it was
    recorded from when that carried credentials (status never holds them)."""
    configured = spec.checkpoint.endpoint or config.s3_endpoint or None
    if configured and configured != pinned.endpoint and recordable_endpoint(configured) == pinned.endpoint:
        return configured
    return pinned.endpoint


def store_of_env(env: list[dict[str, Any]]) -> StoreLocation | None:
    """The store a lap Job was given (its container environment), or None."""
    values = {e.get("name"): e.get("value") for e in env if isinstance(e, dict) and "value" in e}
    uri = values.get(Env.CHECKPOINT_URI)
    if not uri:
        return None
    return StoreLocation(
        uri=uri,
        endpoint=recordable_endpoint(values.get(Env.S3_ENDPOINT) or None),
        region=values.get(Env.S3_REGION) or None,
        path_style=str(values.get(Env.S3_PATH_STYLE, "")).lower() == "true",
    )


@functools.lru_cache(maxsize=8192)
def job_name(run_name: str, uid: str, lap: int, attempt: int) -> str:
    """``<run-name-truncated>-<uid[:5]>-l<lap>-a<attempt>``, at most 63 characters, a DNS label
    (memoized: every pass of every reconcile names the run's current and next Jobs)."""
    suffix = f"-{uid.replace('-', '')[:5].lower()}-l{lap}-a{attempt}"
    head = run_name[: 63 - len(suffix)].rstrip("-.")
    head = re.sub(r"[^a-z0-9-]", "-", head.lower()) or "run"
    return head + suffix


def label_value(value: str) -> str:
    """A valid label value (<=63 chars) standing for ``value``; long values get a hash suffix."""
    if len(value) <= 63:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return value[:54].rstrip("-.") + "-" + digest


def tool_env_name(tool: str) -> str:
    """``AGENTRUN_TOOL_HEADERS_<TOOL>`` (agentrun.api.contract)."""
    return tool_headers_env(tool)


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": str(name), "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _value_env(name: str, value: str) -> dict[str, Any]:
    return {"name": str(name), "value": value}


def build_env(
    run: RunIdentity,
    spec: AgentRunSpec,
    lap: int,
    attempt: int,
    agent_version: str,
    config: OperatorConfig,
    approval: ApprovalEnv | None = None,
    store: StoreLocation | None = None,
    spec_text: str | None = None,
    image: str | None = None,
    address_rules: AddressRules | None = None,
    rewinds: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """The lap container's environment, per docs/contracts.md. ``store``: the run's pinned store
    (status.store); without it, the store a new run would resolve to. ``spec_text``:
    :func:`spec_json` of ``spec``, when the caller has it already. ``address_rules``: those of the
    AgentRunPolicies that apply to the run (the tenancy re-check's), for the lap's connect-time
    check; None when none is known (the lap applies the always-denied ranges). ``rewinds``:
    status.lifecycle.rewinds (set only for a run rewound in place)."""
    ck = spec.checkpoint
    store = store or resolve_store(spec, config)
    uri = store.uri
    endpoint = effective_endpoint(store, spec, config) or ""
    region = store.region or ""
    path_style = store.path_style
    env = [
        _value_env(Env.NAMESPACE, run.namespace),
        _value_env(Env.NAME, run.name),
        _value_env(Env.UID, run.uid),
        _value_env(Env.LAP, str(lap)),
        _value_env(Env.ATTEMPT, str(attempt)),
        _value_env(Env.CHECKPOINT_URI, uri),
        _value_env(Env.S3_ENDPOINT, endpoint),
        _value_env(Env.S3_REGION, region),
        _value_env(Env.S3_PATH_STYLE, "true" if path_style else "false"),
        _value_env(Env.AGENT_VERSION, agent_version),
        _value_env(Env.SPEC, spec_text if spec_text is not None else spec_json(spec)),
        _value_env(Env.LOG_FORMAT, config.log_format),
        _value_env(Env.IMAGE, image or spec.agent.image or config.lap_image),
    ]
    secret = ck.credentials_secret_name or config.credentials_secret
    if secret:
        env.append(_secret_env(Env.AWS_ACCESS_KEY_ID, secret, "AWS_ACCESS_KEY_ID"))
        env.append(_secret_env(Env.AWS_SECRET_ACCESS_KEY, secret, "AWS_SECRET_ACCESS_KEY"))
        env.append(_value_env(Env.S3_CREDENTIALS_SECRET, secret))  # the name, for messages
    ref = spec.agent.model.api_key_secret_ref
    if ref is not None:
        env.append(_secret_env(Env.MODEL_API_KEY, ref.name, ref.key))
    for tool in spec.agent.tools:
        if tool.http.headers_secret_ref is not None:
            r = tool.http.headers_secret_ref
            env.append(_secret_env(tool_env_name(tool.name), r.name, r.key))
    for server in spec.agent.mcp_servers:
        if server.headers_secret_ref is not None:
            m = server.headers_secret_ref
            env.append(_secret_env(mcp_headers_env(server.name), m.name, m.key))
    if approval is not None:
        env.append(_value_env(Env.APPROVAL_DECISION, approval.decision))
        env.append(_value_env(Env.APPROVAL_CALL_ID, approval.call_id))
        if approval.reason:
            env.append(_value_env(Env.APPROVAL_REASON, approval.reason))
        if approval.decided_by:
            env.append(_value_env(Env.APPROVAL_BY, approval.decided_by))
        if approval.arguments_sha256:
            env.append(_value_env(Env.APPROVAL_ARGUMENTS_SHA256, approval.arguments_sha256))
        if approval.target_sha256:
            env.append(_value_env(Env.APPROVAL_TARGET_SHA256, approval.target_sha256))
        if approval.decided_at is not None:
            env.append(_value_env(Env.APPROVAL_DECIDED_AT, approval.decided_at.isoformat()))
    if address_rules is not None:
        env.append(_value_env(Env.ADDRESS_RULES, address_rules.to_env()))
    if rewinds:
        env.append(_value_env(Env.REWINDS, format_rewinds(rewinds)))
    env += [_value_env(name, value) for name, value in config.lap_otel_env]  # tracing (api.contract.LAP_OTEL_ENV)
    return env


def spec_json(spec: AgentRunSpec) -> str:
    """The spec as the lap reads it (``AGENTRUN_SPEC``): canonical JSON of its API form."""
    return json.dumps(spec.to_api(), sort_keys=True, separators=(",", ":"))


def pod_scheduling(tpl: LapPodTemplate) -> dict[str, Any]:
    """The pod spec fields of ``spec.agent.podTemplate`` (only those it sets), as the API server reads them."""
    out: dict[str, Any] = {}
    if tpl.node_selector:
        out["nodeSelector"] = dict(tpl.node_selector)
    if tpl.tolerations:
        out["tolerations"] = [t.to_api() for t in tpl.tolerations]
    if tpl.affinity is not None and (aff := tpl.affinity.to_api()):
        out["affinity"] = aff
    if tpl.priority_class_name:
        out["priorityClassName"] = tpl.priority_class_name
    if tpl.runtime_class_name:
        out["runtimeClassName"] = tpl.runtime_class_name
    if tpl.topology_spread_constraints:
        out["topologySpreadConstraints"] = [c.to_api() for c in tpl.topology_spread_constraints]
    return out


def build_job(
    run: RunIdentity,
    spec: AgentRunSpec,
    lap: int,
    attempt: int,
    agent_version: str,
    config: OperatorConfig,
    approval: ApprovalEnv | None = None,
    image: str | None = None,
    store: StoreLocation | None = None,
    spec_text: str | None = None,
    address_rules: AddressRules | None = None,
    queue_name: str | None = None,
    rewinds: tuple[int, ...] = (),
) -> dict[str, Any]:
    """The batch/v1 Job of one lap attempt (``spec_text``, ``address_rules``: as :func:`build_env`).
    With ``queue_name`` it is created suspended with Kueue's queue label, for Kueue to admit
    (``decide/kueue.py``)."""
    name = job_name(run.name, run.uid, lap, attempt)
    labels = {
        LABEL_RUN: label_value(run.name),
        LABEL_RUN_UID: run.uid,
        LABEL_LAP: str(lap),
        LABEL_ATTEMPT: str(attempt),
        LABEL_MANAGED_BY: "agentrun",
    }
    job_labels = {**labels, QUEUE_NAME_LABEL: queue_name} if queue_name is not None else labels
    if spec.resources is not None:
        requests, limits = dict(spec.resources.requests), dict(spec.resources.limits)
    else:
        requests, limits = dict(config.default_requests), dict(config.default_limits)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    image = image or spec.agent.image or config.lap_image
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(config.lap_command),
        "env": build_env(run, spec, lap, attempt, agent_version, config, approval, store, spec_text, image,
                         address_rules, rewinds),
        "resources": resources,
        # the runner writes a failure's cause there; the log tail when it could not (a crash)
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    tpl = spec.agent.pod_template or LapPodTemplate()
    # the operator's labels and annotations win over a template's (which the models refuse anyway)
    pod_labels = {**tpl.labels, **labels}
    pod_annotations = {**tpl.annotations, ANNOTATION_AGENT_VERSION: agent_version}
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": max(1, int(round(parse_duration(spec.lap_timeout)))),
        "template": {
            "metadata": {"labels": pod_labels, "annotations": pod_annotations},
            "spec": {
                **pod_scheduling(tpl),
                "restartPolicy": "Never",
                "serviceAccountName": config.lap_service_account,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "fsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
            },
        },
    }
    if config.job_ttl_seconds is not None:
        job_spec["ttlSecondsAfterFinished"] = config.job_ttl_seconds
    if queue_name is not None:
        job_spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": job_labels,
            "annotations": {ANNOTATION_AGENT_VERSION: agent_version,
                            ANNOTATION_APPROVAL: approval_annotation(approval)},
            "ownerReferences": [
                {
                    "apiVersion": "agentrun.dev/v1alpha1",
                    "kind": "AgentRun",
                    "name": run.name,
                    "uid": run.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": job_spec,
    }
