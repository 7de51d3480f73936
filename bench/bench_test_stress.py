"""`make test` beside a CPU hog (issue 36): the claim "the suite passes beside a CPU hog" with a
trace in the repository. Starts the hog (Debian's ``stress-ng --cpu N``, installed with apt-get when
it is missing and we may; else one ``yes > /dev/null`` per CPU), runs ``make test`` (its install,
lint, test-deps and the whole suite) with the hog running, stops the hog, and appends to
``bench/stress/<UTC date>.log`` the run's whole output and one summary line:

    SUMMARY 2026-12-03T13:40:00Z commit 0123456789ab hog "stress-ng --cpu 2": make test exit 0 in 1834 s;
    1442 passed, 0 failed, 0 errors, 3 skipped; load 1 min 4.1 before, 6.0 after

It exits with make test's exit code. ``--json FILE`` writes the same figures (run_all.py's
``test_stress`` section, so the result is recorded in bench/results.json like any benchmark's).

    python bench/run_all.py --only test_stress    # what `make test-stress` runs (~30-45 min on 2 cores)
    python bench/bench_test_stress.py --make-args "PYTEST_ARGS=-k chaos"    # a part of the suite
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STRESS_DIR = ROOT / "bench" / "stress"
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``=== 3 passed, 1 skipped in 2.0s ===``)."""
    lines = [ln for ln in output.splitlines() if re.match(r"^=+ .*\bin [\d.]+s", ln)]
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if lines:
        for n, what in COUNTS.findall(lines[-1]):
            out["errors" if what.startswith("error") else what] = int(n)
    return out


def summary_line(rec: dict[str, Any]) -> str:
    c = rec["counts"]
    return (f"SUMMARY {rec['started']} commit {rec['commit'][:12] or '-'} hog \"{rec['hog']}\": make test exit "
            f"{rec['exit']} in {rec['seconds']:.0f} s; {c['passed']} passed, {c['failed']} failed, {c['errors']} "
            f"errors, {c['skipped']} skipped; load 1 min {rec['load_before'][0]:.1f} before, "
            f"{rec['load_after'][0]:.1f} after")


def start_hog(cpus: int) -> tuple[list[subprocess.Popen[bytes]], str]:
    """The CPU hog: stress-ng (apt-get install when missing, as root), else one `yes` per CPU."""
    if not shutil.which("stress-ng") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "stress-ng"],
                       capture_output=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), timeout=600)
    if shutil.which("stress-ng"):
        cmd = ["stress-ng", "--cpu", str(cpus), "--quiet"]
        return [subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)], shlex.join(cmd[:3])
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(cpus)]
    return procs, f"{cpus} x yes > /dev/null"


def stop_hog(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="hog workers (default: one per CPU)")
    ap.add_argument("--make-args", default="", help="more arguments for `make test` (e.g. PYTEST_ARGS=...)")
    ap.add_argument("--log-dir", default=str(STRESS_DIR))
    ap.add_argument("--json", help="write the figures here (run_all.py)")
    a = ap.parse_args()
    started = datetime.now(UTC)
    log = Path(a.log_dir) / f"{started:%Y-%m-%d}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cmd = ["make", "test", f"PYTHON={sys.executable}", *shlex.split(a.make_args)]
    procs, hog = start_hog(a.cpus)
    load_before = list(os.getloadavg())
    with log.open("a") as fh:
        fh.write(f"===== {started:%Y-%m-%dT%H:%M:%SZ} commit {commit or '-'}: {shlex.join(cmd)} beside {hog} "
                 f"(pid(s) {' '.join(str(p.pid) for p in procs)}) =====\n")
    start_at = log.stat().st_size  # this run's output begins here (the day's log keeps every run)
    print(f"make test beside {hog}; output in {log}", flush=True)
    t0 = time.time()
    try:
        with log.open("a") as fh:  # the whole output goes to the log, not the terminal
            p = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    finally:
        load_after = list(os.getloadavg())
        stop_hog(procs)
    output = log.read_bytes()[start_at:].decode(errors="replace")
    rec = {"started": f"{started:%Y-%m-%dT%H:%M:%SZ}", "commit": commit, "hog": hog, "command": shlex.join(cmd),
           "exit": p.returncode, "seconds": round(time.time() - t0, 1), "counts": pytest_counts(output),
           "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
           "log": str(log.relative_to(ROOT)) if log.is_relative_to(ROOT) else str(log)}
    line = summary_line(rec)
    with log.open("a") as fh:
        fh.write(line + "\n")
    skips = [ln for ln in output.splitlines() if ln.startswith(("skips:", "  NOT ALLOWED", "  allowed"))]
    print("\n".join([*skips, line]))
    if a.json:
        Path(a.json).write_text(json.dumps(rec, indent=1) + "\n")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
