"""Model providers: ``openai`` (any OpenAI-compatible chat-completions API) and ``scripted``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agentrun.api.contract import Env
from agentrun.api.spec import AgentRunSpec
from agentrun.lap.cost import lap_cost, lap_cost_usd
from agentrun.lap.interfaces import Model

__all__ = ["API_KEY_ENV", "SCRIPT_FILE_ENV", "lap_cost", "lap_cost_usd", "make_model"]

API_KEY_ENV = Env.MODEL_API_KEY
SCRIPT_FILE_ENV = Env.SCRIPT_FILE
def make_model(
    spec: AgentRunSpec, env: Mapping[str, str], trace: Callable[[], Mapping[str, str]] | None = None,
) -> Model:
    """The provider the spec names, configured from the environment; ``trace``: the trace context
    each request carries (``Tracer.headers``)."""
    model = spec.agent.model
    if model.provider == "scripted":
        from agentrun.lap.models.scripted import ScriptedModel

        return ScriptedModel.from_spec(model, env.get(SCRIPT_FILE_ENV) or None)
    from agentrun.lap.models.openai import OpenAIModel
    from agentrun.lap.netguard import rules_from_env

    return OpenAIModel.from_spec(model, env.get(API_KEY_ENV) or None, rules_from_env(env), trace)
