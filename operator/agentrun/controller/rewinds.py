"""The shell's survey of a rewind in place (``decide.ReadRewind``): the state through the rewind
point and every tool call sent after it, read from the run's current history in the store, handed to
``decide`` as a ``RewindRead`` (``decide/lifecycle.py`` refuses or applies the rewind)."""

from __future__ import annotations

from typing import Any

from agentrun.checkpoint import errors as ce
from agentrun.checkpoint.schema import RunRef

from . import decide as d


def survey_rewind(store: Any, run: RunRef, a: d.ReadRewind, loc: dict[str, Any]) -> d.RewindRead:
    """Read (in a worker thread) what a rewind to ``a.from_lap`` needs; ``store`` is bound to the
    run's rewinds so far (``CheckpointStore.along``). Errors become the read's ``kind``."""
    back, through = a.from_lap, a.through_lap
    try:
        point: d.CheckpointRead | None = None
        agent_version = outcome = None
        if back >= 1:
            try:
                record, obj = store.get_lap(run, back)
                point = d.CheckpointRead(
                    lap=back, kind="ok", record=record, key=obj.key, sha256=obj.sha256, written_at=obj.written_at,
                    uri=f"s3://{store.config.bucket}/{obj.key}", size=obj.size, **loc)
                agent_version, outcome, totals = record.agent_version, record.outcome.type, record.totals
            except ce.CheckpointNotFound:  # a fork snapshot: the base of a forked run
                state, obj = store.get_snapshot(run, back)
                point = d.CheckpointRead(
                    lap=back, kind="ok", key=obj.key, sha256=obj.sha256, written_at=obj.written_at,
                    uri=f"s3://{store.config.bucket}/{obj.key}", size=obj.size, **loc)
                agent_version = state.agent_version
                outcome = state.last_outcome.type if state.last_outcome else None
                totals = state.totals
        else:
            from agentrun.checkpoint.schema import Totals

            totals = Totals()
        calls = tuple(d.SentCall(lap=lap, call_id=c.call_id, tool=c.tool)
                      for lap, c in store.executed_after(run, back, through))
        calls += tuple(d.SentCall(lap=through + 1, call_id=call_id, tool=tool, unconfirmed=True)
                       for call_id, tool in store.requested_unanswered(run, through + 1))
    except ce.CheckpointNotFound as exc:
        return d.RewindRead(back, through, "missing", error=str(exc))
    except (ce.CorruptCheckpoint, ce.UnsupportedSchemaVersion, ValueError) as exc:
        return d.RewindRead(back, through, "unreadable", error=str(exc))
    except ce.CheckpointError as exc:
        return d.RewindRead(back, through, "unavailable", error=str(exc))
    return d.RewindRead(back, through, "ok", point=point, agent_version=agent_version, totals=totals,
                        outcome=outcome, calls=calls)
