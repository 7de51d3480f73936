"""bench/bench_test_stress.py's pure parts (issue 36): the pytest counts read from make test's output
and the summary line written to bench/stress/<date>.log."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_test_stress as bts  # noqa: E402


def test_counts_come_from_pytests_last_summary_line() -> None:
    out = ("===== header =====\n============ 3 passed in 1.0s ============\n"
           "== 1442 passed, 2 failed, 1 error, 10 skipped, 3 deselected in 1834.12s (0:30:34) ==\nskips: ...\n")
    assert bts.pytest_counts(out) == {"passed": 1442, "failed": 2, "errors": 1, "skipped": 10, "deselected": 3}
    assert bts.pytest_counts("no summary") == {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}


def test_the_summary_line_says_what_ran_beside_what_and_how_it_ended() -> None:
    rec = {"started": "2026-12-03T13:40:00Z", "commit": "0123456789abcdef", "hog": "stress-ng --cpu 2", "exit": 1,
           "seconds": 1834.2, "counts": {"passed": 1440, "failed": 2, "errors": 0, "skipped": 0},
           "load_before": [4.1, 3.0, 2.0], "load_after": [6.04, 5.0, 4.0]}
    assert bts.summary_line(rec) == (
        'SUMMARY 2026-12-03T13:40:00Z commit 0123456789ab hog "stress-ng --cpu 2": make test exit 1 in 1834 s; '
        "1440 passed, 2 failed, 0 errors, 0 skipped; load 1 min 4.1 before, 6.0 after")
