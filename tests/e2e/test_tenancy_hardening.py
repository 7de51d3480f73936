"""Tenancy hardening (issue 29) on the real API server and a real lap of the local control plane.

* Checkpoint endpoints, wildcard-DNS names and single-label names are refused at ``kubectl apply``
  by the ``agentrun-tenancy`` policy even under the permissive local policy (``allowedEndpoints:
  ["*"]``, ``allowedHosts: ["*"]``), with the exact message of the pure checker. On the main branch
  before this change every one of them was accepted.
* A resolved-address refusal at connect time: a host name that resolves (here through
  /etc/hosts, as a rebinding or wildcard DNS would) to an address the run's AgentRunPolicy denies
  (127.0.0.2, in ``deniedCIDRs``) passes admission (a name, allowed by ``allowedHosts: ["*"]``),
  and the lap, told the policy's rules by the operator, fails the call naming the host, the
  address and the rule; a listener on that address proves no connection, hence no request, was
  made. Before this change the lap connected and sent the call.
"""

from __future__ import annotations

import json
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "bad-input"))
sys.path.insert(0, str(ROOT / "tests" / "lap"))
from e2e.cluster import install_api  # noqa: E402
from e2e_support import delete_team_policy, wait_for  # noqa: E402
from lap_helpers import Listener  # noqa: E402  (the counting listener of tests/lap/test_netguard.py)

from agentrun.api import tenancy as t  # noqa: E402
from agentrun.api import tenancy_admission as ta  # noqa: E402

pytestmark = [pytest.mark.e2e]

HOSTS = Path("/etc/hosts")


def _run(name: str, **spec: object) -> dict:
    body = {"task": "hardening", "agent": {"version": "v1", "model": {"provider": "scripted",
                                                                      "script": [{"content": "done"}]}},
            "suspend": True, **spec}
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name}, "spec": body}


def _apply(cluster, doc: dict, ns: str):
    return cluster.kubectl_run("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)


@pytest.fixture(scope="module")
def local_ns(cluster) -> Iterator[str]:
    """A namespace under the default binding, i.e. the local AgentRunPolicy "default"."""
    install_api(cluster)
    ns = f"hardening-{uuid.uuid4().hex[:6]}"
    cluster.kubectl_run("create", "namespace", ns)
    yield ns
    cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("field, value, rule, text", [
    ("checkpoint", "http://169.254.169.254", "destinations.alwaysDenied",
     'spec.checkpoint.endpoint "http://169.254.169.254" has address 169.254.169.254: cloud metadata, link-local and '
     "unspecified addresses are always refused (AgentRunPolicy rule destinations.alwaysDenied)"),
    ("checkpoint", "https://kubernetes.default.svc", "destinations.apiServerHosts",
     'spec.checkpoint.endpoint "https://kubernetes.default.svc" has host "kubernetes.default.svc", a name of the '
     "cluster's API server, always refused (AgentRunPolicy rule destinations.apiServerHosts)"),
    ("checkpoint", "http://169.254.169.254.nip.io", "destinations.hostForm",
     'spec.checkpoint.endpoint "http://169.254.169.254.nip.io" has host "169.254.169.254.nip.io", which embeds an IP '
     "address (wildcard DNS such as nip.io resolves it to that address) (AgentRunPolicy rule destinations.hostForm)"),
    ("checkpoint", "http://minio:9000", "destinations.allowedInternalHosts",
     'spec.checkpoint.endpoint "http://minio:9000" has host "minio", a single-label or cluster-internal name (.svc, '
     ".cluster.local, internalDomains), refused unless allowedInternalHosts allows it (AgentRunPolicy rule "
     "destinations.allowedInternalHosts)"),
    ("checkpoint", "http://[fd00:ec2::254]", "destinations.alwaysDenied", None),
    ("tool", "http://169.254.169.254.nip.io/latest/meta-data/", "destinations.hostForm", None),
    ("tool", "http://vault:8200/v1/secret/data/x", "destinations.allowedInternalHosts",
     'spec.agent.tools[fetch].http.url "http://vault:8200/v1/secret/data/x" has host "vault", a single-label or '
     "cluster-internal name (.svc, .cluster.local, internalDomains), refused unless allowedInternalHosts allows it "
     "(AgentRunPolicy rule destinations.allowedInternalHosts)"),
    ("tool", "http://prometheus-server.monitoring.svc/api/v1/query", "destinations.allowedInternalHosts", None),
    ("tool", "http://100.100.100.200/latest/meta-data/", "destinations.alwaysDenied", None),
    ("tool", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/", "destinations.alwaysDenied", None),
], ids=["ck-metadata", "ck-api-server", "ck-nip-io", "ck-single-label", "ck-aws-ipv6-metadata", "tool-nip-io",
        "tool-single-label", "tool-svc", "tool-alibaba-metadata", "tool-nat64-metadata"])
def test_refused_at_apply_under_the_local_policy(cluster, local_ns, field, value, rule, text):
    name = f"h-{uuid.uuid4().hex[:6]}"
    if field == "checkpoint":
        doc = _run(name, checkpoint={"endpoint": value})
    else:
        doc = _run(name)
        doc["spec"]["agent"]["tools"] = [{"name": "fetch", "http": {"url": value}}]
    r = _apply(cluster, doc, local_ns)
    assert r.returncode != 0, f"{value} was accepted: {r.stdout}"
    violations = t.check(doc["spec"], ta.LOCAL_POLICY)
    assert [v.rule for v in violations] == [rule]
    if text is not None:
        assert violations[0].message == text
    assert t.refusal(t.DEFAULT_POLICY, violations) in r.stderr, r.stderr
    assert cluster.kubectl_run("get", "agentrun", name, "-n", local_ns, check=False).returncode != 0


def test_the_local_policy_still_admits_its_loopback_tools_and_store(cluster, local_ns):
    """The e2e tools and S3 listen on 127.0.0.1 and localhost: the local policy's allowLoopback
    is the explicit allowance that keeps them working; nothing weakened the default."""
    doc = _run(f"h-{uuid.uuid4().hex[:6]}", checkpoint={"endpoint": "http://127.0.0.1:9000"})
    doc["spec"]["agent"]["tools"] = [{"name": "a", "http": {"url": "http://127.0.0.1:8765/a"}},
                                     {"name": "b", "http": {"url": "http://localhost:8765/b"}}]
    r = cluster.kubectl_run("apply", "-n", local_ns, "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc),
                            check=False)
    assert r.returncode == 0, r.stderr
    assert [v.rule for v in t.check({"agent": doc["spec"]["agent"]}, t.AgentRunPolicySpec())] == [
        "destinations.schemes", "destinations.schemes"]  # the default policy: https only, no loopback


# ------------------------------------------------------------------------------ connect time

@pytest.fixture
def rebinding_name() -> Iterator[str]:
    """A host name that resolves to 127.0.0.2 through /etc/hosts (the tests run as root), as a
    rebinding or wildcard DNS name would resolve to an address the policy denies; the line is
    removed afterwards (only that line: the file is the machine's)."""
    name = f"tools-{uuid.uuid4().hex[:8]}.agentrun.test"
    line = f"127.0.0.2 {name}\n"
    before = HOSTS.read_text()
    HOSTS.write_text(before + ("" if before.endswith("\n") or not before else "\n") + line)
    try:
        assert socket.gethostbyname(name) == "127.0.0.2"
        yield name
    finally:
        HOSTS.write_text("".join(x for x in HOSTS.read_text().splitlines(keepends=True) if x != line))


def test_a_name_resolving_to_a_denied_address_is_refused_at_connect_time_with_nothing_sent(
        cluster, s3, tmp_path, rebinding_name):
    from test_operator_e2e import Env

    e = Env(cluster, s3, tmp_path)
    e.prepare_namespace()
    pname = f"rebind-{uuid.uuid4().hex[:6]}"
    cluster.kubectl_run("label", "namespace", e.ns, f"{t.NAMESPACE_LABEL}={pname}")
    policy = ta.LOCAL_POLICY.model_copy(update={"destinations": ta.LOCAL_POLICY.destinations.model_copy(
        update={"denied_cidrs": ["127.0.0.2/32"]})})
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    default = ta.binding(namespace_selector={"matchExpressions": [
        {"key": t.NAMESPACE_LABEL, "operator": "NotIn", "values": [pname]}]})
    docs = [ta.policy_object(pname, policy), ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel), default]
    cluster.kubectl_run("apply", "-f", "-", input="".join("---\n" + yaml.safe_dump(d) for d in docs))
    listener = Listener("127.0.0.2")
    url = f"http://{rebinding_name}:{listener.port}/lookup"
    try:
        # the listener records a connection made to it (checked once, then counted from zero)
        socket.create_connection(("127.0.0.2", listener.port), timeout=5).close()
        wait_for("the listener counted the probe", lambda: listener.accepted == 1, timeout=10)
        listener.accepted = 0
        # admission judges the name: allowed (allowedHosts "*"), whatever it resolves to
        doc = e.run_doc("rebind", [{"content": "look", "toolCalls": [{"name": "lookup", "arguments": {"q": "x"}}]},
                                   {"content": "done"}])
        doc["spec"]["agent"]["tools"] = [{"name": "lookup", "sideEffects": False, "http": {"url": url,
                                                                                          "timeout": "5s"}}]
        assert t.check(doc["spec"], policy) == []
        # the team binding is in force once it refuses the denied address as an IP literal
        probe = json.loads(json.dumps(doc))
        probe["spec"]["agent"]["tools"][0]["http"]["url"] = "http://127.0.0.2:1/x"
        wait_for("the team binding in force", lambda: "destinations.deniedCIDRs" in cluster.kubectl_run(
            "apply", "-n", e.ns, "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False).stderr,
            timeout=90, interval=1)
        e.start_operator()
        e.apply(doc)
        st = e.wait_phase("rebind", "Failed", "Succeeded", timeout=180)
        assert st["phase"] == "Failed", st
        want = (f"tool 'lookup': connection to host \"{rebinding_name}\" refused: address 127.0.0.2 is in the denied "
                f"range 127.0.0.2/32 (AgentRunPolicy {pname} rule destinations.deniedCIDRs); no request was sent")
        messages = [c.get("message") or "" for c in st.get("conditions") or []]
        assert any(want in m for m in messages), json.dumps(st, indent=1)
        assert listener.accepted == 0
        # the Job carried the rules the operator resolved for the run
        (job,) = e.jobs("rebind")[:1]
        env = {v["name"]: v.get("value") for v in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        rules = t.AddressRules.from_env(env["AGENTRUN_ADDRESS_RULES"])
        assert ("127.0.0.2/32", f"AgentRunPolicy {pname} rule destinations.deniedCIDRs") in rules.denied
    finally:
        listener.close()
        e.kill_operator()
        e.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)
        delete_team_policy(cluster, pname)
        cluster.kubectl_run("apply", "-f", str(ROOT / "crds" / "agentrun.dev_tenancy-policy.yaml"))
