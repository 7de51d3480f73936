"""The benchmark harness's pure parts (bench/benchlib.py): percentiles, summaries, ratios, the
Markdown table writer, the folded-profile reader. Benchmarks themselves are not tests."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from benchlib import folded_profile_top, markdown_table, percentile, ratio, summary  # noqa: E402


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile(reversed(values), 0.0) == 1
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0  # fewer than 100 samples: p99 is the maximum
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1], 1.5)


def test_summary_median_and_p99() -> None:
    s = summary([4, 1, 3, 2])
    assert s["n"] == 4 and s["p50"] == 2.5 and s["p99"] == 4 and s["min"] == 1 and s["max"] == 4
    assert s["mean"] == 2.5
    assert summary([7])["p50"] == 7


def test_ratio() -> None:
    assert ratio(100, 4) == 25
    assert math.isinf(ratio(1, 0)) and math.isnan(ratio(0, 0))


def test_markdown_table() -> None:
    text = markdown_table(["name", "ms"], [["a|b", 12], ["c", "7.5"]])
    assert text.splitlines() == ["| name | ms |", "|---|---:|", "| a\\|b | 12 |", "| c | 7.5 |"]
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["one"], [["a", "b"]])


def test_folded_profile_top() -> None:
    lines = [
        "main (m.py:1);reconcile (handlers.py:10);connect (connection.py:5) 6",
        "main (m.py:1);reconcile (handlers.py:12) 3",
        "main (m.py:1);idle (m.py:9) 1",
        "garbage",
    ]
    top = folded_profile_top(lines, n=3)
    assert top == [(100.0, "main (m.py)"), (90.0, "reconcile (handlers.py)"), (60.0, "connect (connection.py)")]
    assert folded_profile_top(lines, keep=("handlers",)) == [(90.0, "reconcile (handlers.py)")]
    assert folded_profile_top([]) == []


def test_cpu_between_is_exact_only_while_every_thread_lives() -> None:
    from benchlib import cpu_between

    before = {10: 1_000_000_000, 11: 500_000_000}
    assert cpu_between(before, {10: 1_250_000_000, 11: 500_000_000}) == 0.25
    assert cpu_between(before, {10: 1_000_000_000, 11: 500_000_000, 12: 30_000_000}) == 0.03  # a new thread counts whole
    assert cpu_between(before, {10: 1_200_000_000}) is None  # thread 11 ended: its time went with it
    assert cpu_between(before, {10: 1_200_000_000, 11: 1_000}) is None  # id 11 reused by a new thread
    assert cpu_between(None, before) is None and cpu_between(before, None) is None


def test_proc_thread_cpu_counts_this_process_in_nanoseconds() -> None:
    import os
    import threading
    import time

    from benchlib import cpu_between, proc_thread_cpu

    before = proc_thread_cpu(os.getpid())
    if before is None:
        pytest.skip("no /proc/PID/task/TID/schedstat on this kernel")
    main0 = time.thread_time()
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:  # 30 ms of CPU in the main thread
        pass
    burned = threading.Event()

    def burn() -> None:  # and some in a thread started after `before`
        t_end = time.thread_time() + 0.02
        while time.thread_time() < t_end:
            pass
        burned.set()
        time.sleep(1)  # still alive when `after` is read

    threading.Thread(target=burn, daemon=True).start()
    assert burned.wait(10)
    main = time.thread_time() - main0
    after = proc_thread_cpu(os.getpid())
    used = cpu_between(before, after)
    assert used is not None
    # at least the main thread's own burn and the thread's 20 ms; not wildly more (other threads idle)
    assert main + 0.02 - 0.002 <= used <= main + 0.02 + 0.5, (used, main)


def test_lowered_lowers_a_session_of_its_own_also_under_autogroup() -> None:
    """The lap processes' stand-in for other nodes: started in a session of their own (as the process
    kubelet starts pods), at nice 19 both by their own nice and by their session's autogroup's, which
    is what weighs against the operator when the kernel groups sessions (a plain ``nice`` did not)."""
    from benchlib import autogroup_enabled, lowered, seen_priority

    own, group = seen_priority(19)
    assert own == "19"
    if autogroup_enabled():
        assert group.endswith(" nice 19"), group  # e.g. "/autogroup-398 nice 19"
    assert seen_priority(None)[0] == str(os.nice(0))  # what the wrapper changed: a child inherits the caller's
    assert lowered(["true"], 19, autogroup=False) == ["nice", "-n", "19", "true"]
