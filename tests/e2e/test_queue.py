"""Concurrency limits on the real local control plane (issue 33, item 2): an AgentRunPolicy with
``maxActiveRuns: 2`` bound to a namespace, five runs whose laps are held in flight at a ToolGate.

At most two runs have a lap Job at any moment (sampled from a watch of the namespace's Jobs, the
whole time); the other three show phase ``Queued`` with their place in ``status.queue`` (a run with
``spec.priority`` first), starting no Job. The operator is SIGKILLed while three runs wait and
started again: the bound holds (it is computed from the watch cache, never from a counter). The
gate opens, runs finish, the queued ones are admitted in order, and all five Succeed, each with one
``Queued`` and one ``Admitted`` Event where it waited."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from e2e_support import JobWatch, ToolGate, delete_team_policy, wait_for
from test_operator_e2e import Env

from agentrun.api import tenancy as t
from agentrun.api import tenancy_admission as ta
from agentrun.api.contract import LABEL_RUN_UID
from agentrun.api.reasons import Reason

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LIMIT = 2


class JobSampler:
    """Watches of the namespace's Jobs and pods: the largest number of runs that had a lap Job
    running at once. A lap Job runs from its creation until its pod exits (the run moves on then,
    docs/concepts.md "When a lap is over") or the Job controller marks it finished, whichever is
    seen first. The two watches are two streams: a pod's exit may be seen up to
    :data:`STREAM_SKEW` seconds after the Job that the operator created on it, so a Job's end counts
    from that much before it was seen (a run admitted beyond the limit overlaps for a whole lap)."""

    STREAM_SKEW = 1.0

    def __init__(self, cluster: Any, ns: str) -> None:
        self.started: dict[str, tuple[str, float]] = {}  # job name -> (run uid, first seen)
        self.ended: dict[str, float] = {}  # job name -> when its pod's exit or its end was first seen
        self.seen = 0
        self._lock = threading.Lock()
        self._watch = JobWatch(cluster, ns, self._apply)
        self._pods = JobWatch(cluster, ns, self._pod, resource="pods")

    def _apply(self, type_: str, job: dict[str, Any]) -> None:
        name, now = job["metadata"]["name"], time.monotonic()
        conds = (job.get("status") or {}).get("conditions") or []
        finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)
        with self._lock:
            self.started.setdefault(name, (job["metadata"]["labels"][LABEL_RUN_UID], now))
            if type_ == "DELETED" or finished:
                self.ended.setdefault(name, now)
            self.seen += 1

    def _pod(self, type_: str, pod: dict[str, Any]) -> None:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            job = ((pod.get("metadata") or {}).get("labels") or {}).get("job-name") or ""
            with self._lock:
                self.ended.setdefault(job, time.monotonic())

    @property
    def most(self) -> int:
        """The most runs with a lap Job running at one moment."""
        with self._lock:
            spans = [(uid, t0, self.ended.get(name, float("inf")) - self.STREAM_SKEW)
                     for name, (uid, t0) in self.started.items()]
        return max((len({uid for uid, a, b in spans if a <= t < b}) for _, t, _ in spans), default=0)

    def stop(self) -> None:
        self._watch.stop()
        self._pods.stop()


def test_max_active_runs_queues_the_rest_in_priority_order_across_an_operator_kill(cluster, s3, tmp_path):
    e = Env(cluster, s3, tmp_path)
    e.prepare_namespace()
    pname = f"queue-{e.ns}"
    cluster.kubectl_run("label", "namespace", e.ns, f"{t.NAMESPACE_LABEL}={pname}")
    policy = ta.policy_object(pname, ta.LOCAL_POLICY)
    policy["spec"]["maxActiveRuns"] = LIMIT
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    for doc in (policy, ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel)):
        cluster.kubectl_run("apply", "-f", "-", input=json.dumps(doc))
    gate = ToolGate(e.tool_url)
    sampler = JobSampler(cluster, e.ns)
    e.start_operator()
    names = [f"q{i}" for i in range(5)]
    try:
        script = [{"content": "working", "toolCalls": [{"name": "slow", "arguments": {"order": "q"}}]},
                  {"content": "done"}]
        for name in names:
            doc = e.run_doc(name, script)
            doc["spec"]["agent"]["tools"] = [{"name": "slow", "http": {"url": f"{gate.url}/slow", "timeout": "10m"}}]
            doc["spec"]["lapTimeout"] = "10m"
            if name == "q4":
                doc["spec"]["priority"] = 10  # created last, admitted first of the waiting ones
            e.apply(doc)
            time.sleep(1.1)  # distinct creation timestamps: the order is creation order
        wait_for("two laps held at the gate", lambda: gate.arrived("q") >= LIMIT, timeout=180)

        def queued() -> dict[str, int] | None:
            got = {n: (e.status(n).get("queue") or {}).get("position") for n in names}
            waiting = {n: p for n, p in got.items() if p is not None}
            return waiting if len(waiting) == 3 else None

        waiting = wait_for("three runs Queued with their place", queued, timeout=120)
        assert sorted(waiting) == ["q2", "q3", "q4"] and waiting["q4"] == 1, waiting
        assert [waiting["q2"], waiting["q3"]] == [2, 3], waiting
        st = e.status("q3")
        assert st["phase"] == "Queued" and st["queue"]["limit"] == LIMIT and st["queue"]["policy"] == pname, st
        cond = next(c for c in st["conditions"] if c["type"] == "Progressing")
        assert cond["status"] == "False" and cond["reason"] == Reason.QUEUED and pname in cond["message"], cond
        assert not e.jobs("q3") and gate.arrived("q") == LIMIT

        # the operator dies with three runs waiting; a new one computes the same from its cache
        e.kill_operator()
        e.start_operator()
        time.sleep(8)  # a few resyncs (AGENTRUN_RESYNC_SECONDS=5) of the new operator
        assert gate.arrived("q") == LIMIT and sampler.most <= LIMIT, (gate.arrived("q"), sampler.most)
        assert all(e.status(n)["phase"] == "Queued" for n in ("q2", "q3", "q4"))

        gate.open()
        for n in names:
            assert e.wait_phase(n, "Succeeded", "Failed", timeout=240)["phase"] == "Succeeded", n
        assert sampler.seen >= 5 and sampler.most <= LIMIT, sampler.most
        started = {n: e.status(n)["startedAt"] for n in names}
        assert started["q4"] <= started["q2"] <= started["q3"], started  # priority, then creation
        for n in ("q2", "q3", "q4"):
            reasons = [ev["reason"] for ev in e.events(n)]
            assert reasons.count(Reason.QUEUED) == 1 and reasons.count(Reason.ADMITTED) == 1, (n, reasons)
            assert e.status(n).get("queue") is None
        for n in ("q0", "q1"):
            assert Reason.QUEUED not in [ev["reason"] for ev in e.events(n)]
    finally:
        sampler.stop()
        gate.close()
        e.kill_operator()
        e.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)
        delete_team_policy(cluster, pname)


def test_a_model_limit_queues_only_that_models_runs_and_holds_up_no_other(cluster, s3, tmp_path):
    """``maxActiveRunsPerModel: {m-exp: 1}``: the second run of that model is Queued (scope ``model
    m-exp``) while the first is held in flight, and a run of another model created after it starts
    and Succeeds meanwhile (no head-of-line blocking); then both runs of the model Succeed."""
    e = Env(cluster, s3, tmp_path)
    e.prepare_namespace()
    pname = f"model-{e.ns}"
    cluster.kubectl_run("label", "namespace", e.ns, f"{t.NAMESPACE_LABEL}={pname}")
    policy = ta.policy_object(pname, ta.LOCAL_POLICY)
    policy["spec"]["maxActiveRunsPerModel"] = {"m-exp": 1}
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    for doc in (policy, ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel)):
        cluster.kubectl_run("apply", "-f", "-", input=json.dumps(doc))
    gate = ToolGate(e.tool_url)
    e.start_operator()
    try:
        def doc(name: str, model: str, held: bool) -> dict[str, Any]:
            script = [{"content": "working", "toolCalls": [{"name": "slow", "arguments": {"order": name}}]},
                      {"content": "done"}]
            d = e.run_doc(name, script, lapTimeout="10m")
            d["spec"]["agent"]["model"]["name"] = model
            url = gate.url if held else e.tool_url
            d["spec"]["agent"]["tools"] = [{"name": "slow", "http": {"url": f"{url}/slow", "timeout": "10m"}}]
            return d

        e.apply(doc("exp-1", "m-exp", held=True))
        wait_for("exp-1 held at the gate", lambda: gate.arrived("exp-1") >= 1, timeout=120)
        e.apply(doc("exp-2", "m-exp", held=True))
        time.sleep(1.1)
        e.apply(doc("cheap", "m-cheap", held=False))
        st = wait_for("exp-2 Queued for its model", lambda: (s := e.status("exp-2")).get("phase") == "Queued"
                      and s.get("queue") and s, timeout=60)
        assert st["queue"]["scope"] == "model m-exp" and st["queue"]["limit"] == 1 and st["queue"]["active"] == 1, st
        assert "maxActiveRunsPerModel" in st["message"], st["message"]
        assert e.wait_phase("cheap", "Succeeded", "Failed", timeout=120)["phase"] == "Succeeded"
        assert e.status("exp-2")["phase"] == "Queued" and not e.jobs("exp-2")
        gate.open()
        for n in ("exp-1", "exp-2"):
            assert e.wait_phase(n, "Succeeded", "Failed", timeout=180)["phase"] == "Succeeded", n
        assert e.status("exp-2")["startedAt"] >= e.status("exp-1")["completedAt"]
    finally:
        gate.close()
        e.kill_operator()
        delete_team_policy(cluster, pname)
