"""Small shared types of the AgentRun API: durations, money, names, the model base class.

Kubernetes API conventions avoid floats in specs, so money is a decimal *string*
("0.25", "12.5") and durations are Go-style strings ("30s", "10m", "72h", "1h30m").
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
USD_PATTERN = r"^[0-9]{1,9}(\.[0-9]{1,9})?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
TOOL_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"
# A Secret's name (DNS subdomain, RFC 1123) and a key of its data (what the API server accepts).
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# A Kubernetes resource quantity such as 100m, 0.5, 256Mi, 1G, 1e3.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[munkMGTPE]|[KMGTPE]i)?$"

Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN, max_length=32)]
USD = Annotated[str, StringConstraints(pattern=USD_PATTERN, max_length=24)]

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")


@functools.lru_cache(maxsize=1024)
def parse_duration(value: str) -> float:
    """Return the number of seconds in a Go-style duration string such as ``1h30m``. Remembered per
    string (a run's few durations are read on every reconcile; a refused one is not remembered)."""
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"invalid duration {value!r}: use a number and a unit, e.g. 30s, 10m, 72h")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))


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


def parse_time(value: Any) -> datetime | None:
    """A time as the API server writes it (RFC 3339, ``...Z``, fractions allowed) or a datetime;
    None when unset or malformed. A naive time is taken as UTC."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str) and value:
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def parse_usd(value: str | None) -> Decimal | None:
    """Decimal value of a money string, or None."""
    return None if value is None else Decimal(value)


def format_usd(value: Decimal) -> str:
    """Canonical money string: at most 6 decimals, no exponent, no trailing zeros beyond 2."""
    q = value.quantize(Decimal("0.000001"))
    text = format(q, "f").rstrip("0")
    if "." not in text:
        return text + ".00"
    whole, frac = text.split(".")
    return f"{whole}.{frac.ljust(2, '0')}"


class APIModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields refused. Descriptions are
    ``Field(description=...)`` (the CRDs' schemas; ``crdgen.undocumented_fields`` finds a field
    without one), never attribute docstrings: pydantic reads those by parsing each model's module
    source (``use_attribute_docstrings``), CPU that every process importing the models (a lap pod's
    start) would pay for descriptions the generated CRDs do not use."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
    )

    def to_api(self) -> dict[str, Any]:
        """The wire form (camelCase, no unset optional fields)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path`` of a URL, for messages: no user info (credentials), no query
    string (tokens), no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"
