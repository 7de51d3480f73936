"""The S3 checkpoint store against a real S3 API server (moto server mode) over HTTP."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint.codec import encode_object, pack_lap
from agentrun.checkpoint.errors import (
    CheckpointNotFound,
    CheckpointTooLarge,
    CorruptCheckpoint,
    LapAlreadyCheckpointed,
    StoreConfigError,
    StoreUnavailable,
    UnsupportedSchemaVersion,
)
from agentrun.checkpoint.fold import fold_all, initial_state
from agentrun.checkpoint.schema import Compaction, LapRecord, RunRef, RunState, Storage
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, canonical_json, sha256_hex

pytestmark = pytest.mark.s3

FIXTURES = Path(__file__).parent.parent / "fixtures" / "checkpoints" / "v1"


def same_state(a: RunState, b: RunState) -> bool:
    """Equal apart from ``storage`` (these records carry no storage count; a snapshot adds its own size)."""
    return a.model_copy(update={"storage": Storage()}) == b.model_copy(update={"storage": Storage()})


def make_store(s3_bucket: Any, k: int = 10) -> CheckpointStore:
    return CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=k))


def write_laps(store: CheckpointStore, n: int, start: int = 1, prev: str | None = None, run: RunRef = RUN) -> list[str]:
    """Write laps start..n chained; return their sha256s."""
    shas = []
    for lap in range(start, n + 1):
        prev = store.put_lap(make_record(lap, prev, run=run)).sha256
        shas.append(prev)
    return shas


def raw_put(client: Any, bucket: str, key: str, body: bytes, sha: str | None = None) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sha256": sha or sha256_hex(body)})


def all_keys(client: Any, bucket: str) -> dict[str, str]:
    """key -> ETag of every object in the bucket."""
    resp = client.list_objects_v2(Bucket=bucket)
    return {o["Key"]: o["ETag"] for o in resp.get("Contents", [])}


class GetCounter:
    """Counts the GetObject requests a store sends (botocore's ``before-send`` hook)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.keys: list[str] = []
        store.client.meta.events.register("before-send.s3.GetObject", self._on_send)

    def _on_send(self, request: Any, **_: Any) -> None:
        self.keys.append(request.url)


# ---- layout, round trip ---------------------------------------------------------------------


def test_layout_canonical_bytes_and_sha256_metadata(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    record = make_record(1)
    stored = store.put_lap(record)
    assert stored.key == "checkpoints/billing/invoices-nov/8f2a1c0d-4b7e-4f10-9a51-2c3d4e5f6a7b/laps/00000001.json"
    obj = s3_client.get_object(Bucket=s3_bucket.name, Key=stored.key)
    body = obj["Body"].read()
    assert body == encode_object(pack_lap(record.to_api()))  # gzip of the compact canonical JSON
    assert obj["Metadata"]["sha256"] == sha256_hex(body) == stored.sha256
    assert obj["Metadata"]["encoding"] == "gzip" and obj["ContentType"] == "application/gzip"
    assert stored.size == len(body)
    doc = json.loads(gzip.decompress(body))  # the standard library reads it
    assert doc["schemaVersion"] == 3 and doc["agentVersion"] == "invoice-agent:1.0.0" and doc["keyScheme"] == "uid128"
    got, got_obj = store.get_lap(RUN, 1)
    assert got == record
    assert (got_obj.key, got_obj.sha256, got_obj.size) == (stored.key, stored.sha256, stored.size)
    assert store.head_lap(RUN, 1) is not None and store.head_lap(RUN, 1).sha256 == stored.sha256  # type: ignore[union-attr]
    assert store.head_lap(RUN, 2) is None
    with pytest.raises(CheckpointNotFound, match="laps/00000002.json not found"):
        store.get_lap(RUN, 2)


# ---- conditional put: one writer per lap ------------------------------------------------------


def test_racing_writers_of_the_same_lap_exactly_one_wins(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    for lap in range(1, 11):
        contenders = [make_record(lap, attempt=a, text=f"writer {a}") for a in (1, 2, 3)]
        barrier = threading.Barrier(len(contenders))
        results: dict[int, Any] = {}

        def write(record: LapRecord) -> None:
            barrier.wait()
            try:
                results[record.attempt] = store.put_lap(record)
            except LapAlreadyCheckpointed as e:
                results[record.attempt] = e

        threads = [threading.Thread(target=write, args=(r,)) for r in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [a for a, r in results.items() if not isinstance(r, Exception)]
        assert len(winners) == 1, results
        stored, _ = store.get_lap(RUN, lap)
        assert stored.attempt == winners[0] and stored.messages[0].content == f"writer {winners[0]}"
        for a, r in results.items():
            if a != winners[0]:
                assert isinstance(r, LapAlreadyCheckpointed) and not r.permanent
                assert r.key == store.lap_key(RUN, lap)


def test_a_zombie_cannot_overwrite_a_lap_but_an_identical_retry_is_accepted(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    first = store.put_lap(make_record(1))
    # the same bytes again (a retried PUT whose first try landed): accepted, same object
    assert store.put_lap(make_record(1)).sha256 == first.sha256
    with pytest.raises(LapAlreadyCheckpointed, match="laps/00000001.json already exists"):
        store.put_lap(make_record(1, attempt=2))
    assert store.get_lap(RUN, 1)[1].sha256 == first.sha256


# ---- verification on read ---------------------------------------------------------------------


def test_tampered_body_is_corrupt_and_the_store_is_left_intact(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    write_laps(store, 3)
    key = store.lap_key(RUN, 2)
    original = s3_client.get_object(Bucket=s3_bucket.name, Key=key)
    body = original["Body"].read()
    tampered = body[:30] + bytes([body[30] ^ 1]) + body[31:]
    raw_put(s3_client, s3_bucket.name, key, tampered, sha=original["Metadata"]["sha256"])
    before = all_keys(s3_client, s3_bucket.name)
    with pytest.raises(CorruptCheckpoint) as info:
        store.get_lap(RUN, 2)
    message = str(info.value)
    assert key in message and "x-amz-meta-sha256" in message and "changed or truncated" in message
    assert info.value.permanent and info.value.key == key
    with pytest.raises(CorruptCheckpoint, match="laps/00000002.json"):
        store.load_state(RUN)
    assert all_keys(s3_client, s3_bucket.name) == before
    assert s3_client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read() == tampered


def test_missing_sha256_metadata_is_corrupt(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    key = store.lap_key(RUN, 1)
    s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=canonical_json(make_record(1).to_api()))
    with pytest.raises(CorruptCheckpoint, match="has no sha256 user metadata"):
        store.get_lap(RUN, 1)


def test_invalid_field_is_corrupt_naming_key_and_field(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    doc = make_record(1).to_api()
    doc["outcome"]["type"] = "paused"
    key = store.lap_key(RUN, 1)
    raw_put(s3_client, s3_bucket.name, key, canonical_json(doc))
    with pytest.raises(CorruptCheckpoint) as info:
        store.get_lap(RUN, 1)
    assert f"checkpoint {key}: field outcome.type:" in str(info.value)


def test_unparsable_body_is_corrupt(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    raw_put(s3_client, s3_bucket.name, store.lap_key(RUN, 1), b'{"kind": "LapRec')
    with pytest.raises(CorruptCheckpoint, match="laps/00000001.json is not valid JSON"):
        store.get_lap(RUN, 1)


def test_a_lap_object_under_the_wrong_key_is_corrupt(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    raw_put(s3_client, s3_bucket.name, store.lap_key(RUN, 2), canonical_json(make_record(1).to_api()))
    with pytest.raises(CorruptCheckpoint, match="not the object this key names"):
        store.get_lap(RUN, 2)


def test_future_schema_version_is_refused_naming_both_versions(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    write_laps(store, 6)
    doc = make_record(7).to_api()
    doc["schemaVersion"] = 9
    doc["somethingNew"] = {"x": 1}
    key = store.lap_key(RUN, 7)
    raw_put(s3_client, s3_bucket.name, key, canonical_json(doc))
    expected = (
        f"checkpoint {key} has schemaVersion 9; this agentrun reads schema versions 1..3 "
        "— upgrade the operator/runner image"
    )
    with pytest.raises(UnsupportedSchemaVersion) as info:
        store.get_lap(RUN, 7)
    assert str(info.value) == expected and info.value.permanent
    with pytest.raises(UnsupportedSchemaVersion, match="schemaVersion 9"):
        store.load_state(RUN)  # no partial state comes back
    assert store.load_state(RUN, through_lap=6).state.lap == 6


def test_broken_hash_chain_names_both_keys(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    write_laps(store, 2)
    store.put_lap(make_record(3, "0" * 64))  # not the sha of lap 2
    with pytest.raises(CorruptCheckpoint) as info:
        store.load_state(RUN)
    message = str(info.value)
    assert store.lap_key(RUN, 3) in message and store.lap_key(RUN, 2) in message
    assert "hash chain broken" in message


def test_put_lap_refuses_a_record_that_does_not_chain_to_state_before(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    write_laps(store, 1)
    state = store.load_state(RUN).state
    with pytest.raises(ValueError, match="prevSha256"):
        store.put_lap(make_record(2, "f" * 64), state_before=state)
    assert store.head_lap(RUN, 2) is None


# ---- migrations through the store ----------------------------------------------------------


def test_v1_objects_in_the_store_are_migrated_on_load(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=3)
    snap = (FIXTURES / "snapshot-00000006.json").read_bytes()
    lap7 = (FIXTURES / "lap-00000007.json").read_bytes()
    raw_put(s3_client, s3_bucket.name, store.snapshot_key(RUN, 6), snap)
    raw_put(s3_client, s3_bucket.name, store.lap_key(RUN, 7), lap7)
    record, stored = store.get_lap(RUN, 7)
    assert record.schema_version == 3 and record.outcome.type == "awaiting-approval" and record.key_scheme == "uid8"
    assert stored.sha256 == sha256_hex(lap7)  # the sha256 of the stored (v1) bytes
    loaded = store.load_state(RUN)
    assert loaded.objects_read == 2
    assert loaded.state.lap == 7 and loaded.state.last_sha256 == sha256_hex(lap7)
    assert loaded.state.pending_approval is not None and loaded.state.pending_approval.call_id == "call_7b"
    # the next lap, written by the current schema, chains onto the migrated v1 lap
    store.put_lap(make_record(8, loaded.state.last_sha256), state_before=loaded.state)
    assert store.load_state(RUN).state.lap == 8


# ---- snapshots, bounded reads, latest_lap -------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4, 10])
def test_load_state_reads_at_most_k_plus_one_objects(s3_bucket: Any, k: int) -> None:
    store = make_store(s3_bucket, k=k)
    pairs = []
    prev = None
    for lap in range(1, 26):
        record = make_record(lap, prev)
        prev = store.put_lap(record).sha256
        pairs.append((record, prev))
    counter = GetCounter(store)
    for through in range(0, 26):
        counter.keys.clear()
        result = store.load_state(RUN, through_lap=through)
        assert result.objects_read == len(counter.keys) == len(result.keys_read)
        assert result.objects_read <= k + 1
        expected_reads = through if through < k else 1 + through % k
        assert result.objects_read == expected_reads
        # (storage is counted by the lap runner's records: tests/lap/test_lap_s3.py)
        assert same_state(result.state, fold_all(initial_state(RUN), pairs[:through]))


def test_snapshot_holds_the_folded_state(s3_bucket: Any) -> None:
    store = make_store(s3_bucket, k=5)
    write_laps(store, 10)
    state, _ = store.get_snapshot(RUN, 10)
    assert state.lap == 10 and state.last_sha256 == store.head_lap(RUN, 10).sha256  # type: ignore[union-attr]
    # built without state_before (loaded) and with it: same snapshot
    other = CheckpointStore(store.config.model_copy(update={"uri": store.config.uri + "2"}), client=store.client)
    prev, state_before = None, initial_state(RUN)
    for lap in range(1, 11):
        record = make_record(lap, prev)
        stored = other.put_lap(record, state_before=state_before)
        state_before = fold_all(state_before, [(record, stored.sha256)])
        prev = stored.sha256
    assert other.get_snapshot(RUN, 10)[0] == state


def test_snapshot_size_is_bounded_by_compaction(s3_bucket: Any) -> None:
    store = make_store(s3_bucket, k=5)
    prev = None
    for lap in range(1, 41):
        compaction = Compaction(through_lap=lap - 5, summary="s" * 100) if lap > 5 else None
        prev = store.put_lap(make_record(lap, prev, compaction=compaction)).sha256
    sizes = [len(canonical_json(store.get_snapshot(RUN, lap)[0].to_api())) for lap in (10, 20, 40)]
    assert max(sizes) - min(sizes) < 50, sizes


def test_latest_lap_across_snapshots(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=4)
    assert store.latest_lap(RUN) == 0
    assert store.load_state(RUN).state == RunState(run=RUN)
    prev = None
    for lap in range(1, 14):
        prev = store.put_lap(make_record(lap, prev)).sha256
        assert store.latest_lap(RUN) == lap
    # a lost snapshot (best effort write) does not change the answer
    s3_client.delete_object(Bucket=s3_bucket.name, Key=store.snapshot_key(RUN, 12))
    assert store.latest_lap(RUN) == 13
    assert store.load_state(RUN).state.lap == 13
    # another run of the same name (new uid) is separate
    other = RunRef(namespace=RUN.namespace, name=RUN.name, uid="11111111-2222-3333-4444-555555555555")
    assert store.latest_lap(other) == 0


def test_latest_lap_lists_only_after_the_newest_snapshot(s3_bucket: Any) -> None:
    store = make_store(s3_bucket, k=10)
    write_laps(store, 47)
    listed: list[int] = []

    def on_parsed(parsed: dict[str, Any], **_: Any) -> None:
        listed.append(len(parsed.get("Contents", [])))

    store.client.meta.events.register("after-call.s3.ListObjectsV2", on_parsed)
    assert store.latest_lap(RUN) == 47
    assert listed == [4, 7]  # snapshots 10..40, then laps 41..47 only


# ---- corrupt snapshots: fall back to an older snapshot plus the lap records --------------------


def corrupt(client: Any, bucket: str, key: str, how: str) -> bytes:
    """Overwrite ``key`` in place; returns the new body. ``sha``: tampered body, old sha256 metadata
    kept; ``json``: unparsable body; ``field``: an invalid field (both with a matching sha256)."""
    original = client.get_object(Bucket=bucket, Key=key)
    body = original["Body"].read()
    if how == "sha":
        tampered = body[:30] + bytes([body[30] ^ 1]) + body[31:]
        raw_put(client, bucket, key, tampered, sha=original["Metadata"]["sha256"])
        return tampered
    if how == "json":
        tampered = body[: len(body) // 2]
    else:
        doc = json.loads(gzip.decompress(body))
        doc["lap"] = "twelve"
        tampered = encode_object(doc)
    raw_put(client, bucket, key, tampered)
    return tampered


@pytest.mark.parametrize("how", ["sha", "json", "field"])
def test_a_corrupt_newest_snapshot_falls_back_to_the_previous_one(
    s3_bucket: Any, s3_client: Any, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    store = make_store(s3_bucket, k=4)
    write_laps(store, 13)  # snapshots 4, 8, 12
    intact = store.load_state(RUN)
    assert intact.objects_read == 2 and intact.skipped_snapshots == ()
    snap12, snap8 = store.snapshot_key(RUN, 12), store.snapshot_key(RUN, 8)
    tampered = corrupt(s3_client, s3_bucket.name, snap12, how)
    before = all_keys(s3_client, s3_bucket.name)
    counter = GetCounter(store)
    with caplog.at_level("WARNING", logger="agentrun.checkpoint.store"):
        result = store.load_state(RUN)
    assert result.state == intact.state
    laps = tuple(store.lap_key(RUN, lap) for lap in range(9, 14))
    assert result.keys_read == (snap12, snap8, *laps)
    assert result.objects_read == len(counter.keys) == 7  # more than K+1: the corrupt one, snapshot 8, laps 9..13
    assert result.skipped_snapshots == (snap12,)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and snap12 in warnings[0] and "falling back" in warnings[0]
    # through a lap before the corrupt snapshot: untouched by it
    assert store.load_state(RUN, through_lap=11).skipped_snapshots == ()
    # never deleted nor rewritten
    assert all_keys(s3_client, s3_bucket.name) == before
    assert s3_client.get_object(Bucket=s3_bucket.name, Key=snap12)["Body"].read() == tampered
    # latest_lap only lists snapshot keys: unaffected
    assert store.latest_lap(RUN) == 13
    # the next snapshot (lap 16, loaded without state_before) is written from the fallback
    shas = write_laps(store, 16, start=14, prev=intact.state.last_sha256)
    prevs = [intact.state.last_sha256, *shas[:-1]]
    expected = fold_all(intact.state, [(make_record(lap, p), sha) for lap, p, sha in zip(range(14, 17), prevs, shas)])
    after = store.load_state(RUN)
    assert after.keys_read == (store.snapshot_key(RUN, 16),) and after.skipped_snapshots == ()
    assert same_state(after.state, expected)
    assert s3_client.get_object(Bucket=s3_bucket.name, Key=snap12)["Body"].read() == tampered


def test_corrupt_only_snapshot_folds_from_lap_one(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=5)
    pairs = []
    prev = None
    for lap in range(1, 8):
        record = make_record(lap, prev)
        prev = store.put_lap(record).sha256
        pairs.append((record, prev))
    snap5 = store.snapshot_key(RUN, 5)
    corrupt(s3_client, s3_bucket.name, snap5, "sha")
    result = store.load_state(RUN)
    assert result.state == fold_all(initial_state(RUN), pairs)
    assert result.keys_read == (snap5, *(store.lap_key(RUN, lap) for lap in range(1, 8)))
    assert result.objects_read == 8 and result.skipped_snapshots == (snap5,)
    assert store.latest_lap(RUN) == 7


def test_every_snapshot_corrupt_folds_from_lap_one(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=3)
    write_laps(store, 7)
    intact = store.load_state(RUN)
    keys = [store.snapshot_key(RUN, lap) for lap in (6, 3)]
    for key in keys:
        corrupt(s3_client, s3_bucket.name, key, "json")
    result = store.load_state(RUN)
    assert result.state == intact.state
    assert result.skipped_snapshots == tuple(keys) and result.objects_read == 2 + 7


def test_a_corrupt_lap_record_is_still_corrupt_with_or_without_a_snapshot_fallback(
    s3_bucket: Any, s3_client: Any
) -> None:
    store = make_store(s3_bucket, k=4)
    write_laps(store, 10)  # snapshots 4, 8
    corrupt(s3_client, s3_bucket.name, store.lap_key(RUN, 10), "sha")
    with pytest.raises(CorruptCheckpoint, match="laps/00000010.json") as info:
        store.load_state(RUN)  # snapshot 8 is intact: lap 10 is read and refused
    assert info.value.permanent
    # a corrupt snapshot 8 makes the fold start at snapshot 4: a corrupt lap 6 is refused too
    corrupt(s3_client, s3_bucket.name, store.snapshot_key(RUN, 8), "sha")
    corrupt(s3_client, s3_bucket.name, store.lap_key(RUN, 6), "field")
    with pytest.raises(CorruptCheckpoint, match="laps/00000006.json"):
        store.load_state(RUN, through_lap=9)


def test_a_future_schema_snapshot_is_not_skipped(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=4)
    write_laps(store, 9)
    key = store.snapshot_key(RUN, 8)
    doc = json.loads(gzip.decompress(s3_client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()))
    doc["schemaVersion"] = 9
    raw_put(s3_client, s3_bucket.name, key, canonical_json(doc))
    with pytest.raises(UnsupportedSchemaVersion, match="snapshots/00000008.json has schemaVersion 9"):
        store.load_state(RUN)
    assert store.load_state(RUN, through_lap=7).state.lap == 7  # snapshot 4, laps 5..7
    assert store.latest_lap(RUN) == 9


# ---- journal, attempts, retention ----------------------------------------------------------


def test_journal_is_written_once(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    assert store.get_journal(RUN, 3, "model") is None
    assert store.put_journal(RUN, 3, "model", {"content": "first"}, agent_version="a:1") is True
    assert store.put_journal(RUN, 3, "model", {"content": "second"}) is False
    assert store.get_journal(RUN, 3, "model") == {"content": "first"}
    assert store.put_journal(RUN, 3, "tool-call_3", {"status": 200}) is True
    assert store.get_journal(RUN, 3, "tool-call_3") == {"status": 200}
    with pytest.raises(ValueError, match="journal name"):
        store.put_journal(RUN, 3, "../escape", {})


def test_racing_journal_writers_agree_on_one_value(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    barrier = threading.Barrier(4)
    wrote: list[bool] = []

    def write(i: int) -> None:
        barrier.wait()
        wrote.append(store.put_journal(RUN, 1, "tool-pay", {"writer": i}))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wrote) == [False, False, False, True]


def test_attempt_failures_are_best_effort_and_overwritable(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    assert store.get_attempt_failure(RUN, 2, 1) is None
    store.put_attempt_failure(RUN, 2, 1, {"exitClass": "retryable", "message": "model timeout"})
    store.put_attempt_failure(RUN, 2, 1, {"exitClass": "permanent", "message": "tool removed"})
    assert store.get_attempt_failure(RUN, 2, 1) == {"exitClass": "permanent", "message": "tool removed"}
    assert store.attempt_key(RUN, 2, 1).endswith("/attempts/00000002-001.json")


def test_delete_run_deletes_only_that_run(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket, k=5)
    other = RunRef(namespace="billing", name="invoices-dec", uid="9f2a1c0d-4b7e-4f10-9a51-2c3d4e5f6a7b")
    write_laps(store, 12)
    store.put_journal(RUN, 13, "model", {"x": 1})
    store.put_attempt_failure(RUN, 13, 1, {"m": "x"})
    write_laps(store, 2, run=other)
    assert store.delete_run(RUN) == 12 + 2 + 1 + 1
    assert store.latest_lap(RUN) == 0
    assert all("invoices-dec" in k for k in all_keys(s3_client, s3_bucket.name))
    assert store.latest_lap(other) == 2
    assert store.delete_run(RUN) == 0


def test_iter_laps_from_a_lap(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    write_laps(store, 12)
    assert [r.lap for r, _ in store.iter_laps(RUN, start=9)] == [9, 10, 11, 12]
    assert [r.lap for r, _ in store.iter_laps(RUN)] == list(range(1, 13))


# ---- configuration and store errors ----------------------------------------------------------


def test_from_env_reads_the_lap_job_variables() -> None:
    config = StoreConfig.from_env(
        {
            "AGENTRUN_CHECKPOINT_URI": "s3://agent-ckpt/prod/eu",
            "AGENTRUN_S3_ENDPOINT": "http://minio:9000",
            "AGENTRUN_S3_REGION": "eu-west-1",
            "AGENTRUN_S3_PATH_STYLE": "true",
        },
        snapshot_every=25,
    )
    assert (config.bucket, config.prefix, config.endpoint_url) == ("agent-ckpt", "prod/eu", "http://minio:9000")
    assert (config.region, config.path_style, config.snapshot_every) == ("eu-west-1", True, 25)
    bare = StoreConfig.from_env({"AGENTRUN_CHECKPOINT_URI": "s3://agent-ckpt", "AGENTRUN_S3_ENDPOINT": ""})
    assert (bare.prefix, bare.endpoint_url, bare.path_style, bare.snapshot_every) == ("", None, False, 10)
    assert CheckpointStore(bare, client=object()).lap_key(RUN, 1).startswith("billing/invoices-nov/")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "AGENTRUN_CHECKPOINT_URI is not set"),
        ({"AGENTRUN_CHECKPOINT_URI": "gs://bucket/x"}, "AGENTRUN_CHECKPOINT_URI: Value error, checkpoint uri 'gs://bucket/x'"),
        ({"AGENTRUN_CHECKPOINT_URI": "s3://b/x", "AGENTRUN_S3_PATH_STYLE": "maybe"}, "AGENTRUN_S3_PATH_STYLE must be true or false"),
        ({"AGENTRUN_CHECKPOINT_URI": "s3://bkt/x", "AGENTRUN_S3_ENDPOINT": "ftp://user:pw@host"}, "AGENTRUN_S3_ENDPOINT"),
    ],
)
def test_from_env_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(StoreConfigError) as info:
        StoreConfig.from_env(env)
    assert message in str(info.value) and info.value.permanent
    assert "pw" not in str(info.value)


def test_unreachable_store_is_retryable_and_leaks_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECRETIDENTIFIER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-key-value")
    config = StoreConfig(uri="s3://nowhere-bucket/p", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", path_style=True)
    store = CheckpointStore(config)
    with pytest.raises(StoreUnavailable) as info:
        store.put_lap(make_record(1))
    assert not info.value.permanent and "cannot reach the store" in str(info.value)
    assert "secret" not in str(info.value).lower() and "AKIA" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_missing_bucket_is_a_permanent_config_error(s3_server: Any) -> None:
    config = StoreConfig(uri="s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url, region="us-east-1", path_style=True)
    with pytest.raises(StoreConfigError, match="no-such-bucket-here"):
        CheckpointStore(config).put_lap(make_record(1))


# ---- size ceilings and storage accounting (schema 3) -----------------------------------------------


def test_a_lap_over_max_lap_bytes_is_refused_and_nothing_is_written(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env, max_lap_bytes=2048))
    shas = write_laps(store, 2)
    before = all_keys(s3_client, s3_bucket.name)
    big = make_record(3, shas[-1], payload=0, text="".join(f"{i:08x}" for i in range(2000)))  # ~16 kB, incompressible-ish
    with pytest.raises(CheckpointTooLarge) as info:
        store.put_lap(big)
    e = info.value
    assert e.permanent and (e.lap, e.limit, e.field) == (3, 2048, "maxLapBytes") and e.size > 2048
    assert str(e).startswith(f"lap 3: its checkpoint is {e.size} bytes (compressed), over the limit of 2048 bytes")
    assert "spec.checkpoint.maxLapBytes" in str(e)
    assert all_keys(s3_client, s3_bucket.name) == before  # the store is left as it was


def test_a_lap_that_would_pass_max_run_bytes_is_refused(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env, max_run_bytes=10_000))
    record = make_record(1).model_copy(update={"storage": Storage(bytes=9_900, objects=12)})
    with pytest.raises(CheckpointTooLarge) as info:
        store.put_lap(record)
    e = info.value
    assert e.field == "maxRunBytes" and e.limit == 10_000 and e.size > 10_000
    assert f"the run's checkpoints would reach {e.size} bytes (9900 stored before this lap's record" in str(e)
    assert all_keys(s3_client, s3_bucket.name) == {}
    store.put_lap(make_record(1).model_copy(update={"storage": Storage(bytes=100, objects=1)}))  # under it: written
