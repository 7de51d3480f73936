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
* :data:`VAP_GUARD` (ValidatingAdmissionPolicy): a spec change that would change what an approved
  or a future gated call does needs the approve verb (a gated tool's ``requiresApproval`` turned
  off, its ``http`` url/method/headersSecretRef, ``parameters`` or ``sideEffects`` changed, the tool
  removed; ``spec.agent.image``; ``spec.approval.owner``; ``approvers`` lowered;
  ``distinctFromCreator`` turned off); the creator annotation :data:`~agentrun.api.approval.ANN_CREATED_BY`
  is the requesting user at CREATE and never changes afterwards.
* :data:`VAP_AGENT_GUARD` (ValidatingAdmissionPolicy): the same changes in an Agent whose runs follow
  its edits (``rollout: FollowLatest``), and turning FollowLatest on, need the approve verb on the
  namespace's AgentRuns (:func:`agent_guard_policy`).
* :data:`MAP_ANNOTATION` / :data:`MAP_STATUS` (MutatingAdmissionPolicy, Kubernetes >= 1.36):
  stamp the authenticated user into the decider field whenever a decision is set, overwriting
  whatever the client sent; so ``kubectl annotate agentrun X approved=true`` works as typed and
  records the real user. A namespace labelled :data:`NO_STAMP_LABEL`\\ ``=``\\ :data:`NO_STAMP_VALUE`
  is left out of the stamping (it gets the validating-only behaviour of clusters < 1.36).
  :data:`MAP_CREATOR` stamps the creator (:data:`~agentrun.api.approval.ANN_CREATED_BY`) at CREATE.

"The operator" is recognized by permission: the custom verb :data:`OPERATE_VERB` on
``agentruns/status``, which the chart grants only to the operator's ServiceAccount; and, where the
chart renders the policies, by name too: the variable :data:`OPERATOR_USERNAMES_VAR` of the
validating policies is ``[]`` in ``crds/`` (any holder of the verb is the operator; cluster-admin,
``system:masters``, passes every authorizer check) and the chart sets it to the ServiceAccount's
user name (``system:serviceaccount:NS:SA``), so a tenant holding ``*`` (and so ``operate``) is not
the operator there. Why both: docs/security.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import yaml

from . import approval as ap
from . import lifecycle as lc
from .crdgen import AGENT_PLURAL, GROUP, PLURAL, _Dumper, openapi_schema
from .policy_version import stamped

OPERATE_VERB: Final = "operate"
"""Custom RBAC verb on ``agentruns/status`` that identifies the operator: status fields other than
the decision may be changed only by a requester the authorizer allows this verb."""
APPROVER_CLUSTERROLE: Final = "agentrun-approver"
"""The chart's ClusterRole holding :data:`~agentrun.api.approval.APPROVE_VERB` (bind per namespace)."""

VAP_DECISIONS: Final = "agentrun-decisions"
VAP_STATUS: Final = "agentrun-status-owner"
VAP_GUARD: Final = "agentrun-approval-guard"
VAP_AGENT_GUARD: Final = "agentrun-agent-guard"
MAP_ANNOTATION: Final = "agentrun-stamp-decider"
MAP_STATUS: Final = "agentrun-stamp-decider-status"
MAP_CREATOR: Final = "agentrun-stamp-creator"
VAP_LIFECYCLE: Final = "agentrun-lifecycle"
MAP_RETRY: Final = "agentrun-stamp-retry-requester"
MAP_CANCEL: Final = "agentrun-stamp-canceller"

OPERATOR_USERNAMES_VAR: Final = "operatorUsernames"
"""Variable of :data:`VAP_DECISIONS` and :data:`VAP_STATUS`: a CEL list of the operator's user names.
``[]`` as generated (the ``operate`` verb alone identifies the operator); the chart's
templates/admission-policies.yaml sets it to ``["system:serviceaccount:<release ns>:<operator SA>"]``,
and then the operator is a requester with that name AND the verb."""

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
IS_OPERATOR_NAMED = (f"(size(variables.{OPERATOR_USERNAMES_VAR}) == 0 || "
                     f"{_USER} in variables.{OPERATOR_USERNAMES_VAR}) && {IS_OPERATOR}")
"""The operator: the operate verb, and its user name where the chart names it (:data:`OPERATOR_USERNAMES_VAR`)."""
OPERATOR_VARIABLES: list[dict[str, str]] = [
    {"name": OPERATOR_USERNAMES_VAR, "expression": "[]"},
    {"name": "isOperator", "expression": IS_OPERATOR_NAMED},
]

# Annotations whose setting or change is a decision (the decider annotation is the API server's).
_DECISION_KEYS = tuple(k for k in ap.DECISION_ANNOTATIONS if k != ap.ANN_DECIDED_BY)
# Annotations that qualify a decision (who, which call, why): removing one beside a pending
# `approved` changes that decision, so it needs the approve verb too.
_QUALIFIER_KEYS = tuple(k for k in ap.DECISION_ANNOTATIONS if k != ap.ANN_APPROVED)

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


def _needs_approve(what: str) -> str:
    """CEL text of ``what`` (a CEL string expression) followed by the approve-verb requirement."""
    return (f"{what} + ' needs the \"{ap.APPROVE_VERB}\" verb on {RESOURCE} in namespace ' + request.namespace + "
            f"' (role {APPROVER_CLUSTERROLE}); patch alone is not enough'")


def permission_message() -> str:
    """messageExpression of a decision refused for lack of the approve verb."""
    return _needs_approve(f"'user \"' + {_USER} + '\" may not decide the approval of agentrun ' + "
                          "request.namespace + '/' + request.name + ': deciding an approval'")


CHANGES_THE_CALL: Final = "that changes what an approved or a future gated call does"
CHANGES_WHO_DECIDES: Final = "that changes who may approve its calls"


def guard_message(field: str, what: str, why: str = CHANGES_THE_CALL) -> str:
    """messageExpression of a spec change refused for lack of the approve verb: ``field`` (CEL string
    expression) names the field, ``what`` (plain text) says what the change does, ``why`` why it matters."""
    return _needs_approve(f"{field} + ': ' + 'user \"' + {_USER} + '\" may not {what} in agentrun ' + "
                          f"request.namespace + '/' + request.name + ': {why} and'")


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


_PREFIX_LEN = len(OWNER_GROUP_PREFIX)
# The owner in force before the request: the old spec's (the new one on CREATE), and the owner
# recorded with the pending call (status.approval.owner, copied from the spec when the call started
# waiting). A decider must be a member of every one of them that names a group.
_OWNER_BEFORE = "(oldObject == null ? object : oldObject).spec.?approval.?owner.orValue('')"
_OWNER_PENDING = ("(oldObject == null ? '' : (oldObject.?status.?approval.?state.orValue('') == 'Pending' ? "
                  "oldObject.?status.?approval.?owner.orValue('') : ''))")
_CREATED_BY = _lit(ap.ANN_CREATED_BY)

DECISION_VARIABLES: list[dict[str, str]] = [
    {"name": "ownerGroups",
     "expression": f"[{_OWNER_BEFORE}, {_OWNER_PENDING}].filter(o, o.startsWith({_lit(OWNER_GROUP_PREFIX)}))"
                   f".map(o, o.substring({_PREFIX_LEN}))"},
    {"name": "missingGroups",
     "expression": "variables.ownerGroups.filter(g, !(g in request.userInfo.?groups.orValue([])))"},
    {"name": "ownerChanged",
     "expression": "oldObject != null && object.spec.?approval.?owner.orValue('') != "
                   "oldObject.spec.?approval.?owner.orValue('')"},
    # a decision by someone other than the operator (the operator copying one into status is not deciding)
    {"name": "decides",
     "expression": f"(({ON_MAIN}) && variables.decisionAnnSet) || "
                   f"(({ON_STATUS}) && variables.statusDecisionSet && !variables.isOperator)"},
    # the four-eyes rule and the creator of the run, both as they were before the request
    {"name": "distinctFromCreator",
     "expression": "(oldObject == null ? object : oldObject).spec.?approval.?distinctFromCreator.orValue(false)"},
    {"name": "creator",
     "expression": f"oldObject == null ? {_USER} : variables.oldAnn[?{_CREATED_BY}].orValue('')"},
    {"name": "qualifiersRemoved",
     "expression": f"({_lit(ap.ANN_APPROVED)} in variables.oldAnn && {_lit(ap.ANN_APPROVED)} in variables.newAnn) ? "
                   f"{_list(_QUALIFIER_KEYS)}.filter(k, k in variables.oldAnn && !(k in variables.newAnn)) : []"},
]


def decisions_policy() -> dict[str, Any]:
    """Who may decide, and that the recorded decider is the authenticated user."""
    ann_route, st_route = ON_MAIN, ON_STATUS
    decider = _lit(ap.ANN_DECIDED_BY)
    missing = "variables.missingGroups[0]"
    group_msg = (f"'agentrun ' + request.namespace + '/' + request.name + ' is decided by the members of group ' + "
                 f"{missing} + ' (' + ({_OWNER_BEFORE} == {_lit(OWNER_GROUP_PREFIX)} + {missing} ? "
                 "'spec.approval.owner' : 'status.approval.owner of the pending call') + "
                 f"' \"{OWNER_GROUP_PREFIX}' + {missing} + '\"); user \"' + {_USER} + '\" is not one'")
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
            # removing who/which call/why beside a pending approved=true changes that decision
            "expression": f"!({ann_route}) || size(variables.qualifiersRemoved) == 0 || variables.canApprove",
            "messageExpression": _needs_approve(
                f"'user \"' + {_USER} + '\" may not remove the annotation ' + variables.qualifiersRemoved.join(', ') + "
                f"' of the pending decision {ap.ANN_APPROVED}=' + variables.oldAnn[{_lit(ap.ANN_APPROVED)}] + "
                "' on agentrun ' + request.namespace + '/' + request.name + ': changing a decision'"),
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
            # who may decide is read from the owner before the request, so the two cannot come together
            "expression": f"!({ann_route}) || !variables.decisionAnnSet || !variables.ownerChanged",
            "message": "a decision (annotation approved, reason or call binding) and a change of spec.approval.owner "
                       "cannot be made in one request: who may decide is read from the owner before the request; "
                       f"change the owner first (that needs the \"{ap.APPROVE_VERB}\" verb), then decide",
            "reason": "Forbidden",
        },
        {
            # spec.approval.owner "group:NAME" (as it was before the request, and as recorded with the
            # pending call): only its members decide
            "expression": "!variables.decides || size(variables.missingGroups) == 0",
            "messageExpression": group_msg,
            "reason": "Forbidden",
        },
        {
            # four eyes: the creator may not decide
            "expression": "!variables.decides || !variables.distinctFromCreator || (variables.creator != '' && "
                          f"variables.creator != {_USER})",
            "messageExpression": f"variables.creator == '' ? 'spec.approval.distinctFromCreator: the creator of "
                                 "agentrun ' + request.namespace + '/' + request.name + ' is not recorded (annotation "
                                 f"{ap.ANN_CREATED_BY}), so no decision can be told apart from one by the creator' : "
                                 "'spec.approval.distinctFromCreator: the creator of agentrun ' + request.namespace + "
                                 f"'/' + request.name + ' may not decide its approvals (four eyes); user \"' + {_USER} + "
                                 f"'\" created it (annotation {ap.ANN_CREATED_BY})'",
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
                {"name": "canApprove", "expression": CAN_APPROVE},
                *OPERATOR_VARIABLES,
                *DECISION_VARIABLES,
            ],
            "validations": validations,
        },
    }


# What decides what a gated call does (issue 29): changing one of these on a tool that has
# requiresApproval true in the old object needs the approve verb. (CEL comparing the old tool t with
# the new tool n of the same name; the field's name as shown in the refusal; what the change does.)
# timeout, maxResultBytes and description are left out: they bound or describe the call, they do not
# change what it does or where it goes.
GATED_TOOL_FIELDS: Final = (
    ("requiresApproval", "!n.?requiresApproval.orValue(false)", "turn approval off (true to false)"),
    ("http.url", "n.http.url != t.http.url", "change the URL of a tool with requiresApproval"),
    ("http.method", "n.http.?method.orValue('POST') != t.http.?method.orValue('POST')",
     "change the method of a tool with requiresApproval"),
    ("http.headersSecretRef", "has(n.http.headersSecretRef) != has(t.http.headersSecretRef) || "
     "(has(t.http.headersSecretRef) && n.http.headersSecretRef != t.http.headersSecretRef)",
     "change the headers Secret of a tool with requiresApproval"),
    ("parameters", "has(n.parameters) != has(t.parameters) || (has(t.parameters) && n.parameters != t.parameters)",
     "change the parameters of a tool with requiresApproval"),
    ("sideEffects", "n.?sideEffects.orValue(true) != t.?sideEffects.orValue(true)",
     "change sideEffects of a tool with requiresApproval"),
)


#: The fields of an MCP server with requiresApproval patterns that decide what its gated calls do:
#: (field, CEL true when the new server ``n`` changed it against the old ``s``, what the change does).
#: Patterns may be added to requiresApproval (more calls gated), not removed.
GATED_MCP_FIELDS: Final = (
    ("url", "n.url != s.url", "change the URL of an MCP server with requiresApproval"),
    ("headersSecretRef", "has(n.headersSecretRef) != has(s.headersSecretRef) || "
     "(has(s.headersSecretRef) && n.headersSecretRef != s.headersSecretRef)",
     "change the headers Secret of an MCP server with requiresApproval"),
    ("requiresApproval", "!s.requiresApproval.all(p, p in n.?requiresApproval.orValue([]))",
     "remove a requiresApproval pattern of an MCP server"),
    ("sideEffects", "n.?sideEffects.orValue(['*']) != s.?sideEffects.orValue(['*'])",
     "change sideEffects of an MCP server with requiresApproval"),
)


def _gated_var(field: str) -> str:
    """The variable listing the gated tools whose ``field`` changed: ``http.url`` -> ``gatedHttpUrl``."""
    return "gated" + "".join(p[0].upper() + p[1:] for p in field.split("."))


Rule = Callable[..., dict[str, Any]]


def _gated_parts(base: str, shown: str, rule: Rule) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The variables and validations guarding the gated tools and MCP servers of an agent definition
    at ``base`` under ``object``/``oldObject`` (``.spec.?agent`` in a run, ``.spec`` in an Agent),
    shown in refusals as ``shown`` (``spec.agent``, ``spec``); ``rule(expr, field, what)`` builds one
    validation."""
    def at(obj: str, field: str) -> str:
        return f"{obj}{base}.?{field}.orValue([])"

    tools_changed = f"oldObject != null && {at('object', 'tools')} != {at('oldObject', 'tools')}"
    variables: list[dict[str, str]] = [
        {"name": "oldGated",
         "expression": f"!({tools_changed}) ? [] : "
                       f"{at('oldObject', 'tools')}.filter(t, t.?requiresApproval.orValue(false))"},
        {"name": "newTools", "expression": at("object", "tools")},
        {"name": "gatedRemoved",
         "expression": "variables.oldGated.filter(t, !variables.newTools.exists(n, n.name == t.name)).map(t, t.name)"},
    ]
    for field, changed, _ in GATED_TOOL_FIELDS:
        variables.append({
            "name": _gated_var(field),
            "expression": f"variables.oldGated.filter(t, variables.newTools.exists(n, n.name == t.name && ({changed})))"
                          ".map(t, t.name)",
        })
    mcp_changed = f"oldObject != null && {at('object', 'mcpServers')} != {at('oldObject', 'mcpServers')}"
    variables += [
        {"name": "oldGatedMcp",
         "expression": f"!({mcp_changed}) ? [] : {at('oldObject', 'mcpServers')}"
                       ".filter(s, size(s.?requiresApproval.orValue([])) > 0)"},
        {"name": "newMcp", "expression": at("object", "mcpServers")},
        {"name": "gatedMcpRemoved",
         "expression": "variables.oldGatedMcp.filter(s, !variables.newMcp.exists(n, n.name == s.name)).map(s, s.name)"},
    ]
    for field, changed, _ in GATED_MCP_FIELDS:
        variables.append({
            "name": _gated_var("mcp." + field),
            "expression": f"variables.oldGatedMcp.filter(s, variables.newMcp.exists(n, n.name == s.name && ({changed})))"
                          ".map(s, s.name)",
        })
    validations = [rule("size(variables.gatedRemoved) == 0",
                        f"variables.gatedRemoved.map(n, '{shown}.tools[' + n + ']').join(', ')",
                        "remove a tool with requiresApproval")]
    for field, _, what in GATED_TOOL_FIELDS:
        var = f"variables.{_gated_var(field)}"
        validations.append(rule(f"size({var}) == 0", f"{var}.map(n, '{shown}.tools[' + n + '].{field}').join(', ')",
                                what))
    validations.append(rule("size(variables.gatedMcpRemoved) == 0",
                            f"variables.gatedMcpRemoved.map(n, '{shown}.mcpServers[' + n + ']').join(', ')",
                            "remove an MCP server with requiresApproval"))
    for field, _, what in GATED_MCP_FIELDS:
        var = f"variables.{_gated_var('mcp.' + field)}"
        validations.append(rule(f"size({var}) == 0",
                                f"{var}.map(n, '{shown}.mcpServers[' + n + '].{field}').join(', ')", what))
    image = f"{base}.?image.orValue('')"
    validations.append(rule(f"oldObject == null || object{image} == oldObject{image}", f"'{shown}.image'",
                            "change the lap image"))
    return variables, validations


def _approval_rules(rule: Rule) -> list[dict[str, Any]]:
    """Validations guarding who decides (``spec.approval``: owner, approvers, distinctFromCreator),
    the same in a run and in an Agent (its runs' defaults)."""
    return [
        rule("!variables.ownerChanged", "'spec.approval.owner'", "change who decides", CHANGES_WHO_DECIDES),
        rule("oldObject == null || object.spec.?approval.?approvers.orValue(1) >= "
             "oldObject.spec.?approval.?approvers.orValue(1)",
             "'spec.approval.approvers'", "lower the number of approvers", CHANGES_WHO_DECIDES),
        rule("oldObject == null || !oldObject.spec.?approval.?distinctFromCreator.orValue(false) || "
             "object.spec.?approval.?distinctFromCreator.orValue(false)",
             "'spec.approval.distinctFromCreator'", "turn four eyes off (true to false)",
             CHANGES_WHO_DECIDES),
    ]


_OWNER_CHANGED = {"name": "ownerChanged", "expression": "oldObject != null && object.spec.?approval.?owner.orValue('')"
                  " != oldObject.spec.?approval.?owner.orValue('')"}


def guard_policy() -> dict[str, Any]:
    """Spec changes that would change what an approved or a future gated call does need the approve
    verb; the creator annotation is the API server's."""
    k = _CREATED_BY
    new_has, old_has = f"{k} in variables.newAnn", f"{k} in variables.oldAnn"

    def rule(expr: str, field: str, what: str, why: str = CHANGES_THE_CALL) -> dict[str, Any]:
        return {"expression": f"variables.canApprove || {expr}", "messageExpression": guard_message(field, what, why),
                "reason": "Forbidden"}

    gated_vars, gated_rules = _gated_parts(".spec.?agent", "spec.agent", rule)
    variables: list[dict[str, str]] = [
        *ANNOTATION_VARIABLES[:2],
        {"name": "canApprove", "expression": CAN_APPROVE},
        *gated_vars,
    ]
    old_owner = "oldObject.spec.?approval.?owner.orValue('')"
    variables += [
        _OWNER_CHANGED,
        {"name": "oldOwnerGroup",
         "expression": f"oldObject != null && {old_owner}.startsWith({_lit(OWNER_GROUP_PREFIX)}) ? "
                       f"{old_owner}.substring({_PREFIX_LEN}) : ''"},
    ]

    validations: list[dict[str, Any]] = [
        {
            # where the creator is stamped this holds trivially (the mutating policy ran first)
            "expression": f"oldObject != null || !({new_has}) || variables.newAnn[{k}] == {_USER}",
            "messageExpression": f"'the annotation {ap.ANN_CREATED_BY} must be your authenticated user name \"' + "
                                 f"{_USER} + '\" when you create an AgentRun: the API server records who created "
                                 "the run (leave it out where it is stamped, Kubernetes >= 1.36)'",
            "reason": "Forbidden",
        },
        {
            "expression": f"oldObject == null || (({old_has}) == ({new_has}) && "
                          f"(!({old_has}) || variables.oldAnn[{k}] == variables.newAnn[{k}]))",
            "message": f"the annotation {ap.ANN_CREATED_BY} is recorded by the API server when the run is created "
                       "and cannot be added, changed or removed afterwards",
            "reason": "Forbidden",
        },
        {
            "expression": f"!object.spec.?approval.?distinctFromCreator.orValue(false) || {new_has}",
            "message": f"spec.approval.distinctFromCreator needs the creator recorded in the annotation "
                       f"{ap.ANN_CREATED_BY} at creation (stamped by the API server on Kubernetes >= 1.36; "
                       "elsewhere set it to your own user name when you create the run); this run has none",
            "reason": "Forbidden",
        },
    ]
    validations += gated_rules
    validations += _approval_rules(rule)
    validations += [
        {
            # four eyes cannot be turned off by the one person it keeps from deciding
            "expression": "oldObject == null || !oldObject.spec.?approval.?distinctFromCreator.orValue(false) || "
                          f"object.spec.?approval.?distinctFromCreator.orValue(false) || "
                          f"variables.oldAnn[?{k}].orValue('') != {_USER}",
            "messageExpression": f"'spec.approval.distinctFromCreator: user \"' + {_USER} + '\" created agentrun ' + "
                                 "request.namespace + '/' + request.name + ' and may not turn four eyes off for it "
                                 f"(annotation {ap.ANN_CREATED_BY}); another approver can'",
            "reason": "Forbidden",
        },
        {
            # a group owner is handed on only by one of its members (the approve verb alone is not enough)
            "expression": "!variables.ownerChanged || variables.oldOwnerGroup == '' || "
                          "variables.oldOwnerGroup in request.userInfo.?groups.orValue([])",
            "messageExpression": f"'spec.approval.owner: agentrun ' + request.namespace + '/' + request.name + "
                                 f"' is decided by the members of group ' + variables.oldOwnerGroup + "
                                 f"' (spec.approval.owner \"{OWNER_GROUP_PREFIX}' + variables.oldOwnerGroup + "
                                 f"'\"); only they may change its owner, and user \"' + {_USER} + '\" is not one'",
            "reason": "Forbidden",
        },
    ]
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(VAP_GUARD),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _rules([PLURAL]),
            "matchConditions": [{"name": "main-resource", "expression": ON_MAIN}],
            "variables": variables,
            "validations": validations,
        },
    }


_FOLLOWS = "object.spec.?rollout.orValue('Pinned') == 'FollowLatest'"
CAN_APPROVE_IN_NAMESPACE = (f"authorizer.group({_lit(GROUP)}).resource({_lit(PLURAL)}).namespace(request.namespace)"
                            f".check({_lit(ap.APPROVE_VERB)}).allowed()")
"""The approve verb on every AgentRun of the namespace (an Agent's edit reaches all of its runs)."""
FOLLOWS_WHY: Final = ("its runs take the new definition at their next lap (rollout FollowLatest), so that changes what "
                      "an approved or a future gated call does")


def agent_guard_message(field: str, what: str, why: str = FOLLOWS_WHY) -> str:
    """messageExpression of an Agent edit refused for lack of the approve verb."""
    return _needs_approve(f"{field} + ': ' + 'user \"' + {_USER} + '\" may not {what} in Agent ' + "
                          f"request.namespace + '/' + request.name + ': {why} and'")


def agent_guard_policy() -> dict[str, Any]:
    """An edit of an Agent whose runs follow it (``rollout: FollowLatest``) reaches runs in flight at
    their next lap, so the fields that decide what a gated call does, or who decides it, change only
    with the approve verb on the namespace's AgentRuns, as in a run (:func:`guard_policy`); and so does
    turning FollowLatest on. A Pinned Agent's edits reach only runs not started yet, whose creators
    chose it. An Agent deleted and created again is another object, which runs do not follow
    (``controller/decide/agents.py``)."""
    def rule(expr: str, field: str, what: str, why: str = FOLLOWS_WHY) -> dict[str, Any]:
        return {"expression": f"variables.canApprove || {expr}",
                "messageExpression": agent_guard_message(field, what, why), "reason": "Forbidden"}

    gated_vars, gated_rules = _gated_parts(".spec", "spec", rule)
    validations = [
        rule("oldObject.spec.?rollout.orValue('Pinned') == 'FollowLatest'", "'spec.rollout'",
             "turn FollowLatest on",
             "its runs in flight would take its current definition at their next lap, which changes what an "
             "approved or a future gated call does"),
        *gated_rules,
        *_approval_rules(rule),
    ]
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(VAP_AGENT_GUARD),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [AGENT_PLURAL],
            }]},
            "matchConditions": [{"name": "main-resource", "expression": ON_MAIN},
                                {"name": "follow-latest", "expression": _FOLLOWS}],
            "variables": [{"name": "canApprove", "expression": CAN_APPROVE_IN_NAMESPACE}, *gated_vars,
                          _OWNER_CHANGED],
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
            "expression": f"variables.isOperator || {_unchanged(path)}",
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
            ],
            # the operator is recognized in variables (matchConditions cannot read them), so that the
            # chart can name its ServiceAccount in one place (OPERATOR_USERNAMES_VAR)
            "variables": OPERATOR_VARIABLES,
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


def _stamp_annotation(key: str) -> list[dict[str, Any]]:
    """The mutation that records the authenticated user in annotation ``key``.

    A JSON patch, not an apply configuration: the API server applies a JSON patch to the object as
    sent, while an apply configuration first converts the object to the schema's types, and so
    answers a malformed AgentRun (``maxLaps: "ten"``) with the policy's conversion error instead of
    the schema's message naming the field. Every stamping policy uses this one form."""
    lit = _lit(key)
    return [{
        "patchType": "JSONPatch",
        "jsonPatch": {
            "expression": (
                f"has(object.metadata.annotations) ? [JSONPatch{{op: 'add', path: '/metadata/annotations/' + "
                f"jsonpatch.escapeKey({lit}), value: {_USER}}}] : [JSONPatch{{op: 'add', "
                f"path: '/metadata/annotations', value: {{{lit}: {_USER}}}}}]"
            ),
        },
    }]


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
            "mutations": _stamp_annotation(ap.ANN_DECIDED_BY),
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
            # (a JSON patch, as _stamp_annotation says; the match conditions make status.approval exist)
            "mutations": [{
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": f"[JSONPatch{{op: 'add', path: '/status/approval/decidedBy', value: {_USER}}}]"},
            }],
        },
    }


def stamp_creator_policy() -> dict[str, Any]:
    """Stamp the authenticated user into the creator annotation at CREATE, overwriting what the client sent."""
    return {
        "apiVersion": MAP_API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _meta(MAP_CREATOR),
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE"], "resources": [PLURAL],
            }]},
            "mutations": _stamp_annotation(ap.ANN_CREATED_BY),
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


# ------------------------------------------------------------------ the lifecycle (issue 31)

_RETRY_KEYS = (lc.ANN_RETRY, lc.ANN_RETRY_FROM_LAP)
CAN_RETRY = f"{_AUTHZ}.check({_lit(lc.RETRY_VERB)}).allowed()"
_CANCEL_SET = ("object.?spec.?cancel.hasValue() && "
               "(oldObject == null || !oldObject.?spec.?cancel.hasValue())")

LIFECYCLE_VARIABLES: list[dict[str, str]] = [
    {"name": "newAnn", "expression": _NEW_ANN},
    {"name": "oldAnn", "expression": _OLD_ANN},
    {"name": "retrySet",
     "expression": _list(_RETRY_KEYS) + ".exists(k, k in variables.newAnn && (!(k in variables.oldAnn) || "
                   "variables.oldAnn[k] != variables.newAnn[k]))"},
    {"name": "requesterSet", "expression": _ann_set(lc.ANN_RETRY_REQUESTED_BY)},
    {"name": "cancelSet", "expression": _CANCEL_SET},
    {"name": "cancellerSet", "expression": _ann_set(lc.ANN_CANCELLED_BY)},
]


def retry_permission_message() -> str:
    """messageExpression of a retry refused for lack of the retry verb."""
    return (f"'user \"' + {_USER} + '\" may not retry agentrun ' + request.namespace + '/' + request.name + "
            f"': annotation {lc.ANN_RETRY} needs the \"{lc.RETRY_VERB}\" verb on {RESOURCE} in namespace ' + "
            f"request.namespace + ' (role {lc.RETRIER_CLUSTERROLE}); patch alone is not enough'")


def lifecycle_policy() -> dict[str, Any]:
    """A retry needs the retry verb and records the requester; a cancel records who cancelled."""
    requester, canceller = _lit(lc.ANN_RETRY_REQUESTED_BY), _lit(lc.ANN_CANCELLED_BY)
    validations = [
        {
            "expression": "!variables.retrySet || variables.canRetry",
            "messageExpression": retry_permission_message(),
            "reason": "Forbidden",
        },
        {
            # checked once the permission holds, so an unauthorized user sees one message
            "expression": f"!variables.retrySet || !variables.canRetry || "
                          f"variables.newAnn[?{requester}].orValue('') == {_USER}",
            "messageExpression": f"'the annotation {lc.ANN_RETRY_REQUESTED_BY} must be your authenticated user name \"' + "
                                 f"{_USER} + '\" when you set {lc.ANN_RETRY}: the API server records who retries "
                                 f"(agentrun retry sets it for you)'",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.requesterSet || variables.retrySet",
            "messageExpression": f"'the annotation {lc.ANN_RETRY_REQUESTED_BY} is recorded by the API server with "
                                 f"{lc.ANN_RETRY}; user \"' + {_USER} + '\" may not set or change it on its own'",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.retrySet || !object.?spec.?cancel.hasValue()",
            "message": f"spec.cancel: a retry ({lc.ANN_RETRY}) of a cancelled run removes spec.cancel in the same "
                       "patch (agentrun retry does)",
            "reason": "Invalid",
        },
        {
            "expression": f"!variables.cancelSet || variables.newAnn[?{canceller}].orValue('') == {_USER}",
            "messageExpression": f"'spec.cancel: the annotation {lc.ANN_CANCELLED_BY} must be your authenticated user "
                                 f"name \"' + {_USER} + '\" when you set spec.cancel: the API server records who "
                                 "cancels (agentrun cancel sets it for you)'",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.cancellerSet || variables.cancelSet",
            "messageExpression": f"'the annotation {lc.ANN_CANCELLED_BY} is recorded by the API server when spec.cancel "
                                 f"is set; user \"' + {_USER} + '\" may not set or change it on its own'",
            "reason": "Forbidden",
        },
    ]
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(VAP_LIFECYCLE),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _rules([PLURAL]),
            "matchConditions": [{"name": "main-resource", "expression": ON_MAIN}],
            "variables": [*LIFECYCLE_VARIABLES, {"name": "canRetry", "expression": CAN_RETRY}],
            "validations": validations,
        },
    }


def _stamp(name: str, condition: str, key: str) -> dict[str, Any]:
    return {
        "apiVersion": MAP_API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _meta(name),
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": _rules([PLURAL]),
            "matchConditions": [{"name": "main-resource", "expression": ON_MAIN},
                                {"name": "requested", "expression": condition}],
            "mutations": _stamp_annotation(key),
        },
    }


def stamp_retry_policy() -> dict[str, Any]:
    """Stamp the authenticated user into the retry requester annotation when a retry is requested."""
    cond = " || ".join(_ann_set(k, f"({_NEW_ANN})", f"({_OLD_ANN})") for k in _RETRY_KEYS)
    return _stamp(MAP_RETRY, cond, lc.ANN_RETRY_REQUESTED_BY)


def stamp_cancel_policy() -> dict[str, Any]:
    """Stamp the authenticated user into the canceller annotation when spec.cancel appears."""
    return _stamp(MAP_CANCEL, _CANCEL_SET, lc.ANN_CANCELLED_BY)


def validating_documents() -> list[dict[str, Any]]:
    return stamped([decisions_policy(), _vap_binding(VAP_DECISIONS), status_policy(), _vap_binding(VAP_STATUS),
                    guard_policy(), _vap_binding(VAP_GUARD), lifecycle_policy(), _vap_binding(VAP_LIFECYCLE),
                    agent_guard_policy(), _vap_binding(VAP_AGENT_GUARD)])


def mutating_documents() -> list[dict[str, Any]]:
    return stamped([stamp_annotation_policy(), _map_binding(MAP_ANNOTATION), stamp_status_policy(),
                    _map_binding(MAP_STATUS), stamp_creator_policy(), _map_binding(MAP_CREATOR),
                    stamp_retry_policy(), _map_binding(MAP_RETRY), stamp_cancel_policy(), _map_binding(MAP_CANCEL)])


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
