"""The lap's store-free setup (tool schemas checked, tool runner and model client made) runs in a
thread beside the lap's first store reads (runner._Setup). Its errors must surface exactly as when
it ran inline after those reads: in the same order, with the same exit code, and not at all when
the lap ends before needing it. Against a real S3 server (moto)."""

from __future__ import annotations

import io
import threading

import pytest
from lap_helpers import RUN, lap_env, spec_doc

from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.config import parse_env
from agentrun.lap.logs import LapLogger
from agentrun.lap.runner import EXIT_ALREADY, EXIT_OK, EXIT_PERMANENT, execute_lap

pytestmark = pytest.mark.s3

NO_BASE_URL = {"provider": "openai", "name": "m"}  # valid spec, refused when the model client is made
BAD_SCHEMA_TOOL = {"name": "t", "parameters": {"type": 7}, "http": {"url": "http://127.0.0.1:1/x"}}


def _lap(s3_env: dict[str, str], doc: dict[str, object], lap: int = 1) -> tuple[int, str]:
    env = lap_env(s3_env, doc, lap)
    store = CheckpointStore(StoreConfig.from_env(env))
    result = execute_lap(parse_env(env), store, env, LapLogger({}, stream=io.StringIO()))
    return result.code, result.message


def _setup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lap-setup"]


def test_a_model_configuration_error_fails_the_lap_permanently_and_is_reported(s3_env: dict[str, str]) -> None:
    code, message = _lap(s3_env, spec_doc([], [], model=NO_BASE_URL))
    assert (code, message) == (EXIT_PERMANENT, "spec.agent.model.baseURL is required for provider openai")
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    report = store.get_attempt_failure(RUN, 1, 1)
    assert report is not None and report["exitCode"] == EXIT_PERMANENT and "baseURL" in report["message"]
    assert _setup_threads() == []


def test_a_bad_tool_schema_is_reported_before_a_bad_model_as_before(s3_env: dict[str, str]) -> None:
    code, message = _lap(s3_env, spec_doc([BAD_SCHEMA_TOOL], [], model=NO_BASE_URL))
    assert code == EXIT_PERMANENT
    assert "spec.agent.tools[t].parameters is not a valid JSON Schema" in message, message


def test_a_lap_already_checkpointed_exits_3_without_the_setup_error(s3_env: dict[str, str]) -> None:
    assert _lap(s3_env, spec_doc([], [{"content": "done"}]))[0] == EXIT_OK
    code, message = _lap(s3_env, spec_doc([], [], model=NO_BASE_URL))
    assert code == EXIT_ALREADY, message
    assert "baseURL" not in message
    assert _setup_threads() == []


def test_a_missing_checkpoint_is_reported_before_the_setup_error(s3_env: dict[str, str]) -> None:
    code, message = _lap(s3_env, spec_doc([], [], model=NO_BASE_URL), lap=3)  # laps 1-2 never ran
    assert code == EXIT_PERMANENT
    assert "a checkpoint it needs is missing" in message and "baseURL" not in message, message


def test_lap_1_reads_its_model_journal_entry_once_before_the_model_call(s3_env: dict[str, str]) -> None:
    """The key-scheme check's read of the model response's journal entry stands for the step's
    first read of it (runner.StoreJournal ``already_read``): one GET of that key, not two."""
    env = lap_env(s3_env, spec_doc([], [{"content": "done"}]), 1)
    store = CheckpointStore(StoreConfig.from_env(env))
    gets: list[str] = []
    store.client.meta.events.register("before-send.s3.GetObject", lambda request, **_: gets.append(request.url))
    result = execute_lap(parse_env(env), store, env, LapLogger({}, stream=io.StringIO()))
    assert result.code == EXIT_OK, result.message
    assert [u for u in gets if "/journal/" in u and u.endswith("/model.json")] != []
    assert len([u for u in gets if "/journal/" in u]) == 1, gets
