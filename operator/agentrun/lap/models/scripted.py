"""The ``scripted`` provider: the response of lap N is ``script[N-1]``; past the end, a final
answer "script exhausted" (outcome done). Used by tests, demos and benchmarks.

Usage not given in the script is estimated with the window heuristic (input: the window sent,
output: the response), so costs are deterministic and non-zero when prices are set.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agentrun.api.contract import Env
from agentrun.api.spec import ModelSpec, ScriptedResponse
from agentrun.checkpoint.schema import Usage
from agentrun.lap.errors import ConfigError
from agentrun.lap.interfaces import ModelCall, ModelRequest, ModelResponse
from agentrun.lap.keys import normalize_call_ids
from agentrun.lap.window import messages_tokens, text_tokens

if TYPE_CHECKING:
    from pydantic import TypeAdapter

EXHAUSTED = "script exhausted"


@lru_cache(maxsize=1)
def _script_adapter() -> TypeAdapter[list[ScriptedResponse]]:
    # built on first use: only a script file needs it (the spec's script is validated with the spec)
    from pydantic import TypeAdapter

    return TypeAdapter(list[ScriptedResponse])


def load_script_file(path: str) -> list[ScriptedResponse]:
    """Responses from a YAML file: a list of responses, or a mapping with a ``script`` list."""
    import yaml  # only a script file needs YAML; keeps it off the lap's start-up path

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{Env.SCRIPT_FILE} {path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{Env.SCRIPT_FILE} {path}: not valid YAML: {e}") from None
    if isinstance(data, dict):
        data = data.get("script")
    if not isinstance(data, list):
        raise ConfigError(f"{Env.SCRIPT_FILE} {path}: expected a list of responses (or a mapping with 'script')")
    try:
        return _script_adapter().validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{Env.SCRIPT_FILE} {path}: script.{where}: {first['msg']}") from None


class ScriptedModel:
    """Responses from a list, one per lap."""

    def __init__(self, script: list[ScriptedResponse]) -> None:
        self._script = script

    @classmethod
    def from_spec(cls, spec: ModelSpec, script_file: str | None = None) -> ScriptedModel:
        return cls(load_script_file(script_file) if script_file else list(spec.script))

    def complete(self, request: ModelRequest) -> ModelResponse:
        if request.lap > len(self._script):
            step = ScriptedResponse(content=EXHAUSTED)
        else:
            step = self._script[request.lap - 1]
        ids = normalize_call_ids([None] * len(step.tool_calls))
        calls = tuple(ModelCall(id=i, name=c.name, arguments=dict(c.arguments)) for i, c in zip(ids, step.tool_calls))
        if step.usage is not None:
            usage = Usage(input_tokens=step.usage.input_tokens, output_tokens=step.usage.output_tokens)
        else:
            out = text_tokens(step.content) + sum(text_tokens(c.name + json.dumps(c.arguments)) for c in calls)
            usage = Usage(input_tokens=messages_tokens(request.messages), output_tokens=out)
        return ModelResponse(content=step.content, tool_calls=calls, usage=usage)
