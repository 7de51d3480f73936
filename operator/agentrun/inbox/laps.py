"""What the checkpoint store says about a waiting run: the full arguments of the pending call and
the run's recent laps (the model's words and the tool results that led to the call).

The store is read with the inbox's own S3 credentials, but only for a run the person could GET
(the caller reads the run impersonating them first): the API server decides who sees which run.
Lap records are immutable, so they are cached by (uid, lap). Never raises: an unreadable store is
a message on the page.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from agentrun.api.approval import StoredCall, approval_lap
from agentrun.checkpoint.trace import one_line

MAX_TEXT = 600  # characters of one message or result shown
MAX_ARGS = 200  # characters of a tool call's arguments in a lap summary


@dataclass(frozen=True)
class LapSummary:
    lap: int
    outcome: str
    cost_usd: str
    said: tuple[str, ...]  # the assistant's words, one line each, bounded
    tools: tuple[tuple[str, str, str, str], ...]  # (tool, status, arguments, result), bounded


def summarize(record: Any) -> LapSummary:
    """A lap record as the page shows it (pure)."""
    import json

    said = tuple(one_line(m.content, MAX_TEXT) for m in record.messages if m.role == "assistant" and m.content)
    tools = tuple(
        (one_line(c.tool, 80), c.status,
         one_line(json.dumps(c.arguments, sort_keys=True, ensure_ascii=False), MAX_ARGS),
         one_line(c.result, MAX_TEXT))
        for c in record.tool_calls
    )
    return LapSummary(lap=record.lap, outcome=record.outcome.type, cost_usd=str(record.cost_usd), said=said,
                      tools=tools)


class LapReader:
    """Reads and caches lap records; ``recent`` and ``pending_call`` for one run dict."""

    def __init__(self, env: dict[str, str] | None = None, cache_size: int = 512) -> None:
        self.env = dict(os.environ if env is None else env)
        # (record, stored object) by the lap object's key (a rewound run: its history's)
        self._cache: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._stores: dict[tuple[Any, ...], Any] = {}  # one client per store location (making one is costly)
        self._lock = threading.Lock()
        self.cache_size = cache_size

    def _store(self, run: dict[str, Any]) -> tuple[Any, Any]:
        from agentrun.checkpoint.locate import open_located, resolve_store, rewinds_of
        from agentrun.checkpoint.schema import RunRef

        meta = run.get("metadata") or {}
        where = resolve_store({}, self.env, run)
        if not where["uri"]:
            raise LookupError("no checkpoint store known for this run")
        ref = RunRef(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""))
        key = (where["uri"], where["endpoint"], where["region"], bool(where["pathStyle"]))
        with self._lock:
            store = self._stores.get(key)
        if store is None:
            store = open_located(where)
            with self._lock:
                if len(self._stores) > 64:
                    self._stores.clear()
                self._stores[key] = store
        return store.along(rewinds_of(run)), ref

    def _lap(self, store: Any, ref: Any, lap: int) -> Any:
        return self._lap_stored(store, ref, lap)[0]

    def _lap_stored(self, store: Any, ref: Any, lap: int) -> tuple[Any, Any]:
        """(LapRecord, StoredObject) of one lap, cached (lap records are immutable)."""
        key = store.lap_key(ref, lap)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        pair = store.get_lap(ref, lap)
        with self._lock:
            self._cache[key] = pair
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return pair  # type: ignore[no-any-return]

    def history(self, run: dict[str, Any], count: int) -> tuple[list[tuple[Any, Any]], str | None]:
        """The run's last ``count`` laps as ``(LapRecord, StoredObject)`` pairs, oldest first (the
        pairs ``CheckpointStore.iter_laps`` yields, which ``agentrun trace`` prints), and an error
        message. Laps this run never checkpointed (those before a fork's lap) are skipped."""
        from agentrun.checkpoint.errors import CheckpointNotFound

        last = int((run.get("status") or {}).get("lap") or 0)
        if last < 1:
            return [], None
        out = []
        try:
            store, ref = self._store(run)
            for n in range(max(1, last - count + 1), last + 1):
                try:
                    out.append(self._lap_stored(store, ref, n))
                except CheckpointNotFound:
                    continue
        except Exception as e:  # store missing, credentials, network, corrupt: say so on the page
            return out, f"checkpoint store not read: {type(e).__name__}: {one_line(str(e), 300)}"
        return out, None

    def read(self, run: dict[str, Any], count: int = 3) -> tuple[StoredCall, list[LapSummary], str | None]:
        """(the pending call, the last ``count`` laps up to the approval's lap, an error message)."""
        lap = approval_lap(run)
        if lap is None:
            return StoredCall(error="the run has no lap yet"), [], None
        try:
            store, ref = self._store(run)
            laps = []
            for n in range(max(1, lap - count + 1), lap + 1):
                laps.append(self._lap(store, ref, n))
        except Exception as e:  # store missing, credentials, network, corrupt: say so on the page
            msg = f"checkpoint store not read: {type(e).__name__}: {one_line(str(e), 300)}"
            return StoredCall(error=msg), [], msg
        return StoredCall.of(laps[-1]), [summarize(r) for r in laps], None
