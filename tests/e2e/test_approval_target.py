"""Approvals bound to what actually runs (issue 29, items 1, 3 and 7), on the real local control
plane with the generated admission policies, the chart's ``agentrun-approver`` ClusterRole and real
users by impersonation (``kubectl --as``):

* the redirect: a run waits for approval of ``refund``; a user who may change the run (``patch``, and
  here ``approve`` too: a legitimate spec change) points the tool at another server; an approver then
  approves the call AS SHOWN (bound to the call id, its arguments and the target digest that status
  showed). The call goes nowhere (neither server records it), ONE ``ApprovalStale`` Event names the
  changed URL, and a new Pending request shows the new target; approving that executes the call at
  the new URL once;
* four eyes (``spec.approval.approvers: 2``): one approval gives "1 of 2" (status, Event, ``agentrun
  approvals``) and the run still waits; the same user again is refused with one Event; a second user
  completes it and the call executes once; in another run one of two rejects and the call is Rejected.

On a main without the target binding (before this change) the redirect test fails: the approval
applies and the call goes to the new server (no ApprovalStale Event ever appears).
"""

from __future__ import annotations

import json
import os

import pytest
from e2e_support import wait_for
from test_approval_authz import approver_clusterrole, as_user, cli
from test_operator_e2e import Env, _diagnostics_on_failure, tool_server  # noqa: F401 (a fixture)

from agentrun.api import admission
from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_TARGET_SHA256,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class TargetEnv(Env):
    """The operator e2e environment with a second tool server: where the author redirects the call."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.other_record = self.tmp / "other-tool-calls.jsonl"
        self.other = tool_server.serve(0, str(self.other_record), recorder=tool_server.Recorder())
        self.other_url = f"http://127.0.0.1:{self.other.server_address[1]}"

    def other_calls(self, path: str) -> list[dict]:
        if not self.other_record.exists():
            return []
        return [c for c in map(json.loads, self.other_record.read_text().splitlines()) if c["path"] == path]


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = TargetEnv(cluster, s3, tmp_path_factory.mktemp("target"))
    e.prepare_namespace()
    approver_clusterrole(cluster)
    # alice and bob approve; erin may change runs and approve too (the chart's approver role holds patch)
    e.kubectl("create", "rolebinding", "approvers", "-n", e.ns, f"--clusterrole={admission.APPROVER_CLUSTERROLE}",
              "--group=finance")
    e.start_operator()
    yield e
    e.kill_operator()
    e.tools.shutdown()
    e.other.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def _waiting(e: TargetEnv, name: str, **spec) -> dict:
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": name}}]},
              {"content": "finished"}]
    e.apply(e.run_doc(name, script, **spec))
    st = e.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded")
    assert st["phase"] == "AwaitingApproval", st
    return st["approval"]


def _decide(e: TargetEnv, name: str, user: str, ap: dict, value: str = "true"):
    """``user`` decides the call as status ``ap`` showed it (the binding agentrun approve sends)."""
    ann = {ANN_APPROVED: value, ANN_DECIDED_BY: user, ANN_CALL_ID: ap["callId"],
           ANN_ARGUMENTS_SHA256: ap["argumentsSha256"]}
    if ap.get("targetSha256"):
        ann[ANN_TARGET_SHA256] = ap["targetSha256"]
    return as_user(e, user, "annotate", "agentrun", name, "-n", e.ns, "--overwrite",
                   *(f"{k}={v}" for k, v in ann.items()), groups=("finance",))


def _event(e: TargetEnv, name: str, reason: str, text: str = "") -> str:
    return wait_for(f"{reason} Event of {name}", lambda: next(
        (ev["message"] for ev in e.events(name) if ev["reason"] == reason and text in ev["message"]), None),
        timeout=120)


def _refunds(e: TargetEnv, order: str) -> tuple[list[dict], list[dict]]:
    def mine(calls: list[dict]) -> list[dict]:
        return [c for c in calls if (c.get("arguments") or {}).get("order") == order]
    return mine(e.calls("/refund")), mine(e.other_calls("/refund"))


def test_a_redirected_call_approved_as_shown_goes_nowhere_and_is_asked_again(env):
    e = env
    name = "redirect"
    shown = _waiting(e, name)
    assert shown["target"]["url"] == f"{e.tool_url}/refund", shown
    assert shown["target"]["method"] == "POST" and shown.get("targetSha256"), shown

    # the author points the gated tool at another server (a patch the API server allows her)
    patch = [{"op": "replace", "path": "/spec/agent/tools/1/http/url", "value": f"{e.other_url}/refund"}]
    r = as_user(e, "erin", "patch", "agentrun", name, "-n", e.ns, "--type=json", "-p", json.dumps(patch),
                groups=("finance",))
    assert r.returncode == 0, r.stderr

    # an approver approves the call as it was shown
    r = _decide(e, name, "alice", shown)
    assert r.returncode == 0, r.stderr
    stale = _event(e, name, "ApprovalStale")
    assert f"url {e.tool_url}/refund -> {e.other_url}/refund" in stale, stale
    again = wait_for("the new request with the new target", lambda: (
        (ap := e.status(name).get("approval") or {}).get("state") == "Pending"
        and (ap.get("target") or {}).get("url") == f"{e.other_url}/refund"
        and not set(e.get(name)["metadata"].get("annotations") or {}) & {ANN_APPROVED} and ap), timeout=120)
    assert again["requestedAt"] >= shown["requestedAt"] and again["targetSha256"] != shown["targetSha256"]
    assert again["callId"] == shown["callId"] and again["argumentsSha256"] == shown["argumentsSha256"]
    st = e.status(name)
    assert st["phase"] == "AwaitingApproval", st
    assert [j for j in e.jobs(name) if j["metadata"]["labels"]["agentrun.dev/lap"] != "1"] == []  # nothing ran
    assert _refunds(e, name) == ([], []), "the call went somewhere"
    assert len([ev for ev in e.events(name) if ev["reason"] == "ApprovalStale"]) == 1

    # `agentrun approvals show` names the new target
    r = cli(e, "approvals", "show", name, "-n", e.ns)
    assert r.returncode == 0, r.stderr
    assert f"Target:      POST {e.other_url}/refund" in r.stdout, r.stdout

    # approving the request as it is shown now executes the call, at the new URL, once
    r = _decide(e, name, "alice", again)
    assert r.returncode == 0, r.stderr
    st = e.wait_phase(name, "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st
    old, new = _refunds(e, name)
    assert old == [] and len(new) == 1, (old, new)


def test_four_eyes_two_distinct_approvers_and_one_rejection_rejects(env):
    e = env
    name = "four-eyes"
    shown = _waiting(e, name, approval={"owner": "e2e-team", "timeout": "1h", "onTimeout": "reject", "approvers": 2})
    assert shown["approvalsRequired"] == 2

    assert _decide(e, name, "alice", shown).returncode == 0
    recorded = _event(e, name, "ApprovalRecorded")
    assert "approved by alice (1 of 2)" in recorded, recorded
    ap = wait_for("alice in approvedBy", lambda: (a := e.status(name).get("approval") or {}).get("approvedBy") and a)
    assert [v["user"] for v in ap["approvedBy"]] == ["alice"] and ap["state"] == "Pending"
    assert e.status(name)["phase"] == "AwaitingApproval"
    r = cli(e, "approvals", "show", name, "-n", e.ns)
    assert "Approvals:   1 of 2 (alice" in r.stdout, r.stdout

    assert _decide(e, name, "alice", ap).returncode == 0
    dup = _event(e, name, "ApprovalDuplicateApprover")
    assert "already approved by alice; needs a different approver" in dup, dup
    wait_for("alice's second approval removed",
             lambda: ANN_APPROVED not in (e.get(name)["metadata"].get("annotations") or {}), timeout=60)
    assert [v["user"] for v in e.status(name)["approval"]["approvedBy"]] == ["alice"]
    assert e.status(name)["phase"] == "AwaitingApproval" and _refunds(e, name) == ([], [])

    assert _decide(e, name, "bob", ap).returncode == 0
    st = e.wait_phase(name, "Succeeded", "Failed")
    assert st["phase"] == "Succeeded", st
    assert [v["user"] for v in st["approval"]["approvedBy"]] == ["alice", "bob"]
    assert len(_refunds(e, name)[0]) == 1

    name = "four-eyes-reject"
    shown = _waiting(e, name, approval={"owner": "e2e-team", "timeout": "1h", "onTimeout": "reject", "approvers": 2})
    assert _decide(e, name, "alice", shown).returncode == 0
    _event(e, name, "ApprovalRecorded")
    assert _decide(e, name, "bob", shown, value="false").returncode == 0
    st = e.wait_phase(name, "Succeeded", "Failed")
    assert st["approval"]["state"] == "Rejected" and st["approval"]["decidedBy"] == "bob", st
    assert _refunds(e, name) == ([], [])
