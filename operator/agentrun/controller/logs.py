"""Structured logs: one JSON object per line with namespace, name, lap and attempt on every line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

RUN_FIELDS = ("namespace", "name", "lap", "attempt")
# LogRecord attributes holding them ("name" is taken by the logger's name)
_ATTR = {"namespace": "run_namespace", "name": "run_name", "lap": "lap", "attempt": "attempt"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None) or {}
        for key in RUN_FIELDS:
            value = getattr(record, _ATTR[key], None)
            if value is None and key in ("namespace", "name"):
                value = ref.get(key)
            doc[key] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        parts = [f"{k}={getattr(record, _ATTR[k])}" for k in RUN_FIELDS if getattr(record, _ATTR[k], None) is not None]
        return base + (" " + " ".join(parts) if parts else "")


def setup_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    """Configure the root logger (Kopf's loggers included)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # neither formatter shows a record's thread, process or source line: not gathered per record
    # (the logging HOWTO's "Optimization")
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    root.setLevel(level)
    # httpx logs every request line with its URL at INFO: a webhook URL (a secret) must not reach the log
    for noisy in ("kubernetes", "urllib3", "botocore", "boto3", "aiohttp.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_logger(namespace: str, name: str, lap: int | None = None, attempt: int | None = None) -> logging.LoggerAdapter[logging.Logger]:
    return logging.LoggerAdapter(
        logging.getLogger("agentrun.controller"),
        {"run_namespace": namespace, "run_name": name, "lap": lap, "attempt": attempt},
    )
