"""The operator's logs (``agentrun.controller.logs``): JSON lines carrying the run's fields."""

from __future__ import annotations

import json
import logging

from agentrun.controller.logs import JSONFormatter, run_logger


def test_json_log_lines_carry_run_fields():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("agentrun.controller")
    logger.addHandler(handler)
    try:
        run_logger("ns", "run", 3).warning("hello %s", "x")
    finally:
        logger.removeHandler(handler)
    doc = json.loads(JSONFormatter().format(records[0]))
    assert doc["msg"] == "hello x" and doc["namespace"] == "ns" and doc["name"] == "run"
    assert doc["lap"] == 3 and "attempt" in doc and doc["attempt"] is None
