"""Approvals are authorization decisions, checked by the API server (issue 11; docs/security.md).

On the real local control plane with the generated admission policies of crds/ (installed by
``Env.prepare_namespace`` through ``e2e.cluster.install_api``), the chart's ``agentrun-approver``
ClusterRole (rendered by the real helm), RBAC made here and real users by impersonation
(``kubectl --as/--as-group``) or a ServiceAccount's kubeconfig (TokenRequest):

* a user without the ``approve`` verb (the run's own creator included) cannot decide: ``kubectl
  annotate ... approved=true`` is refused with a message naming the permission;
* an approver's decision lands with the authenticated name in ``status.approval.decidedBy``, the
  ApprovalDecided Event and the lap record (``agentrun trace``); a forged decider is overwritten
  (MutatingAdmissionPolicy) or, in a namespace without stamping (the < 1.36 fallback), refused;
* a user who may patch ``agentruns/status`` cannot change cost, retries or phase; an approver may
  set ``status.approval.decision`` and gets ``decidedBy`` stamped;
* ``agentrun approvals show`` prints the full arguments from the checkpoint store with their
  sha256, and ``agentrun approve`` sends the binding and the decider.

The operator runs with the admin kubeconfig (``system:masters`` passes every authorizer check,
so it counts as the operator). Every wait is on a condition, with generous deadlines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from e2e.cluster import ADMISSION_APIS, sa_kubeconfig
from e2e_support import wait_for
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.api import admission
from agentrun.api.approval import ANN_APPROVED, ANN_CALL_ID, ANN_DECIDED_BY, APPROVE_VERB, arguments_sha256

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"
PERMISSION = f'needs the "{APPROVE_VERB}" verb on agentruns.agentrun.dev in namespace'


# ------------------------------------------------------------------------------------ helpers

def as_user(e, user: str, *args: str, groups: tuple[str, ...] = (), input: str | None = None):
    flags = [f"--as={user}", *(f"--as-group={g}" for g in groups)]
    return e.kubectl(*args, *flags, check=False, input=input)


def approver_clusterrole(cluster) -> None:
    """The chart's agentrun-approver ClusterRole, rendered by the real helm and applied."""
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    out = subprocess.run([helm, "template", "agentrun-operator", str(CHART), *ADMISSION_APIS, "--show-only",
                          "templates/approver-rbac.yaml"], check=True, capture_output=True, text=True).stdout
    doc = yaml.safe_load(out)
    assert doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == admission.APPROVER_CLUSTERROLE
    cluster.kubectl_run("apply", "-f", "-", input=out)


@pytest.fixture(scope="module")
def rbac(env):  # noqa: F811 (the fixture)
    """Users of env.ns: carol creates runs (author), alice approves (bound to agentrun-approver
    through her group finance), mallory may patch the status subresource."""
    approver_clusterrole(env.cluster)
    ns = env.ns
    env.kubectl("create", "role", "author", "-n", ns, "--verb=get,list,watch,create,update,patch",
                "--resource=agentruns.agentrun.dev")
    env.kubectl("create", "rolebinding", "author", "-n", ns, "--role=author", "--user=carol")
    env.kubectl("create", "role", "status-patcher", "-n", ns, "--verb=get,patch",
                "--resource=agentruns.agentrun.dev/status")
    env.kubectl("create", "rolebinding", "status-patcher", "-n", ns, "--role=status-patcher", "--user=mallory",
                "--user=carol")
    env.kubectl("create", "rolebinding", "approvers", "-n", ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
                "--group=finance")
    return env


def waiting_run(e, name: str, arguments: dict | None = None, *, user: str | None = None) -> dict:
    """Apply a run whose first lap asks for approval of refund(arguments); wait until it waits."""
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": arguments or {"order": name}}]},
              {"content": "finished"}]
    doc = e.run_doc(name, script)
    if user:
        r = as_user(e, user, "apply", "-n", e.ns, "-f", "-", input=yaml.safe_dump(doc))
        assert r.returncode == 0, r.stderr
    else:
        e.apply(doc)
    st = e.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded", timeout=180)
    assert st["phase"] == "AwaitingApproval", st
    return st


def annotations(e, name: str) -> dict:
    return (e.get(name).get("metadata") or {}).get("annotations") or {}


def decided_event(e, name: str) -> str:
    return wait_for(f"ApprovalDecided Event of {name}",
                    lambda: next((ev["message"] for ev in e.events(name) if ev["reason"] == "ApprovalDecided"), None),
                    timeout=120)


def cli(e, *args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess:
    """``agentrun ARGS`` as a user runs it: a kubeconfig (admin by default) and S3 credentials."""
    penv = {k: v for k, v in e.cluster.env().items() if not k.startswith("AGENTRUN_")}
    penv.update({"AWS_ACCESS_KEY_ID": e.s3.access_key, "AWS_SECRET_ACCESS_KEY": e.s3.secret_key,
                 "AWS_DEFAULT_REGION": e.s3.region})
    if kubeconfig:
        penv["KUBECONFIG"] = kubeconfig
    return subprocess.run([sys.executable, "-m", "agentrun.cli.main", *args], env=penv, capture_output=True,
                          text=True, timeout=120, check=False)


# -------------------------------------------------------------------------------------- tests

def test_creator_cannot_approve_and_an_approver_decision_records_the_authenticated_user(rbac):
    e = rbac
    st = waiting_run(e, "authz-ann", user="carol")  # carol created the run
    # the creator, with create/patch on agentruns but not the approve verb: refused, naming it
    r = as_user(e, "carol", "annotate", "agentrun", "authz-ann", "-n", e.ns, f"{ANN_APPROVED}=true")
    assert r.returncode != 0, r.stdout
    assert PERMISSION in r.stderr and f"{e.ns} (role {admission.APPROVER_CLUSTERROLE})" in r.stderr, r.stderr
    assert 'user "carol"' in r.stderr and "forbidden" in r.stderr.lower(), r.stderr
    assert ANN_APPROVED not in annotations(e, "authz-ann")
    assert e.status("authz-ann")["phase"] == "AwaitingApproval"
    # nor by the status route
    r = as_user(e, "carol", "patch", "agentrun", "authz-ann", "-n", e.ns, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"approval": {"decision": "approved"}}}))
    assert r.returncode != 0 and PERMISSION in r.stderr, r.stderr

    # an approver (through her group), with a forged decider: the API server records alice
    r = as_user(e, "alice", "annotate", "agentrun", "authz-ann", "-n", e.ns, f"{ANN_APPROVED}=true",
                f"{ANN_DECIDED_BY}=mallory", "agentrun.dev/reason=checked the order", groups=("finance",))
    assert r.returncode == 0, r.stderr
    final = e.wait_phase("authz-ann", "Succeeded", "Failed", timeout=180)
    assert final["phase"] == "Succeeded", final
    ap = final["approval"]
    assert (ap["state"], ap["decidedBy"], ap["callId"]) == ("Approved", "alice", st["approval"]["callId"]), ap
    assert "by alice" in decided_event(e, "authz-ann")
    assert len([c for c in e.calls("/refund") if c["arguments"].get("order") == "authz-ann"]) == 1
    # the lap record that executed the call carries the decider too (agentrun trace)
    r = cli(e, "trace", "authz-ann", "-n", e.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    decisions = [lap["approvalDecision"] for lap in json.loads(r.stdout)["laps"] if lap.get("approvalDecision")]
    assert [d["decidedBy"] for d in decisions] == ["alice"], decisions
    assert "mallory" not in json.dumps(final) + json.dumps(decisions)


def test_status_route_only_the_decision_and_the_decider_is_stamped(rbac):
    e = rbac
    st = waiting_run(e, "authz-status")
    # values that differ from the current ones (cost 0.00, no retries, lap 1, AwaitingApproval)
    for field, value in (("cost", {"usd": "0.01"}), ("totalRetries", 7), ("phase", "Succeeded"),
                         ("retries", [{"lap": 1, "retries": 2}]), ("lap", 0)):
        r = as_user(e, "mallory", "patch", "agentrun", "authz-status", "-n", e.ns, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {field: value}}))
        assert r.returncode != 0, (field, r.stdout)
        assert f"status.{field} is written only by the agentrun operator" in r.stderr, (field, r.stderr)
        assert admission.VAP_STATUS in r.stderr, r.stderr
    r = as_user(e, "mallory", "patch", "agentrun", "authz-status", "-n", e.ns, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"approval": {"callId": "another"}}}))
    assert r.returncode != 0 and "status.approval.callId is written only by the agentrun operator" in r.stderr
    r = as_user(e, "mallory", "patch", "agentrun", "authz-status", "-n", e.ns, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"approval": {"decision": "approved"}}}))
    assert r.returncode != 0 and PERMISSION in r.stderr, r.stderr
    now = e.status("authz-status")
    assert now["phase"] == "AwaitingApproval" and now.get("cost") == st.get("cost")
    assert now["approval"].get("decision") is None

    # an approver sets the decision through the status subresource, naming someone else
    r = as_user(e, "alice", "patch", "agentrun", "authz-status", "-n", e.ns, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"approval": {
                    "decision": "rejected", "reason": "not this one", "decidedBy": "mallory"}}}),
                groups=("finance",))
    assert r.returncode == 0, r.stderr
    final = e.wait_phase("authz-status", "Succeeded", "Failed", timeout=180)
    assert final["phase"] == "Succeeded", final  # a rejected call does not run; the agent goes on
    ap = final["approval"]
    assert (ap["state"], ap["decidedBy"], ap["reason"]) == ("Rejected", "alice", "not this one"), ap
    assert "by alice" in decided_event(e, "authz-status")
    assert not [c for c in e.calls("/refund") if c["arguments"].get("order") == "authz-status"]


def test_cli_shows_full_arguments_and_approves_with_the_binding_as_a_service_account(rbac):
    e = rbac
    big = {"order": "authz-cli", "note": "n" * 6000}  # more than the 4 KiB of status
    st = waiting_run(e, "authz-cli", big)
    assert len(st["approval"].get("arguments") or "") <= 4096
    e.kubectl("create", "serviceaccount", "approver-bot", "-n", e.ns)
    e.kubectl("create", "rolebinding", "approver-bot", "-n", e.ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
              f"--serviceaccount={e.ns}:approver-bot")
    bot = f"system:serviceaccount:{e.ns}:approver-bot"
    kc = sa_kubeconfig(e.cluster, e.ns, "approver-bot")

    r = cli(e, "approvals", "show", "authz-cli", "-n", e.ns, kubeconfig=kc)
    assert r.returncode == 0, r.stderr
    assert "Arguments (from the checkpoint store, lap 1):" in r.stdout and "n" * 6000 in r.stdout, r.stdout[:800]
    assert f"Sha256:      {arguments_sha256(big)}" in r.stdout, r.stdout[:800]
    assert "warning" not in r.stderr, r.stderr

    r = cli(e, "approve", "authz-cli", "-n", e.ns, "--reason", "bot says yes", kubeconfig=kc)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"{ANN_CALL_ID}={st['approval']['callId']}" in r.stdout, r.stdout
    assert f"agentrun.dev/arguments-sha256={arguments_sha256(big)}" in r.stdout, r.stdout
    assert f"{ANN_DECIDED_BY}={bot}" in r.stdout, r.stdout
    final = e.wait_phase("authz-cli", "Succeeded", "Failed", timeout=180)
    assert final["phase"] == "Succeeded" and final["approval"]["decidedBy"] == bot, final
    calls = [c for c in e.calls("/refund") if c["arguments"].get("order") == "authz-cli"]
    assert len(calls) == 1 and calls[0]["arguments"] == big

    # a user without the approve verb gets one line naming the permission
    e.kubectl("create", "serviceaccount", "nobody", "-n", e.ns)
    e.kubectl("create", "rolebinding", "nobody", "-n", e.ns, "--role=author", f"--serviceaccount={e.ns}:nobody")
    waiting_run(e, "authz-cli-2")
    r = cli(e, "approve", "authz-cli-2", "-n", e.ns, kubeconfig=sa_kubeconfig(e.cluster, e.ns, "nobody"))
    assert r.returncode == 4, r.stdout  # ExitCode.FORBIDDEN (docs/cli.md)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("agentrun:")]
    assert len(lines) == 1 and PERMISSION in lines[0] and "cannot approve" in lines[0], r.stderr
    assert ANN_APPROVED not in annotations(e, "authz-cli-2")


@pytest.fixture(scope="module")
def fallback_ns(rbac):
    """A namespace left out of the MutatingAdmissionPolicy bindings (label agentrun.dev/decider-stamping
    =disabled): what a cluster < 1.36 gets from the ValidatingAdmissionPolicies alone."""
    e = rbac
    ns = f"authz-fb-{uuid.uuid4().hex[:6]}"
    e.kubectl("create", "namespace", ns)
    e.kubectl("label", "namespace", ns, f"{admission.NO_STAMP_LABEL}={admission.NO_STAMP_VALUE}")
    e.kubectl("create", "rolebinding", "approvers", "-n", ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
              "--group=finance")
    yield ns
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        e.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _waiting_without_operator(e, ns: str, name: str) -> dict:
    """A run in ``ns`` (no operator watches it) put into AwaitingApproval by admin, as the operator would."""
    doc = e.run_doc(name, [{"content": "x"}])
    doc["spec"]["suspend"] = True
    e.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    approval = {"state": "Pending", "lap": 1, "tool": "refund", "callId": f"call-{name}", "idempotencyKey": "k",
                "arguments": json.dumps({"order": name}), "owner": "e2e-team",
                "requestedAt": "2026-01-01T00:00:00Z", "deadline": "2099-01-01T00:00:00Z"}
    e.kubectl("patch", "agentrun", name, "-n", ns, "--subresource=status", "--type=merge",
              "-p", json.dumps({"status": {"phase": "AwaitingApproval", "approval": approval}}))
    return approval


def test_fallback_without_stamping_requires_the_real_name(rbac, fallback_ns):
    e, ns = rbac, fallback_ns
    _waiting_without_operator(e, ns, "fb")

    def annotate(*kv: str):
        return as_user(e, "alice", "annotate", "agentrun", "fb", "-n", ns, *kv, groups=("finance",))

    # no stamping here: a bare approved=true is refused, saying what to set; a forged name too
    r = annotate(f"{ANN_APPROVED}=true")
    assert r.returncode != 0 and f'{ANN_DECIDED_BY} must be your authenticated user name "alice"' in r.stderr, r.stderr
    r = annotate(f"{ANN_APPROVED}=true", f"{ANN_DECIDED_BY}=bob")
    assert r.returncode != 0 and f'{ANN_DECIDED_BY} must be your authenticated user name "alice"' in r.stderr, r.stderr
    assert ANN_APPROVED not in (json.loads(e.kubectl("get", "agentrun", "fb", "-n", ns, "-o", "json").stdout)
                                ["metadata"].get("annotations") or {})
    # one's own name is accepted, unchanged
    r = annotate(f"{ANN_APPROVED}=true", f"{ANN_DECIDED_BY}=alice")
    assert r.returncode == 0, r.stderr
    ann = json.loads(e.kubectl("get", "agentrun", "fb", "-n", ns, "-o", "json").stdout)["metadata"]["annotations"]
    assert ann[ANN_DECIDED_BY] == "alice"
    # the decider cannot be changed on its own afterwards
    r = annotate("--overwrite", f"{ANN_DECIDED_BY}=bob")
    assert r.returncode != 0 and "cannot be set or changed on its own" in r.stderr, r.stderr
    # the operator's removal of the decision annotations is not a decision
    e.kubectl("annotate", "agentrun", "fb", "-n", ns, f"{ANN_APPROVED}-", f"{ANN_DECIDED_BY}-")

    # the status route without stamping: decidedBy must be one's own name
    patch = {"status": {"approval": {"decision": "approved", "decidedBy": "bob"}}}
    r = as_user(e, "alice", "patch", "agentrun", "fb", "-n", ns, "--subresource=status", "--type=merge",
                "-p", json.dumps(patch), groups=("finance",))
    assert r.returncode != 0 and 'status.approval.decidedBy must be your authenticated user name "alice"' in r.stderr
    patch["status"]["approval"]["decidedBy"] = "alice"
    r = as_user(e, "alice", "patch", "agentrun", "fb", "-n", ns, "--subresource=status", "--type=merge",
                "-p", json.dumps(patch), groups=("finance",))
    assert r.returncode == 0, r.stderr


def test_fallback_agentrun_approve_fills_the_decider_from_a_self_subject_review(rbac, fallback_ns):
    e, ns = rbac, fallback_ns
    approval = _waiting_without_operator(e, ns, "fb-cli")
    e.kubectl("create", "serviceaccount", "approver-bot", "-n", ns)
    e.kubectl("create", "rolebinding", "approver-bot", "-n", ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
              f"--serviceaccount={ns}:approver-bot")
    r = cli(e, "approve", "fb-cli", "-n", ns, kubeconfig=sa_kubeconfig(e.cluster, ns, "approver-bot"))
    assert r.returncode == 0, (r.stdout, r.stderr)
    ann = json.loads(e.kubectl("get", "agentrun", "fb-cli", "-n", ns, "-o", "json").stdout)["metadata"]["annotations"]
    assert ann[ANN_APPROVED] == "true" and ann[ANN_DECIDED_BY] == f"system:serviceaccount:{ns}:approver-bot"
    assert ann[ANN_CALL_ID] == approval["callId"]


def test_checkpoint_retention_stays_mutable_while_the_location_is_pinned(rbac, fallback_ns):
    e, ns = rbac, fallback_ns
    doc = e.run_doc("pinned", [{"content": "x"}], checkpoint={"uri": "s3://agentrun/pinned", "retention": "Retain"})
    doc["spec"]["suspend"] = True
    e.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    doc["spec"]["checkpoint"]["retention"] = "Delete"
    r = e.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert r.returncode == 0, r.stderr
    doc["spec"]["checkpoint"] = {"retention": "Delete"}  # the uri removed: refused
    r = e.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert r.returncode != 0 and "spec.checkpoint.uri is immutable" in r.stderr, r.stderr


def test_owner_group_only_its_members_decide(rbac, fallback_ns):
    """spec.approval.owner "group:finance": the approve verb is not enough, the group is needed too."""
    e, ns = rbac, fallback_ns
    doc = e.run_doc("grouped", [{"content": "x"}])
    doc["spec"]["suspend"] = True
    doc["spec"]["approval"]["owner"] = f"{admission.OWNER_GROUP_PREFIX}finance"
    e.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    e.kubectl("create", "rolebinding", "approver-dave", "-n", ns,
              f"--clusterrole={admission.APPROVER_CLUSTERROLE}", "--user=dave")
    r = as_user(e, "dave", "annotate", "agentrun", "grouped", "-n", ns, f"{ANN_APPROVED}=true",
                f"{ANN_DECIDED_BY}=dave")
    assert r.returncode != 0, r.stdout
    assert 'is decided by the members of group finance (spec.approval.owner "group:finance"); user "dave"' in r.stderr
    r = as_user(e, "alice", "annotate", "agentrun", "grouped", "-n", ns, f"{ANN_APPROVED}=true",
                f"{ANN_DECIDED_BY}=alice", groups=("finance",))
    assert r.returncode == 0, r.stderr
