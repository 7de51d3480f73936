"""The chart's tenancy guardrails (templates/tenancy-policy.yaml) and egress NetworkPolicies
(templates/networkpolicies.yaml), rendered by the real helm. The API server accepts the rendered
NetworkPolicies in tests/e2e/test_tenancy_policy.py (server-side dry-run); the process kubelet of the
local control plane does not enforce NetworkPolicy, so they are tested as manifests here."""
from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import yaml
from helm_support import CHART, ROOT, template

from agentrun.api import tenancy as t
from agentrun.api import tenancy_admission as ta

VAP = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
NP_VALUES = Path(__file__).with_name("networkpolicy-values.yaml")
TENANCY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "AgentRunPolicy"}


def _tenancy(docs):
    return [d for d in docs if d["kind"] in TENANCY_KINDS and d["metadata"]["name"].startswith(("agentrun-tenancy",))
            or d["kind"] == "AgentRunPolicy"]


def _one(docs, kind, name):
    got = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(got) == 1, (kind, name)
    return got[0]


def test_default_install_renders_the_generated_policy_a_default_policy_and_its_binding(helm):
    _, docs = template(helm, *VAP)
    got = {(d["kind"], d["metadata"]["name"]) for d in _tenancy(docs)}
    assert got == {("ValidatingAdmissionPolicy", t.VAP_NAME), ("ValidatingAdmissionPolicyBinding", t.VAP_NAME),
                   ("AgentRunPolicy", t.DEFAULT_POLICY)}
    assert _one(docs, "ValidatingAdmissionPolicy", t.VAP_NAME)["spec"] == ta.policy()["spec"]
    assert _one(docs, "ValidatingAdmissionPolicyBinding", t.VAP_NAME)["spec"] == ta.binding()["spec"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    default = _one(docs, "AgentRunPolicy", t.DEFAULT_POLICY)
    assert default["spec"] == values["tenancy"]["policy"]
    t.AgentRunPolicySpec.model_validate(default["spec"])  # a valid AgentRunPolicy spec
    # the re-check's ClusterRole (tenancy.operatorRecheck, on by default): exactly its watches (and
    # the get of a namespace whose event has not arrived yet)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-tenancy-reader")]
    assert sorted((r["resources"][0], tuple(r["verbs"])) for r in role["rules"]) == [
        ("agentrunpolicies", ("list", "watch")), ("namespaces", ("get", "list", "watch")),
        ("validatingadmissionpolicybindings", ("list", "watch"))]
    # every resource the operator's informers of the re-check read, with list and watch
    from agentrun.controller.tenancy import KINDS
    granted = {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]}
    assert {(plural, v) for _, plural in KINDS.values() for v in ("list", "watch")} <= granted
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and "inbox" not in d["metadata"]["name"]]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_TENANCY_RECHECK"] == "true" and "AGENTRUN_TENANCY_RECHECK_SECONDS" not in env


def test_what_the_default_policy_allows():
    """README/security.md describe these: only the operator's lap image, Secrets agentrun-*, https to
    public host names (no IP literals, no in-cluster names, never metadata or the API server), the
    operator's store, at most 1000 laps."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    p = t.AgentRunPolicySpec.model_validate(values["tenancy"]["policy"])

    def rules(**spec):
        base = {"agent": {"model": {"provider": "openai"}}, "budget": {"maxLaps": 10}}
        for k, v in spec.items():
            base["agent"][k] = v
        return [v.rule for v in t.check(base, p)]

    assert rules() == []
    assert rules(model={"baseURL": "https://api.openai.com/v1",
                        "apiKeySecretRef": {"name": "agentrun-openai", "key": "k"}}) == []
    assert rules(model={"apiKeySecretRef": {"name": "openai", "key": "k"}}) == ["secrets.allowedNames"]
    assert rules(image="docker.io/library/python:3") == ["images"]
    for url, rule in (("http://api.example.com/", "destinations.schemes"),
                      ("https://10.0.0.5/", "destinations.allowedCIDRs"),
                      ("https://127.0.0.1:8765/", "destinations.allowLoopback"),
                      ("https://169.254.169.254/", "destinations.alwaysDenied"),
                      ("https://kubernetes.default.svc/", "destinations.apiServerHosts"),
                      ("https://payments.prod.svc.cluster.local/", "destinations.allowedInternalHosts"),
                      ("https://db.prod.svc/", "destinations.allowedInternalHosts"),
                      ("https://vault/", "destinations.allowedInternalHosts"),
                      ("https://prometheus-server:9090/", "destinations.allowedInternalHosts"),
                      ("https://169.254.169.254.nip.io/", "destinations.hostForm"),
                      ("https://db.corp.internal/", "destinations.allowedInternalHosts"),
                      ("https://printer.local/", "destinations.allowedInternalHosts")):
        assert rules(tools=[{"name": "x", "http": {"url": url}}]) == [rule], url
    assert [v.rule for v in t.check({"checkpoint": {"endpoint": "https://s3.example.net"}}, p)] == [
        "checkpoint.allowedEndpoints"]
    assert [v.rule for v in t.check({"checkpoint": {"endpoint": "http://169.254.169.254"}}, p)] == [
        "destinations.alwaysDenied"]
    assert [v.rule for v in t.check({"budget": {"maxLaps": 1001}}, p)] == ["budget.maxLaps"]


def test_team_policies_get_their_own_binding_and_leave_the_default(helm):
    _, docs = template(helm, *VAP, "-f", str(NP_VALUES))
    default = _one(docs, "ValidatingAdmissionPolicyBinding", t.VAP_NAME)["spec"]
    assert default["matchResources"]["namespaceSelector"] == {"matchExpressions": [
        {"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": ["team-a"]}]}
    team = _one(docs, "ValidatingAdmissionPolicyBinding", f"{t.VAP_NAME}-team-a")["spec"]
    assert team["paramRef"] == {"name": "team-a", "parameterNotFoundAction": "Deny"}
    assert team["matchResources"]["namespaceSelector"] == {"matchLabels": {t.NAMESPACE_LABEL: "team-a"}}
    # the operator's loader picks the same policy for a namespace as these bindings
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert t.binding_params(bindings, {t.NAMESPACE_LABEL: "team-a"}) == ["team-a"]
    assert t.binding_params(bindings, {t.NAMESPACE_LABEL: "team-z"}) == [t.DEFAULT_POLICY]
    assert t.binding_params(bindings, {}) == [t.DEFAULT_POLICY]
    t.AgentRunPolicySpec.model_validate(_one(docs, "AgentRunPolicy", "team-a")["spec"])
    reader = _one(docs, "ClusterRole", "agentrun-operator-tenancy-reader")
    assert {(r, v) for rule in reader["rules"] for r in rule["resources"] for v in rule["verbs"]} == {
        ("namespaces", "get"), ("namespaces", "list"), ("namespaces", "watch"),
        ("validatingadmissionpolicybindings", "list"), ("validatingadmissionpolicybindings", "watch"),
        ("agentrunpolicies", "list"), ("agentrunpolicies", "watch")}


def test_a_policys_notification_outcomes_reach_its_agentrunpolicy_and_the_operator_may_read_it(helm):
    """tenancy.policy / teamPolicies.*.notifications.outcomes (issue 31): rendered into the
    AgentRunPolicies; the notifier is a thread of the operator, so the tenancy re-check's reader
    role (list/watch agentrunpolicies) is what lets it read them."""
    _, docs = template(helm, *VAP, "--set", "notifications.enabled=true", "--set", "notifications.webhook.secretName=hook",
                       "--set-json", 'tenancy.policy.notifications={"outcomes": ["Failed"]}',
                       "--set-json", 'tenancy.teamPolicies={"team-a": {"notifications": {"outcomes": []}}}')
    default = t.AgentRunPolicySpec.model_validate(_one(docs, "AgentRunPolicy", t.DEFAULT_POLICY)["spec"])
    team = t.AgentRunPolicySpec.model_validate(_one(docs, "AgentRunPolicy", "team-a")["spec"])
    assert default.notifications.outcomes == ["Failed"] and team.notifications.outcomes == []
    reader = _one(docs, "ClusterRole", "agentrun-operator-tenancy-reader")
    subjects = _one(docs, "ClusterRoleBinding", "agentrun-operator-tenancy-reader")["subjects"]
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and "inbox" not in d["metadata"]["name"]]
    assert subjects[0]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"list", "watch"} <= {v for r in reader["rules"] if "agentrunpolicies" in r["resources"] for v in r["verbs"]}
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"AGENTRUN_NOTIFY_WEBHOOK_URL", "AGENTRUN_NOTIFY_OUTCOMES"} <= env


def test_with_watch_namespaces_the_reader_lists_and_watches_only_those_namespaces(helm):
    _, docs = template(helm, *VAP, "--set", "watchNamespaces={team-a,team-b}")
    reader = _one(docs, "ClusterRole", "agentrun-operator-tenancy-reader")
    (ns_rule,) = [r for r in reader["rules"] if r["resources"] == ["namespaces"]]
    assert ns_rule["resourceNames"] == ["team-a", "team-b"] and ns_rule["verbs"] == ["get", "list", "watch"]
    assert all("resourceNames" not in r for r in reader["rules"] if r is not ns_rule)


@pytest.mark.parametrize("args, reader", [
    (["--set", "admissionPolicies.validating=false"], True),  # you install them: the re-check still reads them
    (VAP + ["--set", "tenancy.enabled=false"], False),
], ids=["validating-opt-out", "disabled"])
def test_tenancy_renders_only_where_served_and_enabled(helm, args, reader):
    _, docs = template(helm, *args)
    assert _tenancy(docs) == []
    assert bool([d for d in docs if d["metadata"]["name"].endswith("-tenancy-reader")]) == reader


def test_values_schema_holds_the_generated_policy_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["tenancy"]["properties"]
    crd_spec = ta.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def props(n):
        return {k: props(v) for k, v in n.get("properties", {}).items()}
    assert props(schema["policy"]) == props(crd_spec) != {}
    assert props(schema["teamPolicies"]["additionalProperties"]) == props(crd_spec)


@pytest.mark.parametrize("setting, text", [
    (["--set-json", 'tenancy.policy.destinations.schemes=["ftp"]'], "/tenancy/policy/destinations/schemes/0"),
    (["--set-json", 'tenancy.policy.secrets.allowedNames=["Bad Name"]'], "/tenancy/policy/secrets/allowedNames/0"),
    (["--set", "tenancy.policy.budget.maxLaps=0"], "/tenancy/policy/budget/maxLaps"),
    (["--set-json", 'tenancy.policy.notifications.outcomes=["Done"]'], "/tenancy/policy/notifications/outcomes/0"),
    (["--set-json", 'tenancy.teamPolicies={"team-a": {"notifications": {"outcomes": ["Failed", "Failed"]}}}'],
     "/tenancy/teamPolicies/team-a/notifications/outcomes"),
    (["--set", "tenancy.policy.imgs=x"], "imgs"),
    (["--set-json", 'tenancy.teamPolicies={"Team A": {}}'], "'Team A' does not match pattern"),
    (["--set-json", "networkPolicy.apiServer.ports=[0]"], "/networkPolicy/apiServer/ports/0"),
])
def test_bad_tenancy_values_are_refused_by_the_schema(helm, setting, text):
    proc, _ = template(helm, *VAP, *setting, check=False)
    assert proc.returncode != 0 and text in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------ NetworkPolicies

def _nps(docs):
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "NetworkPolicy"}


def _peers(rule):
    return rule.get("to") or []


def test_lap_pods_get_default_deny_egress_except_dns_store_public_and_extra(helm):
    _, docs = template(helm, "-f", str(NP_VALUES))
    nps = _nps(docs)
    laps = {ns: d for (ns, name), d in nps.items() if name.endswith("-lap-egress")}
    assert set(laps) == {"agentrun-system", "team-a", "team-b"}  # every lap namespace
    for d in laps.values():
        spec = d["spec"]
        assert spec["policyTypes"] == ["Egress"]  # an Egress policy selecting the pod: all else is denied
        assert spec["podSelector"] == {"matchExpressions": [{"key": "agentrun.dev/run", "operator": "Exists"}]}
        dns, store, public, models, tools = spec["egress"]
        assert {p["port"] for p in dns["ports"]} == {53}
        assert store["ports"] == [{"protocol": "TCP", "port": 9000}]
        assert _peers(store)[0] == {"ipBlock": {"cidr": "10.40.0.0/24"}}
        block = _peers(public)[0]["ipBlock"]
        assert block["cidr"] == "0.0.0.0/0" and "169.254.0.0/16" in block["except"]
        assert models["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "models"}
        assert tools["to"][0]["ipBlock"]["except"] == ["10.20.99.0/24"]


def test_no_egress_rule_reaches_link_local_metadata(helm):
    """169.254.169.254 is inside no allowed ipBlock (0.0.0.0/0 carries it in except)."""
    meta = ipaddress.ip_address("169.254.169.254")
    for args in ([], ["-f", str(NP_VALUES)]):
        _, docs = template(helm, *args)
        for d in _nps(docs).values():
            for rule in d["spec"].get("egress", []):  # (the inbox's ingress policy has none)
                for peer in _peers(rule):
                    b = peer.get("ipBlock")
                    if b and meta in ipaddress.ip_network(b["cidr"]):
                        assert any(meta in ipaddress.ip_network(e) for e in b.get("except", [])), d["metadata"]


def test_operator_reaches_only_dns_the_api_server_and_the_store(helm):
    _, docs = template(helm, "-f", str(NP_VALUES))
    op = next(d for (_, name), d in _nps(docs).items() if name.endswith("-operator-egress"))
    assert op["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "agentrun-operator",
                                                         "app.kubernetes.io/instance": "agentrun-operator",
                                                         "app.kubernetes.io/component": "operator"}}
    dns, api, store, webhook = op["spec"]["egress"]  # the values file turns notifications on
    assert webhook["to"] == [{"ipBlock": {"cidr": "10.50.0.0/16"}}]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert [p["ipBlock"]["cidr"] for p in api["to"]] == ["10.96.0.1/32", "172.18.0.2/32"]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    assert store["ports"] == [{"protocol": "TCP", "port": 9000}]
    # defaults: the API server ports anywhere (endpoints differ per cluster), the store on the public internet
    _, docs = template(helm)
    op = next(d for (_, name), d in _nps(docs).items() if name.endswith("-operator-egress"))
    dns, api, store = op["spec"]["egress"]
    assert "to" not in api and {p["port"] for p in api["ports"]} == {443, 6443}
    assert store["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in store["to"][0]["ipBlock"]["except"]


def test_network_policies_can_be_turned_off(helm):
    _, docs = template(helm, "--set", "networkPolicy.enabled=false")
    assert not _nps(docs)


def test_the_dev_policy_file_is_the_local_policy():
    doc = yaml.safe_load((ROOT / "e2e" / "tenancy-local-policy.yaml").read_text())
    assert t.AgentRunPolicySpec.model_validate(doc["spec"]) == ta.LOCAL_POLICY
