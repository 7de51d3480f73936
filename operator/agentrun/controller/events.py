"""Which of a run's routine Events are posted: client-go's spam filter, for the lap-cadence ones.

Posted every time, a routine Event (``LapCheckpointed``) is one more API request per lap and one
more object in etcd per lap for the event TTL, of which nobody reads past the last few. client-go's recorder rate-limits every Event per source and object with a token bucket
(``EventSourceObjectSpamFilter``: a burst of 25, then one per 5 minutes). This applies that bucket
to the routine reasons only (``api.reasons.ROUTINE_EVENT_REASONS``); every other Event (a failure,
a retry, an approval requested or decided, a suspension) is always posted. A suppressed Event is still logged and
counted (``agentrun_events_suppressed_total{reason}``); the run's status says the lap as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentrun.api.reasons import ROUTINE_EVENT_REASONS

Key = tuple[str, str]

#: client-go's defaults (tools/record: defaultSpamBurst, defaultSpamQPS = 1/300).
BURST, REFILL_SECONDS = 25, 300.0
#: Runs whose buckets are kept; past it the bucket touched longest ago is dropped (that run starts
#: again with a full bucket, as its bucket would be after 2 hours without an Event).
LIMIT = 100_000


class EventBudget:
    """A token bucket per run for the routine Events (``ROUTINE_EVENT_REASONS``)."""

    def __init__(self, burst: int = BURST, refill_seconds: float = REFILL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, limit: int = LIMIT) -> None:
        self.burst, self.refill_seconds, self.clock, self.limit = burst, refill_seconds, clock, limit
        self._buckets: dict[Key, tuple[float, float]] = {}  # run -> (tokens, when counted)

    def allow(self, key: Key, reason: str) -> bool:
        """Whether an Event of ``reason`` about run ``key`` is posted now (a routine one takes a token)."""
        if reason not in ROUTINE_EVENT_REASONS:
            return True
        now = self.clock()
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / self.refill_seconds)
        allowed = tokens >= 1.0
        if self._buckets.pop(key, None) is None and len(self._buckets) >= self.limit:
            del self._buckets[next(iter(self._buckets))]  # insertion order: the one touched longest ago
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)  # (re)inserted last
        return allowed

    def forget(self, key: Key) -> None:
        self._buckets.pop(key, None)

    def __len__(self) -> int:
        return len(self._buckets)
