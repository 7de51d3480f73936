"""``agentrun lap`` of a run rewound in place (``AGENTRUN_REWINDS``, docs/contracts.md "Histories"):
the redone laps write a new history under ``histories/<h>/``, never reuse the abandoned history's
journal, derive their own idempotency keys, and leave every object of the abandoned history as it
was. Real S3 API server (moto), real tool server, the runner as a subprocess."""

from __future__ import annotations

from typing import Any

import pytest
from lap_helpers import RUN, RecordingToolServer, lap_env, log_lines, run_lap_process, spec_doc, tool

from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = pytest.mark.s3


def _objects(client: Any, bucket: str) -> dict[str, bytes]:
    objs = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in objs}


def test_a_rewound_lap_writes_a_new_history_with_its_own_journal_and_keys(
    s3_env: dict[str, str], s3_client: Any, s3_bucket: Any,
) -> None:
    with RecordingToolServer() as srv:
        tools = [tool("lookup", srv.url, sideEffects=False), tool("pay", srv.url)]
        script = [
            {"content": "looking", "toolCalls": [{"name": "lookup", "arguments": {"doc": "d1"}}]},
            {"content": "paying", "toolCalls": [{"name": "pay", "arguments": {"doc": "d1"}}]},
            {"content": "done"},
        ]
        spec = spec_doc(tools, script)
        for lap in (1, 2):
            assert run_lap_process(lap_env(s3_env, spec, lap)).returncode == 0
        crashed = run_lap_process(lap_env(s3_env, spec, 3, AGENTRUN_TEST_CRASH_AT="after-model-journal"))
        assert crashed.returncode == -9, crashed.stderr  # lap 3 journaled its model response, then died
        before = _objects(s3_client, s3_bucket.name)
        rewound = {"AGENTRUN_REWINDS": "1"}
        for lap in (2, 3):
            p = run_lap_process(lap_env(s3_env, spec, lap, attempt=2, **rewound))
            assert p.returncode == 0, p.stderr
            assert not any(line.get("msg") == "model response reused from the journal" for line in log_lines(p.stderr))
        after = _objects(s3_client, s3_bucket.name)
    assert {k: after[k] for k in before} == before, "the abandoned history is left as it was"
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    prefix = store.run_prefix(RUN)
    assert sorted(k[len(prefix):] for k in set(after) - set(before)) == [
        "histories/001/laps/00000002.json", "histories/001/laps/00000003.json", "rewinds/001.json"]
    assert prefix + "journal/00000003/model.json" in after, "the abandoned lap's journal is kept, not read"
    keys = {k: n for k, n in srv.executions.items() if not k.startswith("(no key)")}
    assert keys == {f"{RUN.long_id}:2:pay:call_1": 1, f"{RUN.long_id}.h1:2:pay:call_1": 1}, \
        "the redone lap's side-effecting call has its own key (the operator refuses such a rewind)"
    assert store.read_rewinds(RUN) == (1,)
    lineage = store.along(store.read_rewinds(RUN))
    recs = [r for r, _ in lineage.iter_laps(RUN)]
    assert [(r.lap, r.attempt, r.outcome.type) for r in recs] == [(1, 1, "continue"), (2, 2, "continue"), (3, 2, "done")]
    assert recs[1].prev_sha256 == store.get_lap(RUN, 1)[1].sha256
    assert lineage.load_state(RUN).state.totals.laps == 3
    assert store.latest_lap(RUN) == 2, "a reader of history 0 alone sees the abandoned laps only"


def test_a_lap_not_after_its_rewind_point_is_refused(s3_env: dict[str, str]) -> None:
    spec = spec_doc([], [{"content": "done"}])
    p = run_lap_process(lap_env(s3_env, spec, 2, AGENTRUN_REWINDS="2"))
    assert p.returncode == 2 and "AGENTRUN_REWINDS=2: lap 2 is not after every rewind point" in p.stderr
