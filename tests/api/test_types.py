"""The API's value parsers (``agentrun.api.types``)."""

from __future__ import annotations

import pytest

from agentrun.api.types import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("10m", 600.0), ("72h", 259200.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1.5s", 1.5),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(text) == seconds  # remembered: the same answer the second time


@pytest.mark.parametrize("text", ["", "30", "1d", "-5s", "5 s", "s"])
def test_a_refused_duration_is_refused_every_time_and_not_remembered(text: str) -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(text)
    hits = parse_duration.cache_info().hits
    with pytest.raises(ValueError):
        parse_duration(text)
    assert parse_duration.cache_info().hits == hits
