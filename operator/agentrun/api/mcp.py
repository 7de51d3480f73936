"""MCP tools as the model, the lap and the operator name them: pure functions over ``spec.agent.mcpServers``.

The model sees a tool ``book`` of server ``ledger`` as ``ledger__book`` (:func:`mcp_tool_name`), so an
MCP tool's name never collides with an HTTP tool's or another server's, and the operator finds the
server of a pending call from the spec alone (:func:`find_mcp_tool`: the approval target binds the
server's URL). ``requiresApproval`` and ``sideEffects`` are shell-style patterns over the server's
own tool name (:func:`matches`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec import AgentSpec, McpServer

MCP_TOOL_SEPARATOR = "__"
"""Between the server's name and its tool's name in the name the model sees."""


def mcp_tool_name(server: str, tool: str) -> str:
    """The name the model sees: ``<server>__<tool>``."""
    return f"{server}{MCP_TOOL_SEPARATOR}{tool}"


def matches(patterns: list[str], tool: str) -> bool:
    """Whether ``tool`` matches one of the shell-style ``patterns`` (case-sensitive)."""
    return any(fnmatchcase(tool, p) for p in patterns)


@dataclass(frozen=True)
class McpToolRef:
    """One MCP tool of a declared server, as the model, the lap and the approval target see it.
    ``description`` and ``parameters`` (the tool's input schema) come from the server's recorded
    listing; the operator, which never lists, leaves them empty."""

    server: McpServer
    tool: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    @property
    def name(self) -> str:
        return mcp_tool_name(self.server.name, self.tool)

    @property
    def side_effects(self) -> bool:
        return matches(self.server.side_effects, self.tool)

    @property
    def requires_approval(self) -> bool:
        return matches(self.server.requires_approval, self.tool)

    def definition(self) -> dict[str, Any]:
        """What decides what a call does (the approval target digest, ``api.approval.tool_definition``):
        the name, the server as declared (url, headersSecretRef, allow list, patterns, timeout, bound)
        and the tool's resolved sideEffects / requiresApproval. Not the listed schema or description:
        the operator binds approvals from the spec alone."""
        return {"name": self.name, "mcp": {**self.server.model_dump(by_alias=True, mode="json"), "tool": self.tool},
                "sideEffects": self.side_effects, "requiresApproval": self.requires_approval}


def find_mcp_tool(agent: AgentSpec, name: str) -> McpToolRef | None:
    """The MCP tool the model-facing ``name`` stands for under ``agent``'s declared servers (its
    allow list respected), or None. Whether the server lists it is the lap's to check."""
    for server in agent.mcp_servers:
        prefix = server.name + MCP_TOOL_SEPARATOR
        if name.startswith(prefix):
            tool = name[len(prefix):]
            if tool and (server.tools is None or tool in server.tools):
                return McpToolRef(server=server, tool=tool)
    return None
