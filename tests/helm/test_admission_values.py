"""admissionPolicies.validating / .mutating (auto|true|false) and .allowMissing, rendered by the real
helm (docs/operations.md#admission-policies): plain `helm template` knows no cluster and fails with a
message rather than silently render no admission policy; a cluster (or --api-versions, or an explicit
value) decides; the operator is told which policy sets to require and whether it may run without."""
from __future__ import annotations

import pytest
from helm_support import CLUSTER_WITHOUT_ADMISSION, template

from agentrun.api import admission, policy_version, tenancy_admission
from agentrun.api.tenancy import VAP_NAME

VAP = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
MAP = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def _env(docs):
    dep = next(d for d in docs if d["kind"] == "Deployment")
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("args", [[], ["--show-only", "templates/deployment.yaml"]], ids=["all", "show-only"])
def test_plain_helm_template_fails_naming_the_value_and_what_to_do(helm, args):
    proc, _ = template(helm, *args, check=False, admission_apis=False)
    assert proc.returncode != 0 and proc.stdout == ""
    err = proc.stderr
    assert "admissionPolicies.validating=auto: cannot tell whether the API server serves " \
           "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy (no cluster: plain `helm template`)" in err, err
    assert "anyone who may patch an AgentRun decides its approvals" in err
    assert "--api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" in err
    assert "admissionPolicies.validating=true" in err and "docs/operations.md#admission-policies" in err


def test_knowing_validating_but_not_mutating_still_fails_for_mutating(helm):
    proc, _ = template(helm, *VAP, check=False, admission_apis=False)
    assert proc.returncode != 0
    assert "admissionPolicies.mutating=auto: cannot tell whether the API server serves " \
           "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" in proc.stderr, proc.stderr
    # not asked when the stamping policies are off
    _, docs = template(helm, *VAP, "--set", "admissionPolicies.mutating=false", admission_apis=False)
    assert {d["kind"] for d in docs} & POLICY_KINDS == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_a_cluster_without_validating_admission_policy_fails_with_the_opt_out(helm):
    proc, _ = template(helm, *CLUSTER_WITHOUT_ADMISSION, check=False, admission_apis=False)
    assert proc.returncode != 0
    assert "the API server does not serve admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy " \
           "(Kubernetes >= 1.30)" in proc.stderr, proc.stderr
    assert "admissionPolicies.validating=false and admissionPolicies.allowMissing=true" in proc.stderr
    # the deliberate opt-out installs (and the operator is told to require the policies all the same)
    _, docs = template(helm, *CLUSTER_WITHOUT_ADMISSION, "--set", "admissionPolicies.validating=false",
                       "--set", "admissionPolicies.allowMissing=true", admission_apis=False)
    assert not {d["kind"] for d in docs} & POLICY_KINDS
    env = _env(docs)
    assert env["AGENTRUN_ADMISSION_POLICIES"] == "approvals,tenancy" and env["AGENTRUN_ALLOW_MISSING_POLICIES"] == "true"


@pytest.mark.parametrize("args, sets", [
    (CLUSTER_WITHOUT_ADMISSION + VAP, "approvals,tenancy"),  # 1.30-1.35: no stamping to require
    (VAP + MAP, "approvals,stamping,tenancy"),
    (VAP + MAP + ["--set", "tenancy.enabled=false"], "approvals,stamping"),
    (VAP + MAP + ["--set", "admissionPolicies.validating=false", "--set", "admissionPolicies.mutating=false"],
     "approvals,tenancy"),  # you install them
    (["--set", "admissionPolicies.validating=false", "--set", "admissionPolicies.mutating=false"], "approvals,tenancy"),
], ids=["validating-cluster", "both", "no-tenancy", "approvals-not-rendered", "opt-out"])
def test_the_operator_is_told_which_policies_to_require(helm, args, sets):
    _, docs = template(helm, *args, admission_apis=False)
    env = _env(docs)
    assert env["AGENTRUN_ADMISSION_POLICIES"] == sets and env["AGENTRUN_ALLOW_MISSING_POLICIES"] == "false"


def test_a_cluster_renders_what_the_operator_expects(helm):
    """Every policy the chart renders carries the marker the operator's code computes, and the
    operator's own verdict on the chart's rendering (as if stored as rendered) is: in place."""
    from agentrun.controller.policycheck import verdict, wanted

    _, docs = template(helm)  # both kinds served
    got = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in POLICY_KINDS}
    want = [*admission.validating_documents(), *admission.mutating_documents(), tenancy_admission.policy()]
    for w in want:
        g = got[(w["kind"], w["metadata"]["name"])]
        assert g["metadata"]["annotations"][policy_version.ANNOTATION] == policy_version.marker(w)
    assert verdict(wanted(("approvals", "stamping", "tenancy")), got) is None
    # the chart's own binding of the tenancy policy is checked by its fields (no marker)
    assert policy_version.ANNOTATION not in (got[("ValidatingAdmissionPolicyBinding", VAP_NAME)]["metadata"]
                                              .get("annotations") or {})
    # another release's operator name is still its own
    _, docs = template(helm, "--namespace", "ops", "--set", "serviceAccount.name=op-sa")
    got = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in POLICY_KINDS}
    assert verdict(wanted(("approvals", "stamping", "tenancy")), got) is None


def test_the_reader_role_names_exactly_the_policies_the_operator_checks(helm):
    from agentrun.controller.policycheck import RESOURCES, wanted

    _, docs = template(helm)
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-admission-reader"))
    granted = {(res, name) for r in role["rules"] for res in r["resources"] for name in r["resourceNames"]
               if r["verbs"] == ["list", "watch"]}
    checked = {(RESOURCES[w.kind], w.name) for w in wanted(("approvals", "stamping", "tenancy"))}
    assert granted == checked
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": "agentrun-system"}]


@pytest.mark.parametrize("setting", [["--set", "admissionPolicies.validating=maybe"],
                                     ["--set", "admissionPolicies.mutating=yes"],
                                     ["--set", "admissionPolicies.allowMissing=sure"],
                                     ["--set", "admissionPolicies.other=1"]])
def test_bad_values_are_refused_naming_the_path(helm, setting):
    proc, _ = template(helm, *setting, check=False)
    assert proc.returncode != 0 and "admissionPolicies" in proc.stderr, proc.stderr


@pytest.mark.parametrize("old", ["approvals.admissionPolicies.enabled=false", "approvals.admissionPolicies.mutating=false"])
def test_the_earlier_charts_approval_policy_values_are_refused_naming_their_replacement(helm, old):
    """One setting per kind: the earlier approvals.admissionPolicies.* are not silently ignored (an
    upgrade that kept them would render what the user had turned off)."""
    proc, _ = template(helm, "--set", "admissionPolicies.validating=true", "--set", "admissionPolicies.mutating=true",
                       "--set", old, check=False)
    assert proc.returncode != 0, proc.stdout[-500:]
    assert "approvals.admissionPolicies was replaced by admissionPolicies.validating and " \
           "admissionPolicies.mutating" in proc.stderr, proc.stderr


def test_notes_say_what_the_operator_checks_and_warn_about_the_opt_outs(helm):
    import subprocess

    from helm_support import CHART

    def notes(*args: str) -> str:
        proc = subprocess.run([helm, "install", "agentrun-operator", str(CHART), "--dry-run=client",
                               "--namespace", "agentrun-system", *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("NOTES:", 1)[1]

    text = notes("--set", "admissionPolicies.validating=true", "--set", "admissionPolicies.mutating=true")
    assert "the operator starts no lap until the\npolicies it requires (approvals,stamping,tenancy)" in text, text
    assert "WARNING" not in text and "validating=false" not in text
    text = notes("--set", "admissionPolicies.validating=false", "--set", "admissionPolicies.mutating=false",
                 "--set", "admissionPolicies.allowMissing=true")
    assert "admissionPolicies.validating=false: the chart rendered no ValidatingAdmissionPolicy" in text
    assert "WARNING: admissionPolicies.allowMissing=true" in text
