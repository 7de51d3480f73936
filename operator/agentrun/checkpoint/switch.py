"""``AGENTRUN_S3_LEAN_GET``: the lean S3 GET's switch (``checkpoint/s3get.py``), in a module of its
own so that the operator's configuration checks it at start without importing an HTTP client."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

ENV_SWITCH: Final = "AGENTRUN_S3_LEAN_GET"


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """``AGENTRUN_S3_LEAN_GET``: on when unset or ``true`` / ``1`` / ``yes`` / ``on``, off when
    ``false`` / ``0`` / ``no`` / ``off`` (the operator's other switches' words); any other value is
    a ValueError naming the variable (the operator checks it at start)."""
    raw = (os.environ if env is None else env).get(ENV_SWITCH, "")
    value = raw.strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_SWITCH}: expected true/false, got {raw[:64]!r}")
