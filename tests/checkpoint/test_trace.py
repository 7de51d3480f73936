"""The per-lap trace: format_trace (pure) and `agentrun trace` against the S3 server."""

from __future__ import annotations

from typing import Any

import pytest
from ckpt_builders import RUN, make_record
from click.testing import CliRunner

from agentrun.checkpoint.schema import Compaction
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.checkpoint.trace import format_trace
from agentrun.cli.main import main


def test_format_trace_shows_each_lap_its_tools_tokens_cost_duration_and_reasoning() -> None:
    records = [
        make_record(1, text="Listing the inbox first."),
        make_record(2, pending=True, outcome="awaiting-approval"),
        make_record(3, decision="rejected", compaction=Compaction(through_lap=1, summary="s")),
    ]
    text = format_trace(records)
    lines = text.splitlines()
    assert lines[0].split() == ["LAP", "ATT", "OUTCOME", "TOKENS", "IN/OUT", "COST", "USD", "DURATION", "TOOLS"]
    assert lines[1].split() == ["1", "1", "continue", "1000/100", "0.0125", "2.0s", "extract_invoice:ok(200)"]
    assert lines[2].strip() == "> Listing the inbox first."
    assert "awaiting-approval" in lines[3]
    assert "? approval pending for post_ledger (call pay_2)" in text
    assert "= call pay_2 rejected by alice" in text
    assert "~ compacted laps <= 1 into the summary" in text
    assert lines[-1] == "totals through lap 3: 3 laps, 3000/300 tokens, 0.0375 USD"


def test_format_trace_of_nothing() -> None:
    assert format_trace([]).splitlines()[1] == "(no laps)"


def test_long_reasoning_is_cut_to_the_width() -> None:
    text = format_trace([make_record(1, text="word " * 100)], width=60)
    assert all(len(line) <= 60 for line in text.splitlines()[2:3])
    assert text.splitlines()[2].endswith("…")


@pytest.mark.s3
def test_agentrun_trace_reads_the_store(s3_bucket: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=3))
    prev = None
    for lap in range(1, 8):
        prev = store.put_lap(make_record(lap, prev)).sha256
    args = ["trace", "--uri", s3_bucket.uri, "--endpoint", s3_bucket.server.endpoint_url, "--path-style",
            "--region", "us-east-1", "--namespace", RUN.namespace, "--name", RUN.name, "--uid", RUN.uid]
    result = CliRunner().invoke(main, [*args, "--from-lap", "5"])
    assert result.exit_code == 0, result.output
    laps = [line.split()[0] for line in result.output.splitlines()[1:] if line[:6].strip().isdigit()]
    assert laps == ["5", "6", "7"]
    assert "totals through lap 7: 7 laps" in result.output


@pytest.mark.s3
def test_agentrun_trace_reports_store_errors_without_a_traceback(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env))
    store.put_lap(make_record(1))
    key = store.lap_key(RUN, 1)
    s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"{}", Metadata={"sha256": "0" * 64})
    args = ["trace", "--uri", s3_bucket.uri, "--endpoint", s3_bucket.server.endpoint_url, "--path-style",
            "--namespace", RUN.namespace, "--name", RUN.name, "--uid", RUN.uid]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert f"checkpoint {key}: sha256" in result.output and result.output.startswith("agentrun: ")
    assert "Traceback" not in result.output


def test_agentrun_trace_names_a_bad_uri() -> None:
    result = CliRunner().invoke(main, ["trace", "--uri", "http://x", "--namespace", "a", "--name", "b", "--uid", "c"])
    assert result.exit_code == 1
    assert "uri: Value error, checkpoint uri 'http://x'" in result.output


def test_model_output_and_tool_results_cannot_drive_the_terminal():
    """agentrun trace prints messages and tool results (model output, tool answers): an ESC sequence
    or a bidirectional override in them is shown escaped, never sent to the terminal as is."""
    from agentrun.checkpoint.trace import one_line

    out = one_line("paid\x1b[2J\x1b]8;;https://evil\x07 \u202eredlof\nnext", 200)
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert out == "paid\\x1b[2J\\x1b]8;;https://evil\\x07 \\u202eredlof next"
    assert one_line("a" * 50, 10) == "a" * 9 + "…"
