"""Operator overhead per lap: CPU time of the reconcile decision and the Job manifest, and the
size of the status the operator patches, across a long run. Prints a table; not a test.

    python bench/bench_operator_overhead.py [--laps 500] [--repeat 200]

It drives the pure ``decide()`` through a whole run with the in-memory world of the unit tests
(``tests/controller/controller_world.py``: it applies actions the way the Kopf shell does), so the
figures are the operator's own compute per lap, without the API server or S3 round trips (those
are network latency, measured by the e2e logs and bench_checkpoints.py's get/put timings).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "controller"))

from controller_world import UID, World, make_spec  # noqa: E402

from agentrun.controller.config import OperatorConfig  # noqa: E402
from agentrun.controller.decide.jobs import RunIdentity, build_job  # noqa: E402


def lap_cycle(world: World) -> tuple[float, int]:
    """Finish the active lap Job and reconcile until the next Job exists; seconds of decide()."""
    world.finish_job("continue")
    t0 = time.perf_counter()
    dec = world.reconcile()
    elapsed = time.perf_counter() - t0
    return elapsed, len(dec.actions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--laps", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=200, help="repetitions of build_job for its timing")
    ap.add_argument("--json", help="write the figures here (every lap's reconcile time)")
    a = ap.parse_args()

    spec = make_spec(budget={"maxLaps": a.laps + 10})
    world = World(spec=spec)
    world.reconcile()  # lap 1's Job
    samples: dict[int, float] = {}
    status_bytes: dict[int, int] = {}
    all_times: list[float] = []
    marks = {5, 50, a.laps}
    for lap in range(1, a.laps + 1):
        secs, _ = lap_cycle(world)
        all_times.append(secs)
        if lap in marks:
            samples[lap] = secs
            status_bytes[lap] = len(json.dumps(world.status.to_api()))
    assert world.status.lap == a.laps, world.status

    cfg = OperatorConfig(checkpoint_uri="s3://agentrun/bench")
    run = RunIdentity(namespace="ns", name="run", uid=UID)
    t0 = time.perf_counter()
    for i in range(a.repeat):
        manifest = build_job(run, spec, lap=i + 1, attempt=1, agent_version="v1", config=cfg)
    job_us = (time.perf_counter() - t0) / a.repeat * 1e6

    print(f"operator overhead per lap over a {a.laps}-lap run (decide() incl. status model, in-process)")
    print(f"{'lap':>6} {'reconcile µs':>14} {'status bytes':>14}")
    for lap in sorted(samples):
        print(f"{lap:>6} {samples[lap] * 1e6:>14.0f} {status_bytes[lap]:>14}")
    ms = [t * 1e3 for t in all_times]
    print(f"reconcile per lap: mean {statistics.mean(ms):.3f} ms, p50 {statistics.median(ms):.3f} ms, "
          f"p95 {sorted(ms)[int(len(ms) * 0.95)]:.3f} ms, max {max(ms):.3f} ms")
    print(f"build_job: {job_us:.0f} µs per manifest ({len(json.dumps(manifest))} bytes)")
    first, last = statistics.mean(ms[:50]), statistics.mean(ms[-50:])
    ok = last <= max(first * 1.5, first + 0.5)
    print(f"{'PASS' if ok else 'FAIL'}: reconcile cost flat across the run "
          f"(first 50 laps {first:.3f} ms, last 50 {last:.3f} ms)")
    ok2 = status_bytes[a.laps] <= status_bytes[5] * 1.5
    print(f"{'PASS' if ok2 else 'FAIL'}: status size flat ({status_bytes[5]} -> {status_bytes[a.laps]} bytes)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"laps": a.laps, "reconcile_seconds": all_times,
                       "status_bytes": {str(k): v for k, v in sorted(status_bytes.items())},
                       "build_job_seconds": job_us / 1e6, "manifest_bytes": len(json.dumps(manifest)),
                       "flat_reconcile": ok, "flat_status": ok2}, f)
    return 0 if ok and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
