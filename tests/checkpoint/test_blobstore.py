"""The ``BlobStore`` conformance suite: every backend passes the same tests. S3 (``S3BlobStore``,
the store's own botocore client) against the real S3 servers over HTTP, moto and versitygw, listing
in pages of two keys so that every listing crosses pages; and the in-memory backend
(``MemoryBlobStore``). Then the checkpoint store on each backend: the fence, the sha256 check and
the errors naming the object are the store's, above the interface."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint.blobstore import BlobStore, MemoryBlobStore
from agentrun.checkpoint.codec import encode_object
from agentrun.checkpoint.errors import CheckpointNotFound, CorruptCheckpoint, LapAlreadyCheckpointed
from agentrun.checkpoint.s3store import S3BlobStore
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

BACKENDS = ["memory", pytest.param("moto", marks=pytest.mark.s3), pytest.param("versitygw", marks=pytest.mark.s3)]
GZIP = b"\x1f\x8b\x08\x00" + bytes(range(256))  # gzip magic: stored and read back as bytes, never decoded


@pytest.fixture(params=BACKENDS)
def blobs(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return MemoryBlobStore()
    server = request.getfixturevalue(f"{request.param}_s3_server")
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    server.client().create_bucket(Bucket=bucket)
    config = StoreConfig(uri=f"s3://{bucket}/c", endpoint_url=server.endpoint_url, region=server.region,
                         path_style=True)
    return S3BlobStore(config, page_size=2)


def test_a_missing_key_is_not_found_naming_it(blobs: BlobStore) -> None:
    with pytest.raises(CheckpointNotFound, match="checkpoint c/none.json not found") as err:
        blobs.get("c/none.json")
    assert err.value.key == "c/none.json" and not err.value.permanent
    assert blobs.head("c/none.json") is None


@pytest.mark.parametrize("key", ["c/laps/00000001.json", "c/journal/00000001/call:1.tool~x.json"])
def test_an_object_reads_back_as_written(blobs: BlobStore, key: str) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    assert blobs.put(key, GZIP, {"sha256": "ab" * 32, "encoding": "gzip"}, "application/gzip") is True
    got = blobs.get(key)
    assert (got.key, got.data, got.size) == (key, GZIP, len(GZIP))
    assert dict(got.metadata) == {"sha256": "ab" * 32, "encoding": "gzip"}
    assert got.last_modified is not None and before <= got.last_modified <= datetime.now(UTC) + timedelta(seconds=5)
    head = blobs.head(key)
    assert head is not None and (head.key, head.size, dict(head.metadata)) == (key, len(GZIP), dict(got.metadata))


def test_a_create_only_put_of_an_existing_key_is_refused_and_the_first_object_stays(blobs: BlobStore) -> None:
    assert blobs.put("c/k", b"first", {"sha256": "1"}, "application/json") is True
    assert blobs.put("c/k", b"second", {"sha256": "2"}, "application/json") is False
    got = blobs.get("c/k")
    assert (got.data, dict(got.metadata)) == (b"first", {"sha256": "1"})


def test_an_overwrite_replaces_the_object(blobs: BlobStore) -> None:
    assert blobs.put("c/k", b"first", {"sha256": "1"}, "application/json", if_absent=False) is True
    assert blobs.put("c/k", b"second!", {"sha256": "2"}, "application/json", if_absent=False) is True
    got = blobs.get("c/k")
    assert (got.data, got.size, dict(got.metadata)) == (b"second!", 7, {"sha256": "2"})


def test_racing_create_only_puts_exactly_one_wins(blobs: BlobStore) -> None:
    n = 8
    start = threading.Barrier(n)
    won: list[int] = []

    def write(i: int) -> None:
        start.wait()
        if blobs.put("c/race", f"writer {i}".encode(), {"sha256": str(i)}, "application/json"):
            won.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, won
    assert blobs.get("c/race").data == f"writer {won[0]}".encode()


def test_list_keys_is_the_prefix_in_order_after_start_after(blobs: BlobStore) -> None:
    keys = ["c/a/00000003.json", "c/a/00000001.json", "c/a/00000002.json", "c/ab/00000001.json",
            "c/a/00000010.json", "c/b/00000001.json", "d/a/00000001.json"]
    for k in keys:
        blobs.put(k, b"x", {}, "application/json")
    mine = ["c/a/00000001.json", "c/a/00000002.json", "c/a/00000003.json", "c/a/00000010.json"]
    assert list(blobs.list_keys("c/a/")) == mine
    assert list(blobs.list_keys("c/a/", start_after="c/a/00000001.json")) == mine[1:]
    assert list(blobs.list_keys("c/a/", start_after="c/a/00000003.json")) == mine[3:]
    assert list(blobs.list_keys("c/a/", start_after="c/a/00000010.json")) == []
    assert list(blobs.list_keys("c/a")) == [*mine, "c/ab/00000001.json"]
    assert list(blobs.list_keys("c/z/")) == []


def test_delete_removes_the_keys_and_an_absent_key_is_no_error(blobs: BlobStore) -> None:
    for k in ("c/1", "c/2", "c/3"):
        blobs.put(k, b"x", {}, "application/json")
    assert blobs.delete(["c/1", "c/3", "c/never-written"]) == []
    assert list(blobs.list_keys("c/")) == ["c/2"]
    with pytest.raises(CheckpointNotFound):
        blobs.get("c/1")
    assert blobs.delete([]) == []


# ---- the checkpoint store above each backend --------------------------------------------------


def _store(blobs: BlobStore) -> CheckpointStore:
    config = blobs.config if isinstance(blobs, S3BlobStore) else StoreConfig(uri="s3://memory/c")
    return CheckpointStore(config, blobs=blobs)


def test_the_store_fences_laps_on_every_backend(blobs: BlobStore) -> None:
    store = _store(blobs)
    first = store.put_lap(make_record(1))
    assert store.put_lap(make_record(1)).sha256 == first.sha256  # a retry whose first try landed
    with pytest.raises(LapAlreadyCheckpointed, match=store.lap_key(RUN, 1)):
        store.put_lap(make_record(1).model_copy(update={"attempt": 2}))  # a zombie's lap
    store.put_lap(make_record(2, first.sha256))
    loaded = store.load_state(RUN)
    assert loaded.state.lap == 2 and loaded.objects_read == 2
    assert store.latest_lap(RUN) == 2 and store.has_state(RUN, 2) and not store.has_state(RUN, 3)
    assert store.get_lap(RUN, 1)[0] == make_record(1)


def test_a_corrupt_object_is_refused_naming_it_on_every_backend(blobs: BlobStore) -> None:
    store = _store(blobs)
    key = store.lap_key(RUN, 1)
    blobs.put(key, encode_object(make_record(1).to_api()), {"sha256": "0" * 64}, "application/gzip")
    with pytest.raises(CorruptCheckpoint, match=f"checkpoint {key}: sha256 of its") as err:
        store.get_lap(RUN, 1)
    assert err.value.key == key and err.value.permanent
    with pytest.raises(CheckpointNotFound, match=store.lap_key(RUN, 2)):
        store.get_lap(RUN, 2)


def test_journal_attempts_and_delete_run_on_every_backend(blobs: BlobStore) -> None:
    store = _store(blobs)
    assert store.put_journal(RUN, 1, "call-1", {"result": "ours"}) is True
    assert store.put_journal(RUN, 1, "call-1", {"result": "theirs"}) is False
    assert store.get_journal(RUN, 1, "call-1") == {"result": "ours"}
    store.put_attempt_failure(RUN, 1, 1, {"message": "one"})
    store.put_attempt_failure(RUN, 1, 1, {"message": "two"})  # best effort, overwrites
    assert store.get_attempt_failure(RUN, 1, 1) == {"message": "two"}
    store.put_lap(make_record(1))
    assert store.delete_journal(RUN, 1) == 1 and store.get_journal(RUN, 1, "call-1") is None
    assert store.delete_run(RUN) == 2 and store.latest_lap(RUN) == 0



def test_an_object_bigger_than_the_layout_allows_is_refused_before_it_is_read(blobs: BlobStore, monkeypatch) -> None:
    """A compromised lap can write any object its credentials allow; the operator must not read a
    huge one into memory: every backend refuses it as corrupt, naming the key (the bound is lowered
    here so the test stores little)."""
    from agentrun.checkpoint import blobstore, s3store

    monkeypatch.setattr(blobstore, "MAX_STORED_BYTES", 64)
    monkeypatch.setattr(s3store, "MAX_STORED_BYTES", 64)
    blobs.put("big/k", b"x" * 65, {}, "application/json")
    with pytest.raises(CorruptCheckpoint, match="checkpoint object big/k is 65 bytes"):
        blobs.get("big/k")
    blobs.put("small/k", b"x" * 64, {}, "application/json")
    assert blobs.get("small/k").data == b"x" * 64
    assert blobs.get("small/k").data == b"x" * 64  # read again: the connection pool still serves
