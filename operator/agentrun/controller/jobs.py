"""The lap Job builder: a pure function from (run, lap, attempt, config) to a batch/v1 Job.

The Job name is deterministic, so a lost status write or an operator restart can never create a
second Job for the same lap attempt: creation returns AlreadyExists and the operator adopts it.
No secret value is ever put into the Job: secrets reach the pod through ``secretKeyRef``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.types import parse_duration

from .config import OperatorConfig

LABEL_RUN = "agentrun.dev/run"
LABEL_RUN_UID = "agentrun.dev/run-uid"
LABEL_LAP = "agentrun.dev/lap"
LABEL_ATTEMPT = "agentrun.dev/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_AGENT_VERSION = "agentrun.dev/agent-version"
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


def job_name(run_name: str, uid: str, lap: int, attempt: int) -> str:
    """``<run-name-truncated>-<uid[:5]>-l<lap>-a<attempt>``, at most 63 characters, a DNS label."""
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
    """``AGENTRUN_TOOL_HEADERS_<TOOL>``: upper-cased, ``-`` -> ``_`` (docs/contracts.md)."""
    return "AGENTRUN_TOOL_HEADERS_" + tool.upper().replace("-", "_")


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _value_env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def build_env(
    run: RunIdentity,
    spec: AgentRunSpec,
    lap: int,
    attempt: int,
    agent_version: str,
    config: OperatorConfig,
    approval: ApprovalEnv | None = None,
) -> list[dict[str, Any]]:
    """The lap container's environment, per docs/contracts.md."""
    ck = spec.checkpoint
    uri = ck.uri or config.checkpoint_uri
    if not uri:
        raise ValueError("spec.checkpoint.uri is not set and the operator has no default (AGENTRUN_CHECKPOINT_URI)")
    endpoint = ck.endpoint or config.s3_endpoint or ""
    region = ck.region or config.s3_region or ""
    path_style = config.s3_path_style if ck.path_style is None else ck.path_style
    env = [
        _value_env("AGENTRUN_NAMESPACE", run.namespace),
        _value_env("AGENTRUN_NAME", run.name),
        _value_env("AGENTRUN_UID", run.uid),
        _value_env("AGENTRUN_LAP", str(lap)),
        _value_env("AGENTRUN_ATTEMPT", str(attempt)),
        _value_env("AGENTRUN_CHECKPOINT_URI", uri),
        _value_env("AGENTRUN_S3_ENDPOINT", endpoint),
        _value_env("AGENTRUN_S3_REGION", region),
        _value_env("AGENTRUN_S3_PATH_STYLE", "true" if path_style else "false"),
        _value_env("AGENTRUN_AGENT_VERSION", agent_version),
        _value_env("AGENTRUN_SPEC", json.dumps(spec.to_api(), sort_keys=True, separators=(",", ":"))),
        _value_env("AGENTRUN_LOG_FORMAT", config.log_format),
    ]
    secret = ck.credentials_secret_name or config.credentials_secret
    if secret:
        env.append(_secret_env("AWS_ACCESS_KEY_ID", secret, "AWS_ACCESS_KEY_ID"))
        env.append(_secret_env("AWS_SECRET_ACCESS_KEY", secret, "AWS_SECRET_ACCESS_KEY"))
        env.append(_value_env("AGENTRUN_S3_CREDENTIALS_SECRET", secret))  # the name, for messages
    ref = spec.agent.model.api_key_secret_ref
    if ref is not None:
        env.append(_secret_env("AGENTRUN_MODEL_API_KEY", ref.name, ref.key))
    for tool in spec.agent.tools:
        if tool.http.headers_secret_ref is not None:
            r = tool.http.headers_secret_ref
            env.append(_secret_env(tool_env_name(tool.name), r.name, r.key))
    if approval is not None:
        env.append(_value_env("AGENTRUN_APPROVAL_DECISION", approval.decision))
        env.append(_value_env("AGENTRUN_APPROVAL_CALL_ID", approval.call_id))
        if approval.reason:
            env.append(_value_env("AGENTRUN_APPROVAL_REASON", approval.reason))
        if approval.decided_by:
            env.append(_value_env("AGENTRUN_APPROVAL_BY", approval.decided_by))
    return env


def build_job(
    run: RunIdentity,
    spec: AgentRunSpec,
    lap: int,
    attempt: int,
    agent_version: str,
    config: OperatorConfig,
    approval: ApprovalEnv | None = None,
    image: str | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job of one lap attempt."""
    name = job_name(run.name, run.uid, lap, attempt)
    labels = {
        LABEL_RUN: label_value(run.name),
        LABEL_RUN_UID: run.uid,
        LABEL_LAP: str(lap),
        LABEL_ATTEMPT: str(attempt),
        LABEL_MANAGED_BY: "agentrun",
    }
    if spec.resources is not None:
        requests, limits = dict(spec.resources.requests), dict(spec.resources.limits)
    else:
        requests, limits = dict(config.default_requests), dict(config.default_limits)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    container = {
        "name": CONTAINER_NAME,
        "image": image or spec.agent.image or config.lap_image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(config.lap_command),
        "env": build_env(run, spec, lap, attempt, agent_version, config, approval),
        "resources": resources,
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
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": max(1, int(round(parse_duration(spec.lap_timeout)))),
        "template": {
            "metadata": {"labels": dict(labels), "annotations": {ANNOTATION_AGENT_VERSION: agent_version}},
            "spec": {
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
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_AGENT_VERSION: agent_version},
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
