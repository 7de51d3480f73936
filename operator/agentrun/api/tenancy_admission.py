"""Generate the tenancy guardrails for the API server from the contract in ``api/tenancy.py``.

``agentrun crd --tenancy crd``    > ``crds/agentrun.dev_agentrunpolicies.yaml`` (the AgentRunPolicy CRD)
``agentrun crd --tenancy policy`` > ``crds/agentrun.dev_tenancy-policy.yaml`` (ValidatingAdmissionPolicy
                                    :data:`~agentrun.api.tenancy.VAP_NAME` + its default binding)
``agentrun crd --tenancy local``  > ``e2e/tenancy-local-policy.yaml`` (the AgentRunPolicy ``default``
                                    of the local control plane: ``make dev`` and the e2e tests)

(``make crds``; ``make helm-crds`` copies the first two into the chart). The CEL builds the list of
violation messages exactly like :func:`agentrun.api.tenancy.check` (same order, same text), and one
validation refuses the request with all of them: ``AgentRunPolicy NAME: FIELD "VALUE" ... (AgentRunPolicy
rule RULE); ...``. The policy runs on create, and on updates that change ``.spec`` (so the operator's
finalizer and annotation writes of a run admitted under an older policy still pass).
"""

from __future__ import annotations

import json
from typing import Any, Final

import yaml
from pydantic import BaseModel

from . import addresses as a
from . import tenancy as t
from .crdgen import GROUP, PLURAL, _Dumper, structural, undocumented_fields
from .policy_version import stamped

VAP_API: Final = "admissionregistration.k8s.io/v1"
GENERATED_BY: Final = "agentrun crd --tenancy (operator/agentrun/api/tenancy_admission.py)"


def _lit(s: str) -> str:
    return json.dumps(s)


def _list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_lit(i) for i in items) + "]"


def _default(model: type[BaseModel], field: str) -> Any:
    f = model.model_fields[field]
    return f.get_default(call_default_factory=True)


def _param(section: str, model: type[BaseModel], field: str) -> str:
    """CEL: params.spec.<section>.<field alias>, or the model's default when unset."""
    alias = model.model_fields[field].alias or field
    dflt = _default(model, field)
    return f"params.?spec.?{section}.?{alias}.orValue({json.dumps(dflt)})"


def _q(expr: str) -> str:
    """CEL: a value quoted like tenancy.quote()."""
    n = t.MAX_VALUE_CHARS
    return f"('\"' + (size({expr}) <= {n} ? {expr} : {expr}.substring(0, {n}) + '...') + '\"')"


def _msg(field: str, value: str, detail: str, rule: str) -> str:
    """CEL: Violation.message of (field expr, value expr, detail expr, rule literal)."""
    return f"{field} + ' ' + {_q(value)} + ' ' + {detail} + {_lit(f' (AgentRunPolicy rule {rule})')}"


def _host_match(h: str, pats: str) -> str:
    return f"{pats}.exists(p, p == '*' || (p.startsWith('*.') ? {h}.endsWith(p.substring(1)) : {h} == p))"


def _in_cidrs(h: str, cidrs: str) -> str:
    return f"{cidrs}.exists(c, cidr(c).containsIP(ip({h})))"


def _url_message() -> str:
    """CEL over ``d`` ({f, v, s, h, k}): the first rule the URL breaks as a message, '' when it passes.
    ``k``: "url" (a model or tool URL), or for spec.checkpoint.endpoint "listed" (its origin is an
    exact entry of allowedEndpoints) or "any": like :func:`agentrun.api.tenancy._check_url`."""
    v = "variables"
    f, val, s, h = "d.f", "d.v", "d.s", "d.h"
    url, listed = "d.k == 'url'", "d.k == 'listed'"

    def m(detail: str, rule: str) -> str:
        return _msg(f, val, detail, rule)

    ip_branch = (
        f"{_in_cidrs(h, _list(a.ALWAYS_DENIED_CIDRS))} ? "
        + m(f"'has address ' + {h} + {_lit(': ' + a.ALWAYS_DENIED_DETAIL)}", "destinations.alwaysDenied")
        + f" : (!{v}.allowLoopback && {_in_cidrs(h, _list(a.LOOPBACK_CIDRS))}) ? "
        + m(f"'has loopback address ' + {h} + ', refused unless allowLoopback is true'", "destinations.allowLoopback")
        + f" : {_in_cidrs(h, v + '.apiServerCIDRs')} ? "
        + m(f"'has address ' + {h} + ' of the cluster\\'s API server, always refused'", "destinations.apiServerCIDRs")
        + f" : {_in_cidrs(h, v + '.deniedCIDRs')} ? "
        + m(f"'has address ' + {h} + ' in a denied range'", "destinations.deniedCIDRs")
        + f" : ({url} && !{_in_cidrs(h, v + '.allowedCIDRs')}) ? "
        + m(f"'has address ' + {h} + ', not in an allowed range'", "destinations.allowedCIDRs")
        + " : ''"
    )
    qh = _q(h)
    loopback = _host_match(h, _list(t.LOOPBACK_HOSTS))
    internal = (f"(!{h}.contains('.') || {_list(t.INTERNAL_DOMAINS)}.exists(x, {h} == x || {h}.endsWith('.' + x)) "
                f"|| {v}.internalDomains.exists(x, {h} == x || {h}.endsWith('.' + x)))")
    name_branch = (
        f"(!{h}.matches({_lit(t.HOST_RE)}) || {h}.matches({_lit(t.NUMERIC_HOST_RE)})) ? "
        + m(f"'has host ' + {qh} + ', which is neither an IP address nor a host name'", "destinations.hostForm")
        + f" : {h}.matches({_lit(t.EMBEDDED_IP_RE)}) ? "
        + m(f"'has host ' + {qh} + ', which embeds an IP address (wildcard DNS such as nip.io resolves it to that "
            "address)'", "destinations.hostForm")
        + f" : ({_host_match(h, _list(t.API_SERVER_HOSTS))} || {h}.startsWith({_lit(t.API_SERVER_HOST_PREFIX)})) ? "
        + m(f"'has host ' + {qh} + ', a name of the cluster\\'s API server, always refused'",
            "destinations.apiServerHosts")
        + f" : {_host_match(h, _list(t.METADATA_HOSTS))} ? "
        + m(f"'has host ' + {qh} + ', a cloud metadata service, always refused'", "destinations.metadataHosts")
        + f" : (!{v}.allowLoopback && {loopback}) ? "
        + m(f"'has loopback host ' + {qh} + ', refused unless allowLoopback is true'", "destinations.allowLoopback")
        + f" : (!{loopback} && !({listed}) && {internal} && !{_host_match(h, v + '.allowedInternalHosts')}) ? "
        + m(f"'has host ' + {qh} + {_lit(', ' + t.INTERNAL_DETAIL)}", "destinations.allowedInternalHosts")
        + f" : {_host_match(h, v + '.deniedHosts')} ? "
        + m(f"'has host ' + {qh} + ', which is denied'", "destinations.deniedHosts")
        + f" : ({url} && !{_host_match(h, v + '.allowedHosts')}) ? "
        + m(f"'has host ' + {qh} + ', which is not allowed'", "destinations.allowedHosts")
        + " : ''"
    )
    scheme_msg = m(f"'has scheme \"' + {s} + '\", not one of [' + {v}.schemes.join(', ') + ']'",
                   "destinations.schemes")
    return f"({url} && !({s} in {v}.schemes)) ? {scheme_msg} : isIP({h}) ? ({ip_branch}) : ({name_branch})"


TOOL_HOST: Final = "(isURL(x.http.url) ? url(x.http.url).getHostname().lowerAscii() : '')"
MCP_HOST: Final = "(isURL(x.url) ? url(x.url).getHostname().lowerAscii() : '')"


def variables() -> list[dict[str, str]]:
    Img, S, D, C, A = t.ImagePolicy, t.SecretPolicy, t.DestinationPolicy, t.CheckpointPolicy, t.ApprovalPolicy  # noqa: N806
    spec = "object.spec"
    # a run of an Agent (spec.agentRef) has no spec.agent: its definition is checked by the operator's
    # re-check of the copy it pins (controller/tenancy.py), not here
    tools = f"{spec}.?agent.?tools.orValue([])"
    mcp = f"{spec}.?agent.?mcpServers.orValue([])"
    url_info = ("{'f': string(u.f), 'v': string(u.v), 's': isURL(u.v) ? url(u.v).getScheme().lowerAscii() : "
                "(u.v.startsWith('https://') ? 'https' : u.v.startsWith('http://') ? 'http' : ''), "
                "'h': isURL(u.v) ? url(u.v).getHostname().lowerAscii() : '', 'k': 'url'}")
    ep = f"{spec}.checkpoint.endpoint"
    ep_host = f"url({ep}).getHostname().lowerAscii()"
    origin = (f"(isURL({ep}) ? url({ep}).getScheme().lowerAscii() + '://' + ({ep_host}.contains(':') ? "
              f"'[' + {ep_host} + ']' : {ep_host}) : '')")
    return [
        {"name": "imagePrefixes", "expression": _param("images", Img, "allowed_prefixes")},
        {"name": "imageDigests", "expression": _param("images", Img, "allowed_digests")},
        {"name": "secretNames", "expression": _param("secrets", S, "allowed_names")},
        {"name": "schemes", "expression": _param("destinations", D, "schemes")},
        {"name": "allowedHosts", "expression": _param("destinations", D, "allowed_hosts")},
        {"name": "allowedCIDRs", "expression": _param("destinations", D, "allowed_cidrs")},
        {"name": "deniedHosts", "expression": _param("destinations", D, "denied_hosts")},
        {"name": "deniedCIDRs", "expression": _param("destinations", D, "denied_cidrs")},
        {"name": "apiServerCIDRs", "expression": _param("destinations", D, "api_server_cidrs")},
        {"name": "allowLoopback", "expression": _param("destinations", D, "allow_loopback")},
        {"name": "internalDomains", "expression": _param("destinations", D, "internal_domains")},
        {"name": "allowedInternalHosts", "expression": _param("destinations", D, "allowed_internal_hosts")},
        {"name": "approvalHosts", "expression": _param("approval", A, "require_for_hosts")},
        {"name": "distinctFromCreator", "expression": _param("approval", A, "distinct_from_creator")},
        {"name": "endpoints", "expression": _param("checkpoint", C, "allowed_endpoints")},
        {"name": "uriPrefixes", "expression": _param("checkpoint", C, "allowed_uri_prefixes")},
        {"name": "maxLaps", "expression": "params.?spec.?budget.?maxLaps.orValue(0)"},
        {"name": "maxCost", "expression": "params.?spec.?budget.?maxCostUSD.orValue('')"},
        {"name": "imageViolations", "expression":
            f"!has({spec}.agent) || !has({spec}.agent.image) || variables.imagePrefixes.exists(p, p == '*' || "
            f"{spec}.agent.image.startsWith(p)) || {spec}.agent.image in variables.imageDigests ? [] : ["
            + _msg("'spec.agent.image'", f"{spec}.agent.image",
                   "'is not under an allowed prefix (images.allowedPrefixes) nor an allowed digest "
                   "(images.allowedDigests)'", "images") + "]"},
        {"name": "secretRefs", "expression":
            f"(has({spec}.agent) && has({spec}.agent.model.apiKeySecretRef) ? [{{'f': 'spec.agent.model.apiKeySecretRef.name', "
            f"'v': string({spec}.agent.model.apiKeySecretRef.name)}}] : []) + "
            f"{tools}.filter(x, has(x.http.headersSecretRef)).map(x, {{'f': 'spec.agent.tools[' + string(x.name) + "
            f"'].http.headersSecretRef.name', 'v': string(x.http.headersSecretRef.name)}}) + "
            f"{mcp}.filter(x, has(x.headersSecretRef)).map(x, {{'f': 'spec.agent.mcpServers[' + string(x.name) + "
            f"'].headersSecretRef.name', 'v': string(x.headersSecretRef.name)}}) + "
            f"(has({spec}.checkpoint) && has({spec}.checkpoint.credentialsSecretName) ? [{{'f': "
            f"'spec.checkpoint.credentialsSecretName', 'v': string({spec}.checkpoint.credentialsSecretName)}}] : [])"},
        {"name": "secretViolations", "expression":
            "variables.secretRefs.filter(r, !variables.secretNames.exists(p, p == '*' || (p.endsWith('*') ? "
            "r.v.startsWith(p.substring(0, size(p) - 1)) : r.v == p))).map(r, "
            + _msg("r.f", "r.v", "'is not an allowed Secret name'", "secrets.allowedNames") + ")"},
        {"name": "urls", "expression":
            f"(has({spec}.agent) && has({spec}.agent.model.baseURL) ? [{{'f': 'spec.agent.model.baseURL', 'v': "
            f"string({spec}.agent.model.baseURL)}}] : []) + {tools}.map(x, {{'f': 'spec.agent.tools[' + "
            "string(x.name) + '].http.url', 'v': string(x.http.url)}) + "
            f"{mcp}.map(x, {{'f': 'spec.agent.mcpServers[' + string(x.name) + '].url', 'v': string(x.url)}})"},
        {"name": "dests", "expression": f"variables.urls.map(u, {url_info})"},
        {"name": "urlViolations", "expression": f"variables.dests.map(d, {_url_message()}).filter(m, m != '')"},
        {"name": "endpointDests", "expression":
            f"!has({spec}.checkpoint) || !has({ep}) ? [] : [{{'f': 'spec.checkpoint.endpoint', 'v': string({ep}), "
            f"'s': '', 'h': isURL({ep}) ? {ep_host} : '', 'k': variables.endpoints.exists(e, e == {origin}) ? "
            "'listed' : 'any'}]"},
        {"name": "endpointViolations", "expression":
            f"variables.endpointDests.map(d, {_url_message()}).filter(m, m != '')"},
        {"name": "checkpointViolations", "expression":
            f"(size(variables.endpointViolations) > 0 ? variables.endpointViolations : "
            f"!has({spec}.checkpoint) || !has({ep}) || variables.endpoints.exists(e, e == '*' || e == {origin}) "
            "? [] : ["
            + _msg("'spec.checkpoint.endpoint'", ep,
                   f"'is at ' + {_q(origin)} + ', not an allowed checkpoint endpoint (the operator connects to it)'",
                   "checkpoint.allowedEndpoints") + "]) + "
            f"(!has({spec}.checkpoint) || !has({spec}.checkpoint.uri) || variables.uriPrefixes.exists(p, "
            f"{spec}.checkpoint.uri == p || {spec}.checkpoint.uri.startsWith(p.endsWith('/') ? p : p + '/')) ? [] : ["
            + _msg("'spec.checkpoint.uri'", f"{spec}.checkpoint.uri", "'is not under an allowed bucket prefix'",
                   "checkpoint.allowedURIPrefixes") + "])"},
        {"name": "laps", "expression": f"{spec}.?budget.?maxLaps.orValue({t.DEFAULT_MAX_LAPS})"},
        {"name": "budgetViolations", "expression":
            "(variables.maxLaps == 0 || variables.laps <= variables.maxLaps ? [] : ["
            + _msg("'spec.budget.maxLaps'", "string(variables.laps)",
                   "'is above the ceiling ' + string(variables.maxLaps)", "budget.maxLaps") + "]) + "
            f"(variables.maxCost == '' ? [] : !has({spec}.budget) || !has({spec}.budget.maxCostUSD) ? ["
            + _msg("'spec.budget.maxCostUSD'", "''",
                   "'must be set: the policy caps a run\\'s cost at ' + variables.maxCost + ' USD'",
                   "budget.maxCostUSD")
            + f"] : double({spec}.budget.maxCostUSD) > double(variables.maxCost) ? ["
            + _msg("'spec.budget.maxCostUSD'", f"{spec}.budget.maxCostUSD",
                   "'is above the ceiling ' + variables.maxCost + ' USD'", "budget.maxCostUSD") + "] : [])"},
        {"name": "approvalViolations", "expression":
            f"{tools}.filter(x, !x.?requiresApproval.orValue(false) && "
            + _host_match(TOOL_HOST, "variables.approvalHosts") + ").map(x, "
            + _msg("'spec.agent.tools[' + string(x.name) + '].requiresApproval'", "'false'",
                   "'must be true: calls to host ' + " + _q(TOOL_HOST) + " + ' need approval'",
                   "approval.requireForHosts") + ") + "
            f"{mcp}.filter(x, !('*' in x.?requiresApproval.orValue([])) && "
            + _host_match(MCP_HOST, "variables.approvalHosts") + ").map(x, "
            + _msg("'spec.agent.mcpServers[' + string(x.name) + '].requiresApproval'",
                   "'[' + x.?requiresApproval.orValue([]).join(', ') + ']'",
                   "'must hold \"*\": calls to host ' + " + _q(MCP_HOST) + " + ' need approval'",
                   "approval.requireForHosts") + ") + "
            f"(variables.distinctFromCreator && !{spec}.?approval.?distinctFromCreator.orValue(false) ? ["
            + _msg("'spec.approval.distinctFromCreator'", "'false'",
                   "'must be true: the policy requires that a run\\'s creator not decide its approvals'",
                   "approval.distinctFromCreator") + "] : [])"},
        *pod_template_variables(),
        {"name": "violations", "expression":
            "variables.imageViolations + variables.secretViolations + variables.urlViolations + "
            "variables.checkpointViolations + variables.budgetViolations + variables.approvalViolations + "
            "variables.podTemplateViolations"},
        {"name": "text", "expression": "variables.violations.join('; ')"},
    ]


def pod_template_variables() -> list[dict[str, str]]:
    """CEL of :func:`agentrun.api.tenancy._check_pod_template`: an unset policy field allows anything, so
    each restriction is on when the field is present in the params (``hasValue()``)."""
    tpl = "object.spec.?agent.?podTemplate"
    pol = "params.?spec.?podTemplate"
    out: list[dict[str, str]] = []
    names: list[str] = []
    for field, rule, what in (("runtimeClassName", "allowedRuntimeClassNames", "runtime class"),
                              ("priorityClassName", "allowedPriorityClassNames", "priority class")):
        var = field.removesuffix("Name")
        value = f"{tpl}.?{field}.orValue('')"
        allowed = f"{pol}.?{rule}.orValue([])"
        out.append({"name": f"{var}Violations", "expression":
                    f"!{tpl}.?{field}.hasValue() || !{pol}.?{rule}.hasValue() || {allowed}.exists(p, p == '*' || "
                    f"(p.endsWith('*') ? {value}.startsWith(p.substring(0, size(p) - 1)) : {value} == p)) ? [] : ["
                    + _msg(_lit(f"{t.POD_TEMPLATE}.{field}"), value, _lit(f"is not an allowed {what}"),
                           f"podTemplate.{rule}") + "]"})
        names.append(f"variables.{var}Violations")
    rule = "podTemplate.allowedNodeSelectors"
    out += [
        {"name": "nodeSelectorRestricted", "expression": f"{pol}.?allowedNodeSelectors.hasValue()"},
        {"name": "allowedNodeSelectors", "expression": f"{pol}.?allowedNodeSelectors.orValue({{}})"},
        {"name": "nodeSelector", "expression": f"{tpl}.?nodeSelector.orValue({{}})"},
        {"name": "nodeSelectorBad", "expression":
            "!variables.nodeSelectorRestricted ? [] : variables.nodeSelector.filter(k, "
            "!(k in variables.allowedNodeSelectors) || "
            "!variables.allowedNodeSelectors[k].exists(a, a == '*' || a == variables.nodeSelector[k]))"},
        # the first in key order (the checker's min()): CEL cannot sort, and map order is not stable
        {"name": "nodeSelectorViolations", "expression":
            "variables.nodeSelectorBad.filter(k, !variables.nodeSelectorBad.exists(j, j < k)).map(k, "
            + _msg(f"{_lit(t.POD_TEMPLATE + '.nodeSelector[')} + k + ']'", "variables.nodeSelector[k]",
                   f"(k in variables.allowedNodeSelectors ? {_lit(t.NODE_VALUE_DETAIL)} : "
                   f"{_lit(t.NODE_KEY_DETAIL)})", rule) + ") + "
            f"(variables.nodeSelectorRestricted && {tpl}.?affinity.?nodeAffinity.hasValue() ? ["
            + _msg(_lit(f"{t.POD_TEMPLATE}.affinity.nodeAffinity"), "''", _lit(t.NODE_AFFINITY_DETAIL), rule)
            + "] : [])"},
    ]
    names.append("variables.nodeSelectorViolations")
    out.append({"name": "podTemplateViolations", "expression": " + ".join(names)})
    return out


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"app.kubernetes.io/part-of": "agentrun"},
            "annotations": {"agentrun.dev/generated-by": GENERATED_BY}}


def policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy of the tenancy rules (params: AgentRunPolicy)."""
    return {
        "apiVersion": VAP_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(t.VAP_NAME),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{t.GROUP}/{t.VERSION}", "kind": t.KIND},
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                "resources": [PLURAL],
            }]},
            "matchConditions": [{
                "name": "create-or-spec-change",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
            }],
            "variables": variables(),
            "validations": [{
                "expression": "size(variables.violations) == 0",
                "messageExpression": "'AgentRunPolicy ' + params.metadata.name + ': ' + "
                                     f"(size(variables.text) <= {t.MAX_REFUSAL_CHARS} ? variables.text : "
                                     f"variables.text.substring(0, {t.MAX_REFUSAL_CHARS}) + '...')",
                "message": "the AgentRun breaks its AgentRunPolicy (agentrun-tenancy; docs/security.md)",
                "reason": "Forbidden",
            }],
        },
    }


def binding(name: str = t.VAP_NAME, param: str = t.DEFAULT_POLICY,
            namespace_selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """A binding of the policy to the AgentRunPolicy ``param`` (missing param: every AgentRun refused)."""
    spec: dict[str, Any] = {
        "policyName": t.VAP_NAME,
        "validationActions": ["Deny"],
        "paramRef": {"name": param, "parameterNotFoundAction": "Deny"},
    }
    if namespace_selector:
        spec["matchResources"] = {"namespaceSelector": namespace_selector}
    return {"apiVersion": VAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(name), "spec": spec}


def policy_documents() -> list[dict[str, Any]]:
    """The policy and its default binding, stamped with their version marker (api/policy_version.py)."""
    return stamped([policy(), binding()])


# ----------------------------------------------------------------------------- the param CRD

def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of AgentRunPolicy (cluster-scoped: only the platform team writes it).
    No categories: the AgentRun CRD's category "agentrun" would then name two kinds, and
    ``kubectl get agentrun NAME`` would stop resolving to one resource."""
    s = t.AgentRunPolicySpec.model_json_schema(by_alias=True, mode="validation")
    spec = structural(s, s.get("$defs", {}))
    schema = {
        "type": "object",
        "description": "An AgentRunPolicy: what AgentRuns in the namespaces of its binding may reach (images, "
        "Secrets, network destinations, checkpoint stores, budgets). The parameters of the agentrun-tenancy "
        "ValidatingAdmissionPolicy; docs/security.md.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object: agentrun.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of the object: AgentRunPolicy."},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": t.CRD_NAME, "annotations": {"agentrun.dev/generated-by": GENERATED_BY}},
        "spec": {
            "group": t.GROUP,
            "scope": "Cluster",
            "names": {"kind": t.KIND, "listKind": f"{t.KIND}List", "plural": t.PLURAL, "singular": t.SINGULAR,
                      "shortNames": ["arp"]},
            "versions": [{"name": t.VERSION, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    }


def undocumented() -> list[str]:
    return undocumented_fields(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def policy_object(name: str, spec: t.AgentRunPolicySpec, comment: str = "") -> dict[str, Any]:
    meta = _meta(name)
    if comment:
        meta["annotations"]["agentrun.dev/description"] = comment
    return {"apiVersion": f"{t.GROUP}/{t.VERSION}", "kind": t.KIND, "metadata": meta,
            "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json")}


LOCAL_POLICY: Final = t.AgentRunPolicySpec.model_validate({
    "images": {"allowedPrefixes": ["*"]},
    "secrets": {"allowedNames": ["*"]},
    "destinations": {"schemes": ["http", "https"], "allowedHosts": ["*"], "allowedCIDRs": ["0.0.0.0/0", "::/0"],
                     "allowLoopback": True},
    "checkpoint": {"allowedEndpoints": ["*"], "allowedURIPrefixes": ["s3://"]},
})
"""The ``default`` AgentRunPolicy of the local control plane (``make dev``, e2e): tool servers and the
S3 server listen on 127.0.0.1 and the pods are host processes, so loopback is intended there. The
always-denied ranges and names (link-local, metadata, the API server) still apply."""


FILES: Final = {
    "crd": "crds/agentrun.dev_agentrunpolicies.yaml",
    "policy": "crds/agentrun.dev_tenancy-policy.yaml",
    "local": "e2e/tenancy-local-policy.yaml",
}


def _dump(docs: list[dict[str, Any]]) -> str:
    return "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
                   for d in docs)


def render(kind: str) -> str:
    """The YAML text of :data:`FILES` ``[kind]``."""
    header = f"# GENERATED by `agentrun crd --tenancy {kind}` from operator/agentrun/api/tenancy.py: do not edit.\n"
    if kind == "crd":
        return header + _dump([crd()])
    if kind == "policy":
        return (header + "# Needs Kubernetes >= 1.30 and the AgentRunPolicy CRD; the binding uses the AgentRunPolicy "
                f"\"{t.DEFAULT_POLICY}\" (docs/security.md).\n" + _dump(policy_documents()))
    if kind == "local":
        return header + _dump([policy_object(t.DEFAULT_POLICY, LOCAL_POLICY,
                                             "local control plane: loopback tool servers and S3 are intended")])
    raise ValueError(kind)
