"""What a resumed run believes about its own size (issue 36): a run of 65 laps written the way the
lap runner writes them (each lap loads the state through the lap before, writes journal entries,
puts its record carrying that state's ``storage``, deletes its journal), against a real S3 API over
HTTP (moto and versitygw). At every lap the storage of the state a resume starts from equals the
bytes and objects the run's prefix lists, on both load paths (the snapshot read directly at a known
lap, and the listing), and the state folded from the records equals the loaded one, its storage
too, except that at a snapshot lap the loaded state also counts the snapshot stored after the lap's
record. The checkpoint_store benchmark compared a fold that never counted (records without
``storage``) with a load at lap 500, a snapshot lap; 60+ laps cross six snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint.fold import fold, initial_state
from agentrun.checkpoint.schema import Compaction, RunState, Storage
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = pytest.mark.s3

K = 10
LAPS = 65


def listed(client: Any, bucket: str, prefix: str) -> Storage:
    """The run's stored bytes and objects as S3 lists them (the truth the accounting must match)."""
    objs = [o for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    return Storage(bytes=sum(o["Size"] for o in objs), objects=len(objs))


def test_a_resumed_run_counts_its_own_storage_over_65_laps(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=K))
    prefix = store.run_prefix(RUN)
    folded: RunState = initial_state(RUN)
    prev: str | None = None
    for lap in range(1, LAPS + 1):
        state = store.load_state(RUN, through_lap=lap - 1).state  # what the lap pod resumes from
        assert state.storage == listed(s3_client, s3_bucket.name, prefix), f"lap {lap} starts believing {state.storage}"
        # the lap's journal (model turn, tool result): stored while the lap runs, deleted once it is checkpointed
        names = ["model", f"tool-call_{lap}"]
        for name in names:
            store.put_journal_entry(RUN, lap, name, {"lap": lap, "pad": "x" * 200})
        compaction = Compaction(through_lap=lap - 20, summary=f"laps 1..{lap - 20}") if lap > 20 and lap % K == 3 else None
        record = make_record(lap, prev, payload=300, compaction=compaction).model_copy(
            update={"storage": state.storage})
        stored = store.put_lap(record, state_before=state)
        store.delete_journal(RUN, lap, names, lap_written=True)
        prev = stored.sha256
        folded = fold(folded, record, stored.sha256, stored.size)

        truth = listed(s3_client, s3_bucket.name, prefix)
        loaded = store.load_state(RUN, through_lap=lap).state
        assert loaded.storage == truth, f"after lap {lap}: loaded {loaded.storage}, stored {truth}"
        snapshot = store._head(store.snapshot_key(RUN, lap)) if lap % K == 0 else None
        if lap % K == 0:
            assert snapshot is not None, f"no snapshot after lap {lap}"
            # the fold is through the lap's record; the snapshot is stored after it, and a resume counts it
            assert folded.storage == Storage(bytes=truth.bytes - snapshot.size, objects=truth.objects - 1), lap
        else:
            assert folded.storage == truth, f"after lap {lap}: folded {folded.storage}, stored {truth}"
        assert loaded.model_copy(update={"storage": folded.storage}) == folded, f"lap {lap}: the states differ"
        if lap % 5 == 0 or lap == LAPS:  # the listing path (no known lap) believes the same
            assert store.load_state(RUN).state == loaded, f"lap {lap}: the listing path differs"
    assert folded.lap == LAPS and truth.objects == LAPS + LAPS // K  # laps and snapshots; the journal is gone
