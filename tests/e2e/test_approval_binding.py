"""Approvals you can audit, the operator's side, on the real local control plane (issue 11):

* a decision is bound to the call it approves (``agentrun.dev/call-id`` and
  ``agentrun.dev/arguments-sha256``): one bound to an older or another call is refused with ONE
  Event and the run keeps waiting for the current call; a correct one proceeds;
* malformed decision inputs (unknown values, huge reasons, control characters, bad bindings) each
  give ONE Warning Event naming the field, the run keeps waiting, and nothing loops;
* a status write the API server refuses (here: a ValidatingAdmissionPolicy made by the test) while
  a decision stands: no Job runs ahead of the decision, ONE Warning Event naming the field, the
  operator backs off (its reconcile count stays bounded), and once the refusal is lifted the
  decision proceeds;
* the status never shows a call pending once a Job that executes it exists (sampled throughout);
* the run's store is pinned in status.store; changing the operator's default store only affects
  new runs.

Own operator (with its metrics port), own namespace. Deadlines are long (1h) and every wait is on a
condition, never on elapsed time.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
import yaml
from e2e_support import wait_for
from test_operator_e2e import Env, _diagnostics_on_failure  # noqa: F401 (a fixture)

from agentrun.api.approval import (
    ANN_APPROVED,
    ANN_ARGUMENTS_SHA256,
    ANN_CALL_ID,
    ANN_DECIDED_BY,
    ANN_REASON,
    DECISION_ANNOTATIONS,
    MAX_DECIDED_BY_CHARS,
    MAX_REASON_CHARS,
    arguments_sha256,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BindingEnv(Env):
    """The operator e2e environment with the operator's /metrics served on a free port."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.metrics_port = _free_port()
        self.extra: dict[str, str] = {}

    def operator_env(self, **extra: str) -> dict[str, str]:
        return super().operator_env(AGENTRUN_METRICS_PORT=str(self.metrics_port), **{**self.extra, **extra})

    def reconciles(self) -> dict[str, float]:
        """agentrun_reconcile_total by result, from the operator's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("agentrun_reconcile_total{"):
                result = line.split('result="', 1)[1].split('"', 1)[0]
                out[result] = float(line.rsplit(" ", 1)[1])
        return out

    def annotate(self, name: str, values: dict[str, str], check: bool = True):
        """Set annotations with a merge patch (values may hold any character)."""
        patch = json.dumps({"metadata": {"annotations": values}})
        return self.kubectl("patch", "agentrun", name, "-n", self.ns, "--type=merge", "-p", patch, check=check)

    def annotations(self, name: str) -> dict[str, str]:
        return self.get(name)["metadata"].get("annotations") or {}

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events(name)]


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = BindingEnv(cluster, s3, tmp_path_factory.mktemp("binding"))
    e.prepare_namespace()
    e.start_operator()
    wait_for("operator metrics", lambda: _safe(e.reconciles), timeout=120)
    yield e
    e.kill_operator()
    e.tools.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def _safe(fn):
    try:
        return fn()
    except OSError:
        return None


class PendingWatch:
    """Samples, in a thread, the run's Jobs and THEN its status: if a Job of a lap after the one that
    asked for approval exists while the status (read after it) still shows that approval Pending,
    the status lied ("call pending" after the Job that executes it existed)."""

    def __init__(self, env: BindingEnv, name: str) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(env.cluster.kubeconfig))
        self.batch, self.custom = client.BatchV1Api(self.api), client.CustomObjectsApi(self.api)
        self.env, self.name = env, name
        self.samples = 0
        self.violations: list[str] = []
        self.job_names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PendingWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)
        self.api.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                jobs = self.batch.list_namespaced_job(self.env.ns, label_selector=f"agentrun.dev/run={self.name}").items
                run = self.custom.get_namespaced_custom_object("agentrun.dev", "v1alpha1", self.env.ns, "agentruns",
                                                               self.name)
            except Exception:  # noqa: BLE001 - a sample lost to a transient error is skipped
                time.sleep(0.3)
                continue
            ap = (run.get("status") or {}).get("approval") or {}
            laps = {j.metadata.name: int(j.metadata.labels["agentrun.dev/lap"]) for j in jobs}
            self.job_names |= set(laps)
            if ap.get("state") == "Pending":
                ahead = [n for n, lap in laps.items() if lap > ap["lap"]]
                if ahead:
                    self.violations.append(f"call {ap['callId']} (lap {ap['lap']}) Pending while Jobs {ahead} exist")
            self.samples += 1
            time.sleep(0.3)


def _two_approvals_script(name: str) -> list[dict]:
    return [
        {"content": "first refund", "toolCalls": [{"name": "refund", "arguments": {"order": f"{name}-a"}}]},
        {"content": "second refund", "toolCalls": [{"name": "refund", "arguments": {"order": f"{name}-b"}}]},
        {"content": "finished"},
    ]


def _wait_pending(env: BindingEnv, name: str, lap: int) -> dict:
    st = wait_for(f"{name} waits for the approval of lap {lap}", lambda: (
        (s := env.status(name)).get("phase") in ("AwaitingApproval", "Failed", "Succeeded")
        and (s.get("phase") != "AwaitingApproval" or (s.get("approval") or {}).get("lap") == lap) and s), timeout=120)
    assert st["phase"] == "AwaitingApproval" and st["approval"]["state"] == "Pending", st
    return st


def _wait_consumed(env: BindingEnv, name: str) -> None:
    wait_for(f"the decision annotations of {name} removed",
             lambda: not set(env.annotations(name)) & set(DECISION_ANNOTATIONS), timeout=90)


def _refunds(env: BindingEnv, order: str) -> int:
    return len([c for c in env.calls("/refund") if c["arguments"].get("order") == order])


def test_decision_bound_to_an_older_call_is_refused_and_the_run_keeps_waiting(env):
    name = "bound"
    env.apply(env.run_doc(name, _two_approvals_script(name)))
    with PendingWatch(env, name) as watch:
        st = _wait_pending(env, name, 1)
        first = st["approval"]
        sha_a = arguments_sha256({"order": f"{name}-a"})
        assert first["argumentsSha256"] == sha_a and first["argumentsTruncated"] is False
        # the store is pinned in status, and it is the operator's default this run resolved to
        store = st["store"]
        assert store["uri"] == f"s3://{env.s3.bucket}/e2e-{env.ns}" and store["pathStyle"] is True
        assert store["endpoint"] == env.s3.endpoint_url and store["region"] == env.s3.region

        # a decision bound to the call pending now proceeds
        env.annotate(name, {ANN_APPROVED: "true", ANN_CALL_ID: first["callId"], ANN_ARGUMENTS_SHA256: sha_a,
                            ANN_REASON: "checked a"})
        st = _wait_pending(env, name, 2)
        second = st["approval"]
        sha_b = arguments_sha256({"order": f"{name}-b"})
        assert second["argumentsSha256"] == sha_b and _refunds(env, f"{name}-a") == 1
        job = next(j for j in env.jobs(name) if j["metadata"]["labels"]["agentrun.dev/lap"] == "2")
        assert json.loads(job["metadata"]["annotations"]["agentrun.dev/approval"]) == {
            "decision": "approved", "callId": first["callId"], "argumentsSha256": sha_a,
            "targetSha256": first["targetSha256"]}  # an approval is bound to its target too (issue 29)

        # the person approves what they saw before: the OLDER call (its id and arguments) -> refused
        env.annotate(name, {ANN_APPROVED: "true", ANN_CALL_ID: first["callId"], ANN_ARGUMENTS_SHA256: sha_a})
        _wait_consumed(env, name)
        wait_for("ApprovalBindingMismatch", lambda: "ApprovalBindingMismatch" in env.reasons(name))
        st = env.status(name)
        assert st["phase"] == "AwaitingApproval" and st["approval"]["state"] == "Pending"
        assert st["approval"]["callId"] == second["callId"] and st["approval"]["argumentsSha256"] == sha_b
        (ev,) = [e for e in env.events(name) if e["reason"] == "ApprovalBindingMismatch"]
        assert ev["type"] == "Warning" and sha_a in ev["message"] and sha_b in ev["message"], ev["message"]
        # ... and one bound to another call id
        env.annotate(name, {ANN_APPROVED: "true", ANN_CALL_ID: "call_99"})
        _wait_consumed(env, name)
        wait_for("a second ApprovalBindingMismatch",
                 lambda: env.reasons(name).count("ApprovalBindingMismatch") == 2)
        assert "'call_99'" in [e for e in env.events(name) if "call_99" in e["message"]][0]["message"]
        assert env.status(name)["approval"]["state"] == "Pending" and _refunds(env, f"{name}-b") == 0

        # the correct decision proceeds
        env.annotate(name, {ANN_APPROVED: "true", ANN_CALL_ID: second["callId"], ANN_ARGUMENTS_SHA256: sha_b})
        st = env.wait_phase(name, "Succeeded", "Failed", timeout=120)
        assert st["phase"] == "Succeeded", st
        assert st["store"] == store  # the same store all along
    assert watch.samples > 0 and not watch.violations, watch.violations
    assert _refunds(env, f"{name}-a") == 1 and _refunds(env, f"{name}-b") == 1
    assert env.reasons(name).count("ApprovalBindingMismatch") == 2
    assert env.reasons(name).count("ApprovalDecided") == 2


MALFORMED = [  # (annotations, the field the Event must name)
    ({ANN_APPROVED: "maybe"}, ANN_APPROVED),
    ({ANN_APPROVED: "true", ANN_REASON: "r" * (MAX_REASON_CHARS * 20)}, ANN_REASON),
    ({ANN_APPROVED: "true", ANN_CALL_ID: "call_1\n; rm -rf /"}, ANN_CALL_ID),
    ({ANN_APPROVED: "true", ANN_ARGUMENTS_SHA256: "not-a-digest"}, ANN_ARGUMENTS_SHA256),
    ({ANN_APPROVED: "tr\x1b[2Jue"}, ANN_APPROVED),
]


def test_malformed_decisions_each_give_one_event_and_the_run_keeps_waiting(env):
    name = "malformed"
    env.apply(env.run_doc(name, _two_approvals_script(name)))
    with PendingWatch(env, name) as watch:
        _wait_pending(env, name, 1)
        for i, (annotations, field) in enumerate(MALFORMED, start=1):
            env.annotate(name, annotations)
            _wait_consumed(env, name)
            wait_for(f"ApprovalInvalid #{i}", lambda i=i: env.reasons(name).count("ApprovalInvalid") == i)
            ev = [e for e in env.events(name) if e["reason"] == "ApprovalInvalid"]
            msg = next(e["message"] for e in ev if field in e["message"])
            assert len(msg) <= 1024 and not any(ord(ch) < 0x20 for ch in msg), msg
            st = env.status(name)
            assert st["phase"] == "AwaitingApproval" and st["approval"]["state"] == "Pending", st
        # the decider annotation: where admission stamps it, a client value never lands (nothing to
        # refuse here); without admission, an over-long or control-character value is refused
        for value in ("u" * (MAX_DECIDED_BY_CHARS + 50), "alice\x1b]0;owned\x07"):
            before = env.reasons(name).count("ApprovalInvalid")
            r = env.annotate(name, {ANN_APPROVED: "maybe", ANN_DECIDED_BY: value}, check=False)
            if r.returncode != 0:
                continue  # refused by the API server's admission policy: the guarantee holds earlier
            _wait_consumed(env, name)
            wait_for("one more ApprovalInvalid", lambda b=before: env.reasons(name).count("ApprovalInvalid") == b + 1)
        # a reason with control characters is recorded escaped, with one Warning
        env.annotate(name, {ANN_APPROVED: "false", ANN_REASON: "no\nrefund\x1b[31m"})
        st = _wait_pending(env, name, 2)
        assert [a for a in env.events(name) if a["reason"] == "ApprovalReasonEscaped"]
        env.annotate(name, {ANN_APPROVED: "false"})
        st = env.wait_phase(name, "Succeeded", "Failed", timeout=120)
        assert st["phase"] == "Succeeded", st
    assert not watch.violations, watch.violations
    assert _refunds(env, f"{name}-a") == 0 and _refunds(env, f"{name}-b") == 0
    assert env.reasons(name).count("ApprovalReasonEscaped") == 1


def _refusing_policy(run: str) -> list[dict]:
    """A ValidatingAdmissionPolicy (and binding) that refuses any status write recording a decision
    on ``run``: the API server will not store it, whatever the operator tries."""
    name = f"e2e-refuse-decision-{run}"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["agentrun.dev"], "apiVersions": ["*"],
                                                          "operations": ["UPDATE"],
                                                          "resources": ["agentruns/status"]}]},
                  "matchConditions": [{"name": "this-run", "expression": f"object.metadata.name == '{run}'"}],
                  "validations": [{"expression": "!has(object.status.approval) || "
                                                 "object.status.approval.state == 'Pending'",
                                   "message": "status.approval.state: the e2e test refuses recording a decision"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}},
    ]


def test_refused_status_write_no_job_ahead_of_the_decision_one_event_no_hot_loop(env):
    name = "refused"
    # a finished run beside it: the resync reconciles it once per pass, the clock of the hot-loop check
    env.apply(env.run_doc("refused-clock", [{"content": "done"}]))
    assert env.wait_phase("refused-clock", "Succeeded", "Failed")["phase"] == "Succeeded"
    env.apply(env.run_doc(name, [{"content": "refund", "toolCalls": [{"name": "refund",
                                                                      "arguments": {"order": name}}]},
                                 {"content": "finished"}]))
    _wait_pending(env, name, 1)
    docs = _refusing_policy(name)
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    with PendingWatch(env, name) as watch:
        try:
            # wait until the policy is in force: a server-side dry run of such a status write is refused
            probe = json.dumps({"status": {"approval": {"state": "Approved"}}})
            wait_for("the refusing policy in force", lambda: env.kubectl(
                "patch", "agentrun", name, "-n", env.ns, "--subresource=status", "--type=merge", "-p", probe,
                "--dry-run=server", check=False).returncode != 0, timeout=60)
            before = env.reconciles()
            env.annotate(name, {ANN_APPROVED: "true", ANN_REASON: "go"})
            wait_for("StatusUpdateRefused", lambda: "StatusUpdateRefused" in env.reasons(name), timeout=90)
            errors0 = env.reconciles().get("error", 0)
            # the operator keeps retrying (backoff, resync) while the refusal stands
            wait_for("three more refused reconciles", lambda: env.reconciles().get("error", 0) >= errors0 + 3,
                     timeout=180)
            after = env.reconciles()
            # nothing ran ahead of the decision: no Job of lap 2, the status is still Pending (true),
            # the decision still stands (it is applied once the status can hold it)
            assert not [j for j in env.jobs(name) if j["metadata"]["labels"]["agentrun.dev/lap"] == "2"]
            st = env.status(name)
            assert st["phase"] == "AwaitingApproval" and st["approval"]["state"] == "Pending", st
            assert env.annotations(name).get(ANN_APPROVED) == "true"
            refused = [e for e in env.events(name) if e["reason"] == "StatusUpdateRefused"]
            assert len(refused) == 1 and refused[0]["type"] == "Warning", refused
            assert "status.approval.state" in refused[0]["message"], refused[0]["message"]
            assert "ApprovalDecided" not in env.reasons(name)
            # no hot loop, counted on the operator's own clock rather than seconds: each other run of
            # the namespace is reconciled once per resync pass (every run not reconciled for half of
            # AGENTRUN_RESYNC_SECONDS), so their reconciles in the window count the passes; the refused
            # run (every reconcile of it an error) gets a few per pass at most (its backoff: 0.5 s,
            # doubling), where the bug this replaces reconciled it several times a second
            runs = len(json.loads(env.kubectl("get", "agentruns", "-n", env.ns, "-o", "json").stdout)["items"])
            errors = after.get("error", 0) - before.get("error", 0)
            passes = (sum(after.values()) - sum(before.values()) - errors) / max(1, runs - 1)
            assert runs >= 2 and passes > 0, (runs, before, after)
            assert errors <= 4 * (passes + 2), (errors, passes, runs, before, after)
            assert watch.job_names == {j["metadata"]["name"] for j in env.jobs(name)}  # no Job came and went
        finally:
            env.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                        docs[0]["metadata"]["name"], check=False)
        # the refusal is lifted: the standing decision is recorded, then the Job runs it
        st = env.wait_phase(name, "Succeeded", "Failed", timeout=180)
    assert st["phase"] == "Succeeded" and st["approval"]["state"] == "Approved" and st["approval"]["reason"] == "go"
    assert _refunds(env, name) == 1
    assert env.reasons(name).count("ApprovalDecided") == 1 and env.reasons(name).count("StatusUpdateRefused") == 1
    assert watch.samples > 0 and not watch.violations, watch.violations


def test_changing_the_default_store_only_affects_new_runs(env):
    old = env.s3.bucket, f"e2e-{env.ns}"
    name = "pinned"
    env.apply(env.run_doc(name, [{"content": "refund", "toolCalls": [{"name": "refund",
                                                                      "arguments": {"order": name}}]},
                                 {"content": "finished"}]))
    st = _wait_pending(env, name, 1)
    assert st["store"]["uri"] == f"s3://{old[0]}/{old[1]}"
    # the operator restarts with another default store (another prefix of the same S3)
    env.kill_operator()
    env.extra = {"AGENTRUN_CHECKPOINT_URI": f"s3://{old[0]}/moved-{env.ns}"}
    env.start_operator()
    env.apply(env.run_doc("fresh", [{"content": "x"}]))
    st = env.wait_phase("fresh", "Succeeded", "Failed", timeout=120)
    assert st["phase"] == "Succeeded" and st["store"]["uri"] == f"s3://{old[0]}/moved-{env.ns}", st
    assert st["checkpoint"]["uri"].startswith(f"s3://{old[0]}/moved-{env.ns}/")
    # the run in flight continues in its pinned store: its lap 1 is found, lap 2 is written there
    env.annotate(name, {ANN_APPROVED: "true"})
    st = env.wait_phase(name, "Succeeded", "Failed", timeout=120)
    assert st["phase"] == "Succeeded" and st["lap"] == 2, st
    assert st["store"]["uri"] == f"s3://{old[0]}/{old[1]}"
    assert st["checkpoint"]["uri"].startswith(f"s3://{old[0]}/{old[1]}/"), st["checkpoint"]
    lap2 = next(j for j in env.jobs(name) if j["metadata"]["labels"]["agentrun.dev/lap"] == "2")
    job_env = {e["name"]: e.get("value") for e in lap2["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job_env["AGENTRUN_CHECKPOINT_URI"] == f"s3://{old[0]}/{old[1]}"
    assert _refunds(env, name) == 1
