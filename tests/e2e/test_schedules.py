"""AgentSchedules on the real local control plane (issue 33 item 1): a schedule every minute, its
clock driven by the test seam (AGENTRUN_TEST_CLOCK_FILE, agentrun.testfault.clock: not real minutes):
runs created on time under their deterministic names, Forbid skipping while one is active, the
history limit pruning, an operator SIGKILL at a schedule time creating that run once; and the bad
input the API server refuses at apply, or the operator with a condition and one Event.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py; ``Env`` from test_operator_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_operator_e2e import ROOT, Env, _diagnostics_on_failure, _wait  # noqa: F401

from agentrun.api.schedule import ANN_SCHEDULED_AT, LABEL_SCHEDULE, run_name

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCHEDULE_CRD = ROOT / "crds" / "agentrun.dev_agentschedules.yaml"


class SchedEnv(Env):
    """Env with the AgentSchedule CRD, a test clock file, and named operator replicas."""

    def __init__(self, cluster: Any, s3: Any, tmp: Path) -> None:
        super().__init__(cluster, s3, tmp)
        self.clock = tmp / "clock"
        self.procs: list[subprocess.Popen] = []

    def set_clock(self, t: datetime) -> None:
        tmp = self.clock.with_suffix(".tmp")
        tmp.write_text(t.strftime("%Y-%m-%dT%H:%M:%SZ"))
        os.replace(tmp, self.clock)  # the operator never reads half a time

    def start_operator(self, identity: str = "op-a") -> None:  # type: ignore[override]
        env = self.operator_env(AGENTRUN_IDENTITY=identity, AGENTRUN_TEST_CLOCK_FILE=str(self.clock))
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"], env=env,
                                     stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(self.proc)

    def kill_operator(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def sched(self, name: str) -> dict:
        r = self.kubectl("get", "agentschedule", name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def runs_of(self, name: str) -> list[dict]:
        r = self.kubectl("get", "agentruns", "-n", self.ns, "-l", f"{LABEL_SCHEDULE}={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def run_names(self, name: str) -> set[str]:
        return {r["metadata"]["name"] for r in self.runs_of(name)}

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events(name)]


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = SchedEnv(cluster, s3, tmp_path_factory.mktemp("schedules"))
    e.prepare_namespace()
    cluster.kubectl_run("apply", "-f", str(SCHEDULE_CRD))
    cluster.kubectl_run("wait", "--for=condition=Established", "crd/agentschedules.agentrun.dev", "--timeout=60s")
    e.set_clock(datetime.now(UTC))
    e.start_operator("op-a")
    yield e
    e.kill_operator()
    e.tools.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def schedule_doc(name: str, **spec: Any) -> dict:
    template_spec = {"task": f"scheduled {name}", "suspend": spec.pop("suspend_runs", False),
                     "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "done"}]}},
                     "lapTimeout": "60s"}
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentSchedule", "metadata": {"name": name},
            "spec": {"schedule": "* * * * *",
                     "runTemplate": {"metadata": {"labels": {"team": "e2e"}}, "spec": template_spec}, **spec}}


def minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def test_every_minute_forbid_history_and_a_kill_at_a_schedule_time(env):
    name = "every-minute"
    now = datetime.now(UTC)
    env.set_clock(now)  # before the schedule's creation: no time has come since
    base = minute(now) + timedelta(minutes=2)
    env.apply(schedule_doc(name, concurrencyPolicy="Forbid", startingDeadlineSeconds=30,
                           successfulRunsHistoryLimit=2, suspend_runs=True))
    _wait("the schedule's Ready condition", lambda: any(
        c["type"] == "Ready" and c["status"] == "True" for c in (env.sched(name).get("status") or {}).get("conditions", [])))
    assert env.run_names(name) == set()  # no time has come since its creation

    # 1. the time comes: its run, under its deterministic name, owned, labelled, annotated
    m1 = base
    env.set_clock(m1 + timedelta(seconds=5))
    r1 = run_name(name, m1)
    assert r1 == f"{name}-{int(m1.timestamp()) // 60}"
    _wait(f"run {r1}", lambda: r1 in env.run_names(name), timeout=30)
    body = env.get(r1)
    assert body["metadata"]["labels"] == {"team": "e2e", LABEL_SCHEDULE: name}
    assert body["metadata"]["annotations"][ANN_SCHEDULED_AT] == m1.strftime("%Y-%m-%dT%H:%M:%SZ")
    owner = body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "AgentSchedule", name, env.sched(name)["metadata"]["uid"], True)
    env.wait_phase(r1, "Suspended", timeout=60)  # the template's spec.suspend: it stays active
    st = _wait("status.active", lambda: (s := env.sched(name).get("status") or {}).get("activeCount") == 1 and s)
    assert st["lastScheduleTime"] == m1.strftime("%Y-%m-%dT%H:%M:%SZ") and st["active"][0]["name"] == r1

    # 2. Forbid: the next time starts nothing while r1 is active, and says so once
    m2 = m1 + timedelta(minutes=1)
    env.set_clock(m2 + timedelta(seconds=5))
    _wait("RunAlreadyActive", lambda: "RunAlreadyActive" in env.reasons(name), timeout=30)
    time.sleep(3)  # three more reconciles of the polled clock
    assert env.run_names(name) == {r1}
    assert env.reasons(name).count("RunAlreadyActive") == 1
    assert (env.sched(name)["status"]["lastSkipped"]) == {"time": m2.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                          "reason": "RunAlreadyActive"}
    # past startingDeadlineSeconds the skipped time is not started when r1 ends
    env.set_clock(m2 + timedelta(seconds=45))
    env.kubectl("patch", "agentrun", r1, "-n", env.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    env.wait_phase(r1, "Succeeded", timeout=120)
    _wait("StartingDeadlineExceeded", lambda: "StartingDeadlineExceeded" in env.reasons(name), timeout=30)
    assert env.run_names(name) == {r1}

    # 3. history: runs that end on their own; only the newest 2 Succeeded are kept
    env.kubectl("patch", "agentschedule", name, "-n", env.ns, "--type=merge", "-p",
                '{"spec":{"runTemplate":{"spec":{"suspend":false}}}}')
    done = [r1]
    for k in (3, 4, 5):
        mk = m1 + timedelta(minutes=k - 1)
        env.set_clock(mk + timedelta(seconds=5))
        rk = run_name(name, mk)
        _wait(f"run {rk}", lambda rk=rk: rk in env.run_names(name), timeout=30)
        env.wait_phase(rk, "Succeeded", timeout=120)
        done.append(rk)
    _wait("the history limit", lambda: env.run_names(name) == set(done[-2:]), timeout=30)
    st = _wait("lastRun", lambda: (s := env.sched(name).get("status") or {}).get("lastRun", {}).get("name") == done[-1] and s)
    assert st["lastRun"]["phase"] == "Succeeded" and st["activeCount"] == 0 and st["lastSuccessfulTime"]

    # 4. SIGKILL at a schedule time: the run appears, the operator dies at once; the next creates nothing more
    m6 = m1 + timedelta(minutes=5)
    r6 = run_name(name, m6)
    env.set_clock(m6 + timedelta(seconds=5))
    _wait(f"run {r6}", lambda: r6 in env.run_names(name), timeout=30, interval=0.05)
    env.kill_operator()
    uid6 = env.get(r6)["metadata"]["uid"]
    written = (env.sched(name).get("status") or {}).get("lastScheduleTime") == m6.strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write(f"killed {'after' if written else 'before'} the status write of {r6}\n")
    env.start_operator("op-b")  # another identity: it takes the Lease once op-a's expires
    _wait("lastScheduleTime after the restart", lambda: (env.sched(name).get("status") or {}).get(
        "lastScheduleTime") == m6.strftime("%Y-%m-%dT%H:%M:%SZ"), timeout=60)
    env.wait_phase(r6, "Succeeded", timeout=120)
    time.sleep(3)
    mine = [r for r in env.runs_of(name) if r["metadata"]["annotations"].get(ANN_SCHEDULED_AT) == m6.strftime("%Y-%m-%dT%H:%M:%SZ")]
    assert [(r["metadata"]["name"], r["metadata"]["uid"]) for r in mine] == [(r6, uid6)]
    # r1, three of the history, r6, each once (r6's Event is lost when the kill came before it)
    assert env.reasons(name).count("RunCreated") in (4, 5)

    # `kubectl get agentschedules` reads well
    out = env.kubectl("get", "agentschedules", "-n", env.ns).stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST-SCHEDULE", "LAST-OUTCOME", "AGE"], out
    assert name in out and "Succeeded" in out


def test_bad_input_is_refused_at_apply_or_by_a_condition_and_one_event(env):
    refusals = {}
    for key, doc in {
        "five fields": schedule_doc("bad-fields", schedule="* * * *"),
        "name": schedule_doc("n" * 53),
        "reserved annotation": {**(d := schedule_doc("bad-ann")), "spec": {**d["spec"], "runTemplate": {
            "metadata": {"annotations": {"agentrun.dev/created-by": "mallory"}}, "spec": d["spec"]["runTemplate"]["spec"]}}},
        "cancel in template": {**(d := schedule_doc("bad-cancel")), "spec": {**d["spec"], "runTemplate": {
            "spec": {**d["spec"]["runTemplate"]["spec"], "cancel": {}}}}},
        "time zone shape": schedule_doc("bad-tz", timeZone="../etc/passwd"),
        "policy": schedule_doc("bad-policy", concurrencyPolicy="Sometimes"),
    }.items():
        r = env.apply(doc, check=False)
        assert r.returncode != 0, f"{key}: accepted"
        refusals[key] = r.stderr.strip()
    sys.stderr.write("refusals at apply:\n" + "\n".join(f"{k}: {v}" for k, v in refusals.items()) + "\n")
    assert "spec.schedule" in refusals["five fields"]
    assert "metadata.name" in refusals["name"]
    assert "spec.runTemplate.metadata.annotations" in refusals["reserved annotation"]
    assert "spec.runTemplate.spec.cancel" in refusals["cancel in template"]
    assert "spec.timeZone" in refusals["time zone shape"]
    assert "spec.concurrencyPolicy" in refusals["policy"]

    # what the API server cannot check: a condition, one Event, no run, no hot loop
    for name, spec, reason in (("bad-cron", {"schedule": "99 * * * *"}, "InvalidSchedule"),
                               ("bad-zone", {"timeZone": "Mars/Olympus"}, "InvalidTimeZone")):
        env.apply(schedule_doc(name, **spec))
        cond = _wait(f"{name} Ready False", lambda name=name: next((c for c in (env.sched(name).get("status") or {}).get(
            "conditions", []) if c["type"] == "Ready" and c["status"] == "False"), None), timeout=30)
        sys.stderr.write(f"{name}: {cond['reason']}: {cond['message']}\n")
        assert cond["reason"] == reason and cond["observedGeneration"] == 1
        rv = env.sched(name)["metadata"]["resourceVersion"]
        time.sleep(3)
        assert env.reasons(name) == [reason]
        assert env.sched(name)["metadata"]["resourceVersion"] == rv  # no status write loop
        assert env.run_names(name) == set()
