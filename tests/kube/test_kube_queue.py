"""The work queue (``agentrun.kube.queue``): dedup, one worker per key, per-key backoff, delayed
adds, and its client-go metrics. No cluster, no sleeps. (tests/e2e/test_queue.py is the concurrency
limit on a cluster.)"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from agentrun.kube.queue import RateLimiter, WorkQueue


def test_queue_dedups_a_key_until_it_is_taken():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        for k in ("a", "b", "a", "a", "b"):
            q.add(k)
        assert len(q) == 2
        assert await q.get() == "a"
        assert await q.get() == "b"
        assert len(q) == 0

    asyncio.run(main())


def test_queue_metrics_count_adds_retries_and_the_wait_as_client_go_does():
    """agentrun_workqueue_*: a deduplicated add is not counted, a rate-limited re-add is a retry,
    the wait in the queue is observed when a worker takes the key, depth and delayed are read at
    scrape time."""
    from agentrun.metrics.workqueue import WorkQueueMetrics

    reg = CollectorRegistry()
    m = WorkQueueMetrics(reg)

    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(observer=m)
        m.watch(lambda: q.depth, lambda: q.delayed)
        q.add("a")
        q.add("a")  # deduplicated
        q.add("b")
        assert reg.get_sample_value("agentrun_workqueue_depth") == 2
        assert await q.get() == "a"
        q.add_rate_limited("a")  # the reconcile of "a" failed
        assert reg.get_sample_value("agentrun_workqueue_delayed") == 1
        assert reg.get_sample_value("agentrun_workqueue_depth") == 1
        q.done("a")
        assert await q.get() == "b"

    asyncio.run(main())
    assert reg.get_sample_value("agentrun_workqueue_adds_total") == 2
    assert reg.get_sample_value("agentrun_workqueue_retries_total") == 1
    assert reg.get_sample_value("agentrun_workqueue_queue_duration_seconds_count") == 2


def test_queue_never_hands_a_key_to_two_workers_and_loses_no_add():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("b")
        first = await q.get()
        assert first == "a"
        q.add("a")  # an event while "a" is reconciled
        q.add("a")
        assert len(q) == 1  # only "b": "a" waits for its worker to finish
        assert await q.get() == "b"
        assert len(q) == 0
        q.done("a")  # the worker finished: "a" is queued again, once
        assert len(q) == 1
        assert await q.get() == "a"
        q.done("a")
        q.done("b")
        assert len(q) == 0

    asyncio.run(main())


def test_queue_workers_run_different_keys_concurrently_but_one_key_serially():
    async def main() -> list[tuple[str, str]]:
        q: WorkQueue[str] = WorkQueue()
        log: list[tuple[str, str]] = []
        running: set[str] = set()
        release = {k: asyncio.Event() for k in ("a1", "a2", "b")}
        seen: dict[str, int] = {}

        async def worker() -> None:
            while (key := await q.get()) is not None:
                assert key not in running, f"{key} processed twice at once"
                running.add(key)
                n = seen[key] = seen.get(key, 0) + 1
                log.append(("start", f"{key}{n if key == 'a' else ''}"))
                await release[f"{key}{n}" if key == "a" else key].wait()
                running.discard(key)
                log.append(("end", key))
                q.done(key)

        workers = [asyncio.create_task(worker()) for _ in range(3)]
        q.add("a")
        q.add("b")
        for _ in range(5):
            await asyncio.sleep(0)  # let the workers take the keys (no time passes)
        q.add("a")  # while a is processed
        for _ in range(5):
            await asyncio.sleep(0)
        assert running == {"a", "b"} and seen == {"a": 1, "b": 1}
        release["a1"].set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert seen["a"] == 2  # re-queued after its first reconcile ended, not before
        release["a2"].set()
        release["b"].set()
        for _ in range(10):
            await asyncio.sleep(0)
        q.shut_down()
        await asyncio.gather(*workers)
        return log

    log = asyncio.run(main())
    a_events = [e for e in log if e[1].startswith("a")]
    assert a_events == [("start", "a1"), ("end", "a"), ("start", "a2"), ("end", "a")]


def test_rate_limiter_backs_off_per_key_exponentially_and_forget_resets():
    rl: RateLimiter[str] = RateLimiter(base=0.5, cap=300.0)
    assert [rl.when("x") for _ in range(12)] == [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert rl.when("y") == 0.5 and rl.num_requeues("x") == 12
    rl.forget("x")
    assert rl.num_requeues("x") == 0 and rl.when("x") == 0.5


def test_queue_delayed_adds_keep_the_earliest_and_rate_limited_adds_use_the_backoff():
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(RateLimiter(base=1.0, cap=8.0))
        q.add_after("a", 100)
        q.add_after("a", 300)  # later: ignored
        assert 99 < (q.pending_delay("a") or 0) <= 100
        q.add_after("a", 10)  # earlier: replaces
        assert 9 < (q.pending_delay("a") or 0) <= 10
        assert len(q) == 0
        assert [q.add_rate_limited("b") for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
        assert 0 < (q.pending_delay("b") or 0) <= 1.0  # the earliest pending one stays
        q.forget("b")
        assert q.num_requeues("b") == 0
        q.add_after("c", 0)  # no delay: queued now
        assert len(q) == 1
        q.discard("a")
        assert q.pending_delay("a") is None
        q.shut_down()
        assert q.pending_delay("b") is None

    asyncio.run(main())


def test_a_delayed_add_fires_into_the_queue():
    async def main() -> str | None:
        q: WorkQueue[str] = WorkQueue()
        q.add_after("a", 0.001)
        return await asyncio.wait_for(q.get(), 10)  # waits for the timer, not a fixed time

    assert asyncio.run(main()) == "a"
