"""``agentrun gc``'s store side (cli/gc.py) against the real S3 servers of the store's tests (moto
and versitygw): the listing by run prefix with object counts and bytes, and deleting one prefix."""

from __future__ import annotations

from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.cli.gc import _list_store, orphans

pytestmark = pytest.mark.s3


def test_gc_lists_run_prefixes_of_a_real_store_and_deletes_only_what_it_is_told(s3_bucket: Any, s3_client: Any) -> None:
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env))
    other = RunRef(namespace="billing", name="other", uid="0000aaaa-0000-0000-0000-000000000000")
    store.put_lap(make_record(1))
    store.put_lap(make_record(1, run=other))
    store.put_journal(other, 1, "call-1", {"result": "x"})
    s3_client.put_object(Bucket=s3_bucket.name, Key="checkpoints/.agentrun-probe/leftover", Body=b"p")
    usages = {u.uid: u for u in _list_store(store, None)}
    assert set(usages) == {RUN.uid, other.uid}
    sizes = {o["Key"]: o["Size"] for o in s3_client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    assert usages[other.uid].objects == 2
    assert usages[other.uid].bytes == sum(v for k, v in sizes.items() if f"/{other.uid}/" in k)
    assert [u.uid for u in _list_store(store, "nobody")] == []
    (orphan,) = orphans(usages.values(), {RUN.uid})
    assert store.delete_run(RunRef(namespace=orphan.namespace, name=orphan.name, uid=orphan.uid)) == 2
    assert [u.uid for u in _list_store(store, None)] == [RUN.uid]
