"""Idempotency keys across runs and across the schema-3 upgrade (issue 11, item 5), on a real S3
server (moto) and a real keyed tool server.

- New runs key their calls with the full uid: 2,000 runs whose uids share their first 8 hex digits
  (the old scheme's whole run id), against ONE tool server that dedupes by key, each get their own
  execution; under the old scheme they would all collide.
- A run checkpointed by the v2 code (tests/fixtures/checkpoints/v2-run: objects as v2 wrote them,
  with a lap that crashed after a tool call ran and before it was journaled) finishes under the new
  code with its old ``r_<uid8>`` keys, and no side effect happens twice.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lap_helpers import RecordingToolServer, lap_env, run_lap_process, spec_doc, tool

from agentrun.api.spec import ToolSpec
from agentrun.checkpoint.schema import KEY_SCHEME_UID8, RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.config import parse_env
from agentrun.lap.keys import idempotency_key
from agentrun.lap.logs import LapLogger
from agentrun.lap.runner import execute_lap
from agentrun.lap.tools.http import HTTPToolRunner

FIXTURE = Path(__file__).parent.parent / "fixtures" / "checkpoints" / "v2-run"


def _colliding_runs(n: int) -> list[RunRef]:
    """n runs in two namespaces whose uids all start with the same 8 hex digits."""
    return [RunRef(namespace=f"tenant-{i % 2}", name=f"run-{i}", uid=f"deadbeef-{i:04x}-4000-8000-{i:012x}")
            for i in range(n)]


def test_two_thousand_runs_sharing_the_old_run_id_never_share_a_key() -> None:
    runs = _colliding_runs(2000)
    assert len({r.short_id for r in runs}) == 1  # the collision the old scheme had, on purpose
    with RecordingToolServer() as srv:
        pay = ToolSpec.model_validate(tool("pay", srv.url))
        runner = HTTPToolRunner()
        results = {}
        for run in runs:
            key = idempotency_key(run, 1, "pay", "call_1")
            assert key == f"{run.long_id}:1:pay:call_1" and len(run.long_id) == 34
            outcome = runner.call(pay, {"doc": run.name}, key)
            results[run.uid] = json.loads(outcome.result)["echo"]["doc"]
    # every run's charge executed once, and each got ITS OWN response back (none answered with another's)
    assert len(srv.executions) == 2000 and set(srv.executions.values()) == {1}
    assert all(results[r.uid] == r.name for r in runs)
    old = Counter(idempotency_key(r, 1, "pay", "call_1", KEY_SCHEME_UID8) for r in runs)
    assert old.most_common(1)[0][1] == 2000  # the same test fails under the old scheme


@pytest.mark.s3
def test_new_runs_on_one_tool_server_get_distinct_keys_through_the_lap_runner(s3_env: dict[str, str]) -> None:
    runs = _colliding_runs(12)
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    with RecordingToolServer() as srv:
        spec = spec_doc([tool("pay", srv.url)], [{"content": "pay", "toolCalls": [{"name": "pay", "arguments": {"doc": "d1"}}]}])
        for run in runs:
            env = lap_env(s3_env, spec, 1, AGENTRUN_NAMESPACE=run.namespace, AGENTRUN_NAME=run.name, AGENTRUN_UID=run.uid)
            result = execute_lap(parse_env(env), store, env, LapLogger({}, stream=io.StringIO()))
            assert result.code == 0, result.message
            record, _ = store.get_lap(run, 1)
            assert record.key_scheme == "uid128"
            assert record.tool_calls[0].idempotency_key == f"{run.long_id}:1:pay:call_1"
    assert len(srv.executions) == 12 and set(srv.executions.values()) == {1}


def _load_fixture(client: Any, bucket: str, prefix: str) -> dict[str, Any]:
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    run = RunRef.model_validate(manifest["run"])
    base = f"{prefix}/{run.namespace}/{run.name}/{run.uid}/"
    for obj in manifest["objects"]:
        client.put_object(Bucket=bucket, Key=base + obj["key"], Body=(FIXTURE / "objects" / obj["key"]).read_bytes(),
                          ContentType="application/json", Metadata={"sha256": obj["sha256"]})
    return manifest


@pytest.mark.s3
def test_a_run_checkpointed_by_the_v2_code_finishes_with_its_old_keys_and_no_repeated_side_effect(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    manifest = _load_fixture(s3_client, s3_bucket.name, "checkpoints")
    run = RunRef.model_validate(manifest["run"])
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    assert store.latest_lap(run) == 3
    with RecordingToolServer() as srv:
        # the tool server remembers what the v2 code executed, as a payment API would
        for key, rec in manifest["toolServer"].items():
            srv.stored[key] = (rec["status"], rec["body"].encode())
            srv.executions[key] = rec["executions"]
        tools = [tool("extract_invoice", srv.url, sideEffects=False), tool("pay", srv.url),
                 tool("post_ledger", srv.url, requiresApproval=True)]
        script = [
            {"content": "extracting doc_1", "toolCalls": [{"name": "extract_invoice", "arguments": {"doc": "doc_1"}}]},
            {"content": "paying doc_1", "toolCalls": [{"name": "pay", "arguments": {"doc": "doc_1"}}]},
            {"content": "posting doc_1", "toolCalls": [{"name": "post_ledger", "arguments": {"doc": "doc_1"}}]},
            {"content": "paying doc_2", "toolCalls": [{"name": "pay", "arguments": {"doc": "doc_2"}}]},
            {"content": "paying doc_3", "toolCalls": [{"name": "pay", "arguments": {"doc": "doc_3"}}]},
            {"content": "all invoices paid"},
        ]
        spec = spec_doc(tools, script, checkpoint={"snapshotEvery": 2})
        ident = {"AGENTRUN_NAMESPACE": run.namespace, "AGENTRUN_NAME": run.name, "AGENTRUN_UID": run.uid}
        decided = {"AGENTRUN_APPROVAL_DECISION": "approved", "AGENTRUN_APPROVAL_CALL_ID": "call_1",
                   "AGENTRUN_APPROVAL_BY": "alice", "AGENTRUN_APPROVAL_REASON": "checked"}
        # lap 4 is the crashed one: the new code replays it (attempt 2), then runs laps 5 and 6
        p = run_lap_process(lap_env(s3_env, spec, 4, attempt=2, **ident, **decided))
        assert p.returncode == 0, p.stderr
        for lap in (5, 6):
            p = run_lap_process(lap_env(s3_env, spec, lap, **ident))
            assert p.returncode == 0, p.stderr
    records = [store.get_lap(run, lap)[0] for lap in range(1, 7)]
    assert [r.schema_version for r in records] == [3] * 6  # v2 objects are read through the migration
    assert [r.key_scheme for r in records] == ["uid8"] * 6  # the run keeps its scheme after the upgrade
    keys = [c.idempotency_key for r in records for c in r.tool_calls]
    assert all(k.startswith("r_5e1d9a3b:") for k in keys), keys
    lap4 = records[3]
    assert [(c.tool, c.idempotency_key, c.replayed) for c in lap4.tool_calls] == [
        ("post_ledger", "r_5e1d9a3b:3:post_ledger:call_1", True),  # journaled by the v2 code: reused
        ("pay", "r_5e1d9a3b:4:pay:call_1", False),  # sent again with the SAME key: the server deduped it
    ]
    assert records[4].tool_calls[0].idempotency_key == "r_5e1d9a3b:5:pay:call_1"
    assert records[5].outcome.type == "done"
    # no side effect happened twice: every key executed exactly once at the tool server
    assert dict(srv.executions) == {
        "r_5e1d9a3b:2:pay:call_1": 1, "r_5e1d9a3b:3:post_ledger:call_1": 1, "r_5e1d9a3b:4:pay:call_1": 1,
        "r_5e1d9a3b:5:pay:call_1": 1,
    }
    # the old objects are untouched (but lap 4's journal: deleted once lap 4's record held its
    # content); the new ones are schema 3, gzip; the hash chain runs across both
    listed = {o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    for obj in manifest["objects"]:
        key = store.run_prefix(run) + obj["key"]
        if obj["key"].startswith("journal/00000004/"):
            assert key not in listed
            continue
        head = s3_client.head_object(Bucket=s3_bucket.name, Key=key)
        assert head["Metadata"]["sha256"] == obj["sha256"]
    assert not any("/journal/0000000" + str(lap) in k for k in listed for lap in (5, 6))
    new = s3_client.get_object(Bucket=s3_bucket.name, Key=store.lap_key(run, 5))
    assert new["Body"].read()[:2] == b"\x1f\x8b" and new["Metadata"]["encoding"] == "gzip"
    assert records[3].prev_sha256 == next(o["sha256"] for o in manifest["objects"] if o["key"] == "laps/00000003.json")
    loaded = store.load_state(run)
    assert loaded.state.lap == 6 and loaded.state.key_scheme == "uid8" and loaded.objects_read <= 3


@pytest.mark.s3
def test_a_first_lap_started_by_the_v2_code_keeps_the_old_keys_when_the_new_code_finishes_it(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    run = RunRef.model_validate(manifest["run"])
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    # only lap 1's journaled model response, as the v2 code wrote it before it was killed
    key = store.journal_key(run, 1, "model")
    sha = next(o["sha256"] for o in manifest["objects"] if o["key"] == "journal/00000001/model.json")
    s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=(FIXTURE / "objects/journal/00000001/model.json").read_bytes(),
                         Metadata={"sha256": sha})
    with RecordingToolServer() as srv:
        script = [{"content": "not used: the journaled response wins", "toolCalls": []}]
        spec = spec_doc([tool("extract_invoice", srv.url, sideEffects=False)], script)
        ident = {"AGENTRUN_NAMESPACE": run.namespace, "AGENTRUN_NAME": run.name, "AGENTRUN_UID": run.uid}
        p = run_lap_process(lap_env(s3_env, spec, 1, attempt=2, **ident))
        assert p.returncode == 0, p.stderr
    record, _ = store.get_lap(run, 1)
    assert record.key_scheme == "uid8" and record.messages[-2].content == "extracting doc_1"
    assert [c.idempotency_key for c in record.tool_calls] == ["r_5e1d9a3b:1:extract_invoice:call_1"]
