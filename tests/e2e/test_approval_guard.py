"""What an approval is bound to, guarded by the API server (issue 29; docs/security.md).

On the real local control plane with the generated admission policies of crds/ (``install_api``),
the chart's ``agentrun-approver`` ClusterRole (rendered by the real helm), RBAC made here and real
users by impersonation (``kubectl --as/--as-group``), as in tests/e2e/test_approval_authz.py:

* a patch-only author cannot change what an approved or a future gated call does
  (``requiresApproval`` off, a gated tool's URL, ``agent.image``, the owner): refused, naming the
  verb and the field; an approver can;
* who may decide is read from before the request: an approver outside the owner group cannot set
  the owner to her own group and approve in one patch, nor hand the owner on, nor decide a pending
  call whose recorded owner she is not in;
* four eyes: with ``spec.approval.distinctFromCreator`` the creator (who holds ``approve``) is
  refused, by annotation and by the status route; without it she may decide;
* ``agentrun.dev/created-by`` is the authenticated creator: a forged value is overwritten (or, without
  stamping, refused) and nobody changes or removes it later;
* a patch-only user cannot strip ``decided-by`` / ``call-id`` beside a pending ``approved=true``;
* where the operator is named (as the chart names its ServiceAccount), a tenant holding ``*`` on
  ``agentruns/status`` (and so the ``operate`` verb) is not the operator.

No operator runs here: the runs are suspended and their pending approvals are written by admin as the
operator would, so every answer comes from the API server's admission alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from e2e.cluster import install_api
from e2e_support import wait_for
from test_approval_authz import approver_clusterrole

from agentrun.api import admission
from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_CALL_ID,
    ANN_CREATED_BY,
    ANN_DECIDED_BY,
    APPROVE_VERB,
    DECISION_ANNOTATIONS,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

VERB = f'needs the "{APPROVE_VERB}" verb on agentruns.agentrun.dev in namespace'
BOTH = "a decision (annotation approved, reason or call binding) and a change of spec.approval.owner cannot be made " \
       "in one request"
ADMIN = "admin"  # the local control plane's admin kubeconfig user (system:masters)


class Guard:
    def __init__(self, cluster) -> None:
        self.cluster = cluster
        tag = uuid.uuid4().hex[:6]
        self.ns, self.fb = f"guard-{tag}", f"guard-fb-{tag}"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        return self.cluster.kubectl_run(*args, check=check, input=input)

    def as_user(self, user: str, *args: str, groups: tuple[str, ...] = (), input: str | None = None):
        return self.kubectl(*args, f"--as={user}", *(f"--as-group={g}" for g in groups), check=False, input=input)

    def doc(self, name: str, *, owner: str = "e2e-team", distinct: bool | None = None,
            annotations: dict | None = None) -> dict:
        approval: dict = {"owner": owner}
        if distinct is not None:
            approval["distinctFromCreator"] = distinct
        meta: dict = {"name": name}
        if annotations:
            meta["annotations"] = annotations
        return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": meta, "spec": {
            "task": f"guard {name}", "suspend": True, "approval": approval,
            "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]},
                      "tools": [{"name": "note", "http": {"url": "http://127.0.0.1:9/note"}},
                                {"name": "wire", "requiresApproval": True,
                                 "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
                                 "http": {"url": "http://127.0.0.1:9/wire"}}]}}}

    def create(self, doc: dict, *, user: str | None = None, ns: str | None = None, groups: tuple[str, ...] = ()):
        args = ("apply", "-n", ns or self.ns, "-f", "-")
        if user is None:
            return self.kubectl(*args, input=yaml.safe_dump(doc))
        return self.as_user(user, *args, groups=groups, input=yaml.safe_dump(doc))

    def get(self, name: str, ns: str | None = None) -> dict:
        return json.loads(self.kubectl("get", "agentrun", name, "-n", ns or self.ns, "-o", "json").stdout)

    def annotations(self, name: str, ns: str | None = None) -> dict:
        return self.get(name, ns)["metadata"].get("annotations") or {}

    def pending(self, name: str, *, owner: str = "e2e-team", ns: str | None = None) -> dict:
        """Put the run into AwaitingApproval as the operator would (admin counts as the operator)."""
        approval = {"state": "Pending", "lap": 1, "tool": "wire", "callId": f"call-{name}", "idempotencyKey": "k",
                    "arguments": json.dumps({"to": "x"}), "owner": owner,
                    "requestedAt": "2026-01-01T00:00:00Z", "deadline": "2099-01-01T00:00:00Z"}
        self.kubectl("patch", "agentrun", name, "-n", ns or self.ns, "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"phase": "AwaitingApproval", "approval": approval}}))
        return approval

    def patch(self, user: str, name: str, patch: dict | list, *, groups: tuple[str, ...] = (),
              status: bool = False, ns: str | None = None, dry_run: bool = False):
        kind = "json" if isinstance(patch, list) else "merge"
        extra = ("--subresource=status",) * status + ("--dry-run=server",) * dry_run
        return self.as_user(user, "patch", "agentrun", name, "-n", ns or self.ns, *extra, f"--type={kind}",
                            "-p", json.dumps(patch), groups=groups)


@pytest.fixture(scope="module")
def g(cluster):
    """carol: author (create/patch agentruns, no approve); alice: approver through group finance;
    dave: approver through group ops; erin: author AND approver (the four-eyes case). ``g.fb`` is a
    namespace without the stamping MutatingAdmissionPolicies (what clusters < 1.36 get)."""
    install_api(cluster)
    approver_clusterrole(cluster)
    g = Guard(cluster)
    for ns in (g.ns, g.fb):
        g.kubectl("create", "namespace", ns)
        g.kubectl("create", "role", "author", "-n", ns, "--verb=get,list,watch,create,update,patch",
                  "--resource=agentruns.agentrun.dev")
        g.kubectl("create", "rolebinding", "author", "-n", ns, "--role=author", "--user=carol", "--user=erin")
        g.kubectl("create", "rolebinding", "approvers", "-n", ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
                  "--group=finance", "--group=ops", "--user=erin")
    g.kubectl("label", "namespace", g.fb, f"{admission.NO_STAMP_LABEL}={admission.NO_STAMP_VALUE}")

    # the policies are live once a forged creator is refused (no stamping) and stamped (stamping)
    forged = g.doc("probe", annotations={ANN_CREATED_BY: "someone-else"})
    wait_for("agentrun-approval-guard refuses a forged creator", lambda: "must be your authenticated user name" in g.kubectl(
        "create", "--dry-run=server", "-n", g.fb, "-f", "-", input=yaml.safe_dump(forged), check=False).stderr,
        timeout=90)
    wait_for("agentrun-stamp-creator stamps the creator", lambda: json.loads(g.kubectl(
        "create", "--dry-run=server", "-n", g.ns, "-o", "json", "-f", "-", input=yaml.safe_dump(forged),
        check=False).stdout or "{}").get("metadata", {}).get("annotations", {}).get(ANN_CREATED_BY) == ADMIN,
        timeout=90)
    yield g
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        for ns in (g.ns, g.fb):
            g.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# -------------------------------------------------------------------------------------- tests

def test_a_patch_only_author_cannot_change_what_a_gated_call_does(g):
    g.create(g.doc("redirect"), user="carol")
    g.pending("redirect")
    refused = [
        ([{"op": "replace", "path": "/spec/agent/tools/1/requiresApproval", "value": False}],
         "spec.agent.tools[wire].requiresApproval", "may not turn approval off (true to false)"),
        ([{"op": "replace", "path": "/spec/agent/tools/1/http/url", "value": "http://127.0.0.1:9/attacker"}],
         "spec.agent.tools[wire].http.url", "may not change the URL of a tool with requiresApproval"),
        ([{"op": "remove", "path": "/spec/agent/tools/1"}],
         "spec.agent.tools[wire]", "may not remove a tool with requiresApproval"),
        ({"spec": {"agent": {"image": "registry.example.com/attacker:1"}}},
         "spec.agent.image", "may not change the lap image"),
        ({"spec": {"approval": {"owner": "carol"}}}, "spec.approval.owner", "may not change who decides"),
    ]
    for patch, field, what in refused:
        r = g.patch("carol", "redirect", patch)
        assert r.returncode != 0, (field, r.stdout)
        assert f'{field}: user "carol" {what} in agentrun {g.ns}/redirect' in r.stderr, (field, r.stderr)
        assert VERB in r.stderr and admission.VAP_GUARD in r.stderr, (field, r.stderr)
    spec = g.get("redirect")["spec"]
    wire = spec["agent"]["tools"][1]
    assert (wire["requiresApproval"], wire["http"]["url"]) == (True, "http://127.0.0.1:9/wire")
    assert "image" not in spec["agent"] and spec["approval"]["owner"] == "e2e-team"

    # what does not change a gated call stays open to her: an ungated tool, a gated tool's timeout, suspend
    for patch in ([{"op": "replace", "path": "/spec/agent/tools/0/http/url", "value": "http://127.0.0.1:9/n2"}],
                  [{"op": "replace", "path": "/spec/agent/tools/1/http/timeout", "value": "9s"}],
                  {"spec": {"suspend": False}}, {"spec": {"suspend": True}}):
        r = g.patch("carol", "redirect", patch)
        assert r.returncode == 0, (patch, r.stderr)
    # an approver may change the target (the operator then asks again for the new one)
    r = g.patch("alice", "redirect", [{"op": "replace", "path": "/spec/agent/tools/1/http/url",
                                       "value": "http://127.0.0.1:9/wire2"}], groups=("finance",))
    assert r.returncode == 0, r.stderr


def test_the_owner_is_read_from_before_the_request(g):
    g.create(g.doc("owned", owner="group:finance"), user="carol")
    g.pending("owned", owner="group:finance")
    # dave approves (group ops) but is not in finance: his own group as owner plus approved=true, one patch
    r = g.patch("dave", "owned", {"metadata": {"annotations": {ANN_APPROVED: "true"}},
                                  "spec": {"approval": {"owner": "group:ops"}}}, groups=("ops",))
    assert r.returncode != 0, r.stdout
    # two policies refuse it (the API server reports one of them): the owner before the request is
    # finance, and a decision and an owner change cannot come together
    assert BOTH in r.stderr or ('is decided by the members of group finance (spec.approval.owner "group:finance")'
                                in r.stderr and 'user "dave" is not one' in r.stderr), r.stderr
    # nor in two steps: handing a group owner on needs its membership
    r = g.patch("dave", "owned", {"spec": {"approval": {"owner": "group:ops"}}}, groups=("ops",))
    assert r.returncode != 0 and "only they may change its owner" in r.stderr, r.stderr
    # a member of the owner group cannot decide and change the owner in one request either
    r = g.patch("alice", "owned", {"metadata": {"annotations": {ANN_APPROVED: "true"}},
                                   "spec": {"approval": {"owner": "group:ops"}}}, groups=("finance",))
    assert r.returncode != 0 and BOTH in r.stderr, r.stderr
    assert ANN_APPROVED not in g.annotations("owned")

    # alice hands the owner to ops; the pending call keeps the owner it was requested with
    r = g.patch("alice", "owned", {"spec": {"approval": {"owner": "group:ops"}}}, groups=("finance",))
    assert r.returncode == 0, r.stderr
    for status in (False, True):
        patch = ({"status": {"approval": {"decision": "approved"}}} if status
                 else {"metadata": {"annotations": {ANN_APPROVED: "true"}}})
        r = g.patch("dave", "owned", patch, groups=("ops",), status=status)
        assert r.returncode != 0, (status, r.stdout)
        assert ('is decided by the members of group finance (status.approval.owner of the pending call '
                '"group:finance"); user "dave" is not one') in r.stderr, (status, r.stderr)
    r = g.patch("alice", "owned", {"metadata": {"annotations": {ANN_APPROVED: "true"}}}, groups=("finance", "ops"))
    assert r.returncode == 0, r.stderr


def test_four_eyes_the_creator_may_not_decide(g):
    # erin holds create and approve; she created both runs
    r = g.create(g.doc("four-eyes", distinct=True), user="erin")
    assert r.returncode == 0, r.stderr
    r = g.create(g.doc("two-eyes", distinct=False), user="erin")
    assert r.returncode == 0, r.stderr
    assert g.get("four-eyes")["spec"]["approval"]["distinctFromCreator"] is True
    g.pending("four-eyes")
    g.pending("two-eyes")
    rule = (f"spec.approval.distinctFromCreator: the creator of agentrun {g.ns}/four-eyes may not decide its "
            f'approvals (four eyes); user "erin" created it (annotation {ANN_CREATED_BY})')
    r = g.as_user("erin", "annotate", "agentrun", "four-eyes", "-n", g.ns, f"{ANN_APPROVED}=true")
    assert r.returncode != 0 and rule in r.stderr, r.stderr
    r = g.patch("erin", "four-eyes", {"status": {"approval": {"decision": "approved"}}}, status=True)
    assert r.returncode != 0 and rule in r.stderr, r.stderr
    # nor can she turn the rule off for her own run; a patch-only user cannot at all
    r = g.patch("erin", "four-eyes", {"spec": {"approval": {"distinctFromCreator": False}}})
    assert r.returncode != 0 and f'user "erin" created agentrun {g.ns}/four-eyes and may not turn four eyes off' \
        in r.stderr, r.stderr
    r = g.patch("carol", "four-eyes", {"spec": {"approval": {"distinctFromCreator": False}}})
    assert r.returncode != 0 and "spec.approval.distinctFromCreator: " in r.stderr and VERB in r.stderr, r.stderr
    # nor pre-approve at creation
    r = g.create(g.doc("four-eyes-pre", distinct=True, annotations={ANN_APPROVED: "true"}), user="erin")
    assert r.returncode != 0 and "may not decide its approvals (four eyes)" in r.stderr, r.stderr
    assert ANN_APPROVED not in g.annotations("four-eyes")
    # another approver may decide it; the creator may decide a run without the rule
    r = g.as_user("alice", "annotate", "agentrun", "four-eyes", "-n", g.ns, f"{ANN_APPROVED}=true",
                  groups=("finance",))
    assert r.returncode == 0, r.stderr
    r = g.as_user("erin", "annotate", "agentrun", "two-eyes", "-n", g.ns, f"{ANN_APPROVED}=true")
    assert r.returncode == 0, r.stderr
    assert g.annotations("two-eyes")[ANN_DECIDED_BY] == "erin"


def test_the_creator_annotation_cannot_be_forged_or_changed(g):
    r = g.create(g.doc("forged", annotations={ANN_CREATED_BY: "bob"}), user="carol")
    assert r.returncode == 0, r.stderr
    assert g.annotations("forged")[ANN_CREATED_BY] == "carol"  # stamped over the forged value
    fixed = f"the annotation {ANN_CREATED_BY} is recorded by the API server when the run is created and " \
            "cannot be added, changed or removed afterwards"
    for user, groups in (("carol", ()), ("alice", ("finance",))):
        r = g.as_user(user, "annotate", "agentrun", "forged", "-n", g.ns, "--overwrite", f"{ANN_CREATED_BY}=bob",
                      groups=groups)
        assert r.returncode != 0 and fixed in r.stderr, (user, r.stderr)
        r = g.as_user(user, "annotate", "agentrun", "forged", "-n", g.ns, f"{ANN_CREATED_BY}-", groups=groups)
        assert r.returncode != 0 and fixed in r.stderr, (user, r.stderr)
    r = g.kubectl("annotate", "agentrun", "forged", "-n", g.ns, f"{ANN_CREATED_BY}-", check=False)  # admin too
    assert r.returncode != 0 and fixed in r.stderr, r.stderr
    assert g.annotations("forged")[ANN_CREATED_BY] == "carol"

    # without stamping: a forged creator is refused, one's own name accepted, none allowed ...
    r = g.create(g.doc("fb-forged", annotations={ANN_CREATED_BY: "bob"}), user="carol", ns=g.fb)
    assert r.returncode != 0, r.stdout
    assert f'the annotation {ANN_CREATED_BY} must be your authenticated user name "carol" when you create an ' \
           "AgentRun" in r.stderr, r.stderr
    r = g.create(g.doc("fb-own", annotations={ANN_CREATED_BY: "carol"}, distinct=True), user="carol", ns=g.fb)
    assert r.returncode == 0, r.stderr
    r = g.create(g.doc("fb-none"), user="carol", ns=g.fb)
    assert r.returncode == 0, r.stderr
    assert ANN_CREATED_BY not in g.annotations("fb-none", g.fb)
    # ... but four eyes needs a recorded creator, and one cannot be added later
    needs = f"spec.approval.distinctFromCreator needs the creator recorded in the annotation {ANN_CREATED_BY}"
    r = g.patch("carol", "fb-none", {"spec": {"approval": {"distinctFromCreator": True}}}, ns=g.fb)
    assert r.returncode != 0 and needs in r.stderr, r.stderr
    r = g.create(g.doc("fb-distinct", distinct=True), user="carol", ns=g.fb)
    assert r.returncode != 0 and needs in r.stderr, r.stderr
    r = g.as_user("carol", "annotate", "agentrun", "fb-none", "-n", g.fb, f"{ANN_CREATED_BY}=carol")
    assert r.returncode != 0 and fixed in r.stderr, r.stderr


def test_a_patch_only_user_cannot_strip_a_pending_decision(g):
    g.create(g.doc("strip"), user="carol")
    approval = g.pending("strip")
    r = g.as_user("alice", "annotate", "agentrun", "strip", "-n", g.ns, f"{ANN_APPROVED}=true",
                  f"{ANN_CALL_ID}={approval['callId']}", groups=("finance",))
    assert r.returncode == 0, r.stderr
    for keys in ((ANN_DECIDED_BY,), (ANN_CALL_ID,), (ANN_CALL_ID, ANN_DECIDED_BY)):
        r = g.as_user("carol", "annotate", "agentrun", "strip", "-n", g.ns, *(f"{k}-" for k in keys))
        assert r.returncode != 0, (keys, r.stdout)
        assert f'user "carol" may not remove the annotation {", ".join(sorted(keys, key=_order))} of the pending ' \
               f"decision {ANN_APPROVED}=true on agentrun {g.ns}/strip" in r.stderr, (keys, r.stderr)
        assert VERB in r.stderr, r.stderr
    ann = g.annotations("strip")
    assert (ann[ANN_DECIDED_BY], ann[ANN_CALL_ID]) == ("alice", approval["callId"])
    # removing the whole decision is not a decision (the operator consumes it that way)
    r = g.as_user("carol", "annotate", "agentrun", "strip", "-n", g.ns, f"{ANN_APPROVED}-", f"{ANN_CALL_ID}-",
                  f"{ANN_DECIDED_BY}-")
    assert r.returncode == 0, r.stderr


def _helm() -> str:
    return subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]


def _order(key: str) -> int:
    return DECISION_ANNOTATIONS.index(key)


def test_a_tenant_holding_star_is_not_the_operator_where_the_operator_is_named(g):
    """docs/security.md: `verbs: ["*"]` holds the custom operate verb. The crds/ policy (verb only)
    takes such a tenant for the operator; the policy as the chart renders it (the real helm; the
    operator's ServiceAccount named in OPERATOR_USERNAMES_VAR) does not. Here that rendering, bound to
    one namespace under another name, next to the crds/ one."""
    ns, sa = f"{g.ns}-op", "agentrun-operator"
    g.kubectl("create", "namespace", ns)
    g.kubectl("label", "namespace", ns, f"agentrun.dev/guard-test={ns}")
    g.kubectl("create", "serviceaccount", sa, "-n", ns)
    g.kubectl("create", "role", "star", "-n", ns, "--verb=*", "--resource=agentruns.agentrun.dev,"
              "agentruns.agentrun.dev/status")
    g.kubectl("create", "rolebinding", "star", "-n", ns, "--role=star", "--user=tenant", f"--serviceaccount={ns}:{sa}")
    # the chart's rendering for a release in `ns` whose operator ServiceAccount is `sa`
    out = subprocess.run([_helm(), "template", "agentrun", str(ROOT / "helm" / "agentrun-operator"), "--namespace", ns,
                          "--set", f"serviceAccount.name={sa}", "--api-versions",
                          "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "--api-versions",
                          "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
                          "--show-only", "templates/admission-policies.yaml"],
                         check=True, capture_output=True, text=True).stdout
    policy = next(d for d in yaml.safe_load_all(out)
                  if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == admission.VAP_STATUS)
    assert {"name": admission.OPERATOR_USERNAMES_VAR,
            "expression": json.dumps([f"system:serviceaccount:{ns}:{sa}"])} in policy["spec"]["variables"]
    name = f"{admission.VAP_STATUS}-named-{ns}"[:63]
    policy["metadata"] = {"name": name}
    binding = {"apiVersion": admission.VAP_API, "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {"agentrun.dev/guard-test": ns}}}}}
    g.create(g.doc("cost"), ns=ns)
    g.pending("cost", ns=ns)  # as admin, before the named policy (admin is not the operator under it)
    g.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([policy, binding]))
    try:
        cost = {"status": {"cost": {"usd": "0.00"}}}
        r = g.as_user("tenant", "auth", "can-i", admission.OPERATE_VERB, "agentruns.agentrun.dev", "--subresource=status",
                      "-n", ns)
        assert r.stdout.strip() == "yes", r.stdout  # `*` holds the custom verb
        refused = "status.cost is written only by the agentrun operator"
        wait_for(f"{name} in force", lambda: g.patch("tenant", "cost", cost, status=True, ns=ns, dry_run=True)
                 .returncode != 0, timeout=60)
        r = g.patch("tenant", "cost", cost, status=True, ns=ns)
        assert r.returncode != 0 and refused in r.stderr and name in r.stderr, r.stderr
        assert "cost" not in g.get("cost", ns)["status"]
        # the named ServiceAccount holding the verb is the operator
        r = g.patch(f"system:serviceaccount:{ns}:{sa}", "cost", {"status": {"cost": {"usd": "0.01"}}}, status=True,
                    ns=ns)
        assert r.returncode == 0, r.stderr
        assert g.get("cost", ns)["status"]["cost"]["usd"] == "0.01"
    finally:
        g.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found", check=False)
        g.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found", check=False)
        if os.environ.get("AGENTRUN_E2E_KEEP") is None:
            g.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_patch_only_author_cannot_change_a_gated_mcp_server(g):
    """An MCP server with requiresApproval patterns is guarded like a gated HTTP tool: its url, headers
    Secret and sideEffects, its patterns (removal) and the server itself need ``approve``; adding a
    pattern, and any change of an ungated server, stay open to the author."""
    doc = g.doc("mcp")
    doc["spec"]["agent"]["mcpServers"] = [
        {"name": "ledger", "url": "http://127.0.0.1:9/mcp", "requiresApproval": ["book_*"]},
        {"name": "docs", "url": "http://127.0.0.1:9/docs"},
    ]
    g.create(doc, user="carol")
    refused = [
        ([{"op": "replace", "path": "/spec/agent/mcpServers/0/url", "value": "http://127.0.0.1:9/attacker"}],
         "spec.agent.mcpServers[ledger].url", "may not change the URL of an MCP server with requiresApproval"),
        ([{"op": "replace", "path": "/spec/agent/mcpServers/0/requiresApproval", "value": []}],
         "spec.agent.mcpServers[ledger].requiresApproval", "may not remove a requiresApproval pattern of an MCP server"),
        ([{"op": "replace", "path": "/spec/agent/mcpServers/0/sideEffects", "value": []}],
         "spec.agent.mcpServers[ledger].sideEffects", "may not change sideEffects of an MCP server with requiresApproval"),
        ([{"op": "add", "path": "/spec/agent/mcpServers/0/headersSecretRef", "value": {"name": "s", "key": "k"}}],
         "spec.agent.mcpServers[ledger].headersSecretRef",
         "may not change the headers Secret of an MCP server with requiresApproval"),
        ([{"op": "remove", "path": "/spec/agent/mcpServers/0"}],
         "spec.agent.mcpServers[ledger]", "may not remove an MCP server with requiresApproval"),
    ]
    for patch, field, what in refused:
        r = g.patch("carol", "mcp", patch)
        assert r.returncode != 0, (field, r.stdout)
        assert f'{field}: user "carol" {what} in agentrun {g.ns}/mcp' in r.stderr, (field, r.stderr)
        assert VERB in r.stderr and admission.VAP_GUARD in r.stderr, (field, r.stderr)
    ledger = g.get("mcp")["spec"]["agent"]["mcpServers"][0]
    assert (ledger["url"], ledger["requiresApproval"]) == ("http://127.0.0.1:9/mcp", ["book_*"])

    for patch in ([{"op": "add", "path": "/spec/agent/mcpServers/0/requiresApproval/-", "value": "pay_*"}],
                  [{"op": "replace", "path": "/spec/agent/mcpServers/1/url", "value": "http://127.0.0.1:9/d2"}],
                  [{"op": "replace", "path": "/spec/agent/mcpServers/0/timeout", "value": "9s"}]):
        r = g.patch("carol", "mcp", patch)
        assert r.returncode == 0, (patch, r.stderr)
    r = g.patch("alice", "mcp", [{"op": "replace", "path": "/spec/agent/mcpServers/0/url",
                                  "value": "http://127.0.0.1:9/mcp2"}], groups=("finance",))
    assert r.returncode == 0, r.stderr


def agent_doc(name: str, rollout: str) -> dict:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": {
        "version": "v1", "rollout": rollout, "task": "guard {{ topic }}",
        "parameters": [{"name": "topic"}], "approval": {"owner": "e2e-team"},
        "model": {"provider": "scripted", "script": [{"content": "x"}]},
        "tools": [{"name": "note", "http": {"url": "http://127.0.0.1:9/note"}},
                  {"name": "wire", "requiresApproval": True, "http": {"url": "http://127.0.0.1:9/wire"}}],
        "mcpServers": [{"name": "ledger", "url": "http://127.0.0.1:9/mcp", "requiresApproval": ["book_*"]}]}}


def test_an_agent_author_cannot_change_what_runs_following_the_agent_call(g):
    """An Agent with ``rollout: FollowLatest`` hands every edit to its runs in flight at their next lap:
    its gated tools and MCP servers, its image and its approval policy change only with ``approve`` on
    the namespace's AgentRuns (policy agentrun-agent-guard), and so does turning FollowLatest on. A
    Pinned Agent's edits (which reach only runs not started) and ungated changes stay open to the
    author; an approver may make them all."""
    g.kubectl("create", "role", "agent-author", "-n", g.ns, "--verb=get,list,watch,create,update,patch",
              "--resource=agents.agentrun.dev")
    g.kubectl("create", "rolebinding", "agent-author", "-n", g.ns, "--role=agent-author", "--user=carol",
              "--group=finance")

    def patch(user: str, name: str, ops: list, groups: tuple[str, ...] = ()):
        return g.as_user(user, "patch", "agent", name, "-n", g.ns, "--type=json", "-p", json.dumps(ops), groups=groups)

    for name, rollout in (("follower", "FollowLatest"), ("pinned", "Pinned")):
        r = g.as_user("carol", "apply", "-n", g.ns, "-f", "-", input=yaml.safe_dump(agent_doc(name, rollout)))
        assert r.returncode == 0, r.stderr  # creating either is open to the author
    refused = [
        ([{"op": "replace", "path": "/spec/tools/1/http/url", "value": "http://127.0.0.1:9/attacker"}],
         "spec.tools[wire].http.url", "may not change the URL of a tool with requiresApproval"),
        ([{"op": "replace", "path": "/spec/tools/1/requiresApproval", "value": False}],
         "spec.tools[wire].requiresApproval", "may not turn approval off (true to false)"),
        ([{"op": "remove", "path": "/spec/tools/1"}], "spec.tools[wire]", "may not remove a tool with requiresApproval"),
        ([{"op": "replace", "path": "/spec/mcpServers/0/requiresApproval", "value": []}],
         "spec.mcpServers[ledger].requiresApproval", "may not remove a requiresApproval pattern of an MCP server"),
        ([{"op": "add", "path": "/spec/image", "value": "registry.example/other:1"}],
         "spec.image", "may not change the lap image"),
        ([{"op": "replace", "path": "/spec/approval/owner", "value": "carol"}],
         "spec.approval.owner", "may not change who decides"),
    ]
    for ops, field, what in refused:
        r = patch("carol", "follower", ops)
        assert r.returncode != 0, (field, r.stdout)
        assert f'{field}: user "carol" {what} in Agent {g.ns}/follower' in r.stderr, (field, r.stderr)
        assert VERB in r.stderr and admission.VAP_AGENT_GUARD in r.stderr, (field, r.stderr)
        assert patch("carol", "pinned", ops).returncode == 0, field  # a Pinned Agent: open to its author
    # turning FollowLatest on hands the Pinned Agent's edits (made above) to its runs in flight
    flip = [{"op": "replace", "path": "/spec/rollout", "value": "FollowLatest"}]
    r = patch("carol", "pinned", flip)
    assert r.returncode != 0 and f'spec.rollout: user "carol" may not turn FollowLatest on in Agent {g.ns}/pinned' \
        in r.stderr, r.stderr
    spec = json.loads(g.kubectl("get", "agent", "follower", "-n", g.ns, "-o", "json").stdout)["spec"]
    assert spec["tools"][1]["http"]["url"] == "http://127.0.0.1:9/wire" and spec["tools"][1]["requiresApproval"]
    # ungated changes stay open: the ungated tool, a new requiresApproval pattern, the version
    for ops in ([{"op": "replace", "path": "/spec/tools/0/http/url", "value": "http://127.0.0.1:9/note2"}],
                [{"op": "add", "path": "/spec/mcpServers/0/requiresApproval/-", "value": "pay_*"}],
                [{"op": "replace", "path": "/spec/version", "value": "v2"}]):
        r = patch("carol", "follower", ops)
        assert r.returncode == 0, (ops, r.stderr)
    # an approver (group finance) may make them
    for name, ops in (("follower", refused[0][0]), ("pinned", flip)):
        r = patch("alice", name, ops, groups=("finance",))
        assert r.returncode == 0, (name, r.stderr)
