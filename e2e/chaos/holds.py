"""A recording tool server that can keep chosen calls in flight.

A fault that needs a running lap (a pod delete or SIGKILL, a kubelet restart) is given a victim by
the plan: one scripted side-effecting call, named by its ``order`` argument (schedule.assign_targets).
The first request carrying that argument is held here, unanswered and not executed, until the runner
has landed the fault and calls ``release``. So the fault finds its lap running, mid-call, however
fast or slow the box is, instead of racing a short lap with a poll (CI, seed 363823: a SIGKILL
planned at 76 % of the laps found only final laps, a second or two long each, and never fired).

A held request that nobody releases is let go after ``max_seconds`` (below the chaos runs' tool
timeout), so a runner bug costs a fault, never a wedged scenario. Only the first arrival of an
order is held: the retried attempt's request (the same key) passes, and is answered from the record.

``count_before_dedup`` (the ``ci`` schedule's mode, issue 36): the example tool server decides under
one lock, after the call's work, whether a key was executed, so two requests of one key can never
both execute there and "executions per key == 1" could not fail against it. In this mode an
execution is counted when a request ARRIVES and no answer is stored for its key yet, before the
server deduplicates: what a tool whose dedup is check-then-act would execute. A lap (or two Jobs of
one lap) sending the same key twice concurrently then shows as a key executed twice. One overlap is
not counted: a retry arriving while the request of a fault's victim (a call held here, whose lap
the runner killed) is still at the tool, the one call in flight at a crash that the README's
Limitations leave to the tool's own Idempotency-Key handling; it is counted in ``overlapsAbandoned``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

_EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)
import tool_server  # noqa: E402

#: How long a held request waits for its release at most (the chaos runs' tool timeout is 60 s).
HOLD_MAX_SECONDS = 45.0


class HoldingRecorder(tool_server.Recorder):
    def __init__(self, orders: set[str] | frozenset[str] = frozenset(), max_seconds: float = HOLD_MAX_SECONDS,
                 *, count_before_dedup: bool = False) -> None:
        super().__init__()
        self.max_seconds = max_seconds
        self._waiting: set[str] = set(orders)  # orders still to be held at their first arrival
        self._gates: dict[str, threading.Event] = {}  # order -> its gate, once it arrived
        self.held_since: dict[str, float] = {}  # order -> when its request arrived (held now)
        self.let_go: dict[str, str] = {}  # order -> "released" | "timed out"
        self.count_before_dedup = count_before_dedup
        self.started: Counter[str] = Counter()  # key -> executions counted at arrival (count_before_dedup)
        self.overlaps_abandoned: Counter[str] = Counter()  # key -> arrivals over a fault victim's call
        self._victim_keys: set[str] = set()  # keys of held requests (their lap is the fault's victim)

    def admit(self, key: str | None, args: Any) -> None:
        order = args.get("order") if isinstance(args, dict) else None
        with self.lock:
            if self.count_before_dedup and key and key not in self.responses:
                # the request is listed in flight already (the server appends it before admit)
                others = sum(1 for e in self.inflight if e.get("idempotencyKey") == key) - 1
                if others > 0 and key in self._victim_keys:
                    self.overlaps_abandoned[key] += 1
                else:
                    self.started[key] += 1
            if not isinstance(order, str) or order not in self._waiting:
                return
            if key:
                self._victim_keys.add(key)
            self._waiting.discard(order)
            gate = self._gates[order] = threading.Event()
            self.held_since[order] = time.time()
        released = gate.wait(self.max_seconds)
        with self.lock:
            self.held_since.pop(order, None)
            self.let_go[order] = "released" if released else "timed out"

    def record(self) -> dict[str, Any]:
        """The server's record; with ``count_before_dedup``, each key's executions are those counted
        at arrival, and a request the server answered from its record while another of its key was
        still executing is moved from replays to executions (so requests == executions + replays +
        refusals still holds)."""
        rec = super().record()
        if not self.count_before_dedup:
            return rec
        with self.lock:
            started, abandoned = dict(self.started), dict(self.overlaps_abandoned)
        tot = rec["totals"]
        for k, v in rec["keys"].items():
            extra = min(max(0, started.get(k, 0) - v["executions"]), v["replays"])
            v["executionsAtDedup"] = v["executions"]
            v["executions"] += extra
            v["replays"] -= extra
            v["overlapsAbandoned"] = abandoned.get(k, 0)
            tot["executions"] += extra
            tot["replays"] -= extra
        tot["overlapsAbandoned"] = sum(abandoned.values())
        rec["mode"] = "count-before-dedup"
        return rec

    def held(self) -> dict[str, float]:
        """The orders held right now, with the time each arrived."""
        with self.lock:
            return dict(self.held_since)

    def release(self, order: str) -> None:
        """Let the held request of ``order`` go on (it is then executed, as a tool finishes a call it
        had begun even when the caller is gone); a no-op if it has not arrived or was let go."""
        with self.lock:
            self._waiting.discard(order)
            gate = self._gates.get(order)
        if gate is not None:
            gate.set()

    def release_all(self) -> None:
        with self.lock:
            self._waiting.clear()
            gates = list(self._gates.values())
        for g in gates:
            g.set()
