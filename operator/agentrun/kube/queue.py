"""A work queue: a rate-limited, deduplicating queue of keys, in the manner of
client-go's ``workqueue`` (``Type`` + ``DelayingQueue`` + ``RateLimitingQueue``).

- ``add(key)``: a key is queued at most once (dedup); a key being processed is not handed to a
  second worker: it is queued again when its worker calls ``done(key)``, so one run is never
  reconciled by two workers at once and an event during a reconcile is never lost.
- ``add_after(key, seconds)``: queue later; of several pending delays the earliest wins.
- ``add_rate_limited(key)``: queue after the key's own exponential backoff (``RateLimiter``: base
  doubling per consecutive failure, capped); ``forget(key)`` after a success resets it.

Single-threaded: every method is called on the event loop. The clock is the loop's. An optional
:class:`QueueObserver` sees what client-go's workqueue metrics count (adds, retries, the time a
key waited in the queue); ``depth`` and ``delayed`` are read at scrape time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)

#: Per-key exponential backoff after a failed reconcile: first delay, cap (seconds).
ERROR_BACKOFF_SECONDS = (0.5, 300.0)


class RateLimiter(Generic[K]):
    """Per-key exponential failure backoff (client-go's ItemExponentialFailureRateLimiter)."""

    def __init__(self, base: float = ERROR_BACKOFF_SECONDS[0], cap: float = ERROR_BACKOFF_SECONDS[1]) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        """The delay before the next try of ``key``, counting this failure."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return float(min(self.cap, self.base * 2.0 ** min(n, 32)))

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class QueueObserver(Protocol):
    def added(self) -> None: ...  # a key entered the queue (not deduplicated away)

    def retried(self) -> None: ...  # a key was re-queued after a failure (rate-limited)

    def waited(self, seconds: float) -> None: ...  # a key left the queue for a worker after this long


class WorkQueue(Generic[K]):
    def __init__(self, limiter: RateLimiter[K] | None = None, observer: QueueObserver | None = None) -> None:
        self.limiter: RateLimiter[K] = limiter or RateLimiter()
        self.observer = observer
        self._queued_at: dict[K, float] = {}
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # queued, or to be queued again when its processing ends
        self._processing: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}  # key -> (due, handle)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutdown = False

    # ------------------------------------------------------------------ adding

    def add(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if self.observer is not None:
            self.observer.added()
        if key in self._processing:
            return  # queued again by done()
        self._enqueue(key)

    def add_after(self, key: K, seconds: float) -> None:
        if self._shutdown:
            return
        if seconds <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + seconds
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return  # an earlier one is pending
            pending[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its backoff; returns the delay."""
        delay = self.limiter.when(key)
        if self.observer is not None:
            self.observer.retried()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: its backoff starts over."""
        self.limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.limiter.num_requeues(key)

    def discard(self, key: K) -> None:
        """Drop everything about ``key`` (the run is gone): pending delays and backoff. A worker
        processing it finishes normally."""
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        self.limiter.forget(key)
        if key in self._dirty and key not in self._processing:
            self._dirty.discard(key)
            self._queued_at.pop(key, None)
            try:
                self._queue.remove(key)
            except ValueError:
                pass

    @property
    def depth(self) -> int:
        """Keys waiting for a worker (client-go's ``workqueue_depth``)."""
        return len(self._queue)

    @property
    def delayed(self) -> int:
        """Keys waiting for a requeue delay or a backoff to pass."""
        return len(self._timers)

    def _enqueue(self, key: K) -> None:
        self._queue.append(key)
        self._queued_at[key] = self._now()
        self._wake()

    @staticmethod
    def _now() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:  # no loop (a unit test adding before it runs one)
            return 0.0

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    # ------------------------------------------------------------------ processing

    async def get(self) -> K | None:
        """The next key to process (now marked processing), or None once shut down."""
        while not self._queue:
            if self._shutdown:
                return None
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and self._queue:
                    self._wake()  # pass the wake-up on
                raise
        key = self._queue.popleft()
        queued_at = self._queued_at.pop(key, None)
        if self.observer is not None and queued_at is not None:
            self.observer.waited(max(0.0, self._now() - queued_at))
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """Processing of ``key`` ended; if it was added meanwhile, it is queued again."""
        self._processing.discard(key)
        if key in self._dirty:
            self._enqueue(key)

    def shut_down(self) -> None:
        self._shutdown = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ introspection

    @property
    def shutting_down(self) -> bool:
        return self._shutdown

    def __len__(self) -> int:
        return len(self._queue)

    def pending_delay(self, key: K) -> float | None:
        """Seconds until a delayed add of ``key`` fires, if one is pending."""
        pending = self._timers.get(key)
        if pending is None:
            return None
        return pending[0] - asyncio.get_running_loop().time()
