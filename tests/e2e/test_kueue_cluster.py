"""The real Kueue (e2e/kueue_server.py: sigs.k8s.io/kueue's controller manager, built by
e2e/kueue/build.sh) admitting plain Jobs on the local control plane, one at a time within a
ClusterQueue's quota. What the operator relies on (issue 33): a suspended Job labelled
``kueue.x-k8s.io/queue-name`` gets a Workload (found by the ``kueue.x-k8s.io/job-uid`` label, owned by
the Job, named by Kueue's naming function); while it waits for quota its Workload's ``QuotaReserved``
condition is False with reason ``Pending`` and a message naming the missing quota; once admitted
(``Admitted`` True) Kueue unsuspends the Job and the process kubelet runs its pod."""

from __future__ import annotations

import datetime
import json
import sys
import time
from typing import Any

import pytest
from e2e.cluster import Cluster
from e2e.kueue_server import JOB_UID_LABEL, QUEUE_LABEL, Kueue, workload_name
from e2e_support import wait_for

pytestmark = pytest.mark.e2e


def _job(name: str, queue: str, cpu: str, seconds: float, suspend: bool | None = True) -> dict[str, Any]:
    spec: dict[str, Any] = {} if suspend is None else {"suspend": suspend}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {**spec, "backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "ignored", "command": ["sleep", str(seconds)],
                                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}}


def _get(cluster: Cluster, kind: str, name: str, ns: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl_run("get", kind, name, "-n", ns, "-o", "json").stdout)  # type: ignore[no-any-return]


def _cond(obj: dict[str, Any] | None, typ: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == typ:
            return c  # type: ignore[no-any-return]
    return None


def _true(obj: dict[str, Any] | None, typ: str) -> bool:
    c = _cond(obj, typ)
    return c is not None and c["status"] == "True"


def _ts(s: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_kueue_admits_jobs_one_at_a_time_within_quota(cluster: Cluster, kueue: Kueue, namespace: str) -> None:
    ns = namespace
    flavor = kueue.resource_flavor(f"rf-{ns}")
    cq = kueue.cluster_queue(f"cq-{ns}", cpu="1", memory="1Gi", flavor=flavor,
                             namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}})
    lq = kueue.local_queue(ns, "lq", cq)

    created: dict[str, float] = {}
    jobs: dict[str, dict[str, Any]] = {}
    # Each asks for the whole quota (cpu 1): one at a time. "first" is created suspended, as the
    # operator does; "second" without spec.suspend: Kueue's mutating webhook suspends it.
    for name, suspend in (("first", True), ("second", None)):
        created[name] = time.monotonic()
        out = cluster.kubectl_run("create", "-n", ns, "-o", "json", "-f", "-",
                                  input=json.dumps(_job(name, lq, cpu="1", seconds=3, suspend=suspend))).stdout
        jobs[name] = json.loads(out)
        assert jobs[name]["spec"]["suspend"] is True, f"Job {name} was created unsuspended"
    uids = {n: j["metadata"]["uid"] for n, j in jobs.items()}

    def workload(name: str) -> dict[str, Any] | None:
        wls = kueue.workloads_of(ns, uids[name])
        assert len(wls) <= 1, f"more than one Workload for Job {name}: {[w['metadata']['name'] for w in wls]}"
        return wls[0] if wls else None

    # Kueue makes one Workload per Job: labelled with the Job's uid, owned (controller) by the Job,
    # named job-<job name>-<5 hex of a sha1 over kind, group, name, uid>.
    wls = {n: wait_for(f"the Workload of Job {n}", lambda n=n: workload(n), timeout=60, interval=0.1)
           for n in ("first", "second")}
    for n, wl in wls.items():
        assert wl["metadata"]["name"] == workload_name(n, uids[n])
        assert wl["metadata"]["labels"][JOB_UID_LABEL] == uids[n]
        owner = [o for o in wl["metadata"]["ownerReferences"] if o.get("controller")]
        assert [(o["kind"], o["name"], o["uid"]) for o in owner] == [("Job", n, uids[n])]
        assert wl["spec"]["queueName"] == lq

    # Every poll from here on reads both Workloads in one request and checks the quota held:
    # never two admitted and unfinished at once (Admitted stays True after Finished).
    admitted_at: dict[str, float] = {}

    def observe() -> dict[str, dict[str, Any]]:
        items = json.loads(cluster.kubectl_run("get", "workloads.kueue.x-k8s.io", "-n", ns, "-o", "json").stdout)
        by_uid = {w["metadata"]["labels"].get(JOB_UID_LABEL): w for w in items["items"]}
        now = {n: by_uid[uids[n]] for n in ("first", "second")}
        for n, wl in now.items():
            if _true(wl, "Admitted"):
                admitted_at.setdefault(n, time.monotonic())
        running = [n for n, wl in now.items() if _true(wl, "Admitted") and not _true(wl, "Finished")]
        assert len(running) <= 1, f"both Workloads admitted at once within a quota for one: {now}"
        return now

    def job(n: str) -> dict[str, Any]:
        observe()
        return _get(cluster, "job", n, ns)

    # Exactly one is admitted first; Kueue unsuspends its Job; the other waits, suspended, with
    # QuotaReserved False / Pending naming the quota it lacks.
    winner = wait_for("one of the two Workloads admitted",
                      lambda: next((n for n, wl in observe().items() if _true(wl, "Admitted")), None),
                      timeout=60, interval=0.1)
    loser = "second" if winner == "first" else "first"

    def held() -> dict[str, Any] | None:
        wl = observe()[loser]
        c = _cond(wl, "QuotaReserved")
        return wl if c and c["status"] == "False" and c["reason"] == "Pending" and c["message"] else None

    held_wl = wait_for(f"Job {loser}'s Workload held for quota", held, timeout=30, interval=0.1)
    held_msg = _cond(held_wl, "QuotaReserved")["message"]  # type: ignore[index]
    assert "insufficient" in held_msg and "cpu" in held_msg, held_msg
    assert job(loser)["spec"]["suspend"] is True
    assert not _true(held_wl, "Admitted")
    print(f"\nheld Workload {held_wl['metadata']['name']}: QuotaReserved=False reason=Pending "
          f"message={held_msg!r}", file=sys.stderr)

    # The Workload is served as v1beta1 too, through Kueue's conversion webhook (wired by URL).
    old_api = json.loads(cluster.kubectl_run("get", "workloads.v1beta1.kueue.x-k8s.io", held_wl["metadata"]["name"],
                                             "-n", ns, "-o", "json").stdout)
    assert (old_api["apiVersion"], old_api["spec"]["queueName"]) == ("kueue.x-k8s.io/v1beta1", lq)

    # The admitted Job runs (unsuspended by Kueue, its pod run by the process kubelet) and
    # completes; the second is admitted only once the first's Workload has finished.
    wait_for(f"Job {winner} unsuspended", lambda: job(winner)["spec"].get("suspend") is False,
             timeout=30, interval=0.1)
    running = job(winner)
    assert running["spec"]["template"]["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == \
        wls[winner]["metadata"]["name"]
    # Kueue's validating webhook: an unsuspended Job cannot move to another queue.
    r = cluster.kubectl_run("label", "job", winner, "-n", ns, f"{QUEUE_LABEL}=elsewhere", "--overwrite", check=False)
    assert r.returncode != 0 and QUEUE_LABEL in r.stderr and "immutable" in r.stderr, r.stderr
    wait_for(f"Job {winner} Complete", lambda: _true(job(winner), "Complete"), timeout=90)
    wait_for(f"Workload of {loser} admitted after {winner} finished", lambda: bool(observe()) and loser in admitted_at,
             timeout=60, interval=0.1)
    wait_for(f"Job {loser} Complete", lambda: _true(job(loser), "Complete"), timeout=90)
    final = observe()
    assert _true(final[winner], "Finished") and _true(final[loser], "Admitted"), final

    first_finished = _ts(_cond(final[winner], "Finished")["lastTransitionTime"])  # type: ignore[index]
    second_wl = final[loser]
    second_admitted = _ts(_cond(second_wl, "Admitted")["lastTransitionTime"])  # type: ignore[index]
    assert second_admitted >= first_finished, (second_admitted, first_finished)
    assert second_wl["status"]["admission"]["clusterQueue"] == cq  # type: ignore[index]
    for n in (winner, loser):
        server = (_ts(_cond(final[n], "Admitted")["lastTransitionTime"])  # type: ignore[index]
                  - _ts(jobs[n]["metadata"]["creationTimestamp"])).total_seconds()
        print(f"Job {n}: created -> Admitted seen by polling after {admitted_at[n] - created[n]:.2f}s "
              f"(server timestamps, 1 s resolution: {server:.0f}s)", file=sys.stderr)

    # Deleting the Jobs removes their Workloads (owner references; Kueue drops its
    # kueue.x-k8s.io/resource-in-use finalizer) and frees the ClusterQueue.
    t_delete = time.monotonic()
    cluster.kubectl_run("delete", "job", "first", "second", "-n", ns, "--cascade=background")
    wait_for("the Workloads deleted with their Jobs",
             lambda: not json.loads(cluster.kubectl_run("get", "workloads.kueue.x-k8s.io", "-n", ns, "-o",
                                                        "json").stdout)["items"], timeout=90, interval=0.2)
    print(f"Workloads gone {time.monotonic() - t_delete:.1f}s after their Jobs were deleted", file=sys.stderr)
    wait_for("the ClusterQueue empty", lambda: (kueue.get("clusterqueue", cq) or {}).get("status", {})
             .get("reservingWorkloads") == 0, timeout=30, interval=0.2)
