"""Operator configuration, read from the environment (the Helm chart sets these variables).

Every field documents its variable. Nothing here is a secret: the S3 credentials are referenced
by Secret *name* only and reach lap pods through ``secretKeyRef``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.api.contract import LAP_OTEL_ENV, traces_endpoint

#: The values of AGENTRUN_EVENT_LOOP (controller/eventloop.py makes the loop).
EVENT_LOOPS = ("uvloop", "asyncio")
#: The admission policy sets of AGENTRUN_ADMISSION_POLICIES (controller/policycheck.py).
POLICY_SETS = ("approvals", "stamping", "tenancy")


def parse_sets(raw: str) -> tuple[str, ...]:
    """AGENTRUN_ADMISSION_POLICIES: comma-separated names of POLICY_SETS."""
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    bad = [n for n in names if n not in POLICY_SETS]
    if bad:
        raise ValueError(f"unknown policy set {', '.join(bad)}: expected a comma-separated list of "
                         f"{', '.join(POLICY_SETS)}")
    return names


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


@dataclass(frozen=True)
class OperatorConfig:
    """Configuration of the operator."""

    lap_image: str = "ghcr.io/agentrun/agentrun:latest"
    """AGENTRUN_LAP_IMAGE: default image of lap pods (spec.agent.image overrides)."""
    lap_command: tuple[str, ...] = ("agentrun", "lap")
    """AGENTRUN_LAP_COMMAND (JSON list): command of the lap container."""
    checkpoint_uri: str | None = None
    """AGENTRUN_CHECKPOINT_URI: default s3://bucket/prefix of runs without spec.checkpoint.uri."""
    s3_endpoint: str | None = None
    """AGENTRUN_S3_ENDPOINT: default S3 endpoint URL (empty: AWS)."""
    s3_region: str | None = None
    """AGENTRUN_S3_REGION: default S3 region."""
    s3_path_style: bool = False
    """AGENTRUN_S3_PATH_STYLE: default path-style addressing."""
    credentials_secret: str | None = None
    """AGENTRUN_S3_CREDENTIALS_SECRET: default Secret (in the run's namespace) with
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for lap pods."""
    lap_service_account: str = "agentrun-lap"
    """AGENTRUN_LAP_SERVICE_ACCOUNT: ServiceAccount of lap pods (needs no permissions; its token is
    not mounted)."""
    default_requests: Mapping[str, str] = field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"})
    """AGENTRUN_LAP_REQUESTS (JSON object): default resource requests of lap pods."""
    default_limits: Mapping[str, str] = field(default_factory=lambda: {"memory": "1Gi"})
    """AGENTRUN_LAP_LIMITS (JSON object): default resource limits of lap pods."""
    job_ttl_seconds: int | None = 3600
    """AGENTRUN_JOB_TTL_SECONDS: ttlSecondsAfterFinished of lap Jobs (empty or -1: keep)."""
    namespaces: tuple[str, ...] = ()
    """AGENTRUN_NAMESPACES (comma-separated): namespaces to watch; empty: cluster-wide."""
    metrics_port: int = 9090
    """AGENTRUN_METRICS_PORT: port of the Prometheus /metrics endpoint and of the /readyz probe (0: off)."""
    liveness_port: int = 0
    """AGENTRUN_LIVENESS_PORT: port of Kopf's liveness endpoint /healthz (controller/process.py; 0: off,
    the chart sets 8081)."""
    log_format: str = "json"
    """AGENTRUN_LOG_FORMAT: json or text (also passed to lap pods)."""
    lease_name: str = "agentrun-operator"
    """AGENTRUN_LEASE_NAME: coordination.k8s.io Lease that elects the active replica."""
    lease_namespace: str = "default"
    """AGENTRUN_LEASE_NAMESPACE (or POD_NAMESPACE): namespace of the Lease."""
    lease_duration_seconds: float = 15.0
    """AGENTRUN_LEASE_DURATION: seconds a standby waits after the leader's last renewal."""
    resync_seconds: float = 300.0
    """AGENTRUN_RESYNC_SECONDS: every run is reconciled at least this often (a safety net: the watch
    cache and the requeues of time-based steps do the work; a short period only adds reconciles).
    The resync looks every half period and queues the runs not reconciled for half a period."""
    store_retry_seconds: float = 10.0
    """AGENTRUN_STORE_RETRY_SECONDS: requeue delay when the checkpoint store is unavailable for the
    lap read (when decide takes it). The retention-Delete cleanup of a deleted run's checkpoints is
    retried with the run's exponential backoff instead (0.5 s doubling up to 5 min, one Event)."""
    pod_config_grace_seconds: float = 30.0
    """AGENTRUN_POD_CONFIG_GRACE_SECONDS: how long a lap pod may wait on a configuration error
    (CreateContainerConfigError: a missing Secret or key) before the run's condition and a Warning
    Event say so. The run keeps waiting: the pod starts once the Secret exists."""
    tenancy_recheck: bool = True
    """AGENTRUN_TENANCY_RECHECK (true/false): re-check a run's AgentRunPolicies before each lap, from
    watches of the policies, their bindings and the namespaces (docs/security.md)."""
    watch_timeout_seconds: int = 120
    """AGENTRUN_WATCH_TIMEOUT_SECONDS (1-1800): server-side timeout of each watch of the watch cache;
    the informer then watches again from where it was. The API server checks RBAC when a watch
    starts, not while it is open, so this bounds how long a replica whose access was taken away
    keeps an open watch before it notices (and steps down 30 s later). Shorter: one more request
    per watch and period."""
    event_loop: str = "uvloop"
    """AGENTRUN_EVENT_LOOP: uvloop (less CPU per lap) or asyncio."""
    admission_policies: tuple[str, ...] = ("approvals", "stamping", "tenancy")
    """AGENTRUN_ADMISSION_POLICIES (comma-separated: approvals, stamping, tenancy; the chart sets the
    sets it installs; empty: all three): the admission policies checked at start and every resync before any lap
    starts (controller/policycheck.py, docs/operations.md#admission-policies); ``stamping`` only where
    the API server serves MutatingAdmissionPolicy."""
    allow_missing_policies: bool = False
    """AGENTRUN_ALLOW_MISSING_POLICIES (true/false): start laps even while those policies are missing
    or outdated (logged as a warning). Anyone who may patch a run then decides its approvals."""
    identity: str = ""
    """AGENTRUN_IDENTITY (or POD_NAME): this replica's name in the Lease (default host-pid)."""
    lap_otel_env: tuple[tuple[str, str], ...] = ()
    """The OpenTelemetry variables of ``agentrun.api.contract.LAP_OTEL_ENV`` set in the operator's
    environment (the chart's ``tracing`` values, e.g. OTEL_EXPORTER_OTLP_ENDPOINT), passed as they
    are to every lap Job: the lap traces when an endpoint is set (docs/observability.md#traces)."""

    @functools.cached_property
    def tracing(self) -> bool:
        """Lap Jobs get an OTLP endpoint: runs record their trace id (``status.traceId``)."""
        return traces_endpoint(dict(self.lap_otel_env)) is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read the configuration; a bad value raises ValueError naming the variable."""
        env = os.environ if env is None else env
        kw: dict[str, Any] = {}

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value not in (None, "") else None

        def parse(name: str, conv: Callable[[str], Any], attr: str) -> None:
            raw = get(name)
            if raw is None:
                return
            try:
                kw[attr] = conv(raw)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{name}: {exc}") from None

        def json_map(raw: str) -> dict[str, str]:
            value = json.loads(raw)
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ValueError("expected a JSON object of strings")
            return value

        def json_list(raw: str) -> tuple[str, ...]:
            value = json.loads(raw)
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise ValueError("expected a non-empty JSON list of strings")
            return tuple(value)

        def ttl(raw: str) -> int | None:
            n = int(raw)
            return None if n < 0 else n

        def watch_seconds(raw: str) -> int:
            n = int(raw)
            if not 1 <= n <= 1800:
                raise ValueError(f"expected 1 to 1800 seconds, got {n}")
            return n

        def port(raw: str) -> int:
            n = int(raw)
            if not 0 <= n <= 65535:
                raise ValueError(f"expected a TCP port, 1 to 65535 (0: off), got {n}")
            return n

        def log_format(raw: str) -> str:
            if raw not in ("json", "text"):
                raise ValueError("expected json or text")
            return raw

        def event_loop(raw: str) -> str:
            if raw not in EVENT_LOOPS:
                raise ValueError(f"expected {' or '.join(EVENT_LOOPS)}")
            return raw

        parse("AGENTRUN_LAP_IMAGE", str, "lap_image")
        parse("AGENTRUN_LAP_COMMAND", json_list, "lap_command")
        parse("AGENTRUN_CHECKPOINT_URI", str, "checkpoint_uri")
        parse("AGENTRUN_S3_ENDPOINT", str, "s3_endpoint")
        parse("AGENTRUN_S3_REGION", str, "s3_region")
        parse("AGENTRUN_S3_PATH_STYLE", lambda v: _bool(v, False), "s3_path_style")
        parse("AGENTRUN_S3_CREDENTIALS_SECRET", str, "credentials_secret")
        parse("AGENTRUN_LAP_SERVICE_ACCOUNT", str, "lap_service_account")
        parse("AGENTRUN_LAP_REQUESTS", json_map, "default_requests")
        parse("AGENTRUN_LAP_LIMITS", json_map, "default_limits")
        parse("AGENTRUN_JOB_TTL_SECONDS", ttl, "job_ttl_seconds")
        parse("AGENTRUN_NAMESPACES", lambda v: tuple(n.strip() for n in v.split(",") if n.strip()), "namespaces")
        parse("AGENTRUN_METRICS_PORT", port, "metrics_port")
        parse("AGENTRUN_LIVENESS_PORT", port, "liveness_port")
        parse("AGENTRUN_LOG_FORMAT", log_format, "log_format")
        parse("AGENTRUN_LEASE_NAME", str, "lease_name")
        parse("POD_NAMESPACE", str, "lease_namespace")
        parse("AGENTRUN_LEASE_NAMESPACE", str, "lease_namespace")
        parse("AGENTRUN_LEASE_DURATION", float, "lease_duration_seconds")
        parse("AGENTRUN_RESYNC_SECONDS", float, "resync_seconds")
        parse("AGENTRUN_STORE_RETRY_SECONDS", float, "store_retry_seconds")
        parse("AGENTRUN_POD_CONFIG_GRACE_SECONDS", float, "pod_config_grace_seconds")
        parse("AGENTRUN_TENANCY_RECHECK", lambda v: _bool(v, True), "tenancy_recheck")
        parse("AGENTRUN_WATCH_TIMEOUT_SECONDS", watch_seconds, "watch_timeout_seconds")
        parse("AGENTRUN_EVENT_LOOP", event_loop, "event_loop")
        parse("AGENTRUN_ADMISSION_POLICIES", parse_sets, "admission_policies")
        parse("AGENTRUN_ALLOW_MISSING_POLICIES", lambda v: _bool(v, False), "allow_missing_policies")
        parse("POD_NAME", str, "identity")
        parse("AGENTRUN_IDENTITY", str, "identity")
        kw["lap_otel_env"] = tuple((str(name), value) for name in LAP_OTEL_ENV if (value := get(name)) is not None)
        if not kw.get("identity"):
            kw["identity"] = f"{os.uname().nodename}-{os.getpid()}"
        return cls(**kw)
