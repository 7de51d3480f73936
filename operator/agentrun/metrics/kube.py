"""``agentrun_kube_requests_total{verb,resource,code}``: every request the operator makes to the
Kubernetes API server, as controller-runtime's ``rest_client_requests_total`` counts them, so the API
work per lap is visible in production (and in ``bench/bench_operator_cluster.py``).

``verb`` is the Kubernetes verb (get, list, watch, create, update, patch, delete); ``resource`` the
plural resource, with its subresource (``agentruns/status``); ``code`` the HTTP status, or
``<error>`` when no response came back (connection refused, timeout). Every label comes from a
bounded set: the verbs are fixed, the resources are the few the operator touches, and anything
else is counted as ``other``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentrun.api.reasons import ROUTINE_EVENT_REASONS

VERBS: tuple[str, ...] = ("get", "list", "watch", "create", "update", "patch", "delete")
#: The resources the operator touches; any other is counted as ``other``.
RESOURCES: tuple[str, ...] = (
    "agentruns", "agentruns/status", "jobs", "pods", "events", "leases",
    # the tenancy re-check's watches (agentrun.controller.tenancy)
    "namespaces", "validatingadmissionpolicybindings", "agentrunpolicies",
    # the admission policy check's lists and watches by name (agentrun.controller.policycheck)
    "validatingadmissionpolicies", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
    "other",
)


class KubeRequestMetrics:
    """The API request counter, on the given registry (the operator's ``metrics.REGISTRY``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "agentrun_kube_requests",
            "Requests of the operator to the Kubernetes API server, by verb, resource and HTTP status "
            "(<error>: no response). Mirrors controller-runtime's rest_client_requests_total.",
            ["verb", "resource", "code"], registry=registry,
        )

    def observe(self, verb: str, resource: str, code: int | str) -> None:
        """Count one request. Never raises."""
        try:
            verb = verb if verb in VERBS else "other"
            resource = resource if resource in RESOURCES else "other"
            self.requests.labels(verb, resource, str(code)).inc()
        except Exception:  # noqa: BLE001 - a metrics problem never breaks a request
            pass


class InformerMetrics:
    """``agentrun_informer_synced{resource}``: 1 once every watch of ``resource`` listed, 0 while one
    has not (a list refused or failing). The replica campaigns for the Lease and is ready only when
    every resource is 1."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.synced = Gauge(
            "agentrun_informer_synced",
            "1 when the operator's watch cache has listed this resource (in every watched namespace), 0 while "
            "a list fails (e.g. RBAC without list/watch). Until all are 1 the replica is not ready and does not "
            "campaign for the Lease.",
            ["resource"], registry=registry,
        )
        self._state: dict[str, dict[int, bool]] = {}

    def set(self, resource: str, synced: bool, informer: int = 0) -> None:
        """Record one informer of ``resource`` (``informer``: which one, when a resource is watched in
        several namespaces). Never raises."""
        try:
            resource = resource if resource in RESOURCES else "other"
            state = self._state.setdefault(resource, {})
            state[informer] = synced
            self.synced.labels(resource).set(1.0 if all(state.values()) else 0.0)
        except Exception:  # noqa: BLE001 - a metrics problem never breaks the controller
            pass


class EventMetrics:
    """``agentrun_events_suppressed_total{reason}``: routine Events not posted by the per-run rate
    limit (``agentrun.controller.events``: a burst of 25 per run, then one per 5 minutes)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.suppressed = Counter(
            "agentrun_events_suppressed",
            "Routine Events of a run (LapCheckpointed) not posted because the run used its Event budget "
            "(a burst of 25, then one per 5 minutes, as client-go's spam filter); they are logged.",
            ["reason"], registry=registry,
        )

    def suppressed_one(self, reason: str) -> None:
        """Count one suppressed Event. Never raises."""
        try:
            self.suppressed.labels(reason if reason in ROUTINE_EVENT_REASONS else "other").inc()
        except Exception:  # noqa: BLE001 - a metrics problem never breaks a reconcile
            pass
