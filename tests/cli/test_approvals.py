"""``agentrun approvals``: the queue's rows, ages and deadlines (pure), and the commands against a
fake CustomObjectsApi (no cluster): what is listed, what a decision patches, what is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from agentrun.api import approval
from agentrun.api.approval import arguments_sha256
from agentrun.api.types import parse_time
from agentrun.cli import approvals as ap
from agentrun.cli.main import SUBCOMMANDS, main

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def run(name: str, ns: str = "team-a", phase: str = "AwaitingApproval", *, owner: str = "payments-oncall",
        tool: str = "refund", lap: int = 3, requested_ago: float = 60, deadline_in: float = 3600,
        on_timeout: str | None = "reject", arguments: str | None = '{"orderId": "1001"}',
        rv: str = "42") -> dict:
    spec_ap = {"owner": owner, "timeout": "72h"}
    if on_timeout is not None:
        spec_ap["onTimeout"] = on_timeout
    status: dict = {"phase": phase, "lap": lap - 1}
    if phase == "AwaitingApproval":
        status["waitingOn"] = owner
        status["approval"] = {
            "state": "Pending", "lap": lap, "tool": tool, "callId": f"call-{name}", "idempotencyKey": "k",
            "arguments": arguments, "owner": owner,
            "requestedAt": iso(NOW - timedelta(seconds=requested_ago)),
            "deadline": iso(NOW + timedelta(seconds=deadline_in)),
        }
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                         "creationTimestamp": iso(NOW - timedelta(days=1))},
            "spec": {"task": "t", "approval": spec_ap}, "status": status}


# ------------------------------------------------------------------------------------ pure logic

@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (45, "45s"), (60, "1m"), (192, "3m12s"), (3600, "1h"), (7500, "2h5m"),
    (86400, "1d"), (86400 * 3 + 3600 * 4 + 59, "3d4h"), (-5, "0s"), (59.9, "59s"),
])
def test_human_duration(seconds, text):
    assert ap.human_duration(seconds) == text


def test_parse_time_forms():
    assert parse_time("2026-11-30T12:00:00Z") == NOW
    assert parse_time("2026-11-30T12:00:00.250000Z") == NOW + timedelta(milliseconds=250)
    assert parse_time("2026-11-30T13:00:00+01:00") == NOW
    assert parse_time(None) is None and parse_time("yesterday") is None


def test_queue_only_awaiting_oldest_first_with_age_deadline_and_on_timeout():
    runs = [
        run("newer", requested_ago=30, deadline_in=90),
        run("done", phase="Succeeded"),
        run("older", ns="team-b", requested_ago=7500, deadline_in=-10, on_timeout="fail", tool="wire", lap=7),
        run("suspended", phase="Suspended"),
        run("default-policy", requested_ago=600, on_timeout=None),
    ]
    rows = approval.queue_rows(runs, NOW)
    assert [r["name"] for r in rows] == ["older", "default-policy", "newer"]
    older, default, newer = rows
    assert (older["namespace"], older["tool"], older["lap"], older["onTimeout"]) == ("team-b", "wire", 7, "fail")
    assert older["ageSeconds"] == 7500 and older["secondsLeft"] == -10
    assert default["onTimeout"] == "reject"  # the CRD default when the field is absent
    assert newer["ageSeconds"] == 30 and newer["secondsLeft"] == 90
    cells = {r["name"]: ap.table_cells(r) for r in rows}
    assert cells["older"] == ["team-b", "older", "payments-oncall", "wire", "<unknown>", "0 of 1", "7", "2h5m",
                              "overdue", "fail"]
    assert cells["newer"][7:] == ["30s", "1m30s", "reject"]


def test_deadline_exactly_now_is_overdue():
    row = approval.queue_rows([run("x", deadline_in=0)], NOW)[0]
    assert ap.deadline_cell(row["secondsLeft"]) == "overdue"
    assert ap.deadline_cell(1) == "1s" and ap.deadline_cell(None) == "<none>"


def test_owner_filter_and_owner_fallbacks():
    runs = [run("a", owner="alice"), run("b", owner="bob")]
    assert [r["name"] for r in approval.queue_rows(runs, NOW, owner="bob")] == ["b"]
    assert approval.queue_rows(runs, NOW, owner="carol") == []
    # approval without an owner: status.waitingOn, then spec.approval.owner
    r = run("c", owner="team-c")
    del r["status"]["approval"]["owner"]
    assert approval.queue_rows([r], NOW)[0]["owner"] == "team-c"
    del r["status"]["waitingOn"]
    r["spec"]["approval"]["owner"] = "spec-owner"
    assert approval.queue_rows([r], NOW)[0]["owner"] == "spec-owner"


def test_table_is_aligned_with_the_header():
    rows = approval.queue_rows([run("short"), run("a-much-longer-name", ns="ns")], NOW)
    lines = ap.format_table(rows).splitlines()
    assert lines[0].split() == list(ap.COLUMNS)
    col = lines[0].index("OWNER")
    assert all(line[col:].startswith("payments-oncall") for line in lines[1:]), lines


def test_show_text_prints_arguments_as_json_and_deadline():
    text = ap.show_text(run("r", deadline_in=7500, arguments='{"orderId":"1001","amount":5}'), NOW)
    assert '"orderId": "1001"' in text and '"amount": 5' in text
    assert "Deadline:    2026-11-30T14:05:00Z (2h5m left)" in text
    overdue = ap.show_text(run("r", deadline_in=-1), NOW)
    assert "(overdue)" in overdue
    truncated = ap.show_text(run("r", arguments='{"orderId": "10'), NOW)  # cut at 4 KiB: shown raw
    assert '{"orderId": "10' in truncated


def test_decision_patch_is_what_kubectl_annotate_sets():
    assert approval.decision_patch(True, "ok", "7") == {
        "metadata": {"annotations": {"approved": "true", "agentrun.dev/reason": "ok"}, "resourceVersion": "7"}}
    assert approval.decision_patch(False, None, None) == {"metadata": {"annotations": {"approved": "false"}}}


# ------------------------------------------------------------------- commands with a fake API

class FakeApi:
    def __init__(self, runs: list[dict]) -> None:
        self.runs = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in runs}
        self.patches: list[tuple] = []
        self.listed: list = []

    def list_cluster_custom_object(self, group, version, plural):
        self.listed.append(None)
        return {"items": list(self.runs.values())}

    def list_namespaced_custom_object(self, group, version, ns, plural):
        self.listed.append(ns)
        return {"items": [r for (n, _), r in self.runs.items() if n == ns]}

    def get_namespaced_custom_object(self, group, version, ns, plural, name):
        from kubernetes.client.exceptions import ApiException

        if (ns, name) not in self.runs:
            raise ApiException(status=404, reason="Not Found")
        return self.runs[(ns, name)]

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, body):
        assert (group, version, plural) == ("agentrun.dev", "v1alpha1", "agentruns")
        self.patches.append((ns, name, body))
        return self.runs[(ns, name)]


@pytest.fixture
def fake(monkeypatch):
    api = FakeApi([run("waiting", requested_ago=120), run("old", ns="team-b", requested_ago=900, owner="ops"),
                   run("busy", phase="Running")])
    monkeypatch.setattr(ap, "_api", lambda: (api, "team-a"))
    monkeypatch.setattr(ap, "_now", lambda: NOW)
    # the two reads beside the run (real ones: tests/e2e/test_approval_authz.py)
    monkeypatch.setattr(ap, "_whoami", lambda: "alice")
    monkeypatch.setattr(ap, "_stored_call", lambda run: STORED.get(run["metadata"]["name"], approval.StoredCall(error="no store")))
    return api


FULL_ARGS = {"orderId": "1001", "note": "x" * 5000}
STORED = {"waiting": approval.StoredCall(arguments=FULL_ARGS, call_id="call-waiting", lap=3)}


def invoke(*args: str):
    return CliRunner().invoke(main, ["approvals", *args])


def test_registered_as_a_subcommand():
    assert SUBCOMMANDS["approvals"] == "agentrun.cli.approvals:approvals_command"


def test_list_default_namespace_all_namespaces_owner_and_json(fake):
    r = invoke("list")
    assert r.exit_code == 0, r.output
    assert fake.listed == ["team-a"]
    lines = r.output.splitlines()
    assert lines[0].split() == list(ap.COLUMNS) and len(lines) == 2
    assert lines[1].split() == ["team-a", "waiting", "payments-oncall", "refund", "<unknown>", "0", "of", "1", "3", "2m",
                                "1h", "reject"]
    r = invoke("list", "-A")
    names = [line.split()[1] for line in r.output.splitlines()[1:]]
    assert names == ["old", "waiting"]  # oldest first; the Running run is not in the queue
    r = invoke("list", "-A", "--owner", "ops", "-o", "json")
    rows = json.loads(r.output)
    assert [(x["namespace"], x["name"], x["owner"], x["ageSeconds"]) for x in rows] == [("team-b", "old", "ops", 900)]
    r = invoke("list", "-n", "team-a", "-A")
    assert r.exit_code != 0 and "exclusive" in r.output


def test_approve_a_waiting_run_patches_the_annotations(fake):
    r = invoke("approve", "waiting", "-n", "team-a", "--reason", "customer verified")
    assert r.exit_code == 0, r.output
    assert fake.patches == [("team-a", "waiting", {"metadata": {
        "annotations": {"approved": "true", "agentrun.dev/reason": "customer verified",
                        "agentrun.dev/call-id": "call-waiting",
                        "agentrun.dev/arguments-sha256": arguments_sha256(FULL_ARGS),
                        "agentrun.dev/decided-by": "alice"},
        "resourceVersion": "42"}})]
    assert "approved call call-waiting of tool refund" in r.output


def test_reject_uses_approved_false(fake):
    r = invoke("reject", "old", "-n", "team-b")
    assert r.exit_code == 2 and "--reason" in r.output and fake.patches == []  # like the top-level reject
    r = invoke("reject", "old", "-n", "team-b", "--reason", " ")
    assert r.exit_code == 2 and "must not be empty" in r.output and fake.patches == []
    r = invoke("reject", "old", "-n", "team-b", "--reason", "dup")
    assert r.exit_code == 0, r.output
    # no store and no status digest: bound by call id only, and it says why
    assert fake.patches[0][2]["metadata"]["annotations"] == {
        "approved": "false", "agentrun.dev/reason": "dup", "agentrun.dev/call-id": "call-old",
        "agentrun.dev/decided-by": "alice"}
    assert "rejected" in r.output and "full arguments not read from the checkpoint store: no store" in r.output


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_decision_on_a_run_not_waiting_is_refused_without_a_patch(fake, verb):
    r = invoke(verb, "busy", "--reason", "early")
    assert r.exit_code == 5  # ExitCode.CONFLICT: not in the phase the verb needs
    assert "not awaiting approval (phase Running)" in r.output
    assert fake.patches == []


def test_missing_run_is_an_error(fake):
    r = invoke("approve", "nope")
    assert r.exit_code == 3 and "not found" in r.output and fake.patches == []


def test_conflict_while_deciding_is_refused(fake, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    def conflict(*a, **k):
        raise ApiException(status=409, reason="Conflict")

    monkeypatch.setattr(fake, "patch_namespaced_custom_object", conflict)
    r = invoke("approve", "waiting")
    assert r.exit_code == 5 and "changed while deciding" in r.output


def test_show(fake):
    r = invoke("show", "waiting")
    assert r.exit_code == 0, r.output
    assert '"orderId": "1001"' in r.output and "Deadline:" in r.output and "(1h left)" in r.output
    # the full arguments from the store (not the 4 KiB cut of status) and their digest
    assert "x" * 5000 in r.output and "Arguments (from the checkpoint store, lap 3):" in r.output
    assert f"Sha256:      {arguments_sha256(FULL_ARGS)}" in r.output


def test_binding_prefers_the_store_and_warns_on_a_differing_digest():
    w = run("w")
    stored = approval.StoredCall(arguments={"a": 1}, call_id="call-w", lap=3)
    assert approval.binding(w, stored) == ("call-w", arguments_sha256({"a": 1}), [])
    w["status"]["approval"]["argumentsSha256"] = "f" * 64
    call_id, sha, warnings = approval.binding(w, stored)
    assert sha == arguments_sha256({"a": 1}) and "differs from status.approval.argumentsSha256" in warnings[0]
    # the store unreadable: the operator's digest in status
    call_id, sha, warnings = approval.binding(w, approval.StoredCall(error="no credentials"))
    assert (call_id, sha) == ("call-w", "f" * 64) and "no credentials" in warnings[0]
    # the store's pending call is another one: no digest of it is sent
    call_id, sha, warnings = approval.binding(run("v"), approval.StoredCall(arguments={"a": 1}, call_id="other", lap=4))
    assert (call_id, sha) == ("call-v", None) and "moved on" in warnings[0]


def test_decision_patch_binding_and_decider():
    assert approval.decision_patch(True, None, None, call_id="c", sha256="s", decided_by="u") == {"metadata": {
        "annotations": {"approved": "true", "agentrun.dev/call-id": "c", "agentrun.dev/arguments-sha256": "s",
                        "agentrun.dev/decided-by": "u"}}}


def test_a_refused_decision_is_one_line_naming_the_permission(fake, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    msg = ('agentruns.agentrun.dev "waiting" is forbidden: ValidatingAdmissionPolicy \'agentrun-decisions\' with '
           'binding \'agentrun-decisions\' denied request: user "bob" may not decide the approval of agentrun '
           'team-a/waiting: deciding an approval needs the "approve" verb on agentruns.agentrun.dev in namespace '
           'team-a (role agentrun-approver); patch alone is not enough')

    def refused(*a, **k):
        e = ApiException(status=403, reason="Forbidden")
        e.body = json.dumps({"kind": "Status", "message": msg, "reason": "Forbidden", "code": 403})
        raise e

    monkeypatch.setattr(fake, "patch_namespaced_custom_object", refused)
    r = invoke("approve", "waiting")
    assert r.exit_code == 4  # ExitCode.FORBIDDEN
    line = [ln for ln in r.output.splitlines() if ln.startswith("agentrun:")]
    assert line == ['agentrun: cannot approve agentrun team-a/waiting: user "bob" may not decide the approval of '
                    'agentrun team-a/waiting: deciding an approval needs the "approve" verb on '
                    'agentruns.agentrun.dev in namespace team-a (role agentrun-approver); patch alone is not enough']


def test_deciding_past_the_deadline_warns_but_still_patches(fake):
    fake.runs[("team-a", "late")] = run("late", deadline_in=-30)
    r = CliRunner().invoke(main, ["approvals", "approve", "late", "-n", "team-a"])
    assert r.exit_code == 0, r.output
    assert "deadline" in r.output and "has passed" in r.output
    assert fake.patches[-1][:2] == ("team-a", "late")
    r = invoke("approve", "waiting", "-n", "team-a")
    assert "has passed" not in r.output


def test_the_queue_and_show_name_the_target_and_the_approvals_so_far():
    r = run("pay")
    r["status"]["approval"].update({
        "target": {"method": "POST", "url": "https://pay.example/refund?token=…", "headersSecret": "pay-headers",
                   "image": "registry.example/agentrun:1"},
        "targetSha256": "ab" * 32, "approvalsRequired": 2,
        "approvedBy": [{"user": "alice", "at": "2026-11-30T11:59:00Z"}],
    })
    (row,) = approval.queue_rows([r], NOW)
    cells = ap.table_cells(row)
    assert cells[4:6] == ["POST https://pay.example/refund?token=…", "1 of 2"]
    assert row["approvedBy"] == ["alice"] and row["targetSha256"] == "ab" * 32
    text = ap.show_text(r, NOW)
    assert "Target:      POST https://pay.example/refund?token=…" in text
    assert "Headers:     Secret pay-headers" in text and "Image:       registry.example/agentrun:1" in text
    assert "Approvals:   1 of 2 (alice at 2026-11-30T11:59:00Z)" in text and "ab" * 32 in text
    long = dict(r["status"]["approval"]["target"], url="https://pay.example/" + "x" * 300 + "\x1b[2J")
    r["status"]["approval"]["target"] = long
    cell = ap.table_cells(approval.queue_rows([r], NOW)[0])[4]
    assert len(cell) <= ap.TARGET_CELL_CHARS and "\x1b" not in cell


def test_a_decision_binds_the_target_that_was_shown():
    body = approval.decision_patch(True, None, "42", call_id="c1", sha256="a" * 64, target_sha256="b" * 64)
    assert body["metadata"]["annotations"]["agentrun.dev/target-sha256"] == "b" * 64
