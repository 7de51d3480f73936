"""The operator starts no lap while its admission policies are not in place (issue 29, item 6;
controller/policycheck.py, docs/operations.md#admission-policies), on the real local control plane.

Without the binding of ``agentrun-decisions`` the API server no longer checks who decides an
approval: anyone who may patch a run could approve. So when the binding is deleted, the operator
(which watches its policies and bindings by name) turns unready (/readyz 503) on the watch event,
within seconds and not at a resync (AGENTRUN_RESYNC_SECONDS is an hour here: issue 29's window
between two checks is closed), and a new run gets no Job: its condition Progressing=False with reason AdmissionPoliciesMissing names the binding, and
ONE Warning Event says so. When the binding is back (the generated file applied again) the operator
is ready again without a restart and the same run goes on to Succeeded. A policy whose version
marker is not the one this operator's code computes (an older chart) holds the runs the same way,
with reason AdmissionPoliciesOutdated.

Fails on a main without the check: the run starts its lap at once and no such condition, Event or
readiness change exists. Fails on a main that checks by polling (a GET of every policy at start and
every resync): with an hour's resync the deletion is not seen within the bound, and a run created
right after it would start its lap.

Meanwhile the replica is alive: Kopf's liveness endpoint (controller/process.py, the chart's
livenessProbe) answers 200, and its ``ready`` probe says the replica waits for its admission
policies, so Kubernetes would not restart it for them. (On a main without that endpoint it does
not answer at all.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.cluster import _free_port
from e2e_support import wait_for
from test_operator_e2e import ROOT, Env

from agentrun.api import admission, policy_version

pytestmark = [pytest.mark.e2e]

POLICIES_FILE = ROOT / "crds" / "agentrun.dev_admission-policies.yaml"
RESYNC_SECONDS = 3600
#: How soon a deleted or edited policy must make the replica unready: a watch event's delivery
#: and a readiness poll, far below any resync.
WATCH_BOUND_SECONDS = 10


class ReadyEnv(Env):
    port: int = 0
    liveness_port: int = 0

    def start_operator(self) -> None:
        self.port, self.liveness_port = _free_port(), _free_port()
        fh = open(self.log, "ab")  # noqa: SIM115 (the operator's log for its lifetime)
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"],
                                     env=self.operator_env(AGENTRUN_METRICS_PORT=str(self.port),
                                                           AGENTRUN_LIVENESS_PORT=str(self.liveness_port),
                                                           # no resync within the tests: only the watch can tell
                                                           AGENTRUN_RESYNC_SECONDS=str(RESYNC_SECONDS)),
                                     stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    def liveness(self) -> tuple[int, Any]:
        """Kopf's liveness endpoint: (status, its JSON: one entry per probe handler)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=5) as r:
                return int(r.status), json.loads(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), None
        except OSError:
            return 0, None

    def alive_and_waiting_for(self, what: list[str]) -> bool:
        code, body = self.liveness()
        assert code == 200, (code, body)  # never a failed liveness probe meanwhile
        return bool(body["lease"] == "ticking" and body["ready"] == {"ready": not what, "waitingFor": what})

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def progressing(self, name: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == "Progressing"), {})


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory) -> Iterator[ReadyEnv]:
    e = ReadyEnv(cluster, s3, tmp_path_factory.mktemp("policy-readiness"))
    e.prepare_namespace()  # install_api: the generated policies, the versions this code expects
    e.start_operator()
    try:
        wait_for("the operator ready with its policies in place", lambda: e.readyz() == 200, timeout=120)
        # Kopf answers from its probes' results of the last 10 s at most
        wait_for("Kopf's liveness endpoint: alive and ready", lambda: e.alive_and_waiting_for([]), timeout=30)
        assert "Activity 'lease'" not in e.log_text()  # a probe every 10 s: its successes are not logged
        yield e
    finally:
        cluster.kubectl_run("apply", "-f", str(POLICIES_FILE))  # whatever a test left
        if e.proc and e.proc.poll() is None:
            os.killpg(e.proc.pid, signal.SIGKILL)
            e.proc.wait(10)
        e.tools.shutdown()
        if os.environ.get("AGENTRUN_E2E_KEEP") is None:
            cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def _diagnostics(env: ReadyEnv, name: str) -> str:
    out = env.kubectl("get", "agentrun,jobs,events", "-n", env.ns, "-o", "wide", check=False)
    return f"{out.stdout}{out.stderr}\n--- operator log (tail)\n" + "\n".join(env.log_text().splitlines()[-40:])


def test_a_deleted_binding_holds_every_lap_until_it_is_back(env: ReadyEnv) -> None:
    binding = admission.VAP_DECISIONS
    env.kubectl("delete", "validatingadmissionpolicybinding", binding)
    try:
        # the watch event, not a resync (an hour away): issue 29's "deleted between checks" window
        wait_for("/readyz 503 once the binding is gone", lambda: env.readyz() == 503, timeout=WATCH_BOUND_SECONDS)
        assert f"missing: ValidatingAdmissionPolicyBinding {binding}" in env.log_text()
        wait_for("Kopf's liveness endpoint: alive, waiting for the admission policies",
                 lambda: env.alive_and_waiting_for(["admission policies"]), timeout=30)
        name = "held"
        env.apply(env.run_doc(name, [{"content": "done"}]))
        cond = wait_for("Progressing=False AdmissionPoliciesMissing",
                        lambda: (c := env.progressing(name)).get("reason") == "AdmissionPoliciesMissing" and c,
                        timeout=60)
        assert cond["status"] == "False", cond
        assert f"ValidatingAdmissionPolicyBinding {binding}" in cond["message"], cond
        assert "lap 1 attempt 1 not started" in cond["message"] and "docs/operations.md#admission-policies" \
            in cond["message"], cond
        # a few resyncs later: still no Job, and ONE Warning Event
        import time
        time.sleep(12)
        assert env.jobs(name) == [], _diagnostics(env, name)
        events = [e for e in env.events(name) if e["reason"] == "AdmissionPoliciesMissing"]
        assert len(events) == 1 and events[0]["type"] == "Warning" and events[0].get("count", 1) == 1, events
        assert binding in events[0]["message"]
        assert env.status(name).get("phase") in (None, "Pending"), env.status(name)
    finally:
        env.kubectl("apply", "-f", str(POLICIES_FILE))
    # back: ready again, without a restart, and the held run goes on
    wait_for("/readyz 200 once the binding is back", lambda: env.readyz() == 200, timeout=WATCH_BOUND_SECONDS)
    st = env.wait_phase(name, "Succeeded", "Failed", timeout=180)
    assert st["phase"] == "Succeeded", (st, _diagnostics(env, name))
    assert len(env.jobs(name)) == 1
    assert [e["reason"] for e in env.events(name)].count("AdmissionPoliciesMissing") == 1


def test_a_policy_of_another_version_holds_the_laps_as_outdated(env: ReadyEnv) -> None:
    policy = admission.VAP_STATUS
    key = policy_version.ANNOTATION
    want = policy_version.marker(admission.status_policy())
    env.kubectl("annotate", "--overwrite", "validatingadmissionpolicy", policy, f"{key}={'0' * 64}")
    try:
        wait_for("/readyz 503 with an outdated policy", lambda: env.readyz() == 503, timeout=WATCH_BOUND_SECONDS)
        name = "outdated"
        env.apply(env.run_doc(name, [{"content": "done"}]))
        cond = wait_for("Progressing=False AdmissionPoliciesOutdated",
                        lambda: (c := env.progressing(name)).get("reason") == "AdmissionPoliciesOutdated" and c,
                        timeout=60)
        assert f"ValidatingAdmissionPolicy {policy} (version {'0' * 15}" in cond["message"], cond
        assert f"this operator expects {want[:12]}" in cond["message"], cond
        assert env.jobs(name) == []
    finally:
        env.kubectl("annotate", "--overwrite", "validatingadmissionpolicy", policy, f"{key}={want}")
    wait_for("/readyz 200 with the expected version", lambda: env.readyz() == 200, timeout=WATCH_BOUND_SECONDS)
    assert env.wait_phase(name, "Succeeded", "Failed", timeout=180)["phase"] == "Succeeded"


def test_a_run_created_right_after_a_deletion_gets_no_job(env: ReadyEnv) -> None:
    """The window issue 29 left open: a policy deleted between two checks, and a run created in
    it. Here the run is created as soon as `kubectl delete` returns, before any readiness poll. The
    deletion's watch event reaches the operator as soon as the API server has written it; the run's
    own comes after a `kubectl apply` (a process start, a request): the run is held. (A polling
    check, an hour between two GETs here, starts its lap.)"""
    binding = admission.VAP_DECISIONS
    name = "in-the-window"
    env.kubectl("delete", "validatingadmissionpolicybinding", binding)
    try:
        env.apply(env.run_doc(name, [{"content": "done"}]))
        cond = wait_for("Progressing=False AdmissionPoliciesMissing for a run created right after the deletion",
                        lambda: (c := env.progressing(name)).get("reason") == "AdmissionPoliciesMissing" and c,
                        timeout=30)
        assert f"ValidatingAdmissionPolicyBinding {binding}" in cond["message"], cond
        assert env.jobs(name) == [], _diagnostics(env, name)
        assert env.readyz() == 503
    finally:
        env.kubectl("apply", "-f", str(POLICIES_FILE))
    wait_for("/readyz 200 once the binding is back", lambda: env.readyz() == 200, timeout=WATCH_BOUND_SECONDS)
    assert env.wait_phase(name, "Succeeded", "Failed", timeout=180)["phase"] == "Succeeded"
    assert len(env.jobs(name)) == 1
