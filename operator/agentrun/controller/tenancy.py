"""The operator's tenancy re-check (docs/security.md "Tenancy guardrails"): read the AgentRunPolicies
that apply to a namespace through the API, the way the API server picks the bindings of the
``agentrun-tenancy`` ValidatingAdmissionPolicy, and check a run's stored spec with the pure
:func:`agentrun.api.tenancy.check_all`. Shell code (API reads); decide() only sees the verdict
(``Observed.policy_check``). Reads are cached per namespace for ``ttl`` seconds."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from agentrun.api.tenancy import (
    GROUP,
    PLURAL,
    VERSION,
    AgentRunPolicySpec,
    PolicyCheck,
    binding_params,
    check_all,
)


def load_policies(api: Any, namespace: str) -> dict[str, AgentRunPolicySpec | None]:
    """Read the policies that apply to ``namespace`` through the kubernetes client ``api``
    (a ``kubernetes.client.ApiClient``): namespace labels, the bindings of VAP_NAME, their params.
    Needs get on namespaces, list on validatingadmissionpolicybindings and get on agentrunpolicies
    (the chart's agentrun-tenancy-reader ClusterRole). Raises the client's ApiException on errors
    other than a missing AgentRunPolicy."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    adm = client.AdmissionregistrationV1Api(api)
    custom = client.CustomObjectsApi(api)
    meta = core.read_namespace(namespace).metadata
    labels = (meta.labels if meta is not None else None) or {}
    bindings = [api.sanitize_for_serialization(b)
                for b in adm.list_validating_admission_policy_binding().items]
    out: dict[str, AgentRunPolicySpec | None] = {}
    for name in binding_params(bindings, labels):
        try:
            obj = cast("dict[str, Any]", custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name))
        except client.ApiException as e:
            if e.status == 404:
                out[name] = None
                continue
            raise
        out[name] = AgentRunPolicySpec.model_validate(obj.get("spec") or {})
    return out


def recheck(api: Any, namespace: str, spec: dict[str, Any]) -> PolicyCheck | None:
    """The operator's re-check of a run before a lap: :func:`check_all` of the stored ``spec`` (the
    JSON of .spec) against :func:`load_policies`. None when the operator may not read the policies
    (403: the chart's ``tenancy.operatorRecheck`` RBAC is off), so the caller logs that the re-check
    is not enforced; other API errors are raised (retry with backoff, like any read)."""
    from kubernetes import client

    try:
        return check_all(spec, load_policies(api, namespace))
    except client.ApiException as e:
        if e.status == 403:
            return None
        raise


class PolicyCache:
    """``recheck`` with the policies of a namespace cached for ``ttl`` seconds (three API reads per
    namespace and period instead of per reconcile). A policy tightened after apply is seen within
    ``ttl``; None (no reader RBAC) is cached too."""

    def __init__(self, api: Any, ttl: float = 10.0, clock: Any = time.monotonic) -> None:
        self.api, self.ttl, self.clock = api, ttl, clock
        self._lock = threading.Lock()
        self._by_ns: dict[str, tuple[float, dict[str, AgentRunPolicySpec | None] | None]] = {}

    def policies(self, namespace: str) -> dict[str, AgentRunPolicySpec | None] | None:
        from kubernetes import client

        now = self.clock()
        with self._lock:
            hit = self._by_ns.get(namespace)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        try:
            got: dict[str, AgentRunPolicySpec | None] | None = load_policies(self.api, namespace)
        except client.ApiException as e:
            if e.status != 403:
                raise
            got = None
        with self._lock:
            self._by_ns[namespace] = (now, got)
        return got

    def check(self, namespace: str, spec: dict[str, Any]) -> PolicyCheck | None:
        policies = self.policies(namespace)
        return None if policies is None else check_all(spec, policies)
