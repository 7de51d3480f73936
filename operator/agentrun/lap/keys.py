"""Idempotency keys and call ids: stable across replays of a lap, unique across runs.

The key of a tool call is ``<run id>:<lap>:<tool>:<callId>``, e.g.
``r_8f2a1c0d4b7e4f109a512c3d4e5f6a7b:301:extract_invoice:call_2``: the run id carries the run's
full uid (key scheme ``uid128``, checkpoint schema 3). Runs checkpointed before schema 3 keep the
scheme they started with (``uid8``: ``r_8f2a1c0d:...``, 32 bits of the uid); the scheme is part of
the run's checkpointed state (``keyScheme``), so a run's keys never change across an upgrade. The
call id comes from the model response, which is journaled before any tool call, so a replayed lap
sees the same ids and derives the same keys.
"""

from __future__ import annotations

from agentrun.api.contract import CALL_ID_PATTERN, MODEL_JOURNAL_NAME, tool_journal_name
from agentrun.checkpoint.schema import KEY_SCHEME, RunRef

__all__ = ["CALL_ID_PATTERN", "MCP_TOOLS_JOURNAL_NAME", "MODEL_JOURNAL_NAME", "approved_journal_name", "idempotency_key", "normalize_call_ids",
           "tool_journal_name"]


def idempotency_key(run: RunRef, lap: int, tool: str, call_id: str, scheme: str = KEY_SCHEME, history: int = 0) -> str:
    """The idempotency key of a tool call; the same inputs always give the same key. A lap of a
    later history of the run (a rewind in place, ``contract.history_of``) has its own keys,
    ``<run id>.h<history>:<lap>:<tool>:<callId>``: a call of the new history is a new call, never
    answered by a tool from its record of an abandoned history's call of the same lap and id."""
    run_id = run.key_id(scheme) + (f".h{history}" if history else "")
    return f"{run_id}:{lap}:{tool}:{call_id}"


def normalize_call_ids(raw_ids: list[str | None]) -> list[str]:
    """Call ids safe for object names and unique within the response.

    An id that is missing, not ``[A-Za-z0-9_-]{1,64}`` or a duplicate of an earlier one is replaced
    by ``call_<n>`` (n: 1-based position). Applied before the model response is journaled, so the
    ids a replay sees are these.
    """
    out: list[str] = []
    for i, rid in enumerate(raw_ids, start=1):
        cid = rid if rid is not None and CALL_ID_PATTERN.match(rid) else f"call_{i}"
        suffix = 0
        while cid in out:
            suffix += 1
            cid = f"call_{i}" if suffix == 1 else f"call_{i}_{suffix}"
        out.append(cid)
    return out


def approved_journal_name(call_id: str) -> str:
    """Journal entry of the approved call of the previous lap, executed in this lap.

    Distinct from :func:`tool_journal_name` because this lap's model may reuse the same call id.
    """
    return f"tool-approved-{call_id}"


MCP_TOOLS_JOURNAL_NAME = "mcp-tools"
"""The journal entry of the lap's MCP tool listing: a replay of the lap offers the same tools."""
