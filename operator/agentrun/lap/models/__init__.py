"""Model providers: ``openai`` (any OpenAI-compatible chat-completions API) and ``scripted``."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from agentrun.api.contract import Env
from agentrun.api.spec import AgentRunSpec, ModelPricing
from agentrun.api.types import format_usd
from agentrun.checkpoint.schema import Usage
from agentrun.lap.interfaces import Model

API_KEY_ENV = Env.MODEL_API_KEY
SCRIPT_FILE_ENV = Env.SCRIPT_FILE
_MILLION = Decimal(1_000_000)


def lap_cost(usage: Usage, pricing: ModelPricing) -> Decimal:
    """Cost of a usage at the spec's per-million-token prices (exact Decimal)."""
    return (
        Decimal(usage.input_tokens) * Decimal(pricing.input_per_million_tokens_usd)
        + Decimal(usage.output_tokens) * Decimal(pricing.output_per_million_tokens_usd)
    ) / _MILLION


def lap_cost_usd(usage: Usage, pricing: ModelPricing) -> str:
    """The lap cost as the canonical money string (6 decimals at most)."""
    return format_usd(lap_cost(usage, pricing))


def make_model(spec: AgentRunSpec, env: Mapping[str, str]) -> Model:
    """The provider the spec names, configured from the environment."""
    model = spec.agent.model
    if model.provider == "scripted":
        from agentrun.lap.models.scripted import ScriptedModel

        return ScriptedModel.from_spec(model, env.get(SCRIPT_FILE_ENV) or None)
    from agentrun.lap.models.openai import OpenAIModel

    return OpenAIModel.from_spec(model, env.get(API_KEY_ENV) or None)
