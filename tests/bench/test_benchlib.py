"""The benchmark harness's pure parts (bench/benchlib.py): percentiles, summaries, ratios, the
Markdown table writer, the folded-profile reader. Benchmarks themselves are not tests."""

from __future__ import annotations

import math
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
