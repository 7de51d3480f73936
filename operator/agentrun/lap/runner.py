"""The imperative shell of one lap: load the state, run the step, write the checkpoint, classify
the exit. Used by ``agentrun lap`` and, in-process, by the benchmark."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrun.api.contract import FAILURE_LOG_MESSAGES, AttemptReason, Env, ExitCode, history_of
from agentrun.checkpoint.errors import (
    CheckpointError,
    CheckpointNotFound,
    CheckpointTooLarge,
    CorruptCheckpoint,
    LapAlreadyCheckpointed,
    StoreConfigError,
    UnsupportedSchemaVersion,
)
from agentrun.checkpoint.schema import (
    KEY_SCHEME,
    KEY_SCHEME_UID8,
    JournalEntry,
    KeyScheme,
    LapRecord,
    RunRef,
    RunState,
)
from agentrun.checkpoint.store import CheckpointStore, StoredObject
from agentrun.lap.config import LapConfig
from agentrun.lap.errors import LapError, LapTerminated, PermanentLapError
from agentrun.lap.interfaces import NO_TRACER, McpTools, Model, ToolRunner, Tracer
from agentrun.lap.keys import MODEL_JOURNAL_NAME
from agentrun.lap.logs import LapLogger, redact
from agentrun.lap.models import API_KEY_ENV, make_model
from agentrun.lap.step import Effects, LapContext, run_lap
from agentrun.lap.tools.http import HTTPToolRunner
from agentrun.lap.tools.validate import check_tool_schemas

try:  # the test-fault switch (docs/chaos.md, "Negative control"): not in the wheel, so absent from the image
    from agentrun import testfault
except ImportError:  # the product: every hook below is inert
    testfault = None  # type: ignore[assignment]

# The exit codes and reasons are the operator <-> lap contract (agentrun.api.contract); these
# names stay for the callers (bench, tests) that import them from here.
EXIT_OK = ExitCode.OK
EXIT_PERMANENT = ExitCode.PERMANENT
EXIT_ALREADY = ExitCode.ALREADY_CHECKPOINTED
EXIT_RETRYABLE = ExitCode.RETRYABLE

TERMINATING = threading.Event()
"""Set by the SIGTERM handler (``agentrun.lap.process.install_sigterm``): the lap finishes the journal
write in flight (a tool's result that came back is kept, so a retry never repeats the call), then
stops with :class:`LapTerminated` before its next call."""
CHECKPOINT_TOO_LARGE = AttemptReason.CHECKPOINT_TOO_LARGE
S3_SECRET_ENV = Env.S3_CREDENTIALS_SECRET
JournalRead = tuple[JournalEntry, StoredObject, int] | None
"""A journal entry as ``CheckpointStore.get_journal_entry`` returns it (None: absent)."""
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
    """The Journal of one lap, backed by the store's conditional journal objects. Keeps the stored
    size of every entry it wrote or read (``sizes``): those are deleted once the lap is checkpointed.

    Zombie safety: a runner whose model response lands (conditional put) while the lap is already
    checkpointed (the winner deleted its journal) stops with ``LapAlreadyCheckpointed`` before any
    tool call. A runner that read the winner's response before the deletion derives the winner's
    keys; a tool result it no longer finds is sent again with the same key (the tool dedupes), as
    after a crash between a call and its journal entry."""

    def __init__(
        self, store: CheckpointStore, run: RunRef, lap: int, agent_version: str,
        already_read: Mapping[str, JournalRead] | None = None,
    ) -> None:
        self.store, self.run, self.lap, self.agent_version = store, run, lap, agent_version
        self.sizes: dict[str, int] = {}
        self._already_read = dict(already_read or {})

    def get(self, name: str) -> dict[str, Any] | None:
        """The entry, read from the store; or, the first time only, what ``already_read`` holds for
        ``name``: this lap's earlier read of the entry (or of its absence) stands for this one, as
        if this read had happened then. A concurrent runner's entry, or the winner's deletion of
        the journal, landing in between is then seen as landing after this read: a schedule the
        journal handles anyway (the conditional put, ``LapAlreadyCheckpointed``, the tools'
        idempotency keys)."""
        if name in self._already_read:
            found = self._already_read.pop(name)
        else:
            found = self.store.get_journal_entry(self.run, self.lap, name)
        if found is None:
            return None
        entry, stored, _ = found
        self.sizes[name] = stored.size
        return entry.body

    def put(self, name: str, body: dict[str, Any]) -> bool:
        if testfault and testfault.skip_journal(name):  # tests only: a lap that skips its journal
            return True
        stored, written = self.store.put_journal_entry(self.run, self.lap, name, body, agent_version=self.agent_version)
        if written:
            self.sizes[name] = stored.size
        if TERMINATING.is_set():
            raise LapTerminated(f"lap {self.lap} stopped by SIGTERM after journal entry {name} (kept for the next attempt)")
        if written and name == MODEL_JOURNAL_NAME and self.store.head_lap(self.run, self.lap) is not None:
            # Our model response landed only because the lap was checkpointed by another runner,
            # which then deleted its journal: never call tools with keys derived from a second response.
            self.store.delete_journal(self.run, self.lap, [name], lap_written=True)
            raise LapAlreadyCheckpointed(self.store.lap_key(self.run, self.lap))
        return written




def key_scheme_of(store: CheckpointStore, run: RunRef, lap: int, state: RunState) -> KeyScheme:
    """The idempotency key scheme of this lap: the one recorded in the run's state; before lap 1
    is checkpointed, the scheme of an earlier attempt of this lap that journaled its model
    response under schema <= 2 (so its keys, maybe already sent, are derived again), else the
    current one."""
    if state.key_scheme is not None:
        return state.key_scheme
    return _key_scheme(state, store.get_journal_entry(run, lap, MODEL_JOURNAL_NAME))


def _key_scheme(state: RunState, model_entry: JournalRead) -> KeyScheme:
    """``key_scheme_of`` given the lap's model journal entry as read (None: absent)."""
    if state.key_scheme is not None:
        return state.key_scheme
    if model_entry is not None and model_entry[2] < 3:
        return KEY_SCHEME_UID8
    return KEY_SCHEME


def exit_for(error: BaseException) -> int:
    """Exit code of a failure: 2 if permanent, 143 if terminated by SIGTERM, else 75."""
    if isinstance(error, LapTerminated):
        return ExitCode.TERMINATED
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
    mcp: McpTools | None = None,
    tracer: Tracer = NO_TRACER,
) -> LapExit:
    """Run lap ``cfg.lap`` once and write its checkpoint. Never raises: returns the exit. ``tracer``:
    the lap's spans (``lap/tracing``), whose trace context every model and tool request carries."""
    log.add_secrets([env.get(API_KEY_ENV, "")])
    try:
        return _execute(cfg, store, env, log, crash, model, tools, mcp, tracer)
    except LapAlreadyCheckpointed:
        msg = f"lap {cfg.lap} already checkpointed by another writer; nothing written"
        log(msg, level="warning")
        return LapExit(EXIT_ALREADY, msg)
    except (CorruptCheckpoint, UnsupportedSchemaVersion) as e:  # permanent; named for the operator
        code, message, reason = exit_for(e), redact(str(e), log.secrets), AttemptReason.CHECKPOINT_UNREADABLE
    except CheckpointTooLarge as e:  # permanent: the lap would be as large again
        code, message, reason = exit_for(e), redact(str(e), log.secrets), CHECKPOINT_TOO_LARGE
    except StoreConfigError as e:  # permanent: bucket missing, access denied, no credentials
        code, message, reason = exit_for(e), redact(str(e), log.secrets), None
        hint = explain_store_refusal(message, env)
        if hint:
            message, reason = f"{message}; {hint}", AttemptReason.STORE_ACCESS_DENIED
    except (LapError, CheckpointError) as e:
        code, message, reason = exit_for(e), redact(str(e), log.secrets), None
    except Exception as e:  # an unexpected bug: retryable by the contract (any other exit)
        code, message, reason = EXIT_RETRYABLE, redact(f"unexpected {type(e).__name__}: {e}", log.secrets), None
    log(FAILURE_LOG_MESSAGES[0], level="error", exit_code=code, error=message)
    report_failure(store, cfg.run, cfg.lap, cfg.attempt, code, message, cfg.agent_version, log, reason=reason)
    return LapExit(code, message)


class _Setup:
    """The lap's setup that needs no store: the tool schemas checked, the tool runner and the model
    client made (``jsonschema`` and ``httpx`` imported: tens of ms of CPU). It runs in a thread
    started before the lap's first store read, so it overlaps the S3 round trips of
    ``_execute`` (reads release the GIL while they wait), and is awaited where the lap needs its
    result, before the model is called. It runs the steps in their sequential order and stops at
    the first error, which ``result`` raises, so the lap fails exactly as it would without it; a
    lap that ends before (already checkpointed, a store error) never sees it."""

    def __init__(
        self, cfg: LapConfig, env: Mapping[str, str], model: Model | None, tools: ToolRunner | None,
        mcp: McpTools | None = None, tracer: Tracer = NO_TRACER,
    ) -> None:
        self._cfg, self._env, self._model, self._tools, self._mcp = cfg, env, model, tools, mcp
        self._trace = tracer.headers
        self._secrets: list[str] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lap-setup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            check_tool_schemas(self._cfg.spec.agent.tools)
            if self._tools is None:
                http_tools = HTTPToolRunner.from_env(self._cfg.spec.agent.tools, self._env, self._trace)
                self._secrets = http_tools.secrets()
                self._tools = http_tools
            self._model = self._model or make_model(self._cfg.spec, self._env, self._trace)
            servers = self._cfg.spec.agent.mcp_servers
            if servers and self._mcp is None:
                # only a run with MCP servers loads the mcp SDK (~hundreds of ms of imports), here, in
                # the setup thread, while the lap's first store reads wait
                from agentrun.lap.tools.mcp import McpToolRunner, preload

                mcp_tools = McpToolRunner.from_env(servers, self._env, self._trace)
                self._secrets += mcp_tools.secrets()
                self._mcp = mcp_tools
                preload()
        except BaseException as e:  # re-raised by result(), in the lap's thread
            self._error = e

    def join(self) -> None:
        self._thread.join()

    def result(self, log: LapLogger) -> tuple[Model, ToolRunner, McpTools | None]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        log.add_secrets(self._secrets)
        assert self._model is not None and self._tools is not None
        return self._model, self._tools, self._mcp


def _execute(
    cfg: LapConfig, store: CheckpointStore, env: Mapping[str, str], log: LapLogger,
    crash: Callable[[str], None], model: Model | None, tools: ToolRunner | None, mcp: McpTools | None = None,
    tracer: Tracer = NO_TRACER,
) -> LapExit:
    setup = _Setup(cfg, env, model, tools, mcp, tracer)
    try:
        return _execute_lap(cfg, store, log, crash, setup, tracer)
    finally:
        setup.join()  # no setup thread outlives the lap (e.g. one that ended before needing it)


def _execute_lap(
    cfg: LapConfig, store: CheckpointStore, log: LapLogger, crash: Callable[[str], None], setup: _Setup,
    tracer: Tracer = NO_TRACER,
) -> LapExit:
    # The lap's three first reads go together: whether the lap is checkpointed (HEAD), the state
    # through the lap before (immutable by now), and the lap's model journal entry (which the key
    # scheme and the step's first journal read need). They are independent reads of different
    # keys with no write of ours between, so reading them at once is as if they were read in this
    # order at one instant; their results (and errors) are taken in the order the lap uses them.
    if cfg.rewinds and cfg.lap == cfg.rewinds[-1] + 1:  # a history's first lap: its marker before any of its objects
        store.put_rewind(cfg.run)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lap-read") as reads:
        state_read = reads.submit(store.load_state, cfg.run, through_lap=cfg.lap - 1)
        model_entry_read = reads.submit(store.get_journal_entry, cfg.run, cfg.lap, MODEL_JOURNAL_NAME)
        if store.head_lap(cfg.run, cfg.lap) is not None:
            msg = f"lap {cfg.lap} already checkpointed; nothing to do"
            store.delete_journal(cfg.run, cfg.lap)  # finish what a runner killed after its checkpoint left
            log(msg)
            return LapExit(EXIT_ALREADY, msg)
        try:
            state = state_read.result().state
        except CheckpointNotFound as e:
            raise PermanentLapError(f"lap {cfg.lap} cannot run: a checkpoint it needs is missing ({e})") from None
        model, tools, mcp = setup.result(log)
        model_entry = model_entry_read.result()
    key_scheme, already_read = _key_scheme(state, model_entry), {MODEL_JOURNAL_NAME: model_entry}
    ctx = LapContext(
        spec=cfg.spec, run=cfg.run, lap=cfg.lap, attempt=cfg.attempt,
        agent_version=cfg.agent_version, decision=cfg.decision, key_scheme=key_scheme, image=cfg.image,
        history=history_of(cfg.rewinds, cfg.lap),
    )
    journal = StoreJournal(store, cfg.run, cfg.lap, cfg.agent_version, already_read)
    tools = testfault.lap_tools(tools, cfg.attempt) if testfault else tools  # tests only: rekey
    fx = Effects(model=model, tools=tools, journal=journal, crash=crash, log=log, mcp=mcp, tracer=tracer)
    record = run_lap(ctx, state, fx)
    record = record.model_copy(update={"storage": state.storage})  # its journal is deleted once it is stored
    crash("before-checkpoint")
    stored = store.put_lap(record, state_before=state)
    crash("after-checkpoint")
    store.delete_journal(cfg.run, cfg.lap, sorted(journal.sizes), lap_written=True)
    log("lap checkpointed", key=stored.key, sha256=stored.sha256, bytes=stored.size, outcome=record.outcome.type,
        cost_usd=record.cost_usd, input_tokens=record.usage.input_tokens, output_tokens=record.usage.output_tokens)
    return LapExit(EXIT_OK, f"lap {cfg.lap} checkpointed: {record.outcome.type}", record, stored)
