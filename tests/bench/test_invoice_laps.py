"""The pure parts of bench/bench_invoice_laps.py: the lap runner's own ``lap checkpointed`` lines (as
its logger writes them, text and JSON) read back, and the figures of a run from its boundaries."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from agentrun.lap.logs import LapLogger

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_invoice_laps as b  # noqa: E402


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_reads_the_lap_runners_own_checkpointed_line(fmt: str) -> None:
    out = io.StringIO()
    log = LapLogger({"namespace": "default", "name": b.RUN, "lap": "7", "attempt": "2"}, fmt=fmt, stream=out)
    log("lap started")
    log("lap checkpointed", key="dev/default/x/laps/00000007.json", sha256="ab" * 32, bytes=812,
        outcome="continue", cost_usd="0.000123")
    first, second = out.getvalue().splitlines()
    assert b.checkpointed_at(first) is None
    name, lap, ts = b.checkpointed_at(second) or ("", 0, 0.0)
    assert (name, lap) == (b.RUN, 7)
    stamp = second.split()[0] if fmt == "text" else json.loads(second)["ts"]
    assert ts == pytest.approx(b.parse_time(stamp), abs=1e-6)
    assert stamp.endswith("Z") and "." in stamp  # the logger's ms kept: the boundary is not the whole second


def test_other_lines_are_not_checkpoints() -> None:
    for line in ("", "not json {", '{"msg": "lap started", "name": "r", "lap": 1, "ts": "2026-01-01T00:00:00Z"}',
                 "2026-01-01T00:00:00.000Z WARNING lap checkpointed name=r lap=1",
                 "2026-01-01T00:00:00.000Z INFO lap checkpointed key=x"):
        assert b.checkpointed_at(line) is None, line


def _run(jobs: list[float], ckpts: list[float], calls: list[float]) -> dict:
    return b.run_figures({i + 1: t for i, t in enumerate(jobs)}, {i + 1: t for i, t in enumerate(ckpts)},
                         {i + 1: t for i, t in enumerate(calls)}, applied=jobs[0] - 0.1, waiting=ckpts[-1] + 0.2, laps=3)


def test_laps_total_is_the_laps_plus_the_gaps_to_the_next_job() -> None:
    fig = _run(jobs=[10.0, 11.5, 13.25], ckpts=[11.0, 12.75, 14.0], calls=[10.5, 11.75, 13.5])
    assert fig["lap"] == pytest.approx({1: 1.0, 2: 1.25, 3: 0.75})
    assert fig["gap_to_job"] == pytest.approx({1: 0.5, 2: 0.5})
    assert fig["gap_to_model_call"] == pytest.approx({1: 0.75, 2: 0.75})
    assert fig["laps_total"] == pytest.approx(sum(fig["lap"].values()) + sum(fig["gap_to_job"].values()))
    assert fig["applied_to_job1"] == pytest.approx(0.1)
    assert fig["checkpoint_to_awaiting_approval"] == pytest.approx(0.2)
    assert fig["complete"]


def test_a_boundary_not_seen_leaves_its_figures_out_and_the_run_incomplete() -> None:
    fig = b.run_figures({1: 10.0, 3: 13.0}, {1: 11.0, 2: 12.5, 3: 14.0}, {2: 11.5, 3: 13.5}, laps=3)
    assert fig["lap"][2] is None and fig["gap_to_job"][1] is None
    assert fig["laps_total"] == pytest.approx(4.0)
    assert not fig["complete"]


def test_table_gives_each_operators_median_over_its_rounds() -> None:
    old = [_run([0, 2, 4], [1, 3, 5], [0.5, 2.5, 4.5]), _run([0, 3, 6], [1, 4, 7], [0.5, 3.5, 6.5]),
           _run([0, 4, 8], [1, 5, 9], [0.5, 4.5, 8.5])]
    new = [_run([0, 1.5, 3], [1, 2.5, 4], [0.5, 2, 3.5])]
    text = b.table({"old": old, "new": new}, laps=3)
    head, lap1, lap2, lap3, total = text.splitlines()[:5]
    assert head.split()[:3] == ["lap", "N", "Job->ckpt"]
    # lap 1: Job->ckpt 1 s both; checkpoint -> next Job: old median of 1, 2, 3 s = 2 s, new 0.5 s; -> next
    # model call: old median of 1.5, 2.5, 3.5 s, new 1 s
    assert lap1.split() == ["1", "1000", "1000", "2000", "500", "2500", "1000"]
    assert lap3.split() == ["3", "1000", "1000"]
    assert total.split()[0] == "sum"
    assert "old: laps 1-3 (Job 1 -> checkpoint 3) median 7000 ms, per round 5000, 7000, 9000 ms" in text
    assert "new: laps 1-3 (Job 1 -> checkpoint 3) median 4000 ms" in text
