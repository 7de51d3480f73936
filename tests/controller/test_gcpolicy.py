"""The operator's garbage-collector settings (controller/gcpolicy.py): the first threshold raised
at start, what is alive once the watch cache synced frozen, and the controller calling it then."""

from __future__ import annotations

import asyncio
import gc

from agentrun.controller import gcpolicy
from agentrun.controller.config import OperatorConfig
from agentrun.controller.reconciler import Controller


def test_the_first_threshold_is_raised_and_never_lowered():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        gcpolicy.at_start()
        assert gc.get_threshold() == (gcpolicy.GEN0_THRESHOLD, 10, 10)
        gc.set_threshold(50_000, 10, 10)  # set higher by someone else (PYTHON* tuning): kept
        gcpolicy.at_start()
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


def test_after_sync_freezes_what_is_alive():
    try:
        alive = [{"kept": i} for i in range(100)]
        gcpolicy.after_sync()
        assert gc.get_freeze_count() >= len(alive)
    finally:
        gc.unfreeze()


def test_the_controller_calls_on_synced_once_the_cache_has_listed():
    calls: list[int] = []
    c = Controller(OperatorConfig(), on_synced=lambda: calls.append(len(calls)))
    assert Controller(OperatorConfig()).on_synced is None  # tests and embedders: no process-wide effect

    async def main() -> None:
        await c._wait_synced()  # no informers: listed at once

    asyncio.run(main())
    assert calls == [0] and c.synced
