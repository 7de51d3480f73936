"""The lap Job's environment, parsed into a LapConfig (pure). See docs/contracts.md."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from agentrun.api.approval import SHA256_HEX_CHARS
from agentrun.api.contract import APPROVAL_DECISIONS, Env, format_rewinds
from agentrun.api.contract import parse_rewinds as contract_rewinds
from agentrun.api.spec import AgentRunSpec
from agentrun.checkpoint.schema import ApprovalDecision, RunRef
from agentrun.lap.errors import ConfigError

DECISIONS = APPROVAL_DECISIONS
_SHA256 = re.compile(f"^[0-9a-f]{{{SHA256_HEX_CHARS}}}$")


@dataclass(frozen=True)
class LapConfig:
    run: RunRef
    lap: int
    attempt: int
    spec: AgentRunSpec
    agent_version: str
    decision: ApprovalDecision | None
    log_format: str
    image: str | None = None
    """AGENTRUN_IMAGE: the lap's own image as the operator set it (None: a Job of an earlier release)."""
    rewinds: tuple[int, ...] = ()
    """AGENTRUN_REWINDS: the run's rewinds in place (``contract.history_of``); () for a run never rewound."""


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw and default is not None:
        return default
    if not raw:
        raise ConfigError(f"{name} is not set")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw[:40]!r}")
    return int(raw)


def parse_spec(raw: str) -> AgentRunSpec:
    """The AgentRun spec from AGENTRUN_SPEC (JSON). Errors name the field."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{Env.SPEC} is not valid JSON ({e.msg} at char {e.pos})") from None
    try:
        return AgentRunSpec.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ConfigError(f"{Env.SPEC}: spec.{where}: {first['msg']}{more}") from None


def parse_decision(env: Mapping[str, str]) -> ApprovalDecision | None:
    raw = env.get(Env.APPROVAL_DECISION, "").strip()
    if not raw:
        return None
    if raw not in DECISIONS:
        raise ConfigError(f"{Env.APPROVAL_DECISION} must be one of {', '.join(DECISIONS)}, got {raw[:40]!r}")
    digests = {}
    for name, field in ((Env.APPROVAL_ARGUMENTS_SHA256, "arguments_sha256"),
                        (Env.APPROVAL_TARGET_SHA256, "target_sha256")):
        value = env.get(name, "").strip().lower()
        if value and not _SHA256.match(value):
            raise ConfigError(f"{name} must be a sha256 ({SHA256_HEX_CHARS} hex digits), got {value[:40]!r}")
        digests[field] = value or None
    return ApprovalDecision(
        call_id=env.get(Env.APPROVAL_CALL_ID, "").strip(),
        decision=raw,
        reason=env.get(Env.APPROVAL_REASON) or None,
        decided_by=env.get(Env.APPROVAL_BY) or None,
        decided_at=_decided_at(env.get(Env.APPROVAL_DECIDED_AT, "")),
        **digests,
    )


def _decided_at(raw: str) -> datetime | None:
    """``AGENTRUN_APPROVAL_DECIDED_AT`` (RFC 3339, with a zone): only where the approval span ends,
    so a value that does not parse is ignored (the span ends at the lap's start), never a failed lap."""
    try:
        when = datetime.fromisoformat(raw.strip()) if raw.strip() else None
    except ValueError:
        return None
    return when if when is not None and when.tzinfo is not None else None


def parse_rewinds(env: Mapping[str, str], lap: int) -> tuple[int, ...]:
    """AGENTRUN_REWINDS; every rewind point is before the lap (the lap is in the newest history)."""
    try:
        rewinds = contract_rewinds(env.get(Env.REWINDS))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if rewinds and max(rewinds) >= lap:
        raise ConfigError(f"{Env.REWINDS}={format_rewinds(rewinds)}: lap {lap} is not after every rewind point")
    return rewinds


def parse_identity(env: Mapping[str, str]) -> tuple[RunRef, int, int]:
    """Run identity, lap and attempt: the part needed to report a failure."""
    run = RunRef(
        namespace=_required(env, Env.NAMESPACE),
        name=_required(env, Env.NAME),
        uid=_required(env, Env.UID),
    )
    return run, _positive_int(env, Env.LAP), _positive_int(env, Env.ATTEMPT, default=1)


def parse_env(env: Mapping[str, str]) -> LapConfig:
    """Everything the lap needs from its environment; ConfigError names the bad variable."""
    run, lap, attempt = parse_identity(env)
    spec = parse_spec(_required(env, Env.SPEC))
    return LapConfig(
        run=run,
        lap=lap,
        attempt=attempt,
        spec=spec,
        agent_version=env.get(Env.AGENT_VERSION, "").strip() or spec.agent.version,
        decision=parse_decision(env),
        log_format=log_format(env),
        image=env.get(Env.IMAGE, "").strip() or None,
        rewinds=parse_rewinds(env, lap),
    )


def log_format(env: Mapping[str, str]) -> str:
    fmt = env.get(Env.LOG_FORMAT, "json").strip() or "json"
    return fmt if fmt in ("json", "text") else "json"
