"""The imperative shell of one lap: load the state, run the step, write the checkpoint, classify
the exit. Used by ``agentrun lap`` and, in-process, by the benchmark."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.checkpoint.errors import (
    CheckpointError,
    CheckpointNotFound,
    CorruptCheckpoint,
    LapAlreadyCheckpointed,
    StoreConfigError,
    UnsupportedSchemaVersion,
)
from agentrun.checkpoint.schema import LapRecord, RunRef
from agentrun.checkpoint.store import CheckpointStore, StoredObject
from agentrun.lap.config import LapConfig
from agentrun.lap.errors import LapError, PermanentLapError
from agentrun.lap.interfaces import Model, ToolRunner
from agentrun.lap.logs import LapLogger, redact
from agentrun.lap.models import API_KEY_ENV, make_model
from agentrun.lap.step import Effects, LapContext, run_lap
from agentrun.lap.tools.http import HTTPToolRunner
from agentrun.lap.tools.validate import check_tool_schemas

EXIT_OK = 0
EXIT_PERMANENT = 2
EXIT_ALREADY = 3
EXIT_RETRYABLE = 75
S3_SECRET_ENV = "AGENTRUN_S3_CREDENTIALS_SECRET"
"""Name (never the value) of the Secret the S3 credentials come from, for messages; set by the operator."""
_ACCESS_DENIED = ("(HTTP 403)", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                  "ExpiredToken", "no usable credentials")


def explain_store_refusal(message: str, env: Mapping[str, str]) -> str | None:
    """A hint naming where the S3 credentials come from, when the store refused them; else None."""
    if not any(code in message for code in _ACCESS_DENIED):
        return None
    secret = env.get(S3_SECRET_ENV, "")
    if secret:
        return (f"the store refused the credentials from Secret {secret!r} (keys AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY): check the keys and the bucket policy")
    return ("the store refused the credentials of the lap pod's standard AWS chain (no "
            "spec.checkpoint.credentialsSecretName / operator S3 Secret is set): check the pod's identity")


@dataclass(frozen=True)
class LapExit:
    code: int
    message: str
    record: LapRecord | None = None
    stored: StoredObject | None = None


class StoreJournal:
    """The Journal of one lap, backed by the store's conditional journal objects."""

    def __init__(self, store: CheckpointStore, run: RunRef, lap: int, agent_version: str) -> None:
        self.store, self.run, self.lap, self.agent_version = store, run, lap, agent_version

    def get(self, name: str) -> dict[str, Any] | None:
        return self.store.get_journal(self.run, self.lap, name)

    def put(self, name: str, body: dict[str, Any]) -> bool:
        return self.store.put_journal(self.run, self.lap, name, body, agent_version=self.agent_version)


def exit_for(error: BaseException) -> int:
    """Exit code of a failure: 2 if permanent, else 75."""
    return EXIT_PERMANENT if getattr(error, "permanent", False) else EXIT_RETRYABLE


def report_failure(
    store: CheckpointStore | None, cfg_run: RunRef, lap: int, attempt: int, code: int, message: str,
    agent_version: str | None, log: LapLogger, reason: str | None = None,
) -> None:
    """Best effort ``attempts/<lap>-<attempt>.json``; the message is already redacted. ``reason``
    (e.g. ``CheckpointUnreadable``) lets the operator name the failure in its condition."""
    if store is None:
        return
    body = {"exitCode": code, "exitClass": "permanent" if code == EXIT_PERMANENT else "retryable", "message": message}
    if reason:
        body["reason"] = reason
    try:
        store.put_attempt_failure(cfg_run, lap, attempt, body, agent_version=agent_version)
    except Exception as e:  # best effort by contract
        log("attempt report not written", level="warning", error=type(e).__name__)


def execute_lap(
    cfg: LapConfig,
    store: CheckpointStore,
    env: Mapping[str, str],
    log: LapLogger,
    crash: Callable[[str], None] = lambda point: None,
    model: Model | None = None,
    tools: ToolRunner | None = None,
) -> LapExit:
    """Run lap ``cfg.lap`` once and write its checkpoint. Never raises: returns the exit."""
    log.add_secrets([env.get(API_KEY_ENV, "")])
    try:
        return _execute(cfg, store, env, log, crash, model, tools)
    except LapAlreadyCheckpointed:
        msg = f"lap {cfg.lap} already checkpointed by another writer; nothing written"
        log(msg, level="warning")
        return LapExit(EXIT_ALREADY, msg)
    except (CorruptCheckpoint, UnsupportedSchemaVersion) as e:  # permanent; named for the operator
        code, message, reason = exit_for(e), redact(str(e), log.secrets), "CheckpointUnreadable"
    except StoreConfigError as e:  # permanent: bucket missing, access denied, no credentials
        code, message, reason = exit_for(e), redact(str(e), log.secrets), None
        hint = explain_store_refusal(message, env)
        if hint:
            message, reason = f"{message}; {hint}", "StoreAccessDenied"
    except (LapError, CheckpointError) as e:
        code, message, reason = exit_for(e), redact(str(e), log.secrets), None
    except Exception as e:  # an unexpected bug: retryable by the contract (any other exit)
        code, message, reason = EXIT_RETRYABLE, redact(f"unexpected {type(e).__name__}: {e}", log.secrets), None
    log("lap failed", level="error", exit_code=code, error=message)
    report_failure(store, cfg.run, cfg.lap, cfg.attempt, code, message, cfg.agent_version, log, reason=reason)
    return LapExit(code, message)


def _execute(
    cfg: LapConfig, store: CheckpointStore, env: Mapping[str, str], log: LapLogger,
    crash: Callable[[str], None], model: Model | None, tools: ToolRunner | None,
) -> LapExit:
    if store.head_lap(cfg.run, cfg.lap) is not None:
        msg = f"lap {cfg.lap} already checkpointed; nothing to do"
        log(msg)
        return LapExit(EXIT_ALREADY, msg)
    try:
        state = store.load_state(cfg.run, through_lap=cfg.lap - 1).state
    except CheckpointNotFound as e:
        raise PermanentLapError(f"lap {cfg.lap} cannot run: a checkpoint it needs is missing ({e})") from None
    check_tool_schemas(cfg.spec.agent.tools)
    if tools is None:
        http_tools = HTTPToolRunner.from_env(cfg.spec.agent.tools, env)
        log.add_secrets(http_tools.secrets())
        tools = http_tools
    model = model or make_model(cfg.spec, env)
    ctx = LapContext(
        spec=cfg.spec, run=cfg.run, lap=cfg.lap, attempt=cfg.attempt,
        agent_version=cfg.agent_version, decision=cfg.decision,
    )
    fx = Effects(model=model, tools=tools, journal=StoreJournal(store, cfg.run, cfg.lap, cfg.agent_version), crash=crash, log=log)
    record = run_lap(ctx, state, fx)
    crash("before-checkpoint")
    stored = store.put_lap(record, state_before=state)
    crash("after-checkpoint")
    log("lap checkpointed", key=stored.key, sha256=stored.sha256, bytes=stored.size, outcome=record.outcome.type,
        cost_usd=record.cost_usd, input_tokens=record.usage.input_tokens, output_tokens=record.usage.output_tokens)
    return LapExit(EXIT_OK, f"lap {cfg.lap} checkpointed: {record.outcome.type}", record, stored)
