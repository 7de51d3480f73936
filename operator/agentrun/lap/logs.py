"""Log lines of the lap runner: JSON (default) or text, to stderr, each carrying the run identity
(namespace, name, lap, attempt). Every line goes through :func:`redact` with the secrets known to
the runner (API key, tool header values), so they never reach the logs."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

REDACTED = "[REDACTED]"


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value (4+ chars) replaced by ``[REDACTED]``, longest first."""
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


class LapLogger:
    """A tiny structured logger: ``log(msg, level="info", **fields)``."""

    def __init__(
        self, context: dict[str, Any], fmt: str = "json", stream: TextIO | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.context = dict(context)
        self.fmt = fmt if fmt in ("json", "text") else "json"
        self.stream = stream
        self.secrets: list[str] = list(secrets)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        self.secrets.extend(s for s in secrets if s)

    def format(self, msg: str, level: str, fields: dict[str, Any]) -> str:
        ts = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if self.fmt == "json":
            line = json.dumps({"ts": ts, "level": level, "msg": msg, **self.context, **fields}, default=str)
        else:
            ctx = " ".join(f"{k}={v}" for k, v in {**self.context, **fields}.items())
            line = f"{ts} {level.upper()} {msg} {ctx}"
        return redact(line, self.secrets)

    def __call__(self, msg: str, level: str = "info", **fields: Any) -> None:
        stream = self.stream or sys.stderr
        stream.write(self.format(msg, level, fields) + "\n")
        stream.flush()
