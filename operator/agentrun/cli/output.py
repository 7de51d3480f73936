"""Plain-text output shared by the CLI's commands (pure): kubectl-like columns and durations."""

from __future__ import annotations

from collections.abc import Sequence


def human_duration(seconds: float) -> str:
    """kubectl-style: ``45s``, ``3m12s``, ``2h5m``, ``3d4h`` (two units at most, floor)."""
    s = max(0, int(seconds))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d{h}h" if h else f"{d}d"
    if h:
        return f"{h}h{m}m" if m else f"{h}h"
    if m:
        return f"{m}m{sec}s" if sec else f"{m}m"
    return f"{sec}s"


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """kubectl-like columns: left-aligned, three spaces apart, no trailing spaces."""
    lines = [list(header)] + [list(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
