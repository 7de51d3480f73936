"""Helpers shared by the e2e test modules."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
