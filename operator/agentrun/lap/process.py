"""The lap process (``agentrun lap``): exactly one lap of an AgentRun, configured by the environment,
ending in an exit code (``run_from_env``; the process entry is ``agentrun.lap.entry``, its click
command ``agentrun.lap.command``).

Exit codes (docs/contracts.md): 0 checkpoint written; 3 lap already checkpointed; 75 retryable;
2 permanent. Needs no Kubernetes API access (imports neither kubernetes nor kopf) and imports no click.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from agentrun.api.contract import (
    FAILURE_LOG_ERROR_FIELD,
    FAILURE_LOG_MESSAGES,
    MAX_TERMINATION_MESSAGE_CHARS,
    TERMINATION_MESSAGE_PATH,
    Env,
    ExitCode,
)
from agentrun.checkpoint.errors import CheckpointError
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.config import log_format, parse_env, parse_identity, parse_rewinds
from agentrun.lap.errors import LapError
from agentrun.lap.logs import LapLogger, redact
from agentrun.lap.models import API_KEY_ENV
from agentrun.lap.netguard import guard_store_connections, rules_from_env
from agentrun.lap.runner import EXIT_PERMANENT, TERMINATING, LapExit, execute_lap, exit_for, report_failure
from agentrun.lap.tracing import ClosingTracer, tracer_from_env
from agentrun.lap.tracing.semconv import LAP_SPAN, lap_attributes, lap_result

CRASH_ENV = Env.TEST_CRASH_AT
"""TEST HOOK: kill this process with SIGKILL at a named point of the lap (see docs/lap-runner.md)."""


def crash_hook(env: Mapping[str, str]) -> Callable[[str], None]:
    """The one place ``AGENTRUN_TEST_CRASH_AT`` is read: SIGKILL ourselves at that point."""
    target = env.get(CRASH_ENV, "").strip()

    def crash(point: str) -> None:
        if target and point == target:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return crash


def write_termination_message(message: str, path: str) -> bool:
    """Best effort: the cause of a failed lap, one line, into the container's termination message
    file when it exists (the kubelet creates it; never outside a pod), as the JSON line the runner
    logs last (``{"msg": "lap failed", "error": ...}``). True if written."""
    line = (message.strip().splitlines() or [""])[0]
    if len(line) > MAX_TERMINATION_MESSAGE_CHARS:
        line = line[: MAX_TERMINATION_MESSAGE_CHARS - 1] + "…"
    if not line or not os.path.isfile(path):
        return False
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"msg": FAILURE_LOG_MESSAGES[0], FAILURE_LOG_ERROR_FIELD: line},
                               ensure_ascii=False) + "\n")
    except OSError:
        return False
    return True


def install_sigterm() -> None:
    """SIGTERM (the Job deleted with a grace period: a cancel, a passed deadline) sets
    :data:`~agentrun.lap.runner.TERMINATING` instead of killing the process: the journal entry in
    flight is written, then the lap exits 143. Only the main thread can install it."""
    try:
        signal.signal(signal.SIGTERM, lambda _sig, _frame: TERMINATING.set())
    except ValueError:  # not the main thread (an embedding test)
        pass


def run_from_env(env: Mapping[str, str]) -> int:
    """Parse the environment, run the lap in its span (when tracing is on, ``lap/tracing``), send
    the spans (bounded in time), return the exit code (a failure's cause also goes to the
    termination message file)."""
    install_sigterm()
    termination_path = env.get(Env.TERMINATION_MESSAGE_PATH) or TERMINATION_MESSAGE_PATH
    context: dict[str, object] = {
        "namespace": env.get(Env.NAMESPACE, ""),
        "name": env.get(Env.NAME, ""),
        "lap": env.get(Env.LAP, ""),
        "attempt": env.get(Env.ATTEMPT, "1"),
    }
    log = LapLogger(context, fmt=log_format(env), secrets=[env.get(API_KEY_ENV, "")])
    tracer = tracer_from_env(env, log.secrets, log)
    try:
        attrs = lap_attributes(env.get(Env.NAMESPACE, ""), env.get(Env.NAME, ""), env.get(Env.UID, ""),
                               env.get(Env.LAP, ""), env.get(Env.ATTEMPT, "1"))
        with tracer.span(LAP_SPAN, attrs) as span:
            result = _run(env, log, tracer)
            span.set_attributes(lap_result(result.code, result.record))
            if result.code not in (ExitCode.OK, ExitCode.ALREADY_CHECKPOINTED):
                span.set_error(result.message)
    finally:
        if not tracer.close():
            log("tracing: spans not sent in time (collector unreachable?); the lap exits without them",
                level="warning")
    if result.code not in (ExitCode.OK, ExitCode.ALREADY_CHECKPOINTED):
        write_termination_message(result.message, termination_path)
    return result.code


def _run(env: Mapping[str, str], log: LapLogger, tracer: ClosingTracer) -> LapExit:
    store: CheckpointStore | None = None
    try:
        cfg = parse_env(env)
        ck = cfg.spec.checkpoint
        if ck.endpoint:  # the run's own store: its connections under the run's rules (lap/netguard.py)
            guard_store_connections(urlsplit(ck.endpoint).hostname or "", rules_from_env(env))
        store = CheckpointStore(StoreConfig.from_env(
            env, snapshot_every=ck.snapshot_every, max_lap_bytes=ck.max_lap_bytes, max_run_bytes=ck.max_run_bytes,
        )).along(cfg.rewinds)
    except (LapError, CheckpointError) as e:
        message = redact(str(e), log.secrets)
        code = EXIT_PERMANENT if isinstance(e, LapError) else exit_for(e)
        log(FAILURE_LOG_MESSAGES[1], level="error", exit_code=code, error=message)
        _report_config_failure(env, code, message, log)
        return LapExit(code, message)
    log.context.update(lap=cfg.lap, attempt=cfg.attempt)
    log("lap starting", agent_version=cfg.agent_version, decision=cfg.decision.decision if cfg.decision else None)
    return execute_lap(cfg, store, env, log, crash=crash_hook(env), tracer=tracer)


def _report_config_failure(env: Mapping[str, str], code: int, message: str, log: LapLogger) -> None:
    """Best effort: report a configuration failure if identity and store are readable."""
    try:
        run, lap, attempt = parse_identity(env)
        store = CheckpointStore(StoreConfig.from_env(env)).along(parse_rewinds(env, lap))
    except Exception:
        return
    report_failure(store, run, lap, attempt, code, message, env.get(Env.AGENT_VERSION) or None, log)

