"""Importing a benchmark leaves the process environment alone: the tests import some (their pure
parts), and a benchmark's dummy S3 keys set at import became the session's keys, refusing the
suite's own S3 server (versitygw: XAdminUserNotFound)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Benchmarks that need a profiler this environment may not have (``make bench`` does not run them).
OPTIONAL = {"yappi_operator"}


def test_importing_a_benchmark_sets_no_environment_variable():
    modules = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in OPTIONAL)
    assert "bench_cold_start" in modules and "benchlib" in modules, modules
    paths = [str(ROOT / "bench"), str(ROOT)]
    probe = (f"import os, sys; sys.path[:0] = {paths!r}; before = dict(os.environ); "
             f"import {', '.join(modules)}; "
             "print(sorted(k for k in os.environ if os.environ.get(k) != before.get(k)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
