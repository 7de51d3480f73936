"""The LangGraph comparison of `make bench` (sections ``langgraph``, ``langgraph_big``) is against LangGraph's
best configuration for each figure: ``bench_vs_langgraph.best_modes`` picks, over every configuration
measured, the one with the fewest bytes and the one with the fastest resume; ``run_all.lg_best`` and
``lg_targets`` compare agentrun with those, ``add_messages`` (the default) only as a labelled extra row."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_vs_langgraph  # noqa: E402
import run_all  # noqa: E402


def _mode(name: str, blob_bytes: int, resume_ms: float, before_ms: float | None = None) -> dict[str, Any]:
    return {"name": name, "blob_bytes": blob_bytes, "laps": 500, "per_lap_bytes": [0, blob_bytes],
            "file_bytes": blob_bytes, "resume_seconds": [resume_ms / 1000] * 3,
            "resume_before_last_seconds": [(before_ms or resume_ms) / 1000] * 3}


def _section(modes: list[dict[str, Any]], ours_bytes: int, ours_resume_ms: float,
             ours_before_ms: float = 20.0) -> dict[str, Any]:
    lg = {"version": "1", "sqlite_version": "1", "modes": modes, **bench_vs_langgraph.best_modes(modes)}
    default = next(m for m in modes if m["name"] == "add_messages")
    return {"agentrun": {"laps": 500, "total_bytes": ours_bytes, "message_bytes_per_lap": 530.0,
                         "resume_seconds": [ours_resume_ms / 1000] * 3, "per_lap_bytes": [1] * 500,
                         "resume_before_last_seconds": [ours_before_ms / 1000] * 3},
            "langgraph": lg, "tool_result_padding": 0, "ratio_total_bytes": default["blob_bytes"] / ours_bytes}


MODES = [_mode("add_messages", 90_000_000, 9.0), _mode("DeltaChannel k=10", 9_000_000, 4.0),
         _mode("DeltaChannel k=50", 2_600_000, 6.0, 3.0), _mode("DeltaChannel k=100", 1_700_000, 8.0)]


def test_the_best_is_picked_per_figure_over_every_configuration() -> None:
    assert bench_vs_langgraph.best_modes(MODES) == {"fewest_bytes": "DeltaChannel k=100",
                                                    "fastest_resume": "DeltaChannel k=10",
                                                    "fastest_resume_before_last": "DeltaChannel k=50"}
    # the default wins a figure if it measured best on it: the best is measured, not assumed
    fast_default = [_mode("add_messages", 90_000_000, 1.0), *MODES[1:]]
    assert bench_vs_langgraph.best_modes(fast_default)["fastest_resume"] == "add_messages"
    with pytest.raises(ValueError):
        bench_vs_langgraph.best_modes([])


def test_mode_names() -> None:
    assert bench_vs_langgraph.mode_name("add_messages", None) == "add_messages"
    assert bench_vs_langgraph.mode_name("DeltaChannel", 50) == "DeltaChannel k=50"


def test_agentrun_is_compared_with_the_best_not_the_default() -> None:
    b = run_all.lg_best(_section(MODES, 400_000, 5.0))
    assert b["fewest"]["name"] == "DeltaChannel k=100" and b["bytes_ratio"] == pytest.approx(4.25)
    assert b["bytes_met"]
    # 5 ms against LangGraph's fastest 4 ms: missed, though it beats add_messages' 9 ms
    assert b["fastest"]["name"] == "DeltaChannel k=10" and not b["resume_met"]
    # at lap N-1 the fastest is another configuration (k=50, 3 ms): agentrun's 20 ms there is missed too
    assert b["fastest_before"]["name"] == "DeltaChannel k=50" and not b["resume_before_met"]
    rows = run_all.lg_targets(_section(MODES, 400_000, 5.0), first=True)
    assert [r[-1] for r in rows] == ["met", "**missed**", "**missed**", "met"]
    assert "DeltaChannel k=100" in rows[0][0] and "DeltaChannel k=10)" in rows[1][0] and "k=50" in rows[2][0]
    assert rows[3][0].startswith("extra row, LangGraph's default `add_messages`")


def test_more_bytes_than_the_best_is_missed() -> None:
    b = run_all.lg_best(_section(MODES, 2_000_000, 3.0, 2.0))
    assert not b["bytes_met"] and b["resume_met"] and b["resume_before_met"]
