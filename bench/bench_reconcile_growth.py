"""CPU of one reconcile pass's pure part (``parse_run`` + ``observe`` + ``decide``) as a run's Job
history grows: a run at lap N keeps its N finished lap Jobs in the watch cache for the Jobs' TTL
(an hour by default; the benchmarks keep them all), and every pass of every reconcile observes them.

Each pass is measured the way the controller makes it: the run and its Jobs as the cache holds them
(Jobs built by ``jobs.build_job`` and slimmed by ``cache.slim_job``, completed), the current lap's
Job active, and either the controller's :class:`~agentrun.controller.memos.JobMemo` (finished
Jobs observed once while the cache holds the same object) or none (each pass observes every Job,
as before the memo). No I/O; this process's CPU (``time.process_time``), median of the rounds::

    python bench/bench_reconcile_growth.py [--jobs 1,10,100,500,1000] [--passes 200] [--rounds 5]

Prints one line per history length: ms of CPU per pass with the memo and without, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.controller import decide as d
from agentrun.controller.cache import slim_job
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import RunIdentity, build_job, job_name
from agentrun.controller.decide.observe import observe, parse_run
from agentrun.controller.memos import JobMemo, SpecMemo

UID = "0f1c2d3e-aaaa-bbbb-cccc-1234567890ab"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "task": "book the invoices",
    "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]}},
    "budget": {"maxLaps": 5000},
}


def cached_job(cfg: OperatorConfig, spec: AgentRunSpec, lap: int, done: bool) -> dict[str, Any]:
    job = build_job(RunIdentity("bench", "invoices", UID), spec, lap, 1, "v1", cfg)
    job["metadata"].update(namespace="bench", uid=f"job-{lap}", resourceVersion=str(1000 + lap),
                           creationTimestamp="2026-12-02T11:00:00Z")
    job["status"] = {"startTime": "2026-12-02T11:00:00Z", "active": 0 if done else 1, "ready": 0 if done else 1}
    if done:
        job["status"].update(succeeded=1, completionTime="2026-12-02T11:00:05Z", conditions=[
            {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}])
    return slim_job(job)


def run_body(lap: int) -> dict[str, Any]:
    active = job_name("invoices", UID, lap + 1, 1)
    return {"metadata": {"namespace": "bench", "name": "invoices", "uid": UID, "resourceVersion": "99",
                         "generation": 1, "finalizers": ["agentrun.dev/checkpoints"]},
            "spec": SPEC,
            "status": {"phase": "Running", "observedGeneration": 1, "lap": lap, "agentVersion": "v1",
                       "activeJob": {"name": active, "lap": lap + 1, "attempt": 1, "agentVersion": "v1",
                                     "startedAt": "2026-12-02T11:00:00Z"},
                       "store": {"uri": "s3://agentrun/runs", "pathStyle": True},
                       "startedAt": "2026-12-02T10:00:00Z"}}


def per_pass(body: dict[str, Any], jobs: list[dict[str, Any]], cfg: OperatorConfig, memo: JobMemo | None,
             passes: int) -> float:
    specs = SpecMemo()
    t0 = time.process_time()
    for _ in range(passes):
        parsed = parse_run(body, specs)
        o = observe(body, jobs, lambda name: [], cfg, NOW, parsed, memo)
        d.decide(o)
    return (time.process_time() - t0) / passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1,10,100,500,1000", help="history lengths (finished Jobs kept)")
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cfg = OperatorConfig(checkpoint_uri="s3://agentrun/runs", s3_endpoint="http://127.0.0.1:9000")
    spec = AgentRunSpec.model_validate(SPEC)
    print("finished Jobs kept | ms per pass, JobMemo | ms per pass, none | ratio")
    for n in (int(x) for x in a.jobs.split(",")):
        jobs = [cached_job(cfg, spec, lap, True) for lap in range(1, n + 1)] + [cached_job(cfg, spec, n + 1, False)]
        body = run_body(n)
        memo = JobMemo()
        passes = max(5, a.passes * 10 // max(10, n))
        with_memo, without = [], []
        for _ in range(a.rounds):  # interleaved: both see the same load
            with_memo.append(per_pass(body, jobs, cfg, memo, passes))
            without.append(per_pass(body, jobs, cfg, None, passes))
        m, w = statistics.median(with_memo) * 1000, statistics.median(without) * 1000
        print(f"{n:>18} | {m:>20.3f} | {w:>18.3f} | {w / m:5.1f}x", flush=True)


if __name__ == "__main__":
    main()
