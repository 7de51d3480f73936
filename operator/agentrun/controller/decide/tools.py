"""The run's MCP tools as the operator sees them: the ``ToolsChanged`` Event (pure).

A lap that lists MCP tools different from the run's recorded ones records the new version in its
lap record (``LapRecord.mcpTools``, version > 1, with what changed). The operator reads each lap
record once (``laps.apply_lap``), so the Event is posted once per new version.
"""

from __future__ import annotations

from agentrun.api.reasons import Reason
from agentrun.api.text import escape_controls, truncate
from agentrun.checkpoint.schema import LapRecord

from .context import Ctx

MAX_EVENT_CHANGES_CHARS = 768


def tools_changed_message(rec: LapRecord) -> str | None:
    """The ``ToolsChanged`` Event's message for ``rec``, or None (no new version, or the first listing)."""
    tools = rec.mcp_tools
    if tools is None or tools.version < 2:
        return None
    changes = "; ".join(tools.changes) or "tool definitions changed"
    changes = truncate(escape_controls(changes)[0], MAX_EVENT_CHANGES_CHARS)
    return (f"lap {rec.lap} listed changed MCP tools, recorded as tools version {tools.version} "
            f"(was {tools.version - 1}): {changes}")


def announce_tools_changed(c: Ctx, rec: LapRecord) -> None:
    """Post ONE Normal Event ``ToolsChanged`` when lap ``rec`` recorded a new version of the MCP tools."""
    message = tools_changed_message(rec)
    if message is not None:
        c.event("Normal", Reason.TOOLS_CHANGED, message)
