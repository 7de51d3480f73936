"""Checkpoint size through the lap runner on a real S3 server (moto): the run's storage count is
exact, and a lap over spec.checkpoint.maxLapBytes fails permanently with the store left intact."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from lap_helpers import RUN, RecordingToolServer, lap_env, log_lines, run_lap_process, spec_doc, tool

from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = pytest.mark.s3


def _bucket_bytes(client: Any, bucket: str) -> tuple[int, int]:
    objs = [o for o in client.list_objects_v2(Bucket=bucket).get("Contents", []) if "/attempts/" not in o["Key"]]
    return sum(o["Size"] for o in objs), len(objs)


def test_the_runs_storage_count_equals_what_the_bucket_holds(s3_env: dict[str, str], s3_client: Any, s3_bucket: Any) -> None:
    with RecordingToolServer() as srv:
        script = [{"content": f"lap {i}", "toolCalls": [{"name": "pay", "arguments": {"doc": f"d{i}"}}]} for i in range(1, 8)]
        spec = spec_doc([tool("pay", srv.url)], script, checkpoint={"snapshotEvery": 3})
        for lap in range(1, 8):
            p = run_lap_process(lap_env(s3_env, spec, lap))
            assert p.returncode == 0, p.stderr
    store = CheckpointStore(StoreConfig.from_env(s3_env, snapshot_every=3))
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]]
    assert not [k for k in keys if "/journal/" in k]  # each lap's journal went once its record held it
    for through in (6, 7):  # after a snapshot lap, and after it
        state = store.load_state(RUN, through_lap=through).state
        size = sum(o["Size"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]
                   if int(o["Key"].split("/")[-1][:8]) <= through)
        assert state.storage.bytes == size
    assert (state.storage.bytes, state.storage.objects) == _bucket_bytes(s3_client, s3_bucket.name)


def test_a_lap_over_max_lap_bytes_fails_permanently_naming_lap_size_and_limit(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    blob = secrets.token_hex(2048)  # 4 kB that gzip cannot shrink much, echoed back by the tool
    with RecordingToolServer() as srv:
        script = [{"content": "reading", "toolCalls": [{"name": "pay", "arguments": {"doc": blob}}]}]
        spec = spec_doc([tool("pay", srv.url)], script, checkpoint={"maxLapBytes": 1024})
        first = run_lap_process(lap_env(s3_env, spec, 1))
        before = _bucket_bytes(s3_client, s3_bucket.name)
        again = run_lap_process(lap_env(s3_env, spec, 1, attempt=2))
        executions = dict(srv.executions)
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    for attempt, p in ((1, first), (2, again)):
        assert p.returncode == 2, p.stderr
        report = store.get_attempt_failure(RUN, 1, attempt)
        assert report is not None and report["reason"] == "CheckpointTooLarge" and report["exitClass"] == "permanent"
        assert report["message"].startswith("lap 1: its checkpoint is ")
        assert "over the limit of 1024 bytes per lap (spec.checkpoint.maxLapBytes)" in report["message"]
        failed = [x for x in log_lines(p.stderr) if x["msg"] == "lap failed"]
        assert failed and "maxLapBytes" in failed[0]["error"]
    assert store.head_lap(RUN, 1) is None  # never checkpointed
    assert _bucket_bytes(s3_client, s3_bucket.name) == before  # the retry changed nothing but its report
    assert list(executions.values()) == [1]  # the tool ran once: the retry reused the journal


def _journal_keys(client: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []) if "/journal/" in o["Key"]]


def test_a_journal_left_by_a_runner_killed_after_its_checkpoint_is_deleted_by_the_next(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    with RecordingToolServer() as srv:
        spec = spec_doc([tool("pay", srv.url)], [{"content": "pay", "toolCalls": [{"name": "pay", "arguments": {"doc": "d"}}]}])
        killed = run_lap_process(lap_env(s3_env, spec, 1, AGENTRUN_TEST_CRASH_AT="after-checkpoint"))
        assert killed.returncode == -9
        assert len(_journal_keys(s3_client, s3_bucket.name)) == 2  # model + tool-call_1
        again = run_lap_process(lap_env(s3_env, spec, 1, attempt=2))
    assert again.returncode == 3 and "already checkpointed" in again.stderr
    assert _journal_keys(s3_client, s3_bucket.name) == []


def test_a_zombie_whose_model_response_lands_after_the_checkpoint_stops_before_any_tool_call(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    from agentrun.checkpoint.errors import LapAlreadyCheckpointed
    from agentrun.lap.runner import StoreJournal

    with RecordingToolServer() as srv:
        spec = spec_doc([tool("pay", srv.url)], [{"content": "pay", "toolCalls": [{"name": "pay", "arguments": {"doc": "d"}}]}])
        assert run_lap_process(lap_env(s3_env, spec, 1)).returncode == 0
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    assert _journal_keys(s3_client, s3_bucket.name) == []  # the winner deleted its journal
    zombie = StoreJournal(store, RUN, 1, "v1")  # loaded its state before the winner's checkpoint
    with pytest.raises(LapAlreadyCheckpointed):
        zombie.put("model", {"kind": "ModelResponse", "response": {"content": "another answer", "toolCalls": []}})
    assert _journal_keys(s3_client, s3_bucket.name) == []  # and it cleaned up its own entry
    assert zombie.put("tool-call_9", {"kind": "ToolResult", "record": {}}) is True  # other entries: no check
