"""The chart's approval authorization (docs/security.md), rendered by the real helm: the
agentrun-approver role is the only one with the approve verb, the operator gets the operate verb,
and the admission policies are the generated ones, rendered only where the API server serves them."""
from __future__ import annotations

import pytest
import yaml
from helm_support import CHART, CLUSTER_WITHOUT_ADMISSION, ROOT, template

from agentrun.api import admission, approval

VAP = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
MAP = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def _by_kind(docs, *kinds):
    """The approval policies of these kinds (the tenancy policy, agentrun-tenancy*, is tests/helm/test_tenancy_chart.py's)."""
    return [d for d in docs if d["kind"] in kinds and not d["metadata"]["name"].startswith("agentrun-tenancy")]


def _verbs(role) -> set[tuple[str, str]]:
    return {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]}


def test_approver_role_and_nobody_else_approves(helm):
    _, docs = template(helm, *VAP, *MAP)
    roles = _by_kind(docs, "Role", "ClusterRole")
    approver = [r for r in roles if r["metadata"]["name"] == admission.APPROVER_CLUSTERROLE]
    assert len(approver) == 1 and approver[0]["kind"] == "ClusterRole"
    assert _verbs(approver[0]) == {
        *{("agentruns", v) for v in ("get", "list", "watch", "patch", approval.APPROVE_VERB)},
        ("agentruns/status", "get"), ("agentruns/status", "patch"),
    }
    # not aggregated into admin/edit: a run's creator is not implicitly an approver
    assert not approver[0].get("aggregationRule") and not any(
        k.startswith("rbac.authorization.k8s.io/aggregate") for k in approver[0]["metadata"]["labels"])
    others = [r for r in roles if r["metadata"]["name"] != admission.APPROVER_CLUSTERROLE]
    assert others and not any(v == approval.APPROVE_VERB for r in others for _, v in _verbs(r))
    # the chart binds the approver role to nobody: that is the cluster admin's decision
    for b in _by_kind(docs, "RoleBinding", "ClusterRoleBinding"):
        assert b["roleRef"]["name"] != admission.APPROVER_CLUSTERROLE
    # the operator's ServiceAccount, and only it, holds the operate verb
    operate = [r["metadata"]["name"] for r in roles if ("agentruns/status", admission.OPERATE_VERB) in _verbs(r)]
    assert operate == ["agentrun-operator"]


def test_namespaced_mode_approver_roles_are_namespaced(helm):
    _, docs = template(helm, "-f", str(CHART / "ci" / "namespaced-values.yaml"), *VAP, *MAP)
    approver = [d for d in docs if d["metadata"]["name"] == admission.APPROVER_CLUSTERROLE]
    assert sorted((d["kind"], d["metadata"]["namespace"]) for d in approver) == [("Role", "team-a"), ("Role", "team-b")]
    _, docs = template(helm, "--set", "approvals.approverRole=false")
    assert not [d for d in docs if d["metadata"]["name"] == admission.APPROVER_CLUSTERROLE]


def test_policies_are_the_generated_ones_where_the_api_exists(helm):
    _, docs = template(helm, *VAP, *MAP)
    got = _by_kind(docs, *POLICY_KINDS)
    want = [d for kind in ("validating", "mutating") for d in yaml.safe_load_all(admission.render(kind)) if d]
    assert len(got) == len(want) == 20  # 5 validating + 5 mutating policies, each with its binding
    want_by = {(w["kind"], w["metadata"]["name"]): w for w in want}
    for g in got:
        w = want_by.pop((g["kind"], g["metadata"]["name"]))
        # the chart adds its labels and names its ServiceAccount as the operator, nothing else
        for v in g["spec"].get("variables", []):
            if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                assert v["expression"] == '["system:serviceaccount:agentrun-system:agentrun-operator"]'
                v["expression"] = "[]"
        assert g["spec"] == w["spec"]
        assert g["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # the chart's copies are byte-equal to crds/ (make helm-crds)
    for name in admission.FILES.values():
        assert (CHART / "files" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), "run `make helm-crds`"


@pytest.mark.parametrize("args, kinds", [
    # Kubernetes 1.30-1.35 (a cluster: Helm knows its kinds)
    (CLUSTER_WITHOUT_ADMISSION + VAP, {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
    (VAP + MAP, POLICY_KINDS),  # >= 1.36
    (VAP + MAP + ["--set", "admissionPolicies.mutating=false"],
     {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
    (VAP + MAP + ["--set", "admissionPolicies.validating=false", "--set", "admissionPolicies.mutating=false"], set()),
    # said by values, no cluster needed
    (["--set", "admissionPolicies.validating=true", "--set", "admissionPolicies.mutating=true"], POLICY_KINDS),
    (["--set", "admissionPolicies.validating=true", "--set", "admissionPolicies.mutating=false"],
     {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
    (["--set-string", "admissionPolicies.validating=false", "--set-string", "admissionPolicies.mutating=false"], set()),
    # an explicit opt-out wins over what the cluster serves
    (VAP + MAP + ["--set", "admissionPolicies.validating=false"], set()),
    (VAP + MAP + ["--set", "admissionPolicies.mutating=false"],
     {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
], ids=["validating-only-cluster", "both-apis", "mutating-off", "all-off", "values-true", "values-validating-only",
        "values-false-strings", "validating-opt-out", "mutating-opt-out"])
def test_policies_render_only_where_served_and_enabled(helm, args, kinds):
    _, docs = template(helm, *args, admission_apis=False)
    assert {d["kind"] for d in _by_kind(docs, *POLICY_KINDS)} == kinds


def test_the_retrier_role_grants_the_retry_verb_and_is_optional(helm):
    from agentrun.api import lifecycle
    _, docs = template(helm)
    roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == lifecycle.RETRIER_CLUSTERROLE]
    assert len(roles) == 1
    verbs = {v for r in roles[0]["rules"] if "agentruns" in r["resources"] for v in r["verbs"]}
    assert lifecycle.RETRY_VERB in verbs and "patch" in verbs
    _, docs = template(helm, "--set", "lifecycle.retrierRole=false")
    assert not [d for d in docs if d["metadata"]["name"] == lifecycle.RETRIER_CLUSTERROLE]
