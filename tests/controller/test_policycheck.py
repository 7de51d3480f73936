"""The operator's check of its admission policies (controller/policycheck.py): what it requires,
how it judges what the API server returns (missing, outdated, tampered, not served), how it reads
(one discovery GET and one GET per object), and its state (readiness, recovery, transient errors)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import admission, policy_version, tenancy_admission
from agentrun.controller.config import OperatorConfig
from agentrun.controller.policycheck import (
    GROUP_VERSION,
    NOT_SERVED,
    RESOURCES,
    PolicyCheck,
    read,
    verdict,
    wanted,
)

ROOT = Path(__file__).resolve().parents[2]
ALL = ("approvals", "stamping", "tenancy")


def _stored(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as the API server returns it: with server-side defaults and metadata added."""
    out = copy.deepcopy(doc)
    out["metadata"].update({"uid": "u", "resourceVersion": "7", "generation": 1})
    spec = out["spec"]
    if "matchConstraints" in spec:
        spec["matchConstraints"].update({"matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {}})
        for rule in spec["matchConstraints"]["resourceRules"]:
            rule["scope"] = "*"
    if out["kind"].endswith("Binding"):
        spec.setdefault("matchResources", {}).update({"matchPolicy": "Equivalent", "objectSelector": {}})
    return out


def _installed(files: tuple[str, ...] = ("agentrun.dev_admission-policies.yaml", "agentrun.dev_admission-mutating.yaml",
                                          "agentrun.dev_tenancy-policy.yaml")) -> dict[tuple[str, str], Any]:
    """What `kubectl apply -f crds/...` leaves in the cluster (the generated files, as committed)."""
    got: dict[tuple[str, str], Any] = {}
    for f in files:
        for doc in yaml.safe_load_all((ROOT / "crds" / f).read_text()):
            if doc:
                got[(doc["kind"], doc["metadata"]["name"])] = _stored(doc)
    return got


def test_the_committed_files_carry_the_marker_the_code_computes():
    wants = wanted(ALL)
    assert sorted((w.set, w.kind, w.name) for w in wants) == sorted([
        *(("approvals", k, n) for n in (admission.VAP_DECISIONS, admission.VAP_STATUS, admission.VAP_GUARD,
                                             admission.VAP_LIFECYCLE)
          for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")),
        *(("stamping", k, n) for n in (admission.MAP_ANNOTATION, admission.MAP_STATUS, admission.MAP_CREATOR,
                                            admission.MAP_RETRY, admission.MAP_CANCEL)
          for k in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")),
        ("tenancy", "ValidatingAdmissionPolicy", "agentrun-tenancy"),
        ("tenancy", "ValidatingAdmissionPolicyBinding", "agentrun-tenancy"),
    ])
    got = _installed()
    for w in wants:
        ann = got[(w.kind, w.name)]["metadata"]["annotations"]
        if w.marker is not None:
            assert ann[policy_version.ANNOTATION] == w.marker, f"{w.name}: run `make crds && make helm-crds`"
    assert verdict(wants, got) is None


def test_the_marker_is_the_sha256_of_the_spec_and_changes_with_any_rule():
    doc = admission.decisions_policy()
    m = policy_version.marker(doc)
    assert len(m) == 64 and m == policy_version.stamp(copy.deepcopy(doc))["metadata"]["annotations"][
        policy_version.ANNOTATION]
    doc["spec"]["validations"][0]["expression"] += " || true"
    assert policy_version.marker(doc) != m
    # labels and annotations do not count (the chart adds its own)
    doc2 = admission.decisions_policy()
    doc2["metadata"]["labels"]["helm.sh/chart"] = "x"
    assert policy_version.marker(doc2) == m


def test_a_missing_binding_is_named():
    got = _installed()
    del got[("ValidatingAdmissionPolicyBinding", admission.VAP_DECISIONS)]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesMissing"
    assert "missing: ValidatingAdmissionPolicyBinding agentrun-decisions" in p.message
    assert "docs/operations.md#admission-policies" in p.message


def test_an_older_policy_is_outdated_with_both_versions_shown():
    got = _installed()
    old = got[("ValidatingAdmissionPolicy", admission.VAP_STATUS)]
    old["metadata"]["annotations"][policy_version.ANNOTATION] = "0123456789abcdef" * 4
    del got[("MutatingAdmissionPolicy", admission.MAP_STATUS)]["metadata"]["annotations"][policy_version.ANNOTATION]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesOutdated"
    want = policy_version.marker(admission.status_policy())
    assert f"ValidatingAdmissionPolicy agentrun-status-owner (version 0123456789abcde…, this operator expects {want[:12]})" \
        in p.message, p.message
    assert "MutatingAdmissionPolicy agentrun-stamp-decider-status (version none" in p.message


def test_a_changed_spec_under_the_current_marker_is_outdated_naming_the_field():
    got = _installed()
    got[("ValidatingAdmissionPolicyBinding", admission.VAP_DECISIONS)]["spec"]["validationActions"] = ["Audit"]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesOutdated"
    assert "ValidatingAdmissionPolicyBinding agentrun-decisions (spec.validationActions[0] is not what" in p.message
    got = _installed()
    got[("ValidatingAdmissionPolicy", "agentrun-tenancy")]["spec"]["failurePolicy"] = "Ignore"
    p = verdict(wanted(ALL), got)
    assert p is not None and "spec.failurePolicy" in p.message


def test_the_operator_name_the_chart_writes_per_release_is_not_a_difference():
    got = _installed()
    policies = [(k, n) for (k, n), o in got.items() if k == "ValidatingAdmissionPolicy"
                and any(v["name"] == admission.OPERATOR_USERNAMES_VAR for v in o["spec"].get("variables") or [])]
    assert policies  # the chart sets it in these (templates/admission-policies.yaml)
    for key in policies:
        for v in got[key]["spec"]["variables"]:
            if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                v["expression"] = '["system:serviceaccount:agentrun-system:agentrun-operator"]'
    assert verdict(wanted(ALL), got) is None
    for bad in ('["system:serviceaccount:a:b", "mallory"]', "true", '["mallory"]'):
        for v in got[policies[0]]["spec"]["variables"]:
            if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                v["expression"] = bad
        p = verdict(wanted(ALL), got)
        assert p is not None and p.reason == "AdmissionPoliciesOutdated" and ".expression is not what" in p.message, bad


def test_the_charts_tenancy_binding_is_checked_by_its_fields_not_a_marker():
    got = _installed()
    chart_binding = got[("ValidatingAdmissionPolicyBinding", "agentrun-tenancy")]
    del chart_binding["metadata"]["annotations"][policy_version.ANNOTATION]
    chart_binding["spec"]["matchResources"]["namespaceSelector"] = {"matchExpressions": [
        {"key": "agentrun.dev/tenancy-policy", "operator": "NotIn", "values": ["team-a"]}]}
    assert verdict(wanted(ALL), got) is None
    chart_binding["spec"]["paramRef"]["parameterNotFoundAction"] = "Allow"
    p = verdict(wanted(ALL), got)
    assert p is not None and "spec.paramRef.parameterNotFoundAction" in p.message


def test_stamping_is_required_only_where_served_the_validating_ones_always():
    got = _installed()
    for (kind, name) in list(got):
        if kind.startswith("Mutating"):
            got[(kind, name)] = NOT_SERVED
    assert verdict(wanted(ALL), got) is None
    got[("ValidatingAdmissionPolicy", admission.VAP_DECISIONS)] = NOT_SERVED
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesMissing"
    assert "the API server does not serve ValidatingAdmissionPolicy" in p.message
    # only what is required counts
    assert verdict(wanted(("stamping",)), _installed()) is None
    assert verdict(wanted(()), {}) is None


def test_a_bad_policy_set_name_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="AGENTRUN_ADMISSION_POLICIES: unknown policy set tenancies"):
        OperatorConfig.from_env({"AGENTRUN_ADMISSION_POLICIES": "approvals,tenancies"})
    cfg = OperatorConfig.from_env({"AGENTRUN_ADMISSION_POLICIES": " approvals , tenancy",
                                   "AGENTRUN_ALLOW_MISSING_POLICIES": "true"})
    assert cfg.admission_policies == ("approvals", "tenancy") and cfg.allow_missing_policies
    cfg = OperatorConfig.from_env({})
    assert cfg.admission_policies == ALL and not cfg.allow_missing_policies


class FakeAPI:
    """The API server's answers to the check's GETs (a dict of objects; a set of served resources)."""

    def __init__(self, objects: dict[tuple[str, str], Any], served: set[str] | None = None) -> None:
        self.objects = objects
        self.served = set(RESOURCES.values()) if served is None else served
        self.requests: list[str] = []
        self.fail: Exception | None = None

    async def call(self, method: str, path: str, **_: Any) -> Any:
        assert method == "GET"
        self.requests.append(path)
        if self.fail is not None:
            raise self.fail
        if path == GROUP_VERSION:
            return {"kind": "APIResourceList", "resources": [{"name": r} for r in sorted(self.served)]}
        resource, name = path[len(GROUP_VERSION) + 1:].split("/")
        kind = next(k for k, r in RESOURCES.items() if r == resource)
        obj = self.objects.get((kind, name))
        if obj is None:
            raise ApiException(status=404, reason="Not Found", body=json.dumps({"kind": "Status", "code": 404}))
        return obj


def test_read_gets_each_object_by_name_and_skips_kinds_not_served():
    api = FakeAPI(_installed(), served={"validatingadmissionpolicies", "validatingadmissionpolicybindings"})
    wants = wanted(ALL)
    got = asyncio.run(read(api.call, wants))
    validating = [w for w in wants if w.set != "stamping"]
    assert api.requests[0] == GROUP_VERSION and len(api.requests) == 1 + len(validating)  # no mutating one asked for
    assert all(got[(w.kind, w.name)] is NOT_SERVED for w in wants if w.set == "stamping")
    assert verdict(wants, got) is None
    del api.objects[("ValidatingAdmissionPolicyBinding", "agentrun-tenancy")]
    got = asyncio.run(read(api.call, wants))
    assert got[("ValidatingAdmissionPolicyBinding", "agentrun-tenancy")] is None


def test_the_check_blocks_until_checked_recovers_without_restart_and_keeps_its_verdict_on_a_blip():
    api = FakeAPI(_installed())
    changes: list[int] = []
    check = PolicyCheck(ALL, False, api.call, on_change=lambda: changes.append(1))

    async def main() -> None:
        assert not check.ready and check.blocking is not None  # not checked yet: no lap
        assert await check.check() is None
        assert check.ready and check.blocking is None and changes == []
        binding = api.objects.pop(("ValidatingAdmissionPolicyBinding", admission.VAP_STATUS))
        p = await check.check()
        assert p is not None and not check.ready and check.blocking == p and changes == [1]
        await check.check()  # the same verdict: no change
        assert changes == [1]
        api.objects[("ValidatingAdmissionPolicyBinding", admission.VAP_STATUS)] = binding
        assert await check.check() is None and check.ready and changes == [1, 1]
        api.fail = ApiException(status=500, reason="Internal Server Error")
        assert await check.check() is None and check.ready  # a blip keeps the verdict
        api.fail = ApiException(status=403, reason="Forbidden")
        p = await check.check()
        assert p is not None and p.reason == "AdmissionPoliciesUnknown" and "HTTP 403" in p.message
        assert "admission-reader" in p.message and not check.ready

    asyncio.run(main())


def test_an_unreadable_first_check_blocks_and_allow_missing_lets_laps_start():
    api = FakeAPI({})
    api.fail = TimeoutError("GET /apis/admissionregistration.k8s.io/v1: no answer from the API server within 30.0s")

    async def main() -> None:
        check = PolicyCheck(ALL, False, api.call)
        p = await check.check()
        assert p is not None and p.reason == "AdmissionPoliciesUnknown" and "no answer" in p.message
        assert not check.ready and check.blocking == p
        lax = PolicyCheck(ALL, True, FakeAPI({}).call)
        p = await lax.check()
        assert p is not None and p.reason == "AdmissionPoliciesMissing"
        assert lax.ready and lax.blocking is None  # allowed: laps start (logged as a warning)

    asyncio.run(main())


def test_the_tenancy_generator_stamps_what_the_check_expects():
    policy, binding = tenancy_admission.policy_documents()
    assert policy["metadata"]["annotations"][policy_version.ANNOTATION] == policy_version.marker(policy)
    assert binding["metadata"]["annotations"][policy_version.ANNOTATION] == policy_version.marker(binding)
