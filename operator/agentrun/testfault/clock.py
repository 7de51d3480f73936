"""The schedule controller's test clock (docs/scheduling.md, "Testing"). TESTS ONLY.

Like the faults of this package, it is not part of the product: pyproject.toml excludes
``agentrun.testfault`` from the wheel and the image, and the schedule controller imports this
module under ``try: ... except ImportError``, so there its clock is always the real one. Where the
module is present (a source checkout, an editable install), ``AGENTRUN_TEST_CLOCK_FILE`` names a file
holding the time (RFC 3339, e.g. ``2030-01-01T00:00:30Z``) that the schedule controller takes as
"now": an end-to-end test moves it to a scheduled time instead of waiting real minutes. Only the
schedule controller reads it; nothing else of the operator or the lap sees another time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

ENV = "AGENTRUN_TEST_CLOCK_FILE"
"""The test-only switch: the path of the file that holds the time."""


def file_clock(env: Mapping[str, str] | None = None) -> Callable[[], datetime] | None:
    """The clock of ``AGENTRUN_TEST_CLOCK_FILE`` (read on every call), or None when it is not set."""
    path = (os.environ if env is None else env).get(ENV, "")
    if not path:
        return None

    def now() -> datetime:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(64).strip()
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{ENV}: cannot read a time from {path!r}: {exc}") from None
        return t if t.tzinfo else t.replace(tzinfo=UTC)

    return now
