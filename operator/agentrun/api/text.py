"""Text safe for status, Events, logs and terminals: control characters escaped, length bounded.
Shared by the controller (``decide``) and the CLI."""

from __future__ import annotations

import re


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# C0 and C1 controls, DEL, line/paragraph separators and the bidirectional overrides (which make a
# terminal show text in another order than it is stored).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> tuple[str, int]:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``, ``\\u202e``),
    and how many there were: safe for status, Events, logs and terminals."""

    def esc(m: re.Match[str]) -> str:
        ch = m.group()
        if ch in _NAMED_ESCAPES:
            return _NAMED_ESCAPES[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _CONTROL.subn(esc, text)


def one_line(text: str, limit: int) -> str:
    """``text`` for one line of a terminal: control characters (newlines included) escaped, cut at ``limit``."""
    return truncate(escape_controls(text)[0], limit)
