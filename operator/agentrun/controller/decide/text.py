"""Text as status, Events, logs and terminals may hold it: user values bounded and escaped, the
cause of a failed lap taken from its pod's termination message with secrets redacted."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

from agentrun.api.approval import MAX_DECIDED_BY_CHARS, MAX_REASON_CHARS, SHA256_HEX_CHARS
from agentrun.api.contract import FAILURE_LOG_ERROR_FIELD, FAILURE_LOG_MESSAGES
from agentrun.api.text import escape_controls, truncate
from agentrun.api.types import redact_url

_SHA256 = re.compile(f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$")


def shown(value: str, limit: int = 64) -> str:
    """A user-supplied value quoted for a message: control characters escaped, cut at ``limit``."""
    return '"' + truncate(escape_controls(value)[0], limit) + '"'


def bounded_reason(text: str | None) -> tuple[str | None, int]:
    """A reason as status may hold it (control characters escaped, at most MAX_REASON_CHARS), and
    how many control characters were escaped."""
    if not text:
        return None, 0
    escaped, n = escape_controls(text)
    return truncate(escaped, MAX_REASON_CHARS), n


def bounded_decider(text: str | None) -> str | None:
    """``decidedBy`` as status may hold it."""
    if not text:
        return None
    return truncate(escape_controls(text)[0], MAX_DECIDED_BY_CHARS)


# ----------------------------------------------------------------------------- the cause of a failed lap

MAX_CAUSE_CHARS = 300
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
_SECRET_PATTERNS = (
    # Authorization headers and bearer tokens
    re.compile(r"(?i)\b(authorization|proxy-authorization)\s*[:=]\s*\S+(?:\s+\S+)?"),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    # key=value / key: value pairs whose key names a secret
    re.compile(r"(?i)\b([a-z0-9_-]*(?:api[_-]?key|secret|token|password|passwd|credential)[a-z0-9_-]*)"
               r"(\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|\S+)"),
    # well-known key formats: AWS access key ids, OpenAI-style keys
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"),
)
REDACTED = "[REDACTED]"


def _redacted_url(m: re.Match[str]) -> str:
    try:
        return redact_url(m.group())
    except ValueError:  # a malformed port: keep nothing of it
        return REDACTED


def redact_secrets(text: str) -> str:
    """``text`` with what looks like a secret replaced by ``[REDACTED]``: credentials in URLs
    (user info, query), Authorization/bearer values, ``<...key|secret|token|password...>=value``
    pairs, AWS access key ids and ``sk-`` keys. The runner redacts the secrets it knows; this is the
    second line for text it did not write (a crash, the kubelet)."""
    text = _URL.sub(_redacted_url, text)
    for i, pattern in enumerate(_SECRET_PATTERNS):
        if i == 2:
            text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        elif i == 0:
            text = pattern.sub(lambda m: f"{m.group(1)}: {REDACTED}", text)
        else:
            text = pattern.sub(REDACTED, text)
    return text


def _runner_error(line: str) -> str | None:
    """The ``error`` of the runner's "lap failed" log line (JSON or text format), else None."""
    if line.startswith("{"):
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        if isinstance(entry, dict) and entry.get("msg") in FAILURE_LOG_MESSAGES and entry.get(FAILURE_LOG_ERROR_FIELD):
            return str(entry[FAILURE_LOG_ERROR_FIELD])
        return None
    for msg in FAILURE_LOG_MESSAGES:
        marker = f" {FAILURE_LOG_ERROR_FIELD}="
        if f" {msg} " in line and marker in line:
            return line.split(marker, 1)[1]
    return None


def cause_text(text: Any, limit: int = MAX_CAUSE_CHARS) -> str | None:
    """A failure cause the lap pod wrote (its termination message's ``error``, its attempt report's
    ``message``) as status, Events and terminals may hold it: the pod's image is the run author's,
    so the text is theirs — its first line, secrets redacted, control characters escaped, at most
    ``limit`` characters; None for no text."""
    if not text or not str(text).strip():
        return None
    first = str(text).strip().splitlines()[0]
    return truncate(escape_controls(redact_secrets(first))[0], limit)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9: the name of the signal a container's exit code 128+N says it died of."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _runner_log_line(line: str) -> bool:
    """Whether ``line`` is one of the runner's structured log lines (JSON with ``msg``)."""
    if not line.startswith("{"):
        return False
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and "msg" in entry


def lap_cause(termination_message: str | None, limit: int = MAX_CAUSE_CHARS) -> str | None:
    """The cause of a failed lap from its pod's termination message, for status, Events and
    ``agentrun runs``: the runner's own ``error`` of its last "lap failed" line when there is one
    (the message is the log tail), else the last non-empty line (a crash, the kubelet's text). One
    line, control characters escaped, secrets redacted, at most ``limit`` characters; None for no text."""
    if not termination_message:
        return None
    lines = [ln.strip() for ln in termination_message.splitlines() if ln.strip()]
    if not lines:
        return None
    cause = next((e for e in map(_runner_error, reversed(lines)) if e), None)
    if cause is None:
        # the runner's own progress lines ("lap starting", ...) are no cause: a lap killed mid-way
        # leaves one as its last line; the crash's text is the last line that is not one
        others = [ln for ln in lines if not _runner_log_line(ln)]
        if not others:
            return None
        cause = others[-1]
    cause = cause.strip().splitlines()[0] if cause.strip() else lines[-1]
    return truncate(escape_controls(redact_secrets(cause))[0], limit)
