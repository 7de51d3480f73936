"""SIGTERM (a cancel or a passed deadline deletes the lap Job with a grace period, issue 31): the lap
finishes the journal write of the call in flight and exits 143; the next attempt answers that call
from the journal and never sends it again (real S3 store, a real HTTP tool server)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from typing import Any

from lap_helpers import RecordingToolServer, lap_env, spec_doc, tool

from agentrun.api.contract import ExitCode
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap import runner
from agentrun.lap.config import parse_env
from agentrun.lap.logs import LapLogger

CALLS = [{"name": "pay", "arguments": {"doc": "inv-1"}}, {"name": "notify", "arguments": {"doc": "inv-1"}}]


def _lap(env: dict[str, str]) -> runner.LapExit:
    store = CheckpointStore(StoreConfig.from_env(env))
    return runner.execute_lap(parse_env(env), store, env, LapLogger({}, stream=io.StringIO()))


def test_sigterm_during_a_call_keeps_its_result_and_the_next_attempt_does_not_repeat_it(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as tools:
        doc = spec_doc([tool("pay", tools.url), tool("notify", tools.url)],
                       [{"tool_calls": CALLS}, {"content": "done"}])
        original = tools.handle

        def handle(method: str, path: str, args: Any, key: str | None, headers: dict[str, str]) -> tuple[int, bytes]:
            if path == "/pay":
                runner.TERMINATING.set()  # SIGTERM arrives while the payment is in flight
            return original(method, path, args, key, headers)

        tools.handle = handle  # type: ignore[method-assign]
        try:
            first = _lap(lap_env(s3_env, doc, 1, attempt=1))
        finally:
            runner.TERMINATING.clear()
        assert first.code == ExitCode.TERMINATED and "SIGTERM" in first.message
        assert [r["path"] for r in tools.requests] == ["/pay"], "the lap stopped before its next call"
        second = _lap(lap_env(s3_env, doc, 1, attempt=2))
        assert second.code == ExitCode.OK
        assert [r["path"] for r in tools.requests] == ["/pay", "/notify"], "the paid call was answered from the journal"
        assert sorted(tools.executions.values()) == [1, 1]


def test_the_lap_process_turns_sigterm_into_the_flag() -> None:
    code = ("import os, signal, time; from agentrun.lap import process, runner; process.install_sigterm(); "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print(runner.TERMINATING.is_set())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ})
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert signal.SIGTERM == 15 and ExitCode.TERMINATED == 128 + 15
