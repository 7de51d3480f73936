"""The approval admission policies (api/admission.py): the committed files in crds/ and the chart
are the generated ones, and the names, verb and fields in them come from the contract modules.
Their behaviour on a real API server is tested in tests/e2e/test_approval_authz.py."""

from __future__ import annotations

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
    conds = {c["name"]: c["expression"] for c in admission.status_policy()["spec"]["matchConditions"]}
    assert conds["not-the-operator"].startswith("!") and admission.OPERATE_VERB in conds["not-the-operator"]


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


def test_owner_group_convention():
    policy = admission.decisions_policy()
    var = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "ownerGroup")
    assert f'startsWith("{admission.OWNER_GROUP_PREFIX}")' in var
    assert f"substring({len(admission.OWNER_GROUP_PREFIX)})" in var
    rule = policy["spec"]["validations"][-1]
    assert "variables.ownerGroup in request.userInfo.?groups.orValue([])" in rule["expression"]
    assert "variables.isOperator" in rule["expression"]  # the operator copying a decision is not deciding
