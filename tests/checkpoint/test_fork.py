"""Forks in the store: ``fork_state`` (pure) and ``CheckpointStore.fork`` against the S3 server."""

from __future__ import annotations

from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint.errors import CheckpointNotFound, CorruptCheckpoint
from agentrun.checkpoint.fold import fold, fork_state
from agentrun.checkpoint.schema import RunRef, RunState
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

FORK = RunRef(namespace=RUN.namespace, name="invoices-nov-retry", uid="77aa88bb-0000-4000-8000-000000000001")


def _source(store: CheckpointStore, laps: int, pending_at: int | None = None) -> list[Any]:
    prev, stored = None, []
    for lap in range(1, laps + 1):
        rec = make_record(lap, prev, pending=(lap == pending_at),
                          outcome="awaiting-approval" if lap == pending_at else "continue")
        obj = store.put_lap(rec)
        stored.append(obj)
        prev = obj.sha256
    return stored


def test_fork_state_rewrites_the_owner_keeps_the_chain_and_rekeys_the_pending_call() -> None:
    state = RunState(run=RUN)
    prev = None
    for lap in (1, 2):
        rec = make_record(lap, prev, pending=(lap == 2), outcome="awaiting-approval" if lap == 2 else "continue")
        state = fold(state, rec, f"{lap:064d}")
        prev = f"{lap:064d}"
    forked = fork_state(state, FORK)
    assert forked.run == FORK and forked.lap == 2 and forked.last_sha256 == f"{2:064d}"
    assert forked.forked_from.run == RUN and forked.forked_from.lap == 2 and forked.forked_from.sha256 == f"{2:064d}"
    assert forked.messages == state.messages and forked.totals == state.totals
    assert forked.pending_approval.idempotency_key == f"{FORK.long_id}:2:post_ledger:pay_2"
    assert state.pending_approval.idempotency_key.startswith(RUN.long_id)  # the source state is not changed
    with pytest.raises(ValueError):
        fork_state(RunState(run=RUN), FORK)


@pytest.mark.s3
def test_fork_writes_the_snapshot_once_and_the_next_lap_chains_onto_it(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=3))
    src = _source(store, 4)
    before = {o["Key"]: o["ETag"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    state, obj = store.fork(RUN, 2, FORK)
    assert obj.key == store.snapshot_key(FORK, 2)
    assert state.run == FORK and state.lap == 2 and state.last_sha256 == src[1].sha256
    assert state.forked_from.sha256 == src[1].sha256 and state.totals.laps == 2
    again, obj2 = store.fork(RUN, 2, FORK)  # idempotent
    assert again == state and obj2.sha256 == obj.sha256
    after = {o["Key"]: o["ETag"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    assert {k: v for k, v in after.items() if k in before} == before  # the source is untouched
    assert set(after) - set(before) == {obj.key}
    # the fork's lap 3 folds onto the snapshot (prevSha256 = the source's lap 2), as a lap runner does
    loaded = store.load_state(FORK, through_lap=2)
    assert loaded.state.model_copy(update={"storage": state.storage}) == state and loaded.objects_read == 1
    assert (state.storage.bytes, loaded.state.storage.bytes, loaded.state.storage.objects) == (0, obj.size, 1)
    assert store.latest_lap(FORK) == 2 and store.has_state(FORK, 2) and not store.has_state(FORK, 3)
    rec3 = make_record(3, loaded.state.last_sha256, run=FORK)
    store.put_lap(rec3, state_before=loaded.state)  # lap 3 is a multiple of K: a snapshot is written too
    state3 = store.load_state(FORK).state
    assert state3.lap == 3 and state3.forked_from == state.forked_from and state3.totals.laps == 3
    assert [r.lap for r, _ in store.iter_laps(FORK)] == [3]


@pytest.mark.s3
def test_fork_of_a_lap_never_checkpointed_or_unreadable(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env))
    _source(store, 2)
    with pytest.raises(CheckpointNotFound):
        store.fork(RUN, 3, FORK)
    assert not store.has_state(RUN, 3) and store.has_state(RUN, 2)
    key = store.lap_key(RUN, 2)
    s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"{}", Metadata={"sha256": "0" * 64})
    with pytest.raises(CorruptCheckpoint):
        store.fork(RUN, 2, FORK)
    assert store._head(store.snapshot_key(FORK, 2)) is None  # nothing written


@pytest.mark.s3
def test_a_corrupt_fork_snapshot_stops_the_run_instead_of_falling_back_to_lap_1(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env))
    _source(store, 2)
    _, obj = store.fork(RUN, 2, FORK)
    s3_client.put_object(Bucket=s3_bucket.name, Key=obj.key, Body=b"not json", Metadata={"sha256": "0" * 64})
    with pytest.raises(CorruptCheckpoint, match=r"fork snapshot .* \(the base this run starts from\) cannot be read"):
        store.load_state(FORK, through_lap=2)
    # an ordinary corrupt snapshot (its lap record exists) is still skipped
    store2 = CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=2))
    other = RunRef(namespace="billing", name="plain", uid="99990000-0000-4000-8000-000000000002")
    prev = None
    for lap in (1, 2, 3):
        prev = store2.put_lap(make_record(lap, prev, run=other)).sha256
    snap = store2.snapshot_key(other, 2)
    s3_client.put_object(Bucket=s3_bucket.name, Key=snap, Body=b"not json", Metadata={"sha256": "0" * 64})
    assert store2.load_state(other).skipped_snapshots == (snap,)


def test_old_states_without_fork_provenance_still_read() -> None:
    doc = RunState(run=RUN, lap=1).to_api()
    assert "forkedFrom" not in doc  # unset optional fields are not written
    assert RunState.model_validate(doc).forked_from is None
