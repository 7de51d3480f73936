"""A run's trace in a tracing UI: the link the run explorer (and anything else) shows (pure).

One trace per run: its trace id is the run's uid's 128 bits (``agentrun.api.contract.run_trace_id``),
recorded by the operator in ``status.traceId`` while its tracing is on. A link is made from a URL
template with ``{trace_id}`` in it (the inbox's ``--trace-url-template`` /
``AGENTRUN_TRACE_URL_TEMPLATE``, chart ``inbox.traceUrlTemplate``, e.g.
``https://jaeger.example/trace/{trace_id}``).
"""

from __future__ import annotations

import re
from typing import Any

from agentrun.api.contract import run_trace_id

PLACEHOLDER = "{trace_id}"
MAX_TEMPLATE = 512
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def check_template(template: str) -> str:
    """``template`` if it is a usable trace URL template: http(s), with ``{trace_id}``, at most
    MAX_TEMPLATE characters, no whitespace or quotes; else ValueError naming what is wrong."""
    if len(template) > MAX_TEMPLATE:
        raise ValueError(f"the trace URL template is longer than {MAX_TEMPLATE} characters")
    if not template.startswith(("https://", "http://")):
        raise ValueError("the trace URL template must begin with https:// or http://")
    if PLACEHOLDER not in template:
        raise ValueError(f"the trace URL template must contain {PLACEHOLDER}")
    if any(c.isspace() or c in "\"'<>`\\" or ord(c) < 32 for c in template):
        raise ValueError("the trace URL template may not contain whitespace, quotes, backslashes or angle brackets")
    return template


def trace_of(run: dict[str, Any], template: str | None) -> tuple[str | None, str | None]:
    """(trace id, link) of a run: ``status.traceId`` when the operator recorded it (32 hex digits);
    else, when a template is configured (tracing is on where the explorer links to a tracing UI),
    the id derived from the uid; else (None, None). The link needs the template."""
    recorded = (run.get("status") or {}).get("traceId")
    uid = str((run.get("metadata") or {}).get("uid") or "")
    if isinstance(recorded, str) and _HEX32.match(recorded):
        tid: str | None = recorded
    elif template and uid:
        tid = run_trace_id(uid)
    else:
        tid = None
    return tid, (template.replace(PLACEHOLDER, tid) if template and tid else None)
