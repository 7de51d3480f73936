"""The lap gap benchmark's pure parts (bench/bench_lap_gap.py): how a gap and its parts are made from
the boundaries seen, and the model's answers. The benchmark itself is not a test."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_lap_gap import PARTS, lap_gaps, model_answer, parse_time, parse_variant  # noqa: E402


def _events(job: str, nxt: str, t: list[float]) -> dict[tuple[str, str], float]:
    return {(f"pod:{job}", "Terminated"): t[1], (f"job:{nxt}", "ADDED"): t[2], (f"pod:{nxt}", "ADDED"): t[3],
            (f"pod:{nxt}", "Running"): t[4]}


def test_a_gap_is_split_at_each_boundary_and_its_parts_add_up() -> None:
    t = [100.0, 100.1, 100.4, 100.45, 100.5, 100.9]
    gaps = lap_gaps({"r1": {1: "j1", 2: "j2"}}, _events("j1", "j2", t), {("r1", 1): t[0]}, {("r1", 2): t[5]})
    assert len(gaps) == 1
    g = gaps[0]
    assert (g["run"], g["lap"]) == ("r1", 1)
    assert g["total"] == pytest.approx(0.9)
    assert [round(g[p], 6) for p in PARTS] == [0.1, 0.3, 0.05, 0.05, 0.4]
    assert sum(g[p] for p in PARTS) == pytest.approx(g["total"])


def test_a_gap_with_a_boundary_missing_or_no_next_lap_is_left_out() -> None:
    t = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    events = _events("j1", "j2", t)
    jobs = {"r1": {1: "j1", 2: "j2"}}
    assert lap_gaps(jobs, events, {}, {("r1", 2): t[5]}) == []  # no checkpoint time
    assert lap_gaps(jobs, events, {("r1", 1): t[0]}, {}) == []  # no model request seen
    del events[("pod:j2", "Running")]
    assert lap_gaps(jobs, events, {("r1", 1): t[0]}, {("r1", 2): t[5]}) == []
    assert lap_gaps({"r1": {2: "j2"}}, _events("j1", "j2", t), {("r1", 2): 0.0}, {("r1", 3): 1.0}) == []


def test_the_model_calls_the_tool_until_the_last_lap() -> None:
    assert model_answer(1, 4)["tool_calls"][0]["function"]["name"] == "note"
    assert model_answer(3, 4)["tool_calls"]
    assert model_answer(4, 4) == {"role": "assistant", "content": "done"}


def test_times_and_variants_parse() -> None:
    assert parse_time("2026-12-05T09:00:00.250000Z") == datetime(2026, 12, 5, 9, 0, 0, 250000, UTC).timestamp()
    assert parse_time(datetime(2026, 12, 5, tzinfo=UTC)) == datetime(2026, 12, 5, tzinfo=UTC).timestamp()
    assert parse_variant("main") == ("main", {})
    assert parse_variant("new:AGENTRUN_A=1,AGENTRUN_B=x=y") == ("new", {"AGENTRUN_A": "1", "AGENTRUN_B": "x=y"})
