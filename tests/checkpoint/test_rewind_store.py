"""A run rewound in place (``agentrun retry --from-lap N``): the laps it redoes are a new history of
the run, stored under ``histories/<h>/`` (docs/contracts.md "Histories"), so that every put stays
create-only, and every reader bound to the run's rewinds (``CheckpointStore.along``) sees the new
history: the resume, the operator's lap reads, trace, fork, the journal of a redone lap."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from ckpt_builders import RUN, T0, make_record

from agentrun.api.contract import MAX_LAP, format_rewinds, history_dir, history_of, parse_rewinds
from agentrun.checkpoint.blobstore import MemoryBlobStore
from agentrun.checkpoint.errors import CorruptCheckpoint
from agentrun.checkpoint.schema import LapRecord, RunRef, ToolCallRecord
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.keys import idempotency_key


@pytest.fixture(params=["memory", pytest.param("moto", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest) -> CheckpointStore:
    config = StoreConfig(uri="s3://bucket/c", snapshot_every=2)
    if request.param == "memory":
        return CheckpointStore(config, blobs=MemoryBlobStore())
    server = request.getfixturevalue("moto_s3_server")
    bucket = f"rw-{uuid.uuid4().hex[:20]}"
    server.client().create_bucket(Bucket=bucket)
    return CheckpointStore(StoreConfig(uri=f"s3://{bucket}/c", endpoint_url=server.endpoint_url, region=server.region,
                                       path_style=True, snapshot_every=2))


def _objects(store: CheckpointStore) -> dict[str, bytes]:
    return {k: store.blobs.get(k).data for k in store.blobs.list_keys("c/")}


def _write(store: CheckpointStore, laps: range, prev: str | None, text: str = "") -> str | None:
    for lap in laps:
        rec = make_record(lap, prev, text=f"lap {lap}{text}")
        state = store.load_state(RUN, through_lap=lap - 1).state
        prev = store.put_lap(rec, state_before=state).sha256
    return prev


def _history0(store: CheckpointStore, n: int) -> list[str]:
    shas: list[str] = []
    prev = None
    for lap in range(1, n + 1):
        prev = store.put_lap(make_record(lap, prev, text=f"lap {lap}")).sha256
        shas.append(prev)
    return shas


def test_the_redone_laps_are_a_new_history_and_nothing_is_overwritten(store: CheckpointStore) -> None:
    shas = _history0(store, 5)
    before = _objects(store)
    rewound = store.along((2,))
    rewound.put_rewind(RUN)
    _write(rewound, range(3, 5), shas[1], text=" again")
    after = _objects(store)
    assert {k: after[k] for k in before} == before, "no object of the abandoned history changed"
    new = sorted(set(after) - set(before))
    prefix = store.run_prefix(RUN)
    assert new == [prefix + "histories/001/laps/00000003.json", prefix + "histories/001/laps/00000004.json",
                   prefix + "histories/001/snapshots/00000004.json", prefix + "rewinds/001.json"]
    assert rewound.latest_lap(RUN) == 4 and store.latest_lap(RUN) == 5
    assert [r.messages[0].content for r, _ in rewound.iter_laps(RUN)] == [
        "lap 1", "lap 2", "lap 3 again", "lap 4 again"]
    assert [r.lap for r, _ in rewound.iter_laps(RUN, start=2)] == [2, 3, 4]
    state = rewound.load_state(RUN).state  # the hash chain goes on across the rewind: lap 3 points at lap 2
    assert state.lap == 4 and state.messages[-2].content == "lap 4 again"
    assert rewound.get_lap(RUN, 3)[0].prev_sha256 == shas[1]
    slow = rewound.load_state(RUN, through_lap=3)
    assert slow.state.messages[-2].content == "lap 3 again"


def test_a_resume_reads_the_new_historys_snapshot_not_the_abandoned_one(store: CheckpointStore) -> None:
    shas = _history0(store, 4)
    rewound = store.along((2,))
    _write(rewound, range(3, 5), shas[1], text=" again")
    res = rewound.load_state(RUN, through_lap=4)
    assert res.keys_read == (store.run_prefix(RUN) + "histories/001/snapshots/00000004.json",)
    assert res.state.messages[-2].content == "lap 4 again"
    assert store.load_state(RUN, through_lap=4).state.messages[-2].content == "lap 4"


def test_right_after_a_rewind_the_run_stands_at_its_point(store: CheckpointStore) -> None:
    _history0(store, 5)
    rewound = store.along((3,))
    assert rewound.latest_lap(RUN) == 3
    assert [r.lap for r, _ in rewound.iter_laps(RUN)] == [1, 2, 3]
    assert rewound.load_state(RUN).state.lap == 3
    assert not rewound.has_state(RUN, 4) and store.has_state(RUN, 4)


def test_a_redone_lap_has_its_own_journal_and_attempt_reports(store: CheckpointStore) -> None:
    _history0(store, 2)
    assert store.put_journal(RUN, 3, "model", {"content": "abandoned"})  # the lap that failed, then the rewind
    store.put_attempt_failure(RUN, 3, 1, {"message": "tool down"})
    rewound = store.along((2,))
    assert rewound.get_journal(RUN, 3, "model") is None and rewound.get_attempt_failure(RUN, 3, 1) is None
    assert rewound.put_journal(RUN, 3, "model", {"content": "new"})
    assert rewound.get_journal(RUN, 3, "model") == {"content": "new"}
    assert store.get_journal(RUN, 3, "model") == {"content": "abandoned"}


def test_two_rewinds_each_lap_from_the_history_that_holds_it(store: CheckpointStore) -> None:
    shas = _history0(store, 6)
    first = store.along((4,))
    first.put_rewind(RUN)
    _write(first, range(5, 7), shas[3], text=" h1")
    second = store.along((4, 2))
    second.put_rewind(RUN)
    _write(second, range(3, 6), shas[1], text=" h2")
    assert [r.messages[0].content for r, _ in second.iter_laps(RUN)] == ["lap 1", "lap 2", "lap 3 h2", "lap 4 h2",
                                                                         "lap 5 h2"]
    assert second.latest_lap(RUN) == 5 and first.latest_lap(RUN) == 6
    assert store.read_rewinds(RUN) == (4, 2)
    assert second.load_state(RUN).state.totals.laps == 5


def test_the_markers_tell_a_reader_without_status_the_rewinds(store: CheckpointStore) -> None:
    assert store.read_rewinds(RUN) == ()
    store.along((3, 1)).put_rewind(RUN)  # history 1 never ran a lap: no marker; it holds no lap either
    assert store.read_rewinds(RUN) == (MAX_LAP, 1)
    assert history_of((MAX_LAP, 1), 5) == 2 and history_of((MAX_LAP, 1), 1) == 0
    store.along((3, 1)).put_rewind(RUN)  # the same marker again: a no-op
    with pytest.raises(CorruptCheckpoint, match="another rewind point holds history 2"):
        store.along((3, 2)).put_rewind(RUN)
    store.along(()).put_rewind(RUN)  # never rewound: nothing to write


def test_a_fork_of_a_rewound_run_copies_its_current_history(store: CheckpointStore) -> None:
    shas = _history0(store, 4)
    rewound = store.along((2,))
    rewound.put_rewind(RUN)
    last = _write(rewound, range(3, 5), shas[1], text=" again")
    target = RunRef(namespace=RUN.namespace, name="fork", uid="11111111-2222-3333-4444-555555555555")
    state, _ = store.fork(RUN, 4, target)
    assert state.last_sha256 == last and state.messages[-2].content == "lap 4 again"


def _sent(lap: int, call_id: str, tool: str, sent: bool = True) -> ToolCallRecord:
    return ToolCallRecord(call_id=call_id, tool=tool, idempotency_key=f"k:{lap}:{call_id}", status="ok",
                          started_at=T0 + timedelta(seconds=lap) if sent else None)


def test_the_calls_sent_after_a_lap_come_from_the_records_and_the_unfinished_laps_journal(store: CheckpointStore) -> None:
    prev = None
    for lap in range(1, 4):
        rec: LapRecord = make_record(lap, prev)
        if lap == 3:
            rec = rec.model_copy(update={"tool_calls": [*rec.tool_calls, _sent(3, "x_1", "pay", sent=False)]})
        prev = store.put_lap(rec).sha256
    store.put_journal(RUN, 4, "model", {"content": "m"})
    store.put_journal(RUN, 4, "tool-call_9", {"kind": "tool", "record": _sent(4, "call_9", "pay").to_api()})
    got = [(lap, c.call_id, c.tool) for lap, c in store.executed_after(RUN, 1, 3)]
    assert got == [(2, "call_2", "extract_invoice"), (3, "call_3", "extract_invoice"), (4, "call_9", "pay")], \
        "a call never sent (no start time) is not counted; the unfinished lap's journaled call is"
    assert [c.call_id for _, c in store.executed_after(RUN, 3, 3)] == ["call_9"]
    store.put_lap(make_record(4, prev))  # lap 4 was checkpointed after all (stopped before the operator read it)
    assert [(lap, c.call_id) for lap, c in store.executed_after(RUN, 3, 3)] == [(4, "call_4")]


def test_the_layout_and_keys_of_a_run_never_rewound_are_unchanged() -> None:
    assert history_of((), 7) == 0 and history_dir(0) == "" and history_dir(3) == "histories/003/"
    assert [history_of((4, 2), n) for n in range(1, 8)] == [0, 0, 2, 2, 2, 2, 2]
    assert [history_of((2, 4), n) for n in range(1, 8)] == [0, 0, 1, 1, 2, 2, 2]
    assert parse_rewinds(None) == () and parse_rewinds(" 4,2 ") == (4, 2) and format_rewinds((4, 2)) == "4,2"
    for bad in ("x", "1,,2", "-1", ",".join(["1"] * 33)):
        with pytest.raises(ValueError, match="AGENTRUN_REWINDS"):
            parse_rewinds(bad)
    assert idempotency_key(RUN, 3, "pay", "call_1") == f"{RUN.long_id}:3:pay:call_1"
    assert idempotency_key(RUN, 3, "pay", "call_1", history=2) == f"{RUN.long_id}.h2:3:pay:call_1"
    store = CheckpointStore(StoreConfig(uri="s3://bucket/c"), blobs=MemoryBlobStore())
    assert store.along(()) is store and store.lap_key(RUN, 3) == store.along((5,)).lap_key(RUN, 3)
    with pytest.raises(ValueError, match="rewinds"):
        store.along((1,) * 33)


def test_put_lap_of_a_rewound_run_refuses_an_existing_lap_of_its_history(store: CheckpointStore) -> None:
    from agentrun.checkpoint.errors import LapAlreadyCheckpointed

    shas = _history0(store, 3)
    rewound = store.along((1,))
    rewound.put_lap(make_record(2, shas[0], text="new"))
    with pytest.raises(LapAlreadyCheckpointed):
        rewound.put_lap(make_record(2, shas[0], text="other"))


def test_a_call_the_unfinished_laps_model_asked_for_without_a_journaled_answer_may_have_been_sent(
        store: CheckpointStore) -> None:
    """The model response is journaled before any call of it is sent; a call whose answer was not
    journaled may have been sent (the lap stopped in between): the rewind survey counts it."""
    prev = None
    for lap in range(1, 3):
        prev = store.put_lap(make_record(lap, prev)).sha256
    assert store.requested_unanswered(RUN, 3) == []  # no model response journaled: nothing was sent
    store.put_journal(RUN, 3, "model", {"kind": "model", "response": {"content": None, "toolCalls": [
        {"id": "call_1", "name": "lookup", "arguments": {}}, {"id": "call_2", "name": "pay", "arguments": {}}]}})
    store.put_journal(RUN, 3, "tool-call_1", {"kind": "tool", "record": _sent(3, "call_1", "lookup").to_api()})
    assert store.requested_unanswered(RUN, 3) == [("call_2", "pay")]
    store.put_lap(make_record(3, prev))  # checkpointed after all: its record says what was sent
    assert store.requested_unanswered(RUN, 3) == []
