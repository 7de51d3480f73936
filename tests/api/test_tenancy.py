"""The tenancy contract (api/tenancy.py) and its generated admission policy (api/tenancy_admission.py).

The pure checker gives exactly the messages of the table tests/fixtures/tenancy/policy-cases.yaml;
tests/e2e/test_tenancy_policy.py runs the same table through the real API server's CEL, so the two
agree case by case. Here: the committed generated files, the table, the always-denied destinations
under any policy (hypothesis), bounded messages, which policies apply to a namespace, and that
docs/bad-input.md quotes every refusal of the table.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api import addresses as addr
from agentrun.api import tenancy as t
from agentrun.api import tenancy_admission as ta
from agentrun.api.spec import AgentRunSpec

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "bad-input"))
import bad_input_table as bt  # noqa: E402

TABLE = yaml.safe_load((ROOT / "tests" / "fixtures" / "tenancy" / "policy-cases.yaml").read_text())
STRICT = t.AgentRunPolicySpec.model_validate(TABLE["policy"])
ALLOW_ALL = t.AgentRunPolicySpec.model_validate({
    "images": {"allowedPrefixes": ["*"]}, "secrets": {"allowedNames": ["*"]},
    "destinations": {"schemes": ["http", "https"], "allowedHosts": ["*"], "allowedCIDRs": ["0.0.0.0/0", "::/0"],
                     "allowLoopback": True, "apiServerCIDRs": []},
    "checkpoint": {"allowedEndpoints": ["*"], "allowedURIPrefixes": ["s3://"]},
})


def _spec(case: dict) -> dict:
    return bt.manifest(TABLE["run"], case.get("patch"), case.get("remove", []))["spec"]


# ------------------------------------------------------------------------------ generated files

@pytest.mark.parametrize("kind", sorted(ta.FILES))
def test_committed_files_are_the_generated_ones(kind):
    assert (ROOT / ta.FILES[kind]).read_text() == ta.render(kind), "run `make crds`"


def test_chart_copies_are_the_generated_ones():
    assert (CHART / "crds" / "agentrun.dev_agentrunpolicies.yaml").read_text() == ta.render("crd"), \
        "run `make crds && make helm-crds`"
    assert (CHART / "files" / "agentrun.dev_tenancy-policy.yaml").read_text() == ta.render("policy"), \
        "run `make crds && make helm-crds`"


def test_the_policy_crd_is_cluster_scoped_documented_and_outside_the_agentrun_category():
    crd = ta.crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert "categories" not in crd["spec"]["names"]  # `kubectl get agentrun X` must stay one kind
    assert ta.undocumented() == []
    cidr = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "destinations"]["properties"]["allowedCIDRs"]["items"]
    assert cidr["x-kubernetes-validations"][0]["rule"] == "isCIDR(self)"


def test_the_cel_defaults_are_the_models_defaults():
    exprs = {v["name"]: v["expression"] for v in ta.variables()}
    assert exprs["schemes"].endswith('.orValue(["https"])')
    assert exprs["apiServerCIDRs"].endswith('.orValue(["10.96.0.1/32"])')
    assert exprs["allowLoopback"].endswith(".orValue(false)")
    assert exprs["laps"].endswith(f".orValue({t.DEFAULT_MAX_LAPS})")
    from agentrun.api.spec import BudgetSpec
    assert BudgetSpec().max_laps == t.DEFAULT_MAX_LAPS


def test_the_policy_refuses_with_one_message_and_skips_writes_that_keep_the_spec():
    p = ta.policy()["spec"]
    assert p["failurePolicy"] == "Fail" and p["paramKind"] == {"apiVersion": "agentrun.dev/v1alpha1",
                                                                "kind": "AgentRunPolicy"}
    assert p["matchConditions"] == [{"name": "create-or-spec-change",
                                     "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec"}]
    assert [v["expression"] for v in p["validations"]] == ["size(variables.violations) == 0"]
    b = ta.binding()["spec"]
    assert b["paramRef"] == {"name": t.DEFAULT_POLICY, "parameterNotFoundAction": "Deny"}
    assert b["validationActions"] == ["Deny"] and "matchResources" not in b


# ------------------------------------------------------------------------------ the table

def test_the_table_has_twenty_refusals():
    assert sum(1 for c in TABLE["cases"] if c["expect"]) >= 20


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_checker_gives_exactly_the_tables_messages(case):
    spec = _spec(case)
    AgentRunSpec.model_validate(spec)  # every case is a valid AgentRun: only the policy refuses it
    assert [v.message for v in t.check(spec, STRICT)] == case["expect"]
    assert t.check(spec, ALLOW_ALL) == [] or case["name"] in _ALWAYS_DENIED_CASES | _INTERNAL_NAME_CASES


_ALWAYS_DENIED_CASES = {"cloud-metadata-address", "link-local-ipv6", "cloud-metadata-name", "api-server-name",
                        "api-server-fqdn", "decimal-ip-host", "hex-ip-host", "ipv4-mapped-ipv6-metadata",
                        "several-violations-all-named", "checkpoint-endpoint-internal-address",
                        "aws-metadata-ipv6", "alibaba-metadata", "nat64-metadata", "nat64-local-use-prefix",
                        "ipv4-compatible-metadata", "wildcard-dns-metadata", "wildcard-dns-dashed",
                        "checkpoint-endpoint-api-server", "checkpoint-endpoint-wildcard-dns",
                        "checkpoint-endpoint-ipv6-metadata"}
_INTERNAL_NAME_CASES = {"allowed-internal-host", "allowed-listed-internal-checkpoint-endpoint", "single-label-host",
                        "cluster-service-host", "cluster-local-host", "checkpoint-endpoint-single-label"}
"""Refused by default (a policy without allowedInternalHosts); "policy-internal-domain" only by the
table's policy, which names corp.internal."""


def test_the_always_denied_cases_are_refused_by_the_loosest_policy():
    for c in TABLE["cases"]:
        if c["name"] in _ALWAYS_DENIED_CASES | _INTERNAL_NAME_CASES:
            assert t.check(_spec(c), ALLOW_ALL), c["name"]
    internal = ALLOW_ALL.model_copy(update={"destinations": ALLOW_ALL.destinations.model_copy(
        update={"allowed_internal_hosts": ["*"]})})
    for c in TABLE["cases"]:
        if c["name"] in _ALWAYS_DENIED_CASES:
            assert t.check(_spec(c), internal), c["name"]
        if c["name"] in _INTERNAL_NAME_CASES:
            assert not t.check(_spec(c), internal), c["name"]


def test_bad_input_doc_quotes_every_refusal_of_the_table():
    doc = (ROOT / "docs" / "bad-input.md").read_text()
    for c in TABLE["cases"]:
        for m in c["expect"]:
            assert m.replace("|", "\\|") in doc, (c["name"], m)


# ------------------------------------------------------------------------------ properties

_DENIED_IPS = st.one_of(
    st.ip_addresses(network="169.254.0.0/16"), st.ip_addresses(network="fe80::/10"),
    st.ip_addresses(network="0.0.0.0/8"), st.ip_addresses(network="64:ff9b::a9fe:0/112"),
    st.ip_addresses(network="::a9fe:0/112"), st.ip_addresses(network="64:ff9b:1::/48"),
    st.sampled_from([ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "64:ff9b::6464:64c8")]))


def _host(a) -> str:
    return f"[{a}]" if isinstance(a, ipaddress.IPv6Address) else str(a)


@given(a=_DENIED_IPS, scheme=st.sampled_from(["http", "https"]), path=st.text(max_size=20))
@settings(max_examples=200)
def test_link_local_and_unspecified_addresses_are_refused_by_any_policy(a, scheme, path):
    spec = {"agent": {"model": {"baseURL": f"{scheme}://{_host(a)}/{path}"}}}
    got = t.check(spec, ALLOW_ALL)
    assert [v.rule for v in got] == ["destinations.alwaysDenied"]
    assert got[0].field == "spec.agent.model.baseURL"


@given(host=st.sampled_from(["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                             "kubernetes.default.svc.cluster.local", "kubernetes.default.svc.corp.internal",
                             "metadata.google.internal", "metadata", "KUBERNETES.default.svc"]),
       port=st.one_of(st.none(), st.integers(1, 65535)))
def test_api_server_and_metadata_names_are_refused_by_any_policy(host, port):
    url = f"https://{host}{'' if port is None else f':{port}'}/x"
    got = t.check({"agent": {"tools": [{"name": "t", "http": {"url": url}}]}}, ALLOW_ALL)
    assert len(got) == 1 and got[0].rule in ("destinations.apiServerHosts", "destinations.metadataHosts")


@given(url=st.text(max_size=3000).map(lambda s: "https://" + s))
@settings(max_examples=300)
def test_any_url_gets_at_most_one_bounded_violation_and_never_an_exception(url):
    got = [v for v in t.check({"agent": {"model": {"baseURL": url}}}, STRICT) if not v.rule.startswith(("budget.", "approval."))]
    assert len(got) <= 1
    for v in got:
        assert len(v.message) < 600 and v.field == "spec.agent.model.baseURL"


def test_quote_bounds_the_value():
    assert t.quote("x" * 5000) == '"' + "x" * t.MAX_VALUE_CHARS + '..."'
    assert t.quote("abc") == '"abc"'


def test_budget_ceilings():
    p = t.AgentRunPolicySpec.model_validate({"budget": {"maxLaps": 5, "maxCostUSD": "1.5"}})
    assert [v.rule for v in t.check({"budget": {"maxLaps": 5, "maxCostUSD": "1.50"}}, p)] == []
    assert [v.rule for v in t.check({"budget": {"maxLaps": 6, "maxCostUSD": "1.51"}}, p)] == [
        "budget.maxLaps", "budget.maxCostUSD"]
    assert [v.value for v in t.check({}, p)] == ["100", ""]


def test_secret_name_patterns():
    assert t.name_matches("agentrun-openai", "agentrun-*")
    assert not t.name_matches("agentrunx", "agentrun-*")
    assert t.name_matches("anything", "*") and t.name_matches("openai", "openai")
    assert not t.name_matches("openai2", "openai")


def test_host_patterns_need_a_dot_boundary():
    assert t.host_matches("a.tools.example.com", "*.tools.example.com")
    assert not t.host_matches("tools.example.com", "*.tools.example.com")
    assert not t.host_matches("eviltools.example.com", "*.tools.example.com")


def test_uri_prefixes_need_a_slash_boundary():
    assert t.uri_under("s3://b/team-a/x", "s3://b/team-a") and t.uri_under("s3://b/team-a", "s3://b/team-a")
    assert not t.uri_under("s3://b/team-ab", "s3://b/team-a")
    assert t.uri_under("s3://anything/x", "s3://")


# ------------------------------------------------------------------------------ which policies apply

def _binding(name, param, selector=None, policy=t.VAP_NAME):
    b = ta.binding(name, param, selector)
    b["spec"]["policyName"] = policy
    return b


def test_binding_params_mirror_the_api_servers_namespace_selection():
    team = {"matchLabels": {t.NAMESPACE_LABEL: "team-a"}}
    default = {"matchExpressions": [{"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": ["team-a"]}]}
    bindings = [_binding("agentrun-tenancy", "default", default), _binding("agentrun-tenancy-team-a", "team-a", team),
                _binding("other", "x", None, policy="agentrun-decisions")]
    assert t.binding_params(bindings, {}) == ["default"]
    assert t.binding_params(bindings, {t.NAMESPACE_LABEL: "team-a"}) == ["team-a"]
    # a label naming no team binding keeps the default: no namespace escapes by its label
    assert t.binding_params(bindings, {t.NAMESPACE_LABEL: "typo"}) == ["default"]


@pytest.mark.parametrize("selector,labels,want", [
    (None, {}, True), ({}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1"}, True), ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
])
def test_selector_matches(selector, labels, want):
    assert t.selector_matches(selector, labels) is want


def test_check_all_refuses_when_a_named_policy_is_missing_and_names_every_policy():
    spec = _spec(next(c for c in TABLE["cases"] if c["name"] == "image-not-allowed"))
    got = t.check_all(spec, {"strict": STRICT, "gone": None, "loose": ALLOW_ALL})
    assert not got.ok
    assert got.message.startswith("AgentRunPolicy gone: spec \"\" cannot be checked: AgentRunPolicy gone")
    assert "AgentRunPolicy strict: spec.agent.image" in got.message and "loose" not in got.message
    assert t.check_all(spec, {"loose": ALLOW_ALL}).ok
    assert t.check_all(spec, {}).ok  # no binding selects the namespace: nothing to enforce


@pytest.mark.parametrize("url, want", [
    ("https://api.openai.com/v1", ("https", "api.openai.com")),
    ("https://API.OpenAI.com/v1", ("https", "api.openai.com")),
    ("https://u:p@api.openai.com/", ("https", "api.openai.com")),
    ("https://api.openai.com@exfil.example.net/", ("https", "exfil.example.net")),
    ("https://exfil.example.net?@api.openai.com/", ("https", "exfil.example.net")),  # query cut first
    ("https://exfil.example.net#@api.openai.com/", ("https", "")),  # '#' in the authority: invalid
    ("https://api.openai.com\\@exfil.example.net/", ("https", "")),  # backslash: invalid
    ("https://api.openai.com:99999/", ("https", "api.openai.com")),  # Go checks digits, not range
    ("https://api.openai.com:44x/", ("https", "")),
    ("https://[fe80::1%25eth0]:443/", ("https", "fe80::1%eth0")),
    ("https://[10.20.1.5]/", ("https", "")),  # an IP-literal must be IPv6
    ("https://BÜCHER.example/", ("https", "bÜcher.example")),  # lowerAscii
    ("https://%61pi.openai.com/", ("https", "")),
])
def test_split_url_reads_hosts_like_the_api_servers_url(url, want):
    """Each pair agrees with the API server's url() (tests/e2e/test_tenancy_policy.py PARSER_PROBES)."""
    assert t.split_url(url) == want


def test_only_bindings_that_deny_are_enforced_and_a_missing_policy_follows_its_not_found_action():
    """Picked as the API server picks them (review finding 4): a Warn/Audit binding (the trial of a
    stricter policy) admits, so the operator must not fail live runs for it; a paramRef with
    parameterNotFoundAction Allow admits when its policy is missing; a paramRef.selector applies
    every policy whose labels match."""
    warn = _binding("trial", "strict")
    warn["spec"]["validationActions"] = ["Warn", "Audit"]
    allow = _binding("optional", "maybe")
    allow["spec"]["paramRef"]["parameterNotFoundAction"] = "Allow"
    by_label = _binding("by-label", "ignored")
    by_label["spec"]["paramRef"] = {"selector": {"matchLabels": {"tier": "prod"}}, "parameterNotFoundAction": "Deny"}
    refs = t.binding_refs([warn, allow, by_label], {})
    assert [(r.name, r.deny_if_missing) for r in refs] == [("maybe", False), (None, True)]
    assert t.binding_params([warn, allow], {}) == ["maybe"]
    prod = t.AgentRunPolicySpec.model_validate({"budget": {"maxLaps": 5}})
    got = t.resolve_refs(refs, {"p1": ({"tier": "prod"}, prod), "p2": ({"tier": "dev"}, ALLOW_ALL)})
    assert got == {"p1": prod}  # "maybe" is missing and allowed; p2's labels do not match
    none = t.resolve_refs(refs, {})
    assert none == {"selected by {tier=prod}": None}
    assert not t.check_all({}, none).ok and "selected by {tier=prod}" in t.check_all({}, none).message


def test_the_operators_message_redacts_url_credentials_and_queries_the_admission_message_keeps_them():
    spec = {"agent": {"model": {"baseURL": "https://u:pw@evil.example/v1?token=abc"}}}
    check = t.check_all(spec, {"strict": STRICT})
    assert not check.ok
    assert "pw" not in check.message and "token=abc" not in check.message
    assert "https://evil.example/v1" in check.message
    (v,) = [v for _, vs in check.violations for v in vs if v.field == "spec.agent.model.baseURL"]
    assert "token=abc" in v.message  # the CEL-parity text, shown only to the requester at admission


# ------------------------------------------------------------------------------ hardening (issue 29)

@pytest.mark.parametrize("url", ["http://169.254.169.254", "https://kubernetes.default.svc",
                                 "http://169.254.169.254.nip.io", "http://vault:8200", "http://[fd00:ec2::254]",
                                 "http://100.100.100.200", "http://[64:ff9b::a9fe:a9fe]"])
def test_checkpoint_endpoints_get_the_always_denied_rules_even_where_any_endpoint_is_allowed(url):
    """Review finding: `allowedEndpoints: ["*"]` let the operator send signed S3 requests to metadata."""
    got = t.check({"checkpoint": {"endpoint": url}}, ALLOW_ALL)
    assert [v.field for v in got] == ["spec.checkpoint.endpoint"], got
    assert got[0].rule.startswith("destinations."), got


def test_a_listed_endpoint_may_be_internal_and_loopback_names_follow_allow_loopback():
    pol = t.AgentRunPolicySpec.model_validate({"checkpoint": {"allowedEndpoints": ["http://minio.storage.svc"]},
                                               "destinations": {"allowLoopback": True}})
    assert t.check({"checkpoint": {"endpoint": "http://minio.storage.svc:9000"}}, pol) == []
    assert [v.rule for v in t.check({"checkpoint": {"endpoint": "http://minio.other.svc:9000"}}, pol)] == [
        "destinations.allowedInternalHosts"]
    # localhost is judged by allowLoopback alone (the local policy's explicit allowance), not as a single label
    local = {"agent": {"tools": [{"name": "x", "http": {"url": "https://localhost:8080/x"}}]}}
    assert t.check(local, ta.LOCAL_POLICY) == []
    assert [v.rule for v in t.check(local, t.AgentRunPolicySpec())] == ["destinations.allowLoopback"]


@pytest.mark.parametrize("host", ["10.0.0.1.nip.io", "app.169.254.169.254.nip.io", "169-254-169-254.sslip.io",
                                  "x.127.0.0.1.nip.io"])
def test_names_that_embed_an_ip_are_refused_as_host_form(host):
    got = t.check({"agent": {"model": {"baseURL": f"https://{host}/v1"}}}, ALLOW_ALL)
    assert [v.rule for v in got] == ["destinations.hostForm"] and "embeds an IP address" in got[0].message


@pytest.mark.parametrize("host", ["ip-10-0-0-1.ec2.internal", "v1.2.example.com", "1.2.3.example.com"])
def test_names_with_numbers_that_are_not_an_ip_pass(host):
    assert t.check({"agent": {"model": {"baseURL": f"https://{host}/v1"}}}, ALLOW_ALL) == []


def _addr(a: str):
    return ipaddress.ip_address(a)


@pytest.mark.parametrize("a", ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "0.0.0.0", "::",
                               "fe80::1", "64:ff9b::a9fe:a9fe", "::ffff:169.254.169.254", "::169.254.169.254",
                               "2002:a9fe:a9fe::1", "64:ff9b:1::a9fe:a9fe"])
def test_connect_time_rules_refuse_the_always_denied_addresses_in_every_form(a):
    msg = addr.address_refusal(_addr(a), addr.AddressRules())
    assert msg is not None and msg.startswith(f"address {_addr(a)}") and "destinations.alwaysDenied" in msg


def test_connect_time_rules_follow_the_policies_denials_and_loopback():
    strict = t.AgentRunPolicySpec.model_validate({"destinations": {"deniedCIDRs": ["10.20.99.0/24"]}})
    rules = addr.AddressRules.of({"strict": strict, "local": ta.LOCAL_POLICY})
    assert addr.address_refusal(_addr("10.20.99.5"), rules) == (
        "address 10.20.99.5 is in the denied range 10.20.99.0/24 (AgentRunPolicy strict rule destinations.deniedCIDRs)")
    assert "(the IPv4 address 10.20.99.5)" in (addr.address_refusal(_addr("64:ff9b::a14:6305"), rules) or "")
    assert "destinations.apiServerCIDRs" in (addr.address_refusal(_addr("10.96.0.1"), rules) or "")
    assert addr.address_refusal(_addr("127.0.0.1"), rules) == (
        "address 127.0.0.1 is loopback, refused unless allowLoopback is true (AgentRunPolicy strict rule "
        "destinations.allowLoopback)")
    assert addr.address_refusal(_addr("127.0.0.1"), addr.AddressRules.of({"local": ta.LOCAL_POLICY})) is None
    # a name's address is judged by what is denied, not by allowedCIDRs (those judge IP literals in URLs)
    assert addr.address_refusal(_addr("93.184.215.14"), rules) is None
    assert addr.AddressRules.from_env(rules.to_env()) == rules


@pytest.mark.parametrize("text", ["[]", '{"denied": [["not-a-cidr", "r"]]}', '{"denied": [["10.0.0.0/8"]]}',
                                  '{"allowLoopback": "yes"}', "{"])
def test_address_rules_from_a_bad_env_value_raise(text):
    with pytest.raises(ValueError):
        addr.AddressRules.from_env(text)


def test_check_all_hands_the_lap_the_rules_only_when_every_policy_is_readable():
    strict = t.AgentRunPolicySpec.model_validate({"destinations": {"deniedCIDRs": ["10.20.99.0/24"]}})
    got = t.check_all({}, {"strict": strict})
    assert got.rules is not None and ("10.20.99.0/24", "AgentRunPolicy strict rule destinations.deniedCIDRs") in \
        got.rules.denied
    assert t.check_all({}, {"strict": strict, "gone": None}).rules is None


# ------------------------------------------------------------------------------ the lap pod template

_TEMPLATE = {"runtimeClassName": "runc", "priorityClassName": "system-cluster-critical",
             "nodeSelector": {"pool": "gpu", "kubernetes.io/hostname": "n1"},
             "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}


def test_a_policy_without_pod_template_rules_allows_any_template():
    spec = _spec({"patch": {"spec": {"agent": {"podTemplate": _TEMPLATE}}}})
    assert t.check(spec, STRICT.model_copy(update={"pod_template": t.PodTemplatePolicy()})) == []
    assert t.check(spec, ta.LOCAL_POLICY) == [] and t.check(spec, ALLOW_ALL) == []
    # the generated CEL is on only where the policy has the field (hasValue), so the same holds at apply
    exprs = {v["name"]: v["expression"] for v in ta.variables()}
    assert "!params.?spec.?podTemplate.?allowedRuntimeClassNames.hasValue()" in exprs["runtimeClassViolations"]
    assert exprs["nodeSelectorRestricted"] == "params.?spec.?podTemplate.?allowedNodeSelectors.hasValue()"
    assert "variables.podTemplateViolations" in exprs["violations"]


def test_an_empty_list_allows_only_leaving_the_field_unset():
    none = t.AgentRunPolicySpec.model_validate({"podTemplate": {"allowedRuntimeClassNames": [],
                                                                "allowedNodeSelectors": {}}})
    assert [v for v in t.check(_spec({"patch": {}}), none) if v.rule.startswith("podTemplate")] == []
    got = [v.field for v in t.check(_spec({"patch": {"spec": {"agent": {"podTemplate": _TEMPLATE}}}}), none)
           if v.rule.startswith("podTemplate")]
    assert got == ["spec.agent.podTemplate.runtimeClassName", "spec.agent.podTemplate.nodeSelector[kubernetes.io/hostname]",
                   "spec.agent.podTemplate.affinity.nodeAffinity"]


@given(keys=st.dictionaries(st.from_regex(r"[a-z]{1,6}(/[a-z]{1,4})?", fullmatch=True),
                            st.sampled_from(["a", "b", "gpu"]), min_size=1, max_size=6))
def test_the_node_selector_rule_names_the_first_offending_key_in_order(keys):
    policy = t.AgentRunPolicySpec.model_validate({"podTemplate": {"allowedNodeSelectors": {"pool": ["a", "b"]}}})
    spec = _spec({"patch": {"spec": {"agent": {"podTemplate": {"nodeSelector": keys}}}}})
    got = [v for v in t.check(spec, policy) if v.rule.startswith("podTemplate")]
    bad = sorted(k for k, v in keys.items() if k != "pool" or v == "gpu")
    assert [v.field for v in got] == ([f"spec.agent.podTemplate.nodeSelector[{bad[0]}]"] if bad else [])


def test_the_operator_recheck_of_a_run_of_an_agent_sees_its_pod_template():
    """The admission policy sees only spec.agentRef; the operator checks the effective spec of the pinned
    copy (controller/reconciler.py: check_all of agent.effective_spec(...).to_api()) with the same checker."""
    from agentrun.api.agent import AgentDefinitionSpec, effective_spec, resolve
    from agentrun.api.spec import AgentRunManifestSpec

    definition = AgentDefinitionSpec.model_validate({
        "version": "v1", "task": "t", "model": {"provider": "scripted", "script": [{"content": "done"}]},
        "podTemplate": {"runtimeClassName": "runc", "labels": {"team": "a"}}})
    run = AgentRunManifestSpec.model_validate({"agentRef": {"name": "a"}})
    effective = effective_spec(run, resolve("a", definition, run))
    policy = t.AgentRunPolicySpec.model_validate({"podTemplate": {"allowedRuntimeClassNames": ["gvisor"]}})
    check = t.check_all(effective.to_api(), {"team": policy})
    assert not check.ok
    assert check.message == ("AgentRunPolicy team: spec.agent.podTemplate.runtimeClassName \"runc\" is not an "
                             "allowed runtime class (AgentRunPolicy rule podTemplate.allowedRuntimeClassNames)")
