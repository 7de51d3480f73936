"""Validation of tool arguments against the tool's JSON Schema, before any call."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from agentrun.api.mcp import McpToolRef
from agentrun.api.spec import ToolSpec
from agentrun.lap.errors import ConfigError

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator


@lru_cache(maxsize=256)
def _validator(schema_json: str, where: str) -> Draft202012Validator:
    # jsonschema (~60 ms of imports) is loaded on first use: a spec without tools never needs it
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    schema = json.loads(schema_json)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise ConfigError(f"{where} is not a valid JSON Schema: {e.message}") from e
    return Draft202012Validator(schema)


def schema_field(tool: ToolSpec | McpToolRef) -> str:
    """Where a tool's schema comes from, as an error names it."""
    if isinstance(tool, McpToolRef):
        return (f"the inputSchema of tool '{tool.tool}' listed by MCP server '{tool.server.name}' "
                "(spec.agent.mcpServers)")
    return f"spec.agent.tools[{tool.name}].parameters"


def check_tool_schemas(tools: list[ToolSpec] | list[McpToolRef]) -> None:
    """Raise ConfigError naming the first tool whose parameters schema is invalid."""
    for t in tools:
        _validator(json.dumps(t.parameters, sort_keys=True), schema_field(t))


def argument_errors(tool: ToolSpec | McpToolRef, arguments: dict[str, Any]) -> str | None:
    """A readable description of what is wrong with the arguments, or None if they validate."""
    validator = _validator(json.dumps(tool.parameters, sort_keys=True), schema_field(tool))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors[:5]
    )
