"""The approval admission policies (api/admission.py): the committed files in crds/ and the chart
are the generated ones, and the names, verb and fields in them come from the contract modules.
Their behaviour on a real API server is tested in tests/e2e/test_approval_authz.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from agentrun.api import admission, approval, crdgen

ROOT = Path(__file__).resolve().parents[2]
CHART_FILES = ROOT / "helm" / "agentrun-operator" / "files"


@pytest.mark.parametrize("kind", sorted(admission.FILES))
def test_committed_policies_are_the_generated_ones(kind):
    name = admission.FILES[kind]
    assert (ROOT / "crds" / name).read_text() == admission.render(kind), "run `make crds`"
    assert (CHART_FILES / name).read_text() == admission.render(kind), "run `make crds && make helm-crds`"


def _docs(kind: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(admission.render(kind)) if d]


def test_every_policy_has_its_binding_and_the_api_versions_are_served_ones():
    for kind, policy_kind in (("validating", "ValidatingAdmissionPolicy"), ("mutating", "MutatingAdmissionPolicy")):
        docs = _docs(kind)
        policies = {d["metadata"]["name"] for d in docs if d["kind"] == policy_kind}
        bindings = {d["spec"]["policyName"] for d in docs if d["kind"] == policy_kind + "Binding"}
        assert policies and policies == bindings
        assert {d["apiVersion"] for d in docs} == {"admissionregistration.k8s.io/v1"}
        for d in docs:
            if d["kind"] == policy_kind:
                assert d["spec"]["failurePolicy"] == "Fail"


def test_the_contract_literals_come_from_approval_py():
    text = admission.render("validating") + admission.render("mutating")
    for literal in (approval.ANN_APPROVED, approval.ANN_DECIDED_BY, approval.ANN_REASON, approval.ANN_CALL_ID,
                    approval.ANN_ARGUMENTS_SHA256):
        assert f'"{literal}"' in text, literal
    assert f'check("{approval.APPROVE_VERB}")' in text
    assert f'check("{admission.OPERATE_VERB}")' in text


def test_refusal_message_names_the_permission():
    policy = admission.decisions_policy()
    msg = policy["spec"]["validations"][0]["messageExpression"]
    assert f'needs the "{approval.APPROVE_VERB}" verb on agentruns.agentrun.dev in namespace' in msg
    assert f"(role {admission.APPROVER_CLUSTERROLE})" in msg
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])


def test_every_status_field_but_the_decision_is_the_operators():
    """A field added to the status model is protected the day it is added (the list is generated)."""
    status = crdgen.openapi_schema()["properties"]["status"]["properties"]
    top, ap_fields = admission.operator_status_fields()
    assert set(top) == set(status) - {"approval"}
    assert set(ap_fields) | set(admission.USER_STATUS_FIELDS) == set(status["approval"]["properties"])
    for f in ("cost", "retries", "totalRetries", "phase", "checkpoint", "lap", "activeJob", "conditions"):
        assert f in top
    for f in ("callId", "state", "tool", "arguments", "deadline", "decidedAt"):
        assert f in ap_fields
    exprs = [v["expression"] for v in admission.status_policy()["spec"]["validations"]]
    assert len(exprs) == len(top) + len(ap_fields)
    assert "object.?status.?cost == oldObject.?status.?cost" in " ".join(exprs)
    assert "object.?status.?approval.?callId == oldObject.?status.?approval.?callId" in " ".join(exprs)
    # the operator is exempt through the variable that the chart narrows to its ServiceAccount's name,
    # not through a matchCondition on the verb alone (which a tenant holding `*` would pass)
    assert all(e.startswith("variables.isOperator || ") for e in exprs)
    conds = {c["name"] for c in admission.status_policy()["spec"]["matchConditions"]}
    assert conds == {"status-subresource"}


def test_stamping_can_be_turned_off_per_namespace():
    for d in _docs("mutating"):
        if d["kind"] == "MutatingAdmissionPolicyBinding":
            sel = d["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
            assert sel == [{"key": admission.NO_STAMP_LABEL, "operator": "NotIn", "values": [admission.NO_STAMP_VALUE]}]


def test_checkpoint_location_rules_sit_on_spec():
    rules = crdgen.CEL_RULES["spec"]
    for f in crdgen.PINNED_CHECKPOINT_FIELDS:
        assert any(f"has(oldSelf.checkpoint.{f})" in r["rule"] and f"spec.checkpoint.{f} is immutable" in r["message"]
                   for r in rules), f
    assert "spec.checkpoint" not in crdgen.CEL_RULES  # a rule on the optional block misses add/remove


def _vars(policy: dict) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"].get("variables", [])}


def _rule(policy: dict, needle: str) -> dict:
    """The one validation whose message (or messageExpression) contains ``needle``."""
    found = [v for v in policy["spec"]["validations"] if needle in v.get("message", v.get("messageExpression", ""))]
    assert len(found) == 1, (needle, found)
    return found[0]


def test_owner_group_convention():
    policy = admission.decisions_policy()
    var = _vars(policy)
    assert f'startsWith("{admission.OWNER_GROUP_PREFIX}")' in var["ownerGroups"]
    assert f"substring({len(admission.OWNER_GROUP_PREFIX)})" in var["ownerGroups"]
    assert "request.userInfo.?groups.orValue([])" in var["missingGroups"]
    rule = _rule(policy, "is decided by the members of group ")
    assert rule["expression"] == "!variables.decides || size(variables.missingGroups) == 0"
    assert "!variables.isOperator" in var["decides"]  # the operator copying a decision is not deciding


def test_owner_groups_are_read_from_before_the_request():
    """Issue 29 hole 2: the owner check reads oldObject (and the pending call's owner), never the new object."""
    groups = _vars(admission.decisions_policy())["ownerGroups"]
    assert "(oldObject == null ? object : oldObject).spec.?approval.?owner" in groups
    assert "oldObject.?status.?approval.?state.orValue('') == 'Pending'" in groups
    assert "oldObject.?status.?approval.?owner" in groups
    assert "object.spec.approval.owner" not in groups
    both = _rule(admission.decisions_policy(), "cannot be made in one request")
    assert "variables.decisionAnnSet" in both["expression"] and "variables.ownerChanged" in both["expression"]
    assert f'needs the "{approval.APPROVE_VERB}" verb' in both["message"]
    # handing a group owner on needs membership of that group, besides the approve verb
    hand_on = _rule(admission.guard_policy(), "only they may change its owner")
    assert "variables.oldOwnerGroup in request.userInfo.?groups.orValue([])" in hand_on["expression"]


def _guard_rule(field_shown: str) -> dict:
    return _rule(admission.guard_policy(), field_shown)


@pytest.mark.parametrize("field", [f for f, _, _ in admission.GATED_TOOL_FIELDS])
def test_changing_a_gated_tool_needs_the_approve_verb(field):
    var = admission._gated_var(field)
    rule = _guard_rule(f"'spec.agent.tools[' + n + '].{field}').join(', ')")
    assert rule["expression"] == f"variables.canApprove || size(variables.{var}) == 0"
    assert f'needs the "{approval.APPROVE_VERB}" verb on agentruns.agentrun.dev' in rule["messageExpression"]
    expr = _vars(admission.guard_policy())[var]
    # only tools gated in the OLD object, matched by name in the new one
    assert expr.startswith("variables.oldGated.filter(t, variables.newTools.exists(n, n.name == t.name && (")
    assert rule["reason"] == "Forbidden"


@pytest.mark.parametrize("field", [f for f, _, _ in admission.GATED_MCP_FIELDS])
def test_changing_a_gated_mcp_server_needs_the_approve_verb(field):
    var = admission._gated_var("mcp." + field)
    rule = _guard_rule(f"'spec.agent.mcpServers[' + n + '].{field}').join(', ')")
    assert rule["expression"] == f"variables.canApprove || size(variables.{var}) == 0"
    expr = _vars(admission.guard_policy())[var]
    # only servers with requiresApproval patterns in the OLD object, matched by name in the new one
    assert expr.startswith("variables.oldGatedMcp.filter(s, variables.newMcp.exists(n, n.name == s.name && (")
    assert "size(s.?requiresApproval.orValue([])) > 0" in _vars(admission.guard_policy())["oldGatedMcp"]


def test_the_gated_fields_are_what_decides_a_call():
    fields = {f for f, _, _ in admission.GATED_TOOL_FIELDS}
    assert fields == {"requiresApproval", "http.url", "http.method", "http.headersSecretRef", "parameters",
                      "sideEffects"}
    old_gated = _vars(admission.guard_policy())["oldGated"]
    assert "oldObject.spec.?agent.?tools.orValue([]).filter(t, t.?requiresApproval.orValue(false))" in old_gated
    removed = _guard_rule("may not remove a tool with requiresApproval")
    assert removed["expression"] == "variables.canApprove || size(variables.gatedRemoved) == 0"


@pytest.mark.parametrize("field, what", [
    ("spec.agent.image", "change the lap image"),
    ("spec.approval.owner", "change who decides"),
    ("spec.approval.approvers", "lower the number of approvers"),
    ("spec.approval.distinctFromCreator", "turn four eyes off (true to false)"),
])
def test_spec_guards_name_the_verb_and_the_field(field, what):
    rule = _guard_rule(f"may not {what} in agentrun")
    assert rule["messageExpression"].startswith(f"'{field}' + ': ' + 'user")
    assert rule["expression"].startswith("variables.canApprove || ")
    assert f'needs the "{approval.APPROVE_VERB}" verb' in rule["messageExpression"]


def test_the_operator_writes_no_spec_so_it_is_not_exempt_from_the_guard():
    policy = admission.guard_policy()
    assert "isOperator" not in admission.render("validating").split(f"name: {admission.VAP_GUARD}")[1].split("---")[0]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["agentruns"]


def test_the_creator_is_stamped_at_create_and_never_changes():
    assert approval.ANN_CREATED_BY == "agentrun.dev/created-by"
    assert approval.ANN_CREATED_BY not in approval.DECISION_ANNOTATIONS  # the operator never removes it
    stamp = admission.stamp_creator_policy()
    assert stamp["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    # a JSON patch (an apply configuration converts the object to the schema's types first and would
    # answer a malformed run with this policy's conversion error instead of the field's message)
    mutation = stamp["spec"]["mutations"][0]
    assert mutation["patchType"] == "JSONPatch" and "applyConfiguration" not in mutation
    expr = mutation["jsonPatch"]["expression"]
    assert f'jsonpatch.escapeKey("{approval.ANN_CREATED_BY}"), value: request.userInfo.username' in expr
    assert f'value: {{"{approval.ANN_CREATED_BY}": request.userInfo.username}}' in expr
    assert "matchConditions" not in stamp["spec"]  # every create, whatever the client sent
    guard = admission.guard_policy()
    forged = _rule(guard, "when you create an AgentRun")
    assert forged["expression"].startswith("oldObject != null || ")
    fixed = _rule(guard, "cannot be added, changed or removed afterwards")
    assert fixed["expression"].startswith("oldObject == null || ")
    needs = _rule(guard, "spec.approval.distinctFromCreator needs the creator recorded")
    assert f'"{approval.ANN_CREATED_BY}" in variables.newAnn' in needs["expression"]


def test_four_eyes_refuses_the_creator_by_the_old_object():
    policy = admission.decisions_policy()
    var = _vars(policy)
    assert var["distinctFromCreator"].startswith("(oldObject == null ? object : oldObject).spec")
    assert f'variables.oldAnn[?"{approval.ANN_CREATED_BY}"]' in var["creator"]
    rule = _rule(policy, "may not decide its approvals (four eyes)")
    assert "variables.creator != request.userInfo.username" in rule["expression"]
    assert "spec.approval.distinctFromCreator: the creator of agentrun" in rule["messageExpression"]
    off = _rule(admission.guard_policy(), "may not turn four eyes off for it")
    assert "request.userInfo.username" in off["expression"]


def test_stripping_a_pending_decision_needs_the_approve_verb():
    """Issue 29 item 7: decided-by, call-id, arguments-sha256 and the reasons beside a pending approved."""
    policy = admission.decisions_policy()
    var = _vars(policy)["qualifiersRemoved"]
    for key in (approval.ANN_DECIDED_BY, approval.ANN_CALL_ID, approval.ANN_ARGUMENTS_SHA256, approval.ANN_REASON,
                approval.ANN_REASON_SHORT):
        assert f'"{key}"' in var, key
    assert f'"{approval.ANN_APPROVED}" in variables.oldAnn && "{approval.ANN_APPROVED}" in variables.newAnn' in var
    rule = _rule(policy, "of the pending decision ")
    assert rule["expression"].endswith("size(variables.qualifiersRemoved) == 0 || variables.canApprove")


def test_operator_by_name_where_the_chart_names_it():
    for policy in (admission.decisions_policy(), admission.status_policy()):
        var = _vars(policy)
        assert var[admission.OPERATOR_USERNAMES_VAR] == "[]"  # crds/: the verb alone
        assert var["isOperator"] == admission.IS_OPERATOR_NAMED
        assert f"request.userInfo.username in variables.{admission.OPERATOR_USERNAMES_VAR}" in var["isOperator"]
        assert f'check("{admission.OPERATE_VERB}")' in var["isOperator"]


def test_the_chart_names_its_service_account_as_the_operator():
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    out = subprocess.run([helm, "template", "rel", str(ROOT / "helm" / "agentrun-operator"), "--namespace", "ops",
                          "--set", "serviceAccount.name=op-sa",
                          "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                          "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
                          "--show-only", "templates/admission-policies.yaml"],
                         check=True, capture_output=True, text=True).stdout
    vaps = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out) if d and d["kind"] == "ValidatingAdmissionPolicy"}
    assert set(vaps) == {admission.VAP_DECISIONS, admission.VAP_STATUS, admission.VAP_GUARD, admission.VAP_LIFECYCLE,
                         admission.VAP_AGENT_GUARD}
    for name in (admission.VAP_DECISIONS, admission.VAP_STATUS):
        assert _vars(vaps[name])[admission.OPERATOR_USERNAMES_VAR] == '["system:serviceaccount:ops:op-sa"]'
        # nothing else differs from the generated policy
        want = next(d for d in _docs("validating") if d["metadata"]["name"] == name)
        got = vaps[name]["spec"]
        got["variables"] = [v if v["name"] != admission.OPERATOR_USERNAMES_VAR else {**v, "expression": "[]"}
                            for v in got["variables"]]
        assert got == want["spec"]


def test_bad_input_doc_quotes_the_new_refusals():
    """docs/bad-input.md section 9 quotes every fixed message of the guard and the new decision rules
    (the computed ones are checked against the real API server's text in tests/e2e/test_approval_guard.py)."""
    doc = (ROOT / "docs" / "bad-input.md").read_text()
    fixed = [v["message"] for v in admission.guard_policy()["spec"]["validations"] if "message" in v]
    fixed.append(_rule(admission.decisions_policy(), "cannot be made in one request")["message"])
    assert len(fixed) == 3
    for message in fixed:
        assert message in doc, message
    for _, _, what in admission.GATED_TOOL_FIELDS:
        assert f"may not {what} in agentrun team-a/x: {admission.CHANGES_THE_CALL} and` NEEDS" in doc, what


def test_the_lifecycle_policy_takes_its_literals_from_lifecycle_py_and_names_the_retry_verb():
    from agentrun.api import lifecycle

    text = admission.render("validating") + admission.render("mutating")
    for literal in (lifecycle.ANN_RETRY, lifecycle.ANN_RETRY_FROM_LAP, lifecycle.ANN_RETRY_REQUESTED_BY,
                    lifecycle.ANN_CANCELLED_BY):
        assert f'"{literal}"' in text, literal
    assert f'check("{lifecycle.RETRY_VERB}")' in text
    policy = admission.lifecycle_policy()
    first = policy["spec"]["validations"][0]
    assert first["expression"] == "!variables.retrySet || variables.canRetry"
    assert f'needs the "{lifecycle.RETRY_VERB}" verb on agentruns.agentrun.dev' in first["messageExpression"]
    assert f"(role {lifecycle.RETRIER_CLUSTERROLE}); patch alone is not enough" in first["messageExpression"]
    # the requester and the canceller are stamped by the API server, on the main resource only
    for doc, key in ((admission.stamp_retry_policy(), lifecycle.ANN_RETRY_REQUESTED_BY),
                     (admission.stamp_cancel_policy(), lifecycle.ANN_CANCELLED_BY)):
        assert doc["spec"]["matchConditions"][0]["expression"] == admission.ON_MAIN
        mutation = doc["spec"]["mutations"][0]
        assert mutation["patchType"] == "JSONPatch" and f'"{key}": request.userInfo.username' in mutation["jsonPatch"]["expression"]
    # a retry's stamping fires on either retry annotation; a cancel's only when spec.cancel appears
    assert lifecycle.ANN_RETRY_FROM_LAP in admission.stamp_retry_policy()["spec"]["matchConditions"][1]["expression"]
    # (optional fields: a malformed object without spec still gets the schema's error, not this one's)
    assert admission.stamp_cancel_policy()["spec"]["matchConditions"][1]["expression"] == (
        "object.?spec.?cancel.hasValue() && (oldObject == null || !oldObject.?spec.?cancel.hasValue())")


def test_status_lifecycle_is_the_operators():
    top, _ = admission.operator_status_fields()
    assert "lifecycle" in top  # retries, who retried or cancelled, the outcome announced: never a user's


def test_bad_input_doc_quotes_the_lifecycle_refusals():
    doc = (ROOT / "docs" / "bad-input.md").read_text()
    fixed = [v["message"] for v in admission.lifecycle_policy()["spec"]["validations"] if "message" in v]
    assert fixed and all(m in doc for m in fixed), fixed


def test_every_stamping_policy_is_a_json_patch():
    """One form of mutation: a JSON patch applies to the object as sent, so a malformed AgentRun
    still gets the schema's message naming the field (an apply configuration converts it first)."""
    docs = [d for d in admission.mutating_documents() if d["kind"] == "MutatingAdmissionPolicy"]
    assert len(docs) == 5
    for d in docs:
        assert [m["patchType"] for m in d["spec"]["mutations"]] == ["JSONPatch"], d["metadata"]["name"]
