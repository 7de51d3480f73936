"""The operator's settings of CPython's cyclic garbage collector (its GOGC, so to speak).

The watch cache holds every run and lap Job as plain dicts decoded from JSON: no reference cycles,
freed by reference counting when a newer version replaces them. The cyclic collector still
traverses them, and everything imported at start (kopf, pydantic, botocore, aiohttp: a few hundred
thousand objects), at each of its full collections, and its default first threshold (700 new
container objects) starts a collection every couple of watch events (a lap Job's event is ~300).

So: a first threshold of :data:`GEN0_THRESHOLD` once ``agentrun operator`` has imported its
modules (a young collection every ~60 watch events), and once the watch cache has listed, what is
alive then (the imports, the listed cache) is moved out of the collector's sight with
:func:`gc.freeze` (CPython's documented way for a long-lived process); the objects of later events
are collected as before: fewer collections, none of them over the long-lived objects (the counts
with and without these settings are in bench/analysis.md).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("agentrun.controller")

#: First-generation threshold (CPython's default: 700). The older generations keep their defaults.
GEN0_THRESHOLD = 20_000


def at_start() -> None:
    """Raise the first threshold (never lower it), before the watch cache's first lists."""
    g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, g0), g1, g2)


def after_sync() -> None:
    """The watch cache has listed: collect once, then freeze what is alive (never traversed again)."""
    gc.collect()
    gc.freeze()
    log.debug("garbage collector: %d objects frozen after the watch cache synced", gc.get_freeze_count())
