"""Tenancy guardrails (issue 13) on the real API server of the local control plane.

* The table tests/fixtures/tenancy/policy-cases.yaml, applied with ``kubectl apply --dry-run=server``
  in a namespace bound to the table's strict AgentRunPolicy (its own binding, selected by the
  namespace label agentrun.dev/tenancy-policy, and the default binding excluding that label value, as
  the chart renders a team policy): every refused case names exactly the messages the pure checker
  (agentrun.api.tenancy.check) gives, and every allowed case is accepted; so the CEL and the Python
  checker agree case by case.
* The loader of the operator's re-check (agentrun.controller.tenancy.load_policies) reads, through the API, the same
  policies the API server applies; tightening the policy after a run was admitted makes the re-check
  of the stored run fail with the violation named; the operator's watched store (PolicyStore fed by
  informers, with exactly the chart's reader ClusterRole) sees the tightening with its watch event;
  and the running operator stops such a run before its next lap, with no periodic policy read (the
  test at the end reads its agentrun_kube_requests_total).
* The chart's NetworkPolicies are accepted by the API server (server-side dry-run). The process
  kubelet does not enforce NetworkPolicy (there is no network plugin): only the manifests are tested.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "bad-input"))
import bad_input_table as bt  # noqa: E402
from e2e.cluster import ADMISSION_APIS, API_MANIFESTS, install_api, sa_kubeconfig  # noqa: E402
from e2e_support import delete_team_policy, wait_for  # noqa: E402

from agentrun.api import tenancy as t  # noqa: E402
from agentrun.api import tenancy_admission as ta  # noqa: E402
from agentrun.controller import tenancy as tc  # noqa: E402
from agentrun.controller.config import OperatorConfig  # noqa: E402
from agentrun.controller.policycheck import wanted  # noqa: E402

pytestmark = [pytest.mark.e2e]

TABLE = yaml.safe_load((ROOT / "tests" / "fixtures" / "tenancy" / "policy-cases.yaml").read_text())
CASES = TABLE["cases"]
DEFAULT_BINDING = ROOT / "crds" / API_MANIFESTS[3]


def _apply(cluster, *docs: dict, ns: str | None = None, flags: tuple[str, ...] = (), check: bool = False):
    text = "".join("---\n" + yaml.safe_dump(d) for d in docs)
    args = ["apply", *(["-n", ns] if ns else []), *flags, "-f", "-"]
    return cluster.kubectl_run(*args, input=text, check=check)


def _manifest(case: dict, name: str) -> dict:
    doc = bt.manifest(TABLE["run"], case.get("patch"), case.get("remove", []))
    doc["metadata"]["name"] = name
    return doc


@pytest.fixture(scope="module")
def strict(cluster):
    """A namespace under the table's strict policy only: (namespace, policy name)."""
    install_api(cluster)
    suffix = uuid.uuid4().hex[:6]
    ns, pname = f"tenancy-{suffix}", f"strict-{suffix}"
    cluster.kubectl_run("create", "namespace", ns)
    cluster.kubectl_run("label", "namespace", ns, f"{t.NAMESPACE_LABEL}={pname}")
    policy = ta.policy_object(pname, t.AgentRunPolicySpec.model_validate(TABLE["policy"]))
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    team = ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel)
    default = ta.binding(namespace_selector={"matchExpressions": [
        {"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": [pname]}]})
    _apply(cluster, policy, team, default, check=True)
    # the binding is in force once a refused case is refused by it and the allowed run passes
    bad = _manifest(next(c for c in CASES if c["name"] == "image-not-allowed"), "probe")
    good = _manifest(CASES[0], "probe")
    wait_for("the strict binding in force", lambda: (
        f"AgentRunPolicy {pname}:" in _apply(cluster, bad, ns=ns, flags=("--dry-run=server",)).stderr
        and _apply(cluster, good, ns=ns, flags=("--dry-run=server",)).returncode == 0), timeout=90, interval=1)
    yield ns, pname
    cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
    delete_team_policy(cluster, pname)
    cluster.kubectl_run("apply", "-f", str(DEFAULT_BINDING))  # the default binding without the exclusion


def test_the_table_has_twenty_refusals_and_allowed_controls():
    refused = [c for c in CASES if c["expect"]]
    assert len(refused) >= 20 and len(CASES) - len(refused) >= 3
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_api_server_refuses_exactly_what_the_checker_refuses(cluster, strict, case):
    ns, pname = strict
    doc = _manifest(case, f"t-{case['name']}"[:63].rstrip("-"))
    r = _apply(cluster, doc, ns=ns, flags=("--dry-run=server",))
    violations = t.check(doc["spec"], t.AgentRunPolicySpec.model_validate(TABLE["policy"]))
    python = [v.message for v in violations]
    assert python == case["expect"]
    if not case["expect"]:
        assert r.returncode == 0, f"{case['name']} refused: {r.stderr}"
        return
    assert r.returncode != 0, f"{case['name']} was accepted: {r.stdout}"
    assert t.refusal(pname, violations) in r.stderr, r.stderr
    assert f"ValidatingAdmissionPolicy '{t.VAP_NAME}'" in r.stderr, r.stderr


def test_the_local_default_policy_still_refuses_metadata_and_the_api_server(cluster, strict):
    """The permissive policy of `make dev` and the e2e tests keeps the always-denied destinations."""
    ns = f"tenancy-local-{uuid.uuid4().hex[:6]}"
    cluster.kubectl_run("create", "namespace", ns)
    try:
        for url in ("http://169.254.169.254/latest/meta-data/", "http://kubernetes.default.svc/api"):
            doc = _manifest({"patch": {"spec": {"agent": {"tools": [{"name": "search", "http": {"url": url}}]}}}},
                            "local")
            want = t.refusal(t.DEFAULT_POLICY, t.check(doc["spec"], ta.LOCAL_POLICY))
            r = _apply(cluster, doc, ns=ns, flags=("--dry-run=server",))
            assert r.returncode != 0 and want in r.stderr, (want, r.stderr)
        doc = _manifest({"patch": {"spec": {"agent": {"tools": [
            {"name": "search", "http": {"url": "http://127.0.0.1:8765/q"}}]}}}}, "local")
        assert _apply(cluster, doc, ns=ns, flags=("--dry-run=server",)).returncode == 0
    finally:
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


def _largest_policy() -> dict:
    """Every list of the policy at its maxItems (64), the entries a run matches last."""
    fill = [f"x{i}.example.org" for i in range(62)] + ["api.openai.com"]
    return {
        "images": {"allowedPrefixes": [f"r{i}.example.org/" for i in range(63)] + ["registry.example.com/"],
                   "allowedDigests": [f"r.example.org/l@sha256:{i:064x}" for i in range(64)]},
        "secrets": {"allowedNames": [f"s{i}-*" for i in range(63)] + ["agentrun-*"]},
        "destinations": {"schemes": ["http", "https"], "allowedHosts": fill + ["*.tools.example.com"],
                         "allowedCIDRs": [f"10.{i}.0.0/16" for i in range(64)],
                         "deniedHosts": [f"d{i}.example.org" for i in range(64)],
                         "deniedCIDRs": [f"192.168.{i}.0/24" for i in range(64)],
                         "apiServerCIDRs": [f"172.16.{i}.1/32" for i in range(64)]},
        "checkpoint": {"allowedEndpoints": [f"https://e{i}.example.org" for i in range(63)] + ["https://s3.example.com"],
                       "allowedURIPrefixes": [f"s3://b{i}" for i in range(63)] + ["s3://checkpoints"]},
        "budget": {"maxLaps": 1000, "maxCostUSD": "100"},
    }


def test_the_largest_run_against_the_largest_policy_stays_within_the_cel_budget(cluster, strict):
    """128 tools (the CRD's maxItems), each with a URL and a headers Secret, against a policy whose
    every list is at its maxItems: the API server evaluates it (no cost-limit error) and agrees with
    the checker both when all pass and when all 128 URLs fail (the refusal is cut at 4000 chars)."""
    ns, _ = strict
    pname = f"{strict[1]}-big"
    label = f"{t.NAMESPACE_LABEL}={pname}"
    big_ns = f"{ns}-big"
    cluster.kubectl_run("create", "namespace", big_ns)
    cluster.kubectl_run("label", "namespace", big_ns, label)
    pol = t.AgentRunPolicySpec.model_validate(_largest_policy())
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    default = ta.binding(namespace_selector={"matchExpressions": [
        {"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": [strict[1], pname]}]})
    _apply(cluster, ta.policy_object(pname, pol), ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel), default, check=True)
    try:
        doc = _manifest(CASES[0], "big")
        tools = [{"name": f"t{i}", "http": {"url": f"https://t{i}.tools.example.com/q",
                                              "headersSecretRef": {"name": f"agentrun-h{i}", "key": "h"}}}
                 for i in range(128)]
        doc["spec"]["agent"]["tools"] = tools
        doc["spec"]["agent"]["model"]["apiKeySecretRef"]["name"] = "agentrun-openai"
        assert t.check(doc["spec"], pol) == []
        wait_for("the big policy's binding in force", lambda: f"AgentRunPolicy {pname}:" in _apply(
            cluster, {**doc, "spec": {**doc["spec"], "budget": {"maxLaps": 5000}}}, ns=big_ns,
            flags=("--dry-run=server",)).stderr, timeout=90, interval=1)
        r = _apply(cluster, doc, ns=big_ns, flags=("--dry-run=server",))
        assert r.returncode == 0, r.stderr
        for tool in tools:
            tool["http"]["url"] = tool["http"]["url"].replace("tools.example.com", "exfil.example.net")
        violations = t.check(doc["spec"], pol)
        assert len(violations) == 128
        r = _apply(cluster, doc, ns=big_ns, flags=("--dry-run=server",))
        assert r.returncode != 0 and t.refusal(pname, violations) in r.stderr, r.stderr
        assert "cost" not in r.stderr.lower().replace("maxcostusd", ""), r.stderr
    finally:
        cluster.kubectl_run("delete", "namespace", big_ns, "--wait=false", check=False)
        _apply(cluster, ta.binding(namespace_selector={"matchExpressions": [
            {"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": [strict[1]]}]}))
        delete_team_policy(cluster, pname)


# URLs where URL parsers are known to disagree (userinfo, backslashes, fragments, trailing dots,
# ports, zones, mapped and abbreviated IPv4, case): the API server's url() (Go) and the checker
# (Python urlsplit) must judge each the same way, or an attacker picks the one that passes.
PARSER_PROBES = [
    "https://api.openai.com/v1", "https://API.OpenAI.com/v1", "https://user:pw@api.openai.com/v1",
    "https://api.openai.com@exfil.example.net/", "https://exfil.example.net#@api.openai.com/",
    "https://exfil.example.net?@api.openai.com/", "https://api.openai.com\\@exfil.example.net/",
    "https://exfil.example.net\\.tools.example.com/", "https://api.openai.com./v1", "https://api.openai.com:443/v1",
    "https://api.openai.com:99999/v1", "https://api.openai.com:/v1", "https:///v1", "https://",
    "https://search.tools.example.com:8443/q?x=1#f", "https://a_b.tools.example.com/", "https://-x.tools.example.com/",
    "https://127.1/", "https://0177.0.0.1/", "https://10.20.1.5/", "https://010.20.1.5/", "https://10.20.1.5:0/",
    "https://[::ffff:127.0.0.1]/", "https://[::ffff:10.20.1.5]/", "https://[fe80::1%25eth0]/", "https://[::1]/",
    "https://[::]/", "https://0.0.0.0/", "https://[2001:db8::1]/", "https://169.254.169.254.nip.io/",
    "https://kubernetes.default.svc.cluster.local./", "https://KUBERNETES.DEFAULT.SVC/", "https://localhost./",
    "https://metadata.google.internal./", "https://xn--bcher-kva.tools.example.com/", "https://bücher.tools.example.com/",
    "https://search.tools.example.com%2f@exfil.example.net/", "https://search.tools.example.com /", "http://10.20.1.5/",
    "HTTPS://api.openai.com/", "https://1.2.3.4.5/", "https://[10.20.1.5]/", "https://[fe80::1%25eth0]:443/",
    "https://a.tools.example.com:8443@exfil.example.net/", "https://exfil.example.net:443\\@a.tools.example.com/",
    "https://a.tools.example.com:44x/", "https://[::ffff:a14:105]/", "https://%61pi.openai.com/",
]


def test_url_parser_probes_are_judged_alike_by_the_api_server_and_the_checker(cluster, strict):
    ns, pname = strict
    pol = t.AgentRunPolicySpec.model_validate(TABLE["policy"])
    disagree = []
    for i, url in enumerate(PARSER_PROBES):
        doc = _manifest({"patch": {"spec": {"agent": {"tools": [{"name": "search", "http": {"url": url}}]}}}},
                        f"probe-{i}")
        r = _apply(cluster, doc, ns=ns, flags=("--dry-run=server",))
        if "should match" in r.stderr:  # the CRD's pattern refuses it before the policy runs
            continue
        violations = t.check(doc["spec"], pol)
        want_ok = not violations
        got_ok = r.returncode == 0
        if want_ok != got_ok or (violations and t.refusal(pname, violations) not in r.stderr):
            disagree.append((url, [v.message for v in violations], r.stderr.strip()[-400:]))
    assert not disagree, "\n".join(map(str, disagree))


def _helm_docs(*args: str) -> list[dict]:
    """The chart rendered by the real helm (tools/install-helm.sh) with these arguments."""
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    out = subprocess.run([helm, "template", "agentrun-operator", str(ROOT / "helm" / "agentrun-operator"),
                          *ADMISSION_APIS, *args],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _api_client(cluster):
    from kubernetes import client, config

    return config.new_client_from_config(config_file=cluster.kubeconfig), client


def test_the_recheck_loader_reads_what_the_api_server_applies_and_sees_a_tightened_policy(cluster, strict):
    ns, pname = strict
    api, _ = _api_client(cluster)
    policies = tc.load_policies(api, ns)
    assert list(policies) == [pname]
    assert policies[pname] == t.AgentRunPolicySpec.model_validate(TABLE["policy"])
    assert list(tc.load_policies(api, "default")) == [t.DEFAULT_POLICY]
    # admit a run, then tighten the policy: the stored run no longer complies
    doc = _manifest(CASES[0], "tightened")
    _apply(cluster, doc, ns=ns, check=True)
    stored = json.loads(cluster.kubectl_run("get", "agentrun", "tightened", "-n", ns, "-o", "json").stdout)["spec"]
    assert t.check_all(stored, tc.load_policies(api, ns)).ok
    cluster.kubectl_run("patch", "agentrunpolicy", pname, "--type=merge", "-p",
                        json.dumps({"spec": {"destinations": {"allowedHosts": ["api.openai.com"]}}}))
    got = t.check_all(stored, tc.load_policies(api, ns))
    assert not got.ok
    assert ('spec.agent.tools[search].http.url "https://search.tools.example.com/q" has host '
            '"search.tools.example.com", which is not allowed (AgentRunPolicy rule destinations.allowedHosts)'
            in got.message), got.message
    # the API server agrees: an update of the spec is refused now; a metadata-only write still passes
    doc["spec"]["suspend"] = False
    r = _apply(cluster, doc, ns=ns)
    assert r.returncode != 0 and "destinations.allowedHosts" in r.stderr, r.stderr
    cluster.kubectl_run("annotate", "agentrun", "tightened", "-n", ns, "example.com/note=kept")
    # a binding naming a missing AgentRunPolicy refuses everything (parameterNotFoundAction: Deny)
    cluster.kubectl_run("patch", "agentrunpolicy", pname, "--type=merge", "-p",
                        json.dumps({"spec": {"destinations": {"allowedHosts": TABLE["policy"]["destinations"]
                                                              ["allowedHosts"]}}}))
    assert t.check_all(stored, tc.load_policies(api, ns)).ok
    missing = t.check_all(stored, {pname: None})
    assert not missing.ok and "does not exist" in missing.message


def _watching(api, body) -> None:
    """Run ``await body(store)`` with a PolicyStore fed by the operator's informers of the
    re-check (list, then watch) through the kubernetes ApiClient ``api``, once they synced."""
    from agentrun.kube.client import Client
    from agentrun.kube.informer import Informer

    async def main() -> None:
        store = tc.PolicyStore()
        loop = asyncio.get_running_loop()
        client = Client(api, 8)
        infs = [Informer(client, kind, None, None, store, loop, resource=res, optional=True)
                for kind, res in tc.KINDS.items()]
        for inf in infs:
            inf.start()
        try:
            await asyncio.wait_for(asyncio.gather(*(inf.synced.wait() for inf in infs)), 60)
            await body(store)
        finally:
            for inf in infs:
                inf.stop()
            for inf in infs:
                await inf.stopped()
            await client.close()

    asyncio.run(main())


async def _until(what: str, fn, timeout: float = 60):
    for _ in range(int(timeout / 0.1)):
        if got := fn():
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_recheck_is_none_without_the_readers_rbac_and_a_check_with_it(cluster, strict):
    """The chart's tenancy.operatorRecheck ClusterRole is exactly what the re-check needs: without it
    the re-check says it cannot run (None: not enforced; the watches are refused), with it the
    loader checks, and the watched store checks and sees a tightened policy with its watch event."""
    from kubernetes import config

    ns, pname = strict
    sa = f"recheck-{uuid.uuid4().hex[:4]}"
    cluster.kubectl_run("create", "serviceaccount", sa, "-n", ns)
    api = config.new_client_from_config(config_file=sa_kubeconfig(cluster, ns, sa))
    spec = _manifest(CASES[0], "x")["spec"]
    assert tc.recheck(api, ns, spec) is None

    async def refused(store):
        assert store.refusals and store.check(ns, spec) is None

    _watching(api, refused)
    chart_role = next(d for d in _helm_docs("--set", "tenancy.operatorRecheck=true", "--api-versions",
                                 "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
                      if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-tenancy-reader"))
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{sa}-{ns}"},
            "rules": chart_role["rules"]}
    crb = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"{sa}-{ns}"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{sa}-{ns}"},
           "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
    _apply(cluster, role, crb, check=True)
    try:
        got = wait_for("the reader RBAC in force", lambda: tc.recheck(api, ns, spec), timeout=60)
        assert got.ok and [n for n, _ in got.violations] == [pname]
        bad = _manifest(next(c for c in CASES if c["name"] == "cloud-metadata-address"), "x")["spec"]
        assert "destinations.alwaysDenied" in tc.recheck(api, ns, bad).message

        async def watched(store):
            got = store.check(ns, spec)
            assert store.refusals == {} and got.ok and [n for n, _ in got.violations] == [pname], got
            hosts = TABLE["policy"]["destinations"]["allowedHosts"]
            await asyncio.to_thread(cluster.kubectl_run, "patch", "agentrunpolicy", pname, "--type=merge", "-p",
                                    json.dumps({"spec": {"destinations": {"allowedHosts": ["api.openai.com"]}}}))
            try:
                got = await _until("the tightened policy watched", lambda: not store.check(ns, spec).ok)
                assert "destinations.allowedHosts" in store.check(ns, spec).message
            finally:
                await asyncio.to_thread(cluster.kubectl_run, "patch", "agentrunpolicy", pname, "--type=merge", "-p",
                                        json.dumps({"spec": {"destinations": {"allowedHosts": hosts}}}))
            await _until("the restored policy watched", lambda: store.check(ns, spec).ok)

        _watching(api, watched)
    finally:
        cluster.kubectl_run("delete", "clusterrolebinding,clusterrole", f"{sa}-{ns}", "--ignore-not-found")


def test_chart_networkpolicies_are_accepted_by_the_api_server(cluster, strict):
    """Rendered with the values that turn every rule on, applied with a server-side dry-run. The
    process kubelet has no network plugin, so nothing enforces them here: manifests only."""
    values = ROOT / "tests" / "helm" / "networkpolicy-values.yaml"
    out = _helm_docs("--namespace", strict[0], "-f", str(values))
    docs = [d for d in out if d["kind"] == "NetworkPolicy"]
    assert len(docs) >= 2
    for d in docs:
        d["metadata"]["namespace"] = strict[0]
    r = _apply(cluster, *docs, flags=("--dry-run=server",))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("created (server dry run)") == len(docs), r.stdout


def test_a_policy_tightened_after_apply_stops_the_run_before_its_next_call(cluster, s3, strict, tmp_path):
    """Lap 1's tool call is held at a gate; the policy is tightened (loopback no longer allowed);
    the call is released once the operator's watch reported the tightened version: lap 1
    completes, and the operator's re-check before lap 2 stops the run (Failed, condition reason
    PolicyViolation naming the rule) before lap 2's call. Throughout, the re-check read the
    policies, bindings and namespaces by one list each and watches: no get or list per reconcile
    or per period (the TTL re-check made three reads per namespace and period)."""
    from e2e_support import ToolGate
    from test_notifications import free_port, kube_requests
    from test_operator_e2e import Env

    port = free_port()

    class RecheckEnv(Env):
        def operator_env(self, **extra: str) -> dict[str, str]:
            return super().operator_env(AGENTRUN_METRICS_PORT=str(port), **extra)

    e = RecheckEnv(cluster, s3, tmp_path)
    e.prepare_namespace()
    pname = f"{strict[1]}-op"
    cluster.kubectl_run("label", "namespace", e.ns, f"{t.NAMESPACE_LABEL}={pname}")
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    _apply(cluster, ta.policy_object(pname, ta.LOCAL_POLICY), ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel),
           check=True)
    gate = ToolGate(e.tool_url)
    e.start_operator()
    try:
        script = [{"content": "one", "toolCalls": [{"name": "slow", "arguments": {"order": "1"}}]},
                  {"content": "two", "toolCalls": [{"name": "slow", "arguments": {"order": "2"}}]},
                  {"content": "done"}]
        doc = e.run_doc("tighten", script)
        doc["spec"]["agent"]["tools"] = [{"name": "slow", "http": {"url": f"{gate.url}/slow", "timeout": "10m"}}]
        e.apply(doc)
        wait_for("lap 1's call held at the gate", lambda: gate.arrived("1") >= 1, timeout=180)
        rv = cluster.kubectl_run("patch", "agentrunpolicy", pname, "--type=merge", "-o",
                                 "jsonpath={.metadata.resourceVersion}", "-p",
                                 json.dumps({"spec": {"destinations": {"allowLoopback": False}}})).stdout.strip()
        # the operator's watch delivered the tightened version (the lap's end comes through another watch)
        wait_for("the tightened policy watched by the operator",
                 lambda: f"AgentRunPolicy {pname} changed (resourceVersion {rv})" in e.log.read_text(), timeout=60)
        gate.open()
        st = e.wait_phase("tighten", "Failed", "Succeeded", timeout=180)
        assert st["phase"] == "Failed", st
        cond = next(c for c in st.get("conditions") or [] if c.get("reason") == t.CONDITION_REASON)
        assert "destinations.allowLoopback" in cond["message"] and pname in cond["message"], cond
        assert gate.arrived("2") == 0
        got = kube_requests(port)
        # (not the admission policy check's: a discovery GET, then one list and watch by name of each
        # policy and binding it checks, counted under the same resources; controller/policycheck.py)
        by_name = sum(1 for w in wanted(OperatorConfig().admission_policies)
                      if w.kind == "ValidatingAdmissionPolicyBinding")
        reads = {k: v for k, v in got.items() if k[0] in ("get", "list") and k[1] in (
            "namespaces", "validatingadmissionpolicybindings", "agentrunpolicies", "other")
            and k != ("list", "other")}
        reads[("list", "validatingadmissionpolicybindings")] = (
            reads.get(("list", "validatingadmissionpolicybindings"), 0) - by_name)
        assert got.get(("get", "other"), 0) == 0, got  # the policy check's gets are labelled by kind
        # one list of each watched kind (a second one only after an expired watch), and at most one
        # get of the run's namespace if the run was reconciled before its namespace's watch event
        assert sum(reads.values()) <= 4 and got.get(("get", "agentrunpolicies"), 0) == 0, got
        assert got.get(("watch", "agentrunpolicies"), 0) >= 1, got
    finally:
        gate.close()
        e.kill_operator()
        e.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)
        delete_team_policy(cluster, pname)
