"""The Kopf intake A/B's pure parts (bench/bench_kopf_intake.py): a write is matched to its event by
resourceVersion, the CPU figures take the idle rate off, and Kopf's marks on an object are found.
The benchmark itself is not a test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_kopf_intake import delays, kopf_marks, run_status, side_figures  # noqa: E402


def test_a_write_is_matched_to_the_first_stamp_of_its_own_version_only() -> None:
    writes = [("runs", "r1", "10", 100.0, "lap start"), ("runs", "r1", "12", 101.0, "lap recorded"),
              ("pods", "p1", "11", 100.5, "succeeded"), ("jobs", "j1", "13", 102.0, "create")]
    stamps: list[list[Any]] = [["runs", "MODIFIED", "r1", "10", 100.004], ["runs", "MODIFIED", "r1", "10", 100.5],
                               ["pods", "ADDED", "p1", "11", 100.52], ["runs", "MODIFIED", "r1", "12", 101.03],
                               ["jobs", "ADDED", "j2", "13", 102.1]]  # another object's version: no match
    got = delays(writes, stamps)
    assert set(got) == {("runs", "r1", "10"), ("runs", "r1", "12"), ("pods", "p1", "11")}
    assert got[("runs", "r1", "10")] == pytest.approx(0.004)  # the first arrival, not the later one
    assert got[("runs", "r1", "12")] == pytest.approx(0.03)
    assert got[("pods", "p1", "11")] == pytest.approx(0.02)


def test_the_figures_take_the_idle_rate_off_and_divide_by_events_runs_and_laps() -> None:
    f = side_figures(cpu=1.2, idle_rate=0.01, seconds=20.0, events=1000, runs=100, laps=2, rss_kb=102400,
                     hwm_kb=204800, delay=[0.001, 0.002, 0.003])
    assert f["cpu_net_s"] == pytest.approx(1.0)
    assert f["cpu_per_event_us"] == pytest.approx(1000.0)
    assert f["cpu_per_run_ms"] == pytest.approx(10.0)
    assert f["cpu_per_lap_ms"] == pytest.approx(5.0)
    assert (f["rss_mb"], f["hwm_mb"]) == (100.0, 200.0)
    assert f["delay_p50_ms"] == pytest.approx(2.0)
    # an idle rate above what the window used never makes the CPU negative
    assert side_figures(0.1, 1.0, 10.0, 10, 1, 1, None, None, [])["cpu_net_s"] == 0.0


def test_objects_marked_by_kopf_are_counted() -> None:
    clean = {"metadata": {"annotations": {"agentrun.dev/spec-hash": "x"}, "finalizers": ["batch.kubernetes.io/job-tracking"]}}
    annotated = {"metadata": {"annotations": {"kopf.zalando.org/last-handled-configuration": "{}"}}}
    finalized = {"metadata": {"finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}}
    assert kopf_marks([clean, {}, {"metadata": {}}]) == 0
    assert kopf_marks([clean, annotated, finalized]) == 2


def test_a_lap_changes_the_run_status_twice() -> None:
    start, recorded = run_status(3, "r-l3-a1"), run_status(3, "r-l3-a1", recorded=True)
    assert start["lap"] == 2 and start["activeJob"]["lap"] == 3
    assert recorded["lap"] == 3 and recorded["activeJob"] is None  # merge patch: the field removed
