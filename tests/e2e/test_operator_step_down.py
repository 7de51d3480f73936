"""A replica whose RBAC is taken away while it leads steps down, on the real control plane.

The active replica runs as the chart's own ServiceAccount with the chart's own namespaced Role
(``helm template --show-only templates/rbac.yaml``, applied here) through a TokenRequest
kubeconfig; a standby runs with the admin kubeconfig. The test takes the ``batch/jobs`` rule out
of that Role while a lap is in flight, as a platform team's RBAC change would:

* the active replica does not step down on the first refusal (only after
  ``REFUSED_STEP_DOWN_SECONDS`` of them), then releases the Lease, says why in its log, turns
  unready (``/readyz``) and exports ``agentrun_informer_synced{resource="jobs"} 0``;
* the standby takes the Lease and finishes the run: one Job per lap, every tool call once;
* once the rule is back, the replica lists again and turns ready, and stays a standby.

Both replicas renew their watches every ``AGENTRUN_WATCH_TIMEOUT_SECONDS`` = 5 s (an RBAC change
does not cut an open watch) and run without the tenancy re-check (its ClusterRole is cluster-wide
and belongs to the chart's own tests). Every wait is on a condition, with generous deadlines.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import ADMISSION_APIS, _free_port, sa_kubeconfig
from test_operator_e2e import ROOT, _diagnostics_on_failure, _gated, _one_job_per_attempt, _wait  # noqa: F401
from test_operator_failures import FailEnv, _note, gate  # noqa: F401 (the gate fixture)

from agentrun.controller.reconciler import REFUSED_STEP_DOWN_SECONDS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHART = ROOT / "helm" / "agentrun-operator"
RELEASE = "agentrun-operator"  # the chart's fullname: its Role, ServiceAccount and Lease name
WATCH_SECONDS = "5"


def chart_rbac(ns: str) -> str:
    """The chart's namespaced RBAC of the operator (Role, leader-election Role, bindings) for ``ns``."""
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    return subprocess.run([helm, "template", RELEASE, str(CHART), "--namespace", ns, "--set", f"watchNamespaces={{{ns}}}",
                           *ADMISSION_APIS, "--show-only", "templates/rbac.yaml"], check=True, capture_output=True, text=True).stdout


class StepEnv(FailEnv):
    def __init__(self, cluster: Any, s3: Any, tmp: Path) -> None:
        super().__init__(cluster, s3, tmp)
        self.ports: dict[str, int] = {}
        self.rbac = ""

    def start_as(self, identity: str, kubeconfig: str | None) -> None:
        port = self.ports[identity] = _free_port()
        self.start_operator(identity, kubeconfig, AGENTRUN_METRICS_PORT=str(port),
                            AGENTRUN_WATCH_TIMEOUT_SECONDS=WATCH_SECONDS, AGENTRUN_TENANCY_RECHECK="false")

    def http(self, identity: str, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[identity]}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def jobs_synced(self, identity: str) -> float | None:
        _, text = self.http(identity, "/metrics")
        for line in text.splitlines():
            if line.startswith("agentrun_informer_synced{") and 'resource="jobs"' in line:
                return float(line.rsplit(" ", 1)[1])
        return None

    def log_text(self, identity: str) -> str:
        return self.logs[identity].read_text(errors="replace")


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = StepEnv(cluster, s3, tmp_path_factory.mktemp("operator-step-down"))
    e.prepare_namespace()
    e.kubectl("create", "serviceaccount", RELEASE, "-n", e.ns)
    e.rbac = chart_rbac(e.ns)
    e.kubectl("apply", "-f", "-", input=e.rbac)
    yield e
    e.kill_operator()
    e.tools.shutdown()
    cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def test_a_leader_whose_jobs_access_is_revoked_steps_down_and_the_standby_finishes_the_run(env, gate):  # noqa: F811 (fixtures)
    kc = sa_kubeconfig(env.cluster, env.ns, RELEASE)
    env.start_as("op-sa", kc)
    _wait("op-sa (the chart's RBAC) takes the Lease", lambda: env.lease_holder() == "op-sa", timeout=120)
    _wait("op-sa ready", lambda: env.http("op-sa", "/readyz")[0] == 200, timeout=60)
    env.start_as("op-admin", None)
    _wait("op-admin standby", lambda: "standby" in env.log_text("op-admin"), timeout=120)

    env.apply(_gated(env.run_doc("sd", [_note("sd1"), _note("sd2"), {"content": "done"}]), gate))
    _wait("lap 1's tool call held at the gate", lambda: gate.arrived("sd1"), timeout=180)
    assert env.log_text("op-sa").count("created lap Job") == 1

    role = json.loads(env.kubectl("get", "role", RELEASE, "-n", env.ns, "-o", "json").stdout)
    at = next(i for i, r in enumerate(role["rules"]) if r.get("resources") == ["jobs"])
    revoked = time.monotonic()
    env.kubectl("patch", "role", RELEASE, "-n", env.ns, "--type=json",
                "-p", json.dumps([{"op": "remove", "path": f"/rules/{at}"}]))
    _wait("op-admin takes the Lease", lambda: env.lease_holder() == "op-admin", timeout=180)
    took = time.monotonic() - revoked
    print(f"jobs rule revoked -> standby holds the Lease: {took:.1f} s (watch renewed every {WATCH_SECONDS} s)")
    # not on the first refusal: only after REFUSED_STEP_DOWN_SECONDS of them
    assert took >= REFUSED_STEP_DOWN_SECONDS, took
    sa_log = env.log_text("op-sa")
    assert "stepping down" in sa_log and "jobs in " + env.ns in sa_log and "403" in sa_log, sa_log[-3000:]
    code, body = env.http("op-sa", "/readyz")
    assert code == 503, (code, body)
    assert env.jobs_synced("op-sa") == 0.0

    gate.open()  # lap 1 ends; the standby adopts it and runs lap 2
    st = env.wait_phase("sd", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    jobs = env.jobs("sd")
    _one_job_per_attempt(jobs)
    assert len(jobs) == 3 and st["totalRetries"] == 0, (jobs, st)
    assert env.log_text("op-sa").count("created lap Job") == 1  # it acted no more
    assert "created lap Job" in env.log_text("op-admin")
    for order in ("sd1", "sd2"):
        assert len([c for c in env.calls("/note") if c["arguments"].get("order") == order]) == 1, order

    env.kubectl("apply", "-f", "-", input=env.rbac)  # the rule is back
    _wait("op-sa lists its Jobs again and turns ready", lambda: env.http("op-sa", "/readyz")[0] == 200, timeout=180)
    # the gauge is set at the elector's next round (a standby's: every Lease duration)
    _wait("op-sa's jobs informer synced again", lambda: env.jobs_synced("op-sa") == 1.0, timeout=30)
    # the holder keeps renewing beside a ready standby: three renewals of op-admin observed (the
    # Lease's renewTime moving), every one still op-admin's; counted renewals, not seconds of sleep
    renewals: list[str] = []

    def renewed_by_the_holder() -> bool:
        r = env.kubectl("get", "lease", "agentrun-operator", "-n", env.ns, "-o",
                        "jsonpath={.spec.holderIdentity} {.spec.renewTime}", check=False)
        holder, _, renew = r.stdout.strip().partition(" ")
        assert r.returncode != 0 or holder == "op-admin", f"the Lease went to {holder!r} after {renewals}"
        if renew and renew not in renewals:
            renewals.append(renew)
        return len(renewals) >= 3
    _wait("op-admin to renew its Lease three times beside the ready op-sa", renewed_by_the_holder, timeout=180,
          interval=0.3)
