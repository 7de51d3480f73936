"""The admission policies of approvals, generated from the approval contract (``api/approval.py``).

``agentrun crd --admission validating`` > ``crds/agentrun.dev_admission-policies.yaml`` and
``agentrun crd --admission mutating`` > ``crds/agentrun.dev_admission-mutating.yaml`` (``make crds``;
``make helm-crds`` copies both into the chart's ``files/``, rendered by
``templates/admission-policies.yaml`` where the API server serves the kinds). In-process CEL
admission, no webhook server. What each policy guarantees, and where, is in docs/security.md.

* :data:`VAP_DECISIONS` (ValidatingAdmissionPolicy, Kubernetes >= 1.30): setting or changing a
  decision, by annotation (``approved``, reason, call binding) or by a status patch of
  ``status.approval.decision``/``reason``, needs the :data:`~agentrun.api.approval.APPROVE_VERB`
  verb on the run (refused with a message naming the permission); the recorded decider
  (annotation ``agentrun.dev/decided-by``, ``status.approval.decidedBy``) must equal the
  authenticated ``request.userInfo.username``, and cannot be changed on its own.
* :data:`VAP_STATUS` (ValidatingAdmissionPolicy): on the status subresource, whoever is not the
  operator may change only ``status.approval`` :data:`USER_STATUS_FIELDS`; every other status field
  (cost, retries, phase, checkpoint, lap, ...; the list is generated from the status model, so a
  new field is protected the day it is added) is the operator's.
* :data:`MAP_ANNOTATION` / :data:`MAP_STATUS` (MutatingAdmissionPolicy, Kubernetes >= 1.36):
  stamp the authenticated user into the decider field whenever a decision is set, overwriting
  whatever the client sent; so ``kubectl annotate agentrun X approved=true`` works as typed and
  records the real user. A namespace labelled :data:`NO_STAMP_LABEL`\\ ``=``\\ :data:`NO_STAMP_VALUE`
  is left out of the stamping (it gets the validating-only behaviour of clusters < 1.36).

"The operator" is recognized by permission, not by name: the custom verb :data:`OPERATE_VERB` on
``agentruns/status``, which the chart grants only to the operator's ServiceAccount (cluster-admin,
``system:masters``, passes every authorizer check and is trusted like the operator).
"""

from __future__ import annotations

import json
from typing import Any, Final

import yaml

from . import approval as ap
from .crdgen import GROUP, PLURAL, _Dumper, openapi_schema
from .policy_version import stamped

OPERATE_VERB: Final = "operate"
"""Custom RBAC verb on ``agentruns/status`` that identifies the operator: status fields other than
the decision may be changed only by a requester the authorizer allows this verb."""
APPROVER_CLUSTERROLE: Final = "agentrun-approver"
"""The chart's ClusterRole holding :data:`~agentrun.api.approval.APPROVE_VERB` (bind per namespace)."""

VAP_DECISIONS: Final = "agentrun-decisions"
VAP_STATUS: Final = "agentrun-status-owner"
MAP_ANNOTATION: Final = "agentrun-stamp-decider"
MAP_STATUS: Final = "agentrun-stamp-decider-status"

NO_STAMP_LABEL: Final = "agentrun.dev/decider-stamping"
NO_STAMP_VALUE: Final = "disabled"

OWNER_GROUP_PREFIX: Final = "group:"
"""``spec.approval.owner: "group:NAME"``: only members of the Kubernetes group NAME (as the API
server authenticates them) may decide, besides needing the approve verb. Any other owner is a
label for people (the queue, Waiting-On), not checked."""

VAP_API: Final = "admissionregistration.k8s.io/v1"
MAP_API: Final = "admissionregistration.k8s.io/v1"

USER_STATUS_FIELDS: Final = ("decision", "reason", "decidedBy")
"""``status.approval`` fields a non-operator (an approver) may write through the status subresource."""
DECISION_STATUS_FIELDS: Final = ("decision", "reason")
"""Status fields whose change is a decision (needs the approve verb; stamps decidedBy)."""

RESOURCE: Final = f"{PLURAL}.{GROUP}"


def _lit(s: str) -> str:
    """A CEL string literal."""
    return json.dumps(s)


def _list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_lit(i) for i in items) + "]"


# --------------------------------------------------------------------------- shared CEL pieces

_USER = "request.userInfo.username"
_SUB = "request.?subResource.orValue('')"  # absent (not "") on the main resource
ON_MAIN = f"{_SUB} == ''"
ON_STATUS = f"{_SUB} == 'status'"
_AUTHZ = (f"authorizer.group({_lit(GROUP)}).resource({_lit(PLURAL)}).namespace(request.namespace)"
          ".name(request.name)")
CAN_APPROVE = f"{_AUTHZ}.check({_lit(ap.APPROVE_VERB)}).allowed()"
IS_OPERATOR = (f"authorizer.group({_lit(GROUP)}).resource({_lit(PLURAL)}).subresource('status')"
               f".namespace(request.namespace).name(request.name).check({_lit(OPERATE_VERB)}).allowed()")

# Annotations whose setting or change is a decision (the decider annotation is the API server's).
_DECISION_KEYS = tuple(k for k in ap.DECISION_ANNOTATIONS if k != ap.ANN_DECIDED_BY)

_NEW_ANN = "object.metadata.?annotations.orValue({})"
_OLD_ANN = "oldObject == null ? {} : oldObject.metadata.?annotations.orValue({})"


def _ann_set(key: str, new: str = "variables.newAnn", old: str = "variables.oldAnn") -> str:
    """CEL: annotation ``key`` is present in the new object and absent or different in the old one."""
    k = _lit(key)
    return f"({k} in {new} && (!({k} in {old}) || {old}[{k}] != {new}[{k}]))"


def _approval_field(obj: str, field: str) -> str:
    return f"{obj}.?status.?approval.?{field}.orValue('')"


ANNOTATION_VARIABLES: list[dict[str, str]] = [
    {"name": "newAnn", "expression": _NEW_ANN},
    {"name": "oldAnn", "expression": _OLD_ANN},
    {"name": "approvedSet", "expression": _ann_set(ap.ANN_APPROVED)},
    {"name": "decisionAnnSet",
     "expression": _list(_DECISION_KEYS) + ".exists(k, k in variables.newAnn && (!(k in variables.oldAnn) || "
                   "variables.oldAnn[k] != variables.newAnn[k]))"},
    {"name": "deciderAnnSet", "expression": _ann_set(ap.ANN_DECIDED_BY)},
]


def _status_changed(fields: tuple[str, ...]) -> str:
    return " || ".join(f"{_approval_field('object', f)} != "
                       f"(oldObject == null ? '' : {_approval_field('oldObject', f)})" for f in fields)


STATUS_VARIABLES: list[dict[str, str]] = [
    {"name": "statusDecisionSet", "expression": _status_changed(DECISION_STATUS_FIELDS)},
    {"name": "statusDeciderSet", "expression": _status_changed(("decidedBy",))},
]


def permission_message() -> str:
    """messageExpression of a decision refused for lack of the approve verb."""
    return (f"'user \"' + {_USER} + '\" may not decide the approval of agentrun ' + request.namespace + '/' + "
            f"request.name + ': deciding an approval needs the \"{ap.APPROVE_VERB}\" verb on {RESOURCE} in "
            f"namespace ' + request.namespace + ' (role {APPROVER_CLUSTERROLE}); patch alone is not enough'")


# ------------------------------------------------------------------------------- the policies

def _meta(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {"app.kubernetes.io/part-of": "agentrun"},
        "annotations": {"agentrun.dev/generated-by": "agentrun crd --admission (operator/agentrun/api/admission.py)"},
    }


def _rules(resources: list[str]) -> dict[str, Any]:
    return {"resourceRules": [{
        "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": resources,
    }]}


def decisions_policy() -> dict[str, Any]:
    """Who may decide, and that the recorded decider is the authenticated user."""
    ann_route, st_route = ON_MAIN, ON_STATUS
    decider = _lit(ap.ANN_DECIDED_BY)
    group_msg = (f"'agentrun ' + request.namespace + '/' + request.name + ' is decided by the members of group ' + "
                 f"variables.ownerGroup + ' (spec.approval.owner \"{OWNER_GROUP_PREFIX}' + variables.ownerGroup + "
                 f"'\"); user \"' + {_USER} + '\" is not one'")
    validations = [
        {
            "expression": f"!({ann_route}) || !variables.decisionAnnSet || variables.canApprove",
            "messageExpression": permission_message(),
            "reason": "Forbidden",
        },
        {
            "expression": f"!({st_route}) || !variables.statusDecisionSet || variables.isOperator || "
                          "variables.canApprove",
            "messageExpression": permission_message(),
            "reason": "Forbidden",
        },
        {
            # checked only once the permission holds, so an unauthorized user sees one message
            "expression": f"!({ann_route}) || !variables.approvedSet || !variables.canApprove || "
                          f"variables.newAnn[?{decider}].orValue('') == {_USER}",
            "messageExpression": f"'the annotation {ap.ANN_DECIDED_BY} must be your authenticated user name \"' + "
                                 f"{_USER} + '\" when you set {ap.ANN_APPROVED}: the API server records who "
                                 f"decides (agentrun approve sets it for you)'",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({ann_route}) || !variables.deciderAnnSet || variables.approvedSet",
            "message": f"the annotation {ap.ANN_DECIDED_BY} is recorded with a decision ({ap.ANN_APPROVED}) and "
                       "cannot be set or changed on its own",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({st_route}) || !variables.statusDecisionSet || variables.isOperator || "
                          f"!variables.canApprove || {_approval_field('object', 'decidedBy')} == {_USER}",
            "messageExpression": f"'status.approval.decidedBy must be your authenticated user name \"' + {_USER} + "
                                 "'\" when you set status.approval.decision: the API server records who decides'",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({st_route}) || !variables.statusDeciderSet || variables.isOperator || "
                          "variables.statusDecisionSet",
            "message": "status.approval.decidedBy is recorded with a decision (status.approval.decision) and "
                       "cannot be set or changed on its own",
            "reason": "Forbidden",
        },
        {
            # spec.approval.owner "group:NAME": only its members decide (the operator copying one is not deciding)
            "expression": f"variables.ownerGroup == '' || !((({ann_route}) && variables.decisionAnnSet) || "
                          f"(({st_route}) && variables.statusDecisionSet)) || variables.isOperator || "
                          "variables.ownerGroup in request.userInfo.?groups.orValue([])",
            "messageExpression": group_msg,
            "reason": "Forbidden",
        },
    ]
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(VAP_DECISIONS),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _rules([PLURAL, f"{PLURAL}/status"]),
            "variables": [
                *ANNOTATION_VARIABLES,
                *STATUS_VARIABLES,
                {"name": "ownerGroup",
                 "expression": f"object.spec.?approval.?owner.orValue('').startsWith({_lit(OWNER_GROUP_PREFIX)}) ? "
                               f"object.spec.approval.owner.substring({len(OWNER_GROUP_PREFIX)}) : ''"},
                {"name": "canApprove", "expression": CAN_APPROVE},
                {"name": "isOperator", "expression": IS_OPERATOR},
            ],
            "validations": validations,
        },
    }


def operator_status_fields() -> tuple[list[str], list[str]]:
    """(status fields, status.approval fields) that only the operator may change: every field of
    the generated CRD's status schema except :data:`USER_STATUS_FIELDS` of the approval."""
    status = openapi_schema()["properties"]["status"]["properties"]
    top = [f for f in status if f != "approval"]
    approval = [f for f in status["approval"]["properties"] if f not in USER_STATUS_FIELDS]
    return top, approval


def _unchanged(path: str) -> str:
    """CEL: the optional field at ``status.<path>`` is the same in object and oldObject."""
    chain = "".join(f".?{p}" for p in path.split("."))
    return f"(oldObject == null || object.?status{chain} == oldObject.?status{chain})"


def status_policy() -> dict[str, Any]:
    """Status fields other than the decision are the operator's."""
    top, approval = operator_status_fields()
    allowed = ", ".join(f"status.approval.{f}" for f in USER_STATUS_FIELDS)
    validations = []
    for path in [*top, *(f"approval.{f}" for f in approval)]:
        validations.append({
            "expression": _unchanged(path),
            "messageExpression": f"'status.{path} is written only by the agentrun operator (the \"{OPERATE_VERB}\" "
                                 f"verb on {PLURAL}/status, which the chart grants to its ServiceAccount); user \"' + "
                                 f"{_USER} + '\" may change only {allowed}'",
            "reason": "Forbidden",
        })
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(VAP_STATUS),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _rules([f"{PLURAL}/status"]),
            "matchConditions": [
                {"name": "status-subresource", "expression": ON_STATUS},
                {"name": "not-the-operator", "expression": "!" + IS_OPERATOR},
            ],
            "validations": validations,
        },
    }


def _vap_binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(name),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def stamp_annotation_policy() -> dict[str, Any]:
    """Stamp the authenticated user into the decider annotation when ``approved`` is set."""
    return {
        "apiVersion": MAP_API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _meta(MAP_ANNOTATION),
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": _rules([PLURAL]),
            "matchConditions": [
                {"name": "approved-set", "expression": _ann_set(ap.ANN_APPROVED, f"({_NEW_ANN})", f"({_OLD_ANN})")},
            ],
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {
                    "expression": f"Object{{metadata: Object.metadata{{annotations: {{{_lit(ap.ANN_DECIDED_BY)}: "
                                  f"{_USER}}}}}}}",
                },
            }],
        },
    }


def stamp_status_policy() -> dict[str, Any]:
    """Stamp the authenticated user into status.approval.decidedBy when a non-operator decides."""
    return {
        "apiVersion": MAP_API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _meta(MAP_STATUS),
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": _rules([f"{PLURAL}/status"]),
            "matchConditions": [
                {"name": "status-subresource", "expression": ON_STATUS},
                {"name": "decision-set", "expression": _status_changed(DECISION_STATUS_FIELDS)},
                {"name": "not-the-operator", "expression": "!" + IS_OPERATOR},
            ],
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {
                    "expression": f"Object{{status: Object.status{{approval: Object.status.approval{{decidedBy: "
                                  f"{_USER}}}}}}}",
                },
            }],
        },
    }


def _map_binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": MAP_API,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": _meta(name),
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": NO_STAMP_LABEL, "operator": "NotIn", "values": [NO_STAMP_VALUE]},
            ]}},
        },
    }


def validating_documents() -> list[dict[str, Any]]:
    return stamped([decisions_policy(), _vap_binding(VAP_DECISIONS), status_policy(), _vap_binding(VAP_STATUS)])


def mutating_documents() -> list[dict[str, Any]]:
    return stamped([stamp_annotation_policy(), _map_binding(MAP_ANNOTATION), stamp_status_policy(),
                    _map_binding(MAP_STATUS)])


FILES: Final = {
    "validating": "agentrun.dev_admission-policies.yaml",
    "mutating": "agentrun.dev_admission-mutating.yaml",
}


def render(kind: str) -> str:
    """The YAML text of ``crds/`` :data:`FILES` ``[kind]`` (``validating`` or ``mutating``)."""
    docs = validating_documents() if kind == "validating" else mutating_documents()
    need = "1.30 (ValidatingAdmissionPolicy)" if kind == "validating" else "1.36 (MutatingAdmissionPolicy)"
    header = (f"# GENERATED by `agentrun crd --admission {kind}` from operator/agentrun/api/admission.py and "
              "approval.py: do not edit.\n"
              f"# Needs Kubernetes >= {need}. What these guarantee: docs/security.md.\n")
    return header + "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
                            for d in docs)
