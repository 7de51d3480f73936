"""A resume at a known lap K-1 laps after a snapshot: its parallel reads run on the process's
reader pool (kept between resumes, started again in a forked child), and the in-place unpacking
the store uses on the documents it parses gives the same records as the copying one."""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
from typing import Any

import pytest
from ckpt_builders import RUN, make_record
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.checkpoint import store as store_module
from agentrun.checkpoint.codec import pack_lap, unpack_lap
from agentrun.checkpoint.fold import fold_all, initial_state
from agentrun.checkpoint.schema import LapRecord
from agentrun.checkpoint.store import CheckpointStore, StoreConfig


def _reader_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name.startswith("agentrun-s3-read") and t.ident}


def _store(s3_bucket: Any) -> CheckpointStore:
    return CheckpointStore(StoreConfig.from_env(s3_bucket.env, snapshot_every=10))


def _write(store: CheckpointStore, n: int) -> list[tuple[LapRecord, str]]:
    out, prev = [], None
    for lap in range(1, n + 1):
        record = make_record(lap, prev, pending=lap % 3 == 0)
        prev = store.put_lap(record).sha256
        out.append((record, prev))
    return out


@pytest.mark.s3
def test_resumes_share_the_reader_threads_instead_of_starting_their_own(s3_bucket: Any) -> None:
    store = _store(s3_bucket)
    written = _write(store, 19)
    first = store.load_state(RUN, through_lap=19)  # snapshot 10 and laps 11..19, read in parallel
    readers = _reader_threads()
    assert 1 <= len(readers) <= store_module._RESUME_READERS  # kept after the resume, bounded
    for _ in range(5):
        second = store.load_state(RUN, through_lap=19)
    after = _reader_threads()
    assert readers <= after and len(after) <= store_module._RESUME_READERS  # kept, reused, bounded
    assert first.objects_read == second.objects_read == 10
    assert first.state == second.state
    want = fold_all(initial_state(RUN), written)
    assert first.state.model_dump(exclude={"storage"}) == want.model_dump(exclude={"storage"})


@pytest.mark.s3
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_resumes_on_its_own_reader_threads(s3_bucket: Any) -> None:
    store = _store(s3_bucket)
    _write(store, 19)
    want = store.load_state(RUN, through_lap=19).state  # the parent's pool has started its threads
    assert _reader_threads()
    pid = os.fork()
    if pid == 0:  # the child: the parent's reader threads do not exist here
        code = 1
        try:
            signal.alarm(60)  # a read queued on a pool whose threads are gone would wait forever
            child = _store(s3_bucket)  # its own client: the parent's connections stay the parent's
            got = child.load_state(RUN, through_lap=19)
            code = 0 if got.state == want and got.objects_read == 10 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child: {status}"


_args = st.dictionaries(st.sampled_from(["doc", "n"]), st.one_of(st.text(max_size=10), st.integers()), max_size=2)


@settings(max_examples=100, deadline=None)
@given(lap=st.integers(1, 50), pending=st.booleans(), args=_args)
def test_unpacking_in_place_gives_the_copying_result(lap: int, pending: bool, args: dict[str, Any]) -> None:
    record = make_record(lap, pending=pending)
    calls = [c.model_copy(update={"arguments": args}) for c in record.messages[0].tool_calls]
    record = record.model_copy(update={  # the call record's arguments are the message's: stored once
        "messages": [record.messages[0].model_copy(update={"tool_calls": calls}), *record.messages[1:]],
        "tool_calls": [c.model_copy(update={"arguments": args}) for c in record.tool_calls]})
    packed = json.loads(json.dumps(pack_lap(record.to_api())))
    assert packed["toolCalls"][0]["argumentsFrom"] == "message"
    before = copy.deepcopy(packed)
    copied = unpack_lap(packed, "k")
    assert packed == before  # the default leaves its argument as it is
    in_place = unpack_lap(packed, "k", in_place=True)
    assert in_place == copied
    assert LapRecord.model_validate(in_place) == LapRecord.model_validate(copied)
    for item in in_place.get("toolCalls") or []:  # restored arguments are never the message's object
        for m in in_place["messages"]:
            for c in m.get("toolCalls") or []:
                assert item["arguments"] is not c["arguments"]


@pytest.mark.s3
def test_the_operators_lap_read_is_the_stores_in_a_worker_thread(s3_server: Any, s3_bucket: Any) -> None:
    """The operator reads a lap record through the store's one S3 path (botocore's ``get_object``)
    in a worker thread, off its event loop: the same record and object as ``store.get_lap``, the
    store's errors naming the key or the bucket; ``aclose`` closes the stores it made."""
    import asyncio

    from agentrun.checkpoint.errors import CheckpointNotFound, StoreConfigError
    from agentrun.controller.cache import Cache
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor

    store = _store(s3_bucket)
    stored = store.put_lap(make_record(1))
    sent_in: list[str] = []
    store.client.meta.events.register("before-send.s3.GetObject",
                                      lambda **_: sent_in.append(threading.current_thread().name))
    ex = Executor(OperatorConfig(), None, Cache(on_change=lambda _: None))  # type: ignore[arg-type]

    async def read(s: CheckpointStore, lap: int) -> Any:
        return await ex._get_lap(s, RUN, lap)

    record, got = asyncio.run(read(store, 1))
    assert (record, got.sha256, got.size) == (store.get_lap(RUN, 1)[0], stored.sha256, stored.size)
    assert sent_in[0] != "MainThread" and sent_in[1] == "MainThread"  # the operator's, then the check's own
    with pytest.raises(CheckpointNotFound, match=store.lap_key(RUN, 2)):
        asyncio.run(read(store, 2))
    gone = CheckpointStore(StoreConfig(uri="s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url,
                                       region="us-east-1", path_style=True))
    with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket-here' does not exist"):
        asyncio.run(read(gone, 1))
    closed: list[bool] = []
    ex._stores[("x",)] = type("Closing", (), {"close": lambda self: closed.append(True)})()
    asyncio.run(ex.aclose())
    assert closed == [True] and ex._stores == {}
