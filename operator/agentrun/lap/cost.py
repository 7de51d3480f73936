"""The cost of a lap's model usage at the spec's prices (pure: no provider, no I/O)."""

from __future__ import annotations

from decimal import Decimal

from agentrun.api.spec import ModelPricing
from agentrun.api.types import format_usd
from agentrun.checkpoint.schema import Usage

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
