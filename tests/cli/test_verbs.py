"""The lifecycle verbs (issue 31) against click's runner: wait's exit codes, suspend/resume,
cancel and retry write the routes of ``agentrun.api.lifecycle``, describe, logs' stored output,
and ``trace --follow`` exiting by the outcome. The API is a fake CustomObjectsApi (the same verbs
against the real API server: tests/e2e/test_cli_e2e.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_conventions import FakeApi, run

from agentrun.api import lifecycle as contract
from agentrun.cli import approvals as ap
from agentrun.cli import describe as ds
from agentrun.cli import kube, logs
from agentrun.cli import lifecycle as lc
from agentrun.cli import trace as tr
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
from ckpt_builders import RUN, make_record  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    api = FakeApi([run("r1"), run("done", phase="Succeeded"), run("bad", phase="Failed"),
                   run("broke", phase="BudgetExceeded"),
                   run("stopped", phase="Cancelled", lifecycle={"retries": 2}),
                   run("late", phase="DeadlineExceeded")])
    api.runs[("team-a", "stopped")]["spec"]["cancel"] = {"reason": "oops"}

    def connect(opts=None):
        opts = opts or kube.current_options()
        return api, opts.namespace or "team-a"

    for mod in (kube, lc, ds):
        monkeypatch.setattr(mod, "connect", connect)
    monkeypatch.setattr(ap, "_whoami", lambda: "alice")
    monkeypatch.setattr(lc.time, "sleep", lambda s: None)
    return api


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


# ------------------------------------------------------------------------------------ wait

@pytest.mark.parametrize("name, code", [("done", 0), ("bad", 10), ("broke", 11), ("stopped", 12), ("late", 13)])
def test_wait_exits_by_the_outcome(fake, name, code):
    r = invoke("wait", name)
    assert r.exit_code == code, r.output
    assert r.stdout.startswith(f"agentrun team-a/{name}: ")


def test_wait_polls_until_the_run_ends_and_times_out(fake):
    phases = iter(["Running", "Running", "AwaitingApproval", "Succeeded"])

    def advance(api):
        api.runs[("team-a", "r1")]["status"]["phase"] = next(phases)

    fake.on_read = advance
    assert invoke("wait", "r1", "--for=phase=AwaitingApproval").exit_code == 0
    assert invoke("wait", "r1", "-o", "jsonpath={.status.phase}").stdout == "Succeeded"
    fake.on_read = None
    fake.runs[("team-a", "r1")]["status"]["phase"] = "Running"
    r = invoke("wait", "r1", "--timeout", "0")
    assert r.exit_code == ExitCode.TIMEOUT and "timed out after 0 waiting for agentrun team-a/r1 to end" in r.output
    r = invoke("wait", "done", "--for", "AwaitingApproval")
    assert r.exit_code == ExitCode.CONFLICT  # Succeeded: it never will be
    assert invoke("wait", "r1", "--for", "Sleeping").exit_code == ExitCode.USAGE
    assert invoke("wait", "r1", "--timeout", "soon").exit_code == ExitCode.USAGE
    assert invoke("wait", "ghost").exit_code == ExitCode.NOT_FOUND


def test_wait_does_not_take_a_stale_phase_for_the_outcome():
    failed = run("x", phase="Failed")
    assert lc.wait_result(failed, None) == ExitCode.FAILED
    pending_retry = run("x", phase="Failed")
    pending_retry["metadata"]["annotations"] = {contract.ANN_RETRY: "1"}
    assert lc.wait_result(pending_retry, None) is None
    cancel_unseen = run("x", phase="Running")
    cancel_unseen["metadata"]["generation"] = 2
    assert lc.wait_result(cancel_unseen, "Running") is None
    assert lc.wait_result(run("x", phase="Running"), "Running") == ExitCode.OK


# ------------------------------------------------------------------------------------ writes

def test_suspend_and_resume_patch_spec_suspend(fake):
    assert invoke("suspend", "r1").exit_code == 0
    assert invoke("resume", "r1", "-o", "name").stdout.strip() == "agentrun.agentrun.dev/r1"
    assert [p[2] for p in fake.patches] == [{"spec": {"suspend": True}}, {"spec": {"suspend": False}}]
    r = invoke("suspend", "done")
    assert r.exit_code == ExitCode.CONFLICT and "has ended" in r.output and len(fake.patches) == 2


def test_cancel_writes_spec_cancel(fake):
    r = invoke("cancel", "r1", "--reason", "wrong task")
    assert r.exit_code == 0, r.output
    assert fake.patches == [("team-a", "r1", {"spec": {"cancel": {"reason": "wrong task"}}})]
    assert invoke("cancel", "bad").exit_code == ExitCode.CONFLICT
    assert invoke("cancel", "r1", "--reason", "x" * (contract.MAX_CANCEL_REASON_CHARS + 1)).exit_code == ExitCode.USAGE
    fake.runs[("team-a", "r1")]["spec"]["cancel"] = {}
    r = invoke("cancel", "r1")
    assert r.exit_code == 0 and "already cancelled" in r.output and len(fake.patches) == 1


def test_retry_writes_the_annotation_of_the_contract(fake):
    r = invoke("retry", "bad")
    assert r.exit_code == 0, r.output
    assert fake.patches[-1][2] == {"metadata": {"annotations": {
        contract.ANN_RETRY: "1", contract.ANN_RETRY_REQUESTED_BY: "alice"}, "resourceVersion": "7"}}
    # a cancelled run: the next retry number, the lap to rewind to, and spec.cancel removed in the same patch
    r = invoke("retry", "stopped", "--from-lap", "1")
    assert r.exit_code == 0, r.output
    assert fake.patches[-1][2] == {
        "metadata": {"annotations": {contract.ANN_RETRY: "3", contract.ANN_RETRY_FROM_LAP: "1",
                                     contract.ANN_RETRY_REQUESTED_BY: "alice"}, "resourceVersion": "7"},
        "spec": {"cancel": None}}
    n = len(fake.patches)
    r = invoke("retry", "done")
    assert r.exit_code == ExitCode.CONFLICT and "`agentrun fork`" in r.output
    assert invoke("retry", "r1").exit_code == ExitCode.CONFLICT
    r = invoke("retry", "bad", "--from-lap", "9")
    assert r.exit_code == 1 and "never checkpointed (its last checkpointed lap is 2)" in r.output
    fake.runs[("team-a", "late")]["metadata"]["annotations"] = {contract.ANN_RETRY: "1"}
    r = invoke("retry", "late")
    assert r.exit_code == ExitCode.CONFLICT and "not applied yet" in r.output
    assert len(fake.patches) == n


def test_a_refused_retry_names_the_verb_and_exits_forbidden(fake, monkeypatch):
    import json

    from kubernetes.client.exceptions import ApiException

    def refused(*a, **k):
        e = ApiException(status=403, reason="Forbidden")
        e.body = json.dumps({"message": "agentruns \"bad\" is forbidden: ValidatingAdmissionPolicy 'x' with binding "
                                        "'x' denied request: retrying needs the \"retry\" verb\x1b[2J"})
        raise e

    monkeypatch.setattr(fake, "patch_namespaced_custom_object", refused)
    r = invoke("retry", "bad")
    assert r.exit_code == ExitCode.FORBIDDEN
    assert r.output.startswith('agentrun: cannot retry agentrun team-a/bad: retrying needs the "retry" verb')
    assert "\x1b" not in r.output


def test_retry_help_names_the_contract():
    out = " ".join(invoke("retry", "-h").output.split())
    assert contract.ANN_RETRY in out and f'"{contract.RETRY_VERB}" verb' in out and contract.RETRIER_CLUSTERROLE in out


# ------------------------------------------------------------------------------------ describe, logs

def test_describe_is_bounded_and_complete():
    r = run("d", phase="Cancelled", message="stopped\x1b[2J" + "m" * 1000,
            lifecycle={"retries": 1, "lastRetryBy": "alice", "cancelledBy": "bob", "cancelReason": "wrong"},
            conditions=[{"type": "Progressing", "status": "False", "reason": "Cancelled", "message": "x\ny"}],
            approval={"state": "Withdrawn", "tool": "pay", "callId": "c1", "lap": 2})
    r["spec"]["cancel"] = {"reason": "wrong"}
    events = [{"type": "Normal", "reason": "Cancelled", "message": "by bob", "lastTimestamp": "2030-01-01T00:00:00Z",
               "source": {"component": "agentrun-operator"}}]
    text = ds.describe_text(r, events, lc_now())
    assert "\x1b" not in text and "\ny" not in text and max(len(line) for line in text.splitlines()) < 400
    for want in ("Phase:          Cancelled", "Cancel:         reason wrong", "Retries in place: 1 (last by alice",
                 "Cancelled:      by bob", "Progressing", "State:          Withdrawn", "agentrun-operator"):
        assert want in text, want


def test_describe_shows_the_pinned_agent_of_a_run_of_an_agent():
    digest = "ab12cd34ef56" + "0" * 52
    r = run("m", phase="Succeeded", agent={"name": "ledger-clerk", "version": "2026.12.1", "digest": digest,
                                           "uid": "u-1", "pinnedAt": "2030-01-01T00:02:00Z"})
    r["spec"] = {"agentRef": {"name": "ledger-clerk"}, "parameters": {"invoice": "INV-2001", "amountCents": "12500"},
                 "budget": {"maxLaps": 4}}
    text = ds.describe_text(r, [], lc_now())
    lines = text.splitlines()
    assert ("  Agent:          ledger-clerk version 2026.12.1, digest sha256:ab12cd34ef56, "
            "pinned 2030-01-01T00:02:00Z (3m ago)") in lines, text
    assert digest not in text  # the short digest; the full one: -o yaml
    assert "  Agent ref:      ledger-clerk" in lines and "  Parameters:     amountCents=12500, invoice=INV-2001" in lines
    # what the run leaves unset is the Agent's, not a default of an inline run
    assert "  Budget:         maxLaps 4, maxCostUSD <the Agent's>" in lines
    assert not any(ln.startswith("  Model:") or ln.startswith("  Tools:") for ln in lines), text


def test_describe_without_a_pinned_agent_and_hostile_values_stay_bounded():
    assert "  Agent:          <none>" in ds.describe_text(run("plain"), [], lc_now()).splitlines()
    r = run("h", agent={"name": "a\x1b[2J" + "n" * 600, "version": "v\n2", "digest": "f" * 64})
    r["spec"] = {"agentRef": {"name": "x"}, "parameters": {f"p{i}": "v" * 500 for i in range(40)}}
    text = ds.describe_text(r, [], lc_now())
    assert "\x1b" not in text and "\n2" not in text and max(len(line) for line in text.splitlines()) < 1200
    assert "... (30 more)" in text and "digest sha256:ffffffffffff" in text and "pinned" not in text


def lc_now():
    from datetime import UTC, datetime

    return datetime(2030, 1, 1, 0, 5, tzinfo=UTC)


def test_logs_labels_are_the_operators():
    from agentrun.controller.decide import jobs

    assert (logs.LABEL_RUN_UID, logs.LABEL_LAP, logs.LABEL_ATTEMPT) == (jobs.LABEL_RUN_UID, jobs.LABEL_LAP,
                                                                         jobs.LABEL_ATTEMPT)


def test_logs_stored_output_is_the_lap_record():
    rec = make_record(3, text="line one\nline two \x1b[2J", outcome="failed")
    lines = logs.stored_lines(rec)
    assert lines[0] == "# lap 3 attempt 1 (from the checkpoint store), outcome failed"
    assert "assistant: line one" in lines and any(ln.startswith("assistant: line two") and "\x1b" not in ln
                                                   for ln in lines)
    assert "tool extract_invoice call call_3: ok http 200" in lines


# ------------------------------------------------------------------------------------ trace --follow

class Store:
    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def iter_laps(self, ref: Any, start: int = 1) -> Any:
        class Obj:
            key, sha256, size = "k", "s", 1

        return [(r, Obj()) for r in self.records if r.lap >= start]


@pytest.mark.parametrize("phase, code", [("Succeeded", 0), ("Failed", 10), ("Cancelled", 12),
                                         ("DeadlineExceeded", 13)])
def test_trace_follow_exits_by_the_runs_outcome(monkeypatch, phase, code):
    api = FakeApi([run(RUN.name, ns=RUN.namespace, phase=phase, lap=1)])
    api.runs[(RUN.namespace, RUN.name)]["status"]["lap"] = 1
    exit_code = 0
    with CliRunner().isolation():
        try:
            tr._follow(Store([make_record(1)]), RUN, api, RUN.namespace, RUN.name, 1, None, "json", 100, 0.1, None)
        except SystemExit as e:
            exit_code = int(e.code or 0)
    assert exit_code == code


def test_trace_follow_without_a_cluster_exits_by_the_last_laps_outcome():
    with CliRunner().isolation():
        with pytest.raises(SystemExit) as e:
            tr._follow(Store([make_record(1, outcome="failed")]), RUN, None, RUN.namespace, RUN.name, 1, None, "json",
                       100, 0.1, None)
    assert e.value.code == ExitCode.FAILED


def test_describe_shows_a_queued_runs_place():
    r = run("q", phase="Queued", queue={"position": 3, "active": 2, "limit": 2, "policy": "team-a"})
    lines = ds.describe_text(r, [], lc_now()).splitlines()
    assert "  Queue:          position 3 (2 of 2 runs active; AgentRunPolicy team-a maxActiveRuns)" in lines
    assert not any(ln.startswith("  Queue:") for ln in ds.describe_text(run("r"), [], lc_now()).splitlines())


def test_describe_shows_the_job_kueue_holds_with_its_workload_escaped():
    r = run("k", phase="Queued", kueue={"job": "k-0f9e8-l1-a1", "localQueue": "lq", "since": "2030-01-01T00:00:00Z",
                                       "workload": "job-k-0f9e8-l1-a1-\x1b[2Jabc"})
    lines = ds.describe_text(r, [], lc_now()).splitlines()
    [line] = [ln for ln in lines if ln.startswith("  Kueue:")]
    assert "Job k-0f9e8-l1-a1 held in LocalQueue lq since 2030-01-01T00:00:00Z; Workload job-k-0f9e8-l1-a1-" in line
    assert "\x1b" not in line


def test_describe_names_the_agent_or_model_limit_a_run_waits_for():
    r = run("q", phase="Queued", queue={"position": 1, "active": 2, "limit": 2, "policy": "team-a",
                                       "scope": "model gpt-4o"})
    lines = ds.describe_text(r, [], lc_now()).splitlines()
    assert ("  Queue:          position 1 (2 of 2 runs of model gpt-4o active; AgentRunPolicy team-a "
            "maxActiveRunsPerModel)") in lines


def test_describe_shows_the_rewinds_of_a_run_retried_from_an_earlier_lap():
    r = run("w", phase="Running", lifecycle={"retries": 2, "rewinds": [3, 1]})
    lines = ds.describe_text(r, [], lc_now()).splitlines()
    assert "  Rewinds:        2 (to laps 3, 1; history 2 is current)" in lines
    assert not any(ln.startswith("  Rewinds:") for ln in ds.describe_text(run("r"), [], lc_now()).splitlines())


def test_describe_shows_the_trace_id():
    r = run("t", phase="Running", traceId="0f9e8d7c111122223333444455556666")
    assert "  Trace:          0f9e8d7c111122223333444455556666 (OpenTelemetry trace id)" in \
        ds.describe_text(r, [], lc_now()).splitlines()
