"""python -m e2e.chaos --schedule ci|full|smoke|new|soak [--seed N] [--only NAME ...] [--dir DIR]

The seed defaults to $CHAOS_SEED, else one derived from the git commit (schedule.default_seed), so
every run of a commit injects the same plan, else (no .git) a random one; it is printed first so a
failure can be replayed with CHAOS_SEED=N. ``--schedule soak --runs N --laps L --minutes M``:
waves of N runs of up to L laps with random faults, until M minutes have passed."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile

from e2e.chaos.runner import ScenarioFailed, run_schedule
from e2e.chaos.schedule import default_seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", choices=["ci", "full", "smoke", "new", "soak"], default="ci")
    ap.add_argument("--runs", type=int, default=20, help="soak: runs per wave")
    ap.add_argument("--laps", type=int, default=4, help="soak: laps per run (at most)")
    ap.add_argument("--minutes", type=float, default=10.0, help="soak: no new wave after this many minutes")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="run only these scenarios")
    ap.add_argument("--dir", default=None, help="work dir (default: a new temp dir)")
    a = ap.parse_args(argv)
    # SIGTERM (timeout, kill, CI's cancel) unwinds like Ctrl-C: the world's control plane, S3 server,
    # kubelet and operators are stopped by run_schedule's `finally`, not left running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed, source = (a.seed, "--seed") if a.seed is not None else default_seed()
    print(f"chaos seed {seed} ({source})", flush=True)
    tmp = a.dir or tempfile.mkdtemp(prefix="agentrun-chaos-")
    try:
        run_schedule(a.schedule, seed, tmp, a.only,
                     soak=(a.runs, a.laps, a.minutes) if a.schedule == "soak" else None)
    except ScenarioFailed as e:
        print(f"CHAOS FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
