"""The tools a lap offers: the spec's HTTP tools plus the listed tools of its MCP servers (pure).

:func:`offered_tools` checks the listings against ``spec.agent.mcpServers`` (allow lists, names,
schemas) and :func:`tools_version` compares them with the run's recorded list: a changed listing is
a new version of the run's MCP tools, recorded in the lap record with what changed
(:func:`listing_changes`), which the operator announces with ONE ``ToolsChanged`` Event.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentrun.api.mcp import McpToolRef
from agentrun.api.spec import MCP_TOOL_NAME_PATTERN, AgentSpec, ToolSpec
from agentrun.api.text import truncate
from agentrun.api.types import redact_url
from agentrun.checkpoint.schema import McpServerTools, McpToolList
from agentrun.lap.errors import PermanentLapError
from agentrun.lap.interfaces import OfferedTool

MAX_CHANGES = 32
"""Most lines of ``McpToolList.changes`` (the rest is counted in the last line)."""
_OFFERABLE = re.compile(MCP_TOOL_NAME_PATTERN)


@dataclass(frozen=True)
class ToolSet:
    """The tools of one lap, by the name the model sees."""

    http: tuple[ToolSpec, ...] = ()
    mcp: tuple[McpToolRef, ...] = ()

    def get(self, name: str) -> OfferedTool | None:
        for t in self.http:
            if t.name == name:
                return t
        for m in self.mcp:
            if m.name == name:
                return m
        return None

    def offered(self) -> tuple[OfferedTool, ...]:
        return (*self.http, *self.mcp)

    def names(self) -> list[str]:
        return [t.name for t in self.offered()]


def offered_tools(agent: AgentSpec, listings: list[McpServerTools]) -> tuple[ToolSet, list[str]]:
    """(the lap's tools, names of listed tools left out because the lap cannot offer their names).

    ``listings[i]`` is what ``agent.mcpServers[i]`` listed. An allow-listed name the server does not
    list fails the run (PermanentLapError naming ``spec.agent.mcpServers[i].tools``)."""
    refs: list[McpToolRef] = []
    skipped: list[str] = []
    http_names = {t.name for t in agent.tools}
    for i, (server, listing) in enumerate(zip(agent.mcp_servers, listings, strict=True)):
        listed = {t.name: t for t in listing.tools}
        if server.tools is not None:
            missing = [n for n in server.tools if n not in listed]
            if missing:
                have = ", ".join(sorted(listed)[:20]) or "(none)"
                raise PermanentLapError(
                    f"spec.agent.mcpServers[{i}].tools names {', '.join(repr(n) for n in missing)}, which MCP server "
                    f"'{server.name}' ({redact_url(server.url)}) does not list; it lists: {truncate(have, 1000)}")
        for t in listing.tools:
            if server.tools is not None and t.name not in server.tools:
                continue
            if not _OFFERABLE.fullmatch(t.name):
                skipped.append(f"{server.name}/{t.name}")
                continue
            ref = McpToolRef(server=server, tool=t.name, description=t.description, parameters=t.input_schema)
            if ref.name in http_names:
                raise PermanentLapError(f"tool '{t.name}' of MCP server '{server.name}' is offered as '{ref.name}', "
                                        "the name of a tool in spec.agent.tools; rename that tool")
            refs.append(ref)
    return ToolSet(http=tuple(agent.tools), mcp=tuple(refs)), skipped


def _comparable(servers: list[McpServerTools]) -> list[Any]:
    """What a change of the listings is judged on: each server's name, URL and tools (name,
    description, schema); not the server's name and version it reports."""
    return [[s.server, s.url, sorted(json.dumps([t.name, t.description, t.input_schema], sort_keys=True)
                                    for t in s.tools)] for s in servers]


def listing_changes(before: list[McpServerTools], after: list[McpServerTools]) -> list[str]:
    """What changed between two versions, one line per server and kind, e.g.
    ``ledger: removed lookup_invoice``; at most :data:`MAX_CHANGES` lines."""
    out: list[str] = []
    old = {s.server: s for s in before}
    new = {s.server: s for s in after}
    for name in sorted(old.keys() - new.keys()):
        out.append(f"{name}: server removed")
    for name in sorted(new.keys() - old.keys()):
        out.append(f"{name}: server added ({len(new[name].tools)} tools)")
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        if a.url != b.url:
            out.append(f"{name}: url {redact_url(a.url)} -> {redact_url(b.url)}")
        ta, tb = {t.name: t for t in a.tools}, {t.name: t for t in b.tools}
        for verb, names in (("added", sorted(tb.keys() - ta.keys())), ("removed", sorted(ta.keys() - tb.keys())),
                            ("changed", sorted(n for n in ta.keys() & tb.keys() if ta[n] != tb[n]))):
            if names:
                out.append(truncate(f"{name}: {verb} {', '.join(names)}", 512))
    if len(out) > MAX_CHANGES:
        out = [*out[:MAX_CHANGES - 1], f"... and {len(out) - MAX_CHANGES + 1} more"]
    return out


def tools_version(recorded: McpToolList | None, listings: list[McpServerTools]) -> McpToolList | None:
    """The new version of the run's MCP tools when ``listings`` differ from ``recorded`` (the first
    listing is version 1), else None (the recorded version stands)."""
    if recorded is not None and _comparable(recorded.servers) == _comparable(listings):
        return None
    if recorded is None:
        return McpToolList(version=1, servers=listings)
    return McpToolList(version=recorded.version + 1, servers=listings,
                       changes=listing_changes(recorded.servers, listings))
