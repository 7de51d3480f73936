"""The operator's tenancy re-check (docs/security.md "Tenancy guardrails"): the AgentRunPolicies
that apply to a namespace, picked the way the API server picks the bindings of the
``agentrun-tenancy`` ValidatingAdmissionPolicy, and a run's stored spec checked against them with
the pure :func:`agentrun.api.tenancy.check_all`. decide() only sees the verdict
(``Observed.policy_check``).

In the operator, what the re-check reads is kept by watches (:class:`PolicyStore`, fed by
:class:`~agentrun.controller.cache.Informer`\\ s of the validatingadmissionpolicybindings, the
AgentRunPolicies and the namespaces: all of them, or with exact watched namespaces each of those by
name, which RBAC grants by ``resourceNames``): no request per reconcile or per period,
and a policy tightened after apply is seen with its watch event, which also queues the live runs of
the namespaces it applies to. :func:`load_policies` / :func:`recheck` are the same reads done once
through the API (tools, tests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import pydantic

from agentrun.api.tenancy import (
    GROUP,
    PLURAL,
    VAP_NAME,
    VERSION,
    AgentRunPolicySpec,
    PolicyCheck,
    PolicyUnreadable,
    binding_refs,
    check_all,
    resolve_refs,
)
from agentrun.api.text import one_line
from agentrun.kube.informer import is_newer, rv_int

from .decide.observe import spec_error_text
from .decide.queue import Limits

log = logging.getLogger("agentrun.controller")

#: (group/version prefix, plural) of what the re-check watches (all cluster-scoped).
NAMESPACES = ("/api/v1", "namespaces")
BINDINGS = ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings")
POLICIES = (f"/apis/{GROUP}/{VERSION}", PLURAL)
#: The informer kinds of :class:`PolicyStore` and their resources.
KINDS: dict[str, tuple[str, str]] = {"namespaces": NAMESPACES, "bindings": BINDINGS, "policies": POLICIES}


def load_policies(api: Any, namespace: str) -> dict[str, AgentRunPolicySpec | PolicyUnreadable | None]:
    """Read the policies that apply to ``namespace`` through the kubernetes client ``api``
    (a ``kubernetes.client.ApiClient``): namespace labels, the bindings of VAP_NAME, the policies.
    Needs get on namespaces, list on validatingadmissionpolicybindings and agentrunpolicies (the
    chart's agentrun-tenancy-reader ClusterRole). Raises the client's ApiException on errors."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    adm = client.AdmissionregistrationV1Api(api)
    custom = client.CustomObjectsApi(api)
    meta = core.read_namespace(namespace).metadata
    labels = (meta.labels if meta is not None else None) or {}
    bindings = [api.sanitize_for_serialization(b)
                for b in adm.list_validating_admission_policy_binding().items]
    doc = cast("dict[str, Any]", custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))
    listed = {str((p.get("metadata") or {}).get("name") or ""): p for p in doc.get("items") or []}
    return resolve_refs(binding_refs(bindings, labels),
                        {name: (dict((p.get("metadata") or {}).get("labels") or {}), parse_policy(p))
                         for name, p in listed.items()})


def parse_policy(obj: dict[str, Any]) -> AgentRunPolicySpec | PolicyUnreadable:
    """An AgentRunPolicy's spec, or why this operator cannot read it."""
    try:
        return AgentRunPolicySpec.model_validate(obj.get("spec") or {})
    except ValueError as exc:
        return PolicyUnreadable(unreadable_text(exc))


def recheck(api: Any, namespace: str, spec: dict[str, Any]) -> PolicyCheck | None:
    """:func:`check_all` of the stored ``spec`` (the JSON of .spec) against :func:`load_policies`.
    None when the policies may not be read (403: the chart's ``tenancy.operatorRecheck`` RBAC is
    off); other API errors are raised."""
    from kubernetes import client

    try:
        return check_all(spec, load_policies(api, namespace))
    except client.ApiException as e:
        if e.status == 403:
            return None
        raise


def unreadable_text(exc: ValueError, limit: int = 500) -> str:
    """Why a policy's spec cannot be read: pydantic's first errors with their field paths (as a
    run's spec errors are named), one line, bounded (a policy is user-written text all the same)."""
    text = spec_error_text(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)
    return one_line(" ".join(text.split()), limit)


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name") or ""


class PolicyStore:
    """What the re-check reads, as the watches last reported it: the labels of every namespace,
    the bindings of VAP_NAME and the AgentRunPolicies. The sink of the informers of :data:`KINDS`
    (``replace``/``event``/``refused``, like :class:`~agentrun.controller.cache.Cache`); mutated
    and read on the event loop only.

    ``on_change(namespaces)`` is called when what applies to some namespaces changed: a set of
    namespace names, or None for every namespace (a binding changed)."""

    def __init__(self, on_change: Callable[[set[str] | None], None] | None = None) -> None:
        self.on_change = on_change
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.bindings: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self._parsed: dict[str, AgentRunPolicySpec | PolicyUnreadable] = {}
        # kind (or "kind/name" for an object watched by name) -> HTTP status of its refused list/watch
        self.refusals: dict[str, int] = {}
        self.changes = 0  # changes that applied (for logs and tests)

    # ---------------------------------------------------------------- informer sink

    def _store(self, kind: str) -> dict[str, dict[str, Any]]:
        return {"namespaces": self.namespaces, "bindings": self.bindings, "policies": self.policies}[kind]

    def refused(self, kind: str, status: int, scope: str | None = None) -> None:
        """The API server refused to list or watch ``kind`` (403: no RBAC; 404: not served), or the
        one object ``scope`` of it watched by name. Until a list succeeds, the checks it concerns
        answer None (not enforced): a partial view could pick a wrong policy. A refused namespace
        watched by name concerns the runs of that namespace only."""
        key = kind if scope is None else f"{kind}/{scope}"
        if key not in self.refusals:
            log.warning("tenancy re-check not enforced%s: the operator may not list and watch %s%s (HTTP %s); "
                        "see the chart's tenancy.operatorRecheck", "" if scope is None else f" in {scope}",
                        KINDS[kind][1], "" if scope is None else f" {scope}", status)
        self.refusals[key] = status

    def not_enforced(self, namespace: str) -> bool:
        """True when a refused list or watch leaves the policies of ``namespace`` unknown."""
        return any("/" not in key or key == f"namespaces/{namespace}" for key in self.refusals)

    def replace(self, kind: str, scope: str | None, items: list[dict[str, Any]]) -> None:
        """A (re)list of ``kind``: of every object (``scope`` None), or of the one named ``scope``
        (a namespace watched by name)."""
        if self.refusals.pop(kind if scope is None else f"{kind}/{scope}", None) is not None:
            log.info("tenancy re-check: %s%s listed again", KINDS[kind][1], "" if scope is None else f" {scope}")
        store = self._store(kind)
        listed = {_name(o) for o in items}
        for name in [n for n in store if n not in listed and (scope is None or n == scope)]:
            self.event(kind, "DELETED", store[name])
        for obj in items:
            self.event(kind, "ADDED", obj)

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        store, name = self._store(kind), _name(obj)
        old = store.get(name)
        if type_ == "DELETED":
            if old is None:
                return
            del store[name]
            if kind == "policies":
                self._parsed.pop(name, None)
            self._changed(kind, name, old, None)
            return
        if not is_newer(obj, old):
            return
        if kind == "namespaces":  # only the labels are read: keep nothing else
            meta = obj.get("metadata") or {}
            obj = {"metadata": {"name": name, "resourceVersion": meta.get("resourceVersion"),
                                "labels": dict(meta.get("labels") or {})}}
        else:
            (obj.get("metadata") or {}).pop("managedFields", None)
        store[name] = obj
        if kind == "policies":
            self._parsed[name] = parse_policy(obj)
            if isinstance(self._parsed[name], PolicyUnreadable):
                log.warning("tenancy re-check: AgentRunPolicy %s (resourceVersion %s) cannot be read; the runs "
                            "it applies to are refused: %s", name, rv_int(obj), self._parsed[name])
        self._changed(kind, name, old, obj)

    def put_namespace(self, obj: dict[str, Any]) -> None:
        """A namespace read by the operator (the watch had not reported it yet)."""
        self.event("namespaces", "ADDED", obj)

    def _changed(self, kind: str, name: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if kind == "namespaces":
            if new is None or (old is not None and old["metadata"]["labels"] == new["metadata"]["labels"]):
                return
            affected: set[str] | None = {name}
        elif kind == "bindings":
            if not any(((o or {}).get("spec") or {}).get("policyName") == VAP_NAME for o in (old, new)):
                return
            if old is not None and new is not None and old.get("spec") == new.get("spec"):
                return
            affected = None
        else:
            if old is not None and new is not None and old.get("spec") == new.get("spec") \
                    and (old.get("metadata") or {}).get("labels") == (new.get("metadata") or {}).get("labels"):
                return
            log.info("tenancy re-check: AgentRunPolicy %s %s (resourceVersion %s)", name,
                     "deleted" if new is None else "added" if old is None else "changed", rv_int(new) if new is not None else rv_int(old))
            bindings = list(self.bindings.values())
            affected = {ns for ns, o in self.namespaces.items()
                        if any(r.name in (name, None) for r in binding_refs(bindings, o["metadata"]["labels"]))}
        self.changes += 1
        if self.on_change is not None:
            self.on_change(affected)

    # ---------------------------------------------------------------- reads (reconciles)

    def knows(self, namespace: str) -> bool:
        return namespace in self.namespaces

    def policies_for(self, namespace: str) -> dict[str, AgentRunPolicySpec | PolicyUnreadable | None] | None:
        """The policies that apply to ``namespace`` (None for a name no policy has, a
        :class:`PolicyUnreadable` for one whose spec cannot be read: both refuse); None when a
        watch is refused."""
        if self.not_enforced(namespace):
            return None
        ns = self.namespaces.get(namespace)
        labels = ns["metadata"]["labels"] if ns is not None else {}
        known = {name: (dict((p.get("metadata") or {}).get("labels") or {}), self._parsed[name])
                 for name, p in self.policies.items() if name in self._parsed}
        return resolve_refs(binding_refs(list(self.bindings.values()), labels), known)

    def limits(self, namespace: str) -> Limits | None:
        """The concurrency limits of ``namespace`` (``decide/queue.py``): per scope, the lowest of the
        policies that apply to it, with the policy's name; None: no policy sets one (or the policies
        are not read)."""
        specs = [(name, p) for name, p in sorted((self.policies_for(namespace) or {}).items())
                 if isinstance(p, AgentRunPolicySpec)]
        ns = min(((p.max_active_runs, name) for name, p in specs if p.max_active_runs is not None), default=None)
        agents: dict[str, tuple[int, str]] = {}
        models: dict[str, tuple[int, str]] = {}
        for name, p in specs:
            for scope, per in ((agents, p.max_active_runs_per_agent), (models, p.max_active_runs_per_model)):
                for group, n in per.items():
                    scope[group] = min(scope.get(group, (n, name)), (n, name))
        if ns is None and not agents and not models:
            return None
        return Limits(namespace=ns, agents=agents, models=models)

    def default_queue_name(self, namespace: str) -> str | None:
        """The Kueue LocalQueue for runs of ``namespace`` without spec.queueName: the
        ``defaultQueueName`` of the first policy by name that sets one; None: none does."""
        policies = self.policies_for(namespace) or {}
        names = sorted((name, p.default_queue_name) for name, p in policies.items()
                       if isinstance(p, AgentRunPolicySpec) and p.default_queue_name is not None)
        return names[0][1] if names else None

    def check(self, namespace: str, spec: dict[str, Any]) -> PolicyCheck | None:
        """The verdict for a run of ``namespace`` with ``spec`` (None: not enforced)."""
        policies = self.policies_for(namespace)
        return None if policies is None else check_all(spec, policies)
