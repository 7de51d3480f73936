"""Folding lap records into the run state: a pure function, no I/O.

``fold(state, record)`` is the only way a ``RunState`` advances, both in the lap runner (to build the
state the next lap starts from, and the snapshot every K laps) and on resume (snapshot + the lap
records after it). Folding N records one by one equals folding the snapshot taken at any lap K and
then the records after K.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.checkpoint.errors import CorruptCheckpoint
from agentrun.checkpoint.schema import (
    KEY_SCHEME,
    SCHEMA_VERSION,
    ForkProvenance,
    LapRecord,
    Message,
    RunRef,
    RunState,
    Storage,
)


def initial_state(run: RunRef) -> RunState:
    """The state before lap 1."""
    return RunState(run=run)


def check_chain(state: RunState, record: LapRecord) -> None:
    """Raise ``CorruptCheckpoint`` if ``record`` cannot follow ``state``: another run, a gap in the
    laps, or a ``prevSha256`` that is not the sha256 of the previous lap's object."""
    if record.run != state.run:
        raise CorruptCheckpoint(
            f"lap {record.lap} belongs to run {record.run.namespace}/{record.run.name} "
            f"(uid {record.run.uid}), not to {state.run.namespace}/{state.run.name} (uid {state.run.uid})"
        )
    if record.lap != state.lap + 1:
        raise CorruptCheckpoint(
            f"cannot fold lap {record.lap} onto the state after lap {state.lap}: laps must follow each other"
        )
    if (
        record.prev_sha256 is not None
        and state.last_sha256 is not None
        and record.prev_sha256 != state.last_sha256
    ):
        raise CorruptCheckpoint(
            f"hash chain broken: lap {record.lap} has prevSha256 {record.prev_sha256} but lap "
            f"{state.lap} has sha256 {state.last_sha256}"
        )


def _compact(messages: list[Message], through_lap: int) -> list[Message]:
    """Drop the messages of laps 1..through_lap. Lap-0 messages (the task) are never dropped."""
    return [m for m in messages if m.lap == 0 or m.lap > through_lap]


def fold(state: RunState, record: LapRecord, sha256: str | None = None, size: int | None = None) -> RunState:
    """The state after ``record``. ``sha256`` is the sha256 of the record's stored object (kept as
    ``lastSha256`` so the next lap can chain to it); None when the record is not stored yet.
    ``size``: the stored size of the record's object, added to ``storage`` when the record carries
    the run's storage so far (schema >= 3); records without it keep the state's count."""
    check_chain(state, record)
    storage = state.storage
    if record.storage is not None and size is not None:
        storage = Storage(bytes=record.storage.bytes + size, objects=record.storage.objects + 1)
    messages = [*state.messages, *record.messages]
    summary, pinned, compacted = state.summary, state.pinned_facts, state.compacted_through_lap
    if record.compaction is not None:
        messages = _compact(messages, record.compaction.through_lap)
        summary = record.compaction.summary
        pinned = list(record.compaction.pinned_facts)
        compacted = max(compacted, record.compaction.through_lap)
    pending = state.pending_approval
    if record.approval_decision is not None:
        pending = None
    if record.pending_approval is not None:
        pending = record.pending_approval
    return state.model_copy(
        update={
            "schema_version": SCHEMA_VERSION,
            "agent_version": record.agent_version,
            "lap": record.lap,
            "last_sha256": sha256,
            "summary": summary,
            "pinned_facts": pinned,
            "compacted_through_lap": compacted,
            "messages": messages,
            "plan": list(record.plan) if record.plan is not None else state.plan,
            "pending_approval": pending,
            "last_outcome": record.outcome,
            "totals": record.totals,
            "key_scheme": record.key_scheme,
            "storage": storage,
            "mcp_tools": record.mcp_tools if record.mcp_tools is not None else state.mcp_tools,
        }
    )


def fold_all(
    state: RunState, records: Iterable[LapRecord | tuple[LapRecord, str | None]]
) -> RunState:
    """Fold records (or ``(record, sha256)`` pairs) in order."""
    for item in records:
        record, sha = item if isinstance(item, tuple) else (item, None)
        state = fold(state, record, sha)
    return state


def fork_state(source: RunState, target: RunRef) -> RunState:
    """The fork snapshot of ``target``: the source's state through its lap ``source.lap``, owned by
    ``target`` (so the target's lap ``source.lap + 1`` folds onto it), keeping ``lastSha256`` (the
    next lap's ``prevSha256`` chains onto the source's lap) and recording the provenance. A pending
    approval gets the target's idempotency key: the fork's side effects are its own. A fork is a new
    run, so it uses the current key scheme (``KEY_SCHEME``) whatever the source's; its storage count
    starts at zero (its objects live under its own prefix)."""
    if source.lap < 1:
        raise ValueError("a fork needs a source state of lap 1 or later")
    pending = source.pending_approval
    if pending is not None:
        old = source.run.key_id(source.key_scheme or KEY_SCHEME) + ":"
        key = pending.idempotency_key
        if key.startswith(old):
            new = target.key_id(KEY_SCHEME) + ":"
            pending = pending.model_copy(update={"idempotency_key": new + key[len(old):]})
    return source.model_copy(
        update={
            "schema_version": SCHEMA_VERSION,
            "run": target,
            "pending_approval": pending,
            "key_scheme": KEY_SCHEME,
            "storage": Storage(),
            "forked_from": ForkProvenance(run=source.run, lap=source.lap, sha256=source.last_sha256),
        }
    )
