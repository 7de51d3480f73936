"""Kueue admits lap Jobs (issue 33, items 3 and 4), on the real local control plane with the real
Kueue controller manager (``e2e/kueue_server.py``: built from its Go module, its webhooks served).

Two runs with ``spec.queueName`` share a ClusterQueue whose quota fits one lap at a time. Every lap
Job is created suspended with Kueue's label; Kueue admits them one after the other (a watch of the
namespace's Jobs never sees two admitted, unfinished lap Jobs at once). While the first run's lap
is held in flight at a ToolGate, the second run is ``Queued`` with reason ``KueueQueued`` and
``status.kueue`` names its Job and the Workload Kueue made of it (the one labelled with the Job's
uid), with Kueue's own reason. Both runs Succeed, and each side-effecting call executed once in the
tool server's own record.

It also prints what Kueue admission adds per lap: the interval between the tool calls of
consecutive laps of one run through Kueue, beside the same run without it (docs/scheduling.md).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from e2e_support import JobWatch, ToolGate, wait_for
from test_operator_e2e import Env

from agentrun.api.kueue import QUEUE_NAME_LABEL
from agentrun.api.reasons import Reason

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LAP_REQUESTS = {"cpu": "100m", "memory": "64Mi"}


class AdmittedSampler:
    """A watch of the namespace's Jobs: the most lap Jobs admitted (not suspended) and unfinished at once."""

    def __init__(self, cluster: Any, ns: str) -> None:
        self.jobs: dict[str, bool] = {}  # job name -> admitted and unfinished
        self.most = 0
        self.suspended_at_creation: dict[str, bool] = {}
        self._watch = JobWatch(cluster, ns, self._apply)

    def _apply(self, type_: str, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        self.suspended_at_creation.setdefault(name, (job.get("spec") or {}).get("suspend") is True)
        conds = (job.get("status") or {}).get("conditions") or []
        finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)
        self.jobs[name] = type_ != "DELETED" and not (job.get("spec") or {}).get("suspend") and not finished
        self.most = max(self.most, sum(self.jobs.values()))

    def stop(self) -> None:
        self._watch.stop()


def lap_gaps(e: Env, order: str) -> list[float]:
    """Seconds between the tool calls of consecutive laps of one run (their arguments.order)."""
    at = sorted(c["at"] for c in e.calls("/note") if (c.get("arguments") or {}).get("order", "").startswith(order))
    return [b - a for a, b in zip(at, at[1:])]


def test_kueue_admits_lap_jobs_one_at_a_time_and_the_run_shows_the_hold(cluster, s3, kueue, tmp_path):
    e = Env(cluster, s3, tmp_path)
    e.prepare_namespace()
    flavor = kueue.resource_flavor()
    cq = kueue.cluster_queue(f"cq-{e.ns}", cpu=LAP_REQUESTS["cpu"], memory=LAP_REQUESTS["memory"], flavor=flavor,
                             namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": e.ns}})
    lq = kueue.local_queue(e.ns, "lq", cq)
    gate = ToolGate(e.tool_url, hold=lambda args: isinstance(args, dict) and args.get("order") == "a-1")
    sampler = AdmittedSampler(cluster, e.ns)
    e.start_operator()
    try:
        def doc(name: str, queue: str | None, laps: int, url: str) -> dict[str, Any]:
            script = [{"content": f"lap {i}", "toolCalls": [{"name": "note", "arguments": {"order": f"{name}-{i}"}}]}
                      for i in range(1, laps + 1)] + [{"content": "done"}]
            d = e.run_doc(name, script, resources={"requests": LAP_REQUESTS}, lapTimeout="10m")
            d["spec"]["agent"]["tools"] = [{"name": "note", "http": {"url": f"{url}/note", "timeout": "10m"}}]
            if queue is not None:
                d["spec"]["queueName"] = queue
            return d

        e.apply(doc("a", lq, 2, gate.url))
        wait_for("run a's first lap in flight at the gate", lambda: gate.arrived("a-1") >= 1, timeout=120)
        e.apply(doc("b", lq, 2, gate.url))

        seen: list[dict[str, Any]] = []

        def held() -> dict[str, Any] | str:
            st = e.status("b")
            k = st.get("kueue") or {}
            seen[:] = [st]
            return st if st.get("phase") == "Queued" and k.get("workload") else ""

        try:
            st = wait_for("run b Queued by Kueue with its Workload", held, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; run b: {seen}; run a: {e.status('a')}") from None
        cond = next(c for c in st["conditions"] if c["type"] == "Progressing")
        assert cond["reason"] == Reason.KUEUE_QUEUED and st["kueue"]["localQueue"] == lq, st
        [job] = e.jobs("b")
        assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_NAME_LABEL] == lq
        assert st["kueue"]["job"] == job["metadata"]["name"]
        [wl] = kueue.workloads_of(e.ns, job["metadata"]["uid"])
        assert st["kueue"]["workload"] == wl["metadata"]["name"], (st["kueue"], wl["metadata"])
        assert f"Workload {wl['metadata']['name']}" in st["message"], st["message"]
        assert not any(ev["reason"] == Reason.KUEUE_QUEUED for ev in e.events("b"))  # status, not an Event per lap

        gate.open()
        for name in ("a", "b"):
            final = e.wait_phase(name, "Succeeded", "Failed", timeout=240)
            assert final["phase"] == "Succeeded", final
            assert final.get("kueue") is None
        for order in ("a-1", "a-2", "b-1", "b-2"):  # each side effect executed once, in the tool's own record
            assert len([c for c in e.calls("/note") if c["arguments"]["order"] == order]) == 1, order
        assert sampler.most == 1, sampler.most  # never two admitted lap Jobs at once: the quota held
        assert sampler.suspended_at_creation and all(sampler.suspended_at_creation.values())

        # what admission adds per lap: the same 4-lap run through Kueue and without it
        e.apply(doc("kq", lq, 4, e.tool_url))
        e.apply(doc("plain", None, 4, e.tool_url))
        for name in ("kq", "plain"):
            assert e.wait_phase(name, "Succeeded", "Failed", timeout=240)["phase"] == "Succeeded"
        kq, plain = lap_gaps(e, "kq-"), lap_gaps(e, "plain-")
        print(f"\nlap gap through Kueue: median {statistics.median(kq):.2f}s {[round(g, 2) for g in kq]}; "
              f"without: median {statistics.median(plain):.2f}s {[round(g, 2) for g in plain]}")
    finally:
        sampler.stop()
        gate.close()
        e.kill_operator()
        e.tools.shutdown()
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)
