"""The contract between the operator and the lap runner, in one place both sides import.

The operator never talks to the model or the tools; the lap runner never talks to the Kubernetes
API. They meet in three places, all defined here (docs/contracts.md explains them):

* the lap Job's environment (operator -> runner): :class:`Env`, :func:`tool_headers_env`;
* the process exit and the termination message (runner -> operator): :class:`ExitCode`,
  :data:`FAILURE_LOG_MESSAGES`;
* the checkpoint store (runner -> operator): the key layout (:func:`run_prefix`, :func:`lap_key`,
  ...) and the reasons of an attempt report (:class:`AttemptReason`).

This module imports nothing but the standard library: the lap imports it at start.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from enum import IntEnum, StrEnum
from typing import Final


class ExitCode(IntEnum):
    """Exit codes of ``agentrun lap``. Any other exit (signal, OOM, eviction) is retryable."""

    OK = 0
    """The lap's checkpoint is written (its outcome is inside: continue, done, awaiting-approval, failed)."""
    PERMANENT = 2
    """Retrying cannot help (bad configuration, unreadable checkpoint, tool removed): the run fails;
    the message is in the attempt report."""
    ALREADY_CHECKPOINTED = 3
    """Another writer had checkpointed the lap (conditional put refused): read it, not a failure."""
    TERMINATED = 143
    """SIGTERM (the Job deleted: a cancel, a drain): the journal write in flight finished, nothing
    checkpointed; like any signal, retryable."""
    RETRYABLE = 75
    """Transient (model/tool timeout, 5xx, store unavailable): the operator retries with backoff."""


# --- the labels the operator puts on every lap Job and its pods (the CLI finds lap pods by them) ---
LABEL_RUN: Final = "agentrun.dev/run"
LABEL_RUN_UID: Final = "agentrun.dev/run-uid"
LABEL_LAP: Final = "agentrun.dev/lap"
LABEL_ATTEMPT: Final = "agentrun.dev/attempt"


class Env(StrEnum):
    """Environment variables of the lap container, set by the operator (controller/decide/jobs.py)."""

    NAMESPACE = "AGENTRUN_NAMESPACE"
    NAME = "AGENTRUN_NAME"
    UID = "AGENTRUN_UID"
    LAP = "AGENTRUN_LAP"
    ATTEMPT = "AGENTRUN_ATTEMPT"
    CHECKPOINT_URI = "AGENTRUN_CHECKPOINT_URI"
    S3_ENDPOINT = "AGENTRUN_S3_ENDPOINT"
    S3_REGION = "AGENTRUN_S3_REGION"
    S3_PATH_STYLE = "AGENTRUN_S3_PATH_STYLE"
    S3_CREDENTIALS_SECRET = "AGENTRUN_S3_CREDENTIALS_SECRET"
    """The *name* of the Secret the S3 credentials come from (never a value), for messages."""
    AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
    AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
    AGENT_VERSION = "AGENTRUN_AGENT_VERSION"
    SPEC = "AGENTRUN_SPEC"
    """The AgentRun spec as JSON (``agentrun.api.spec.AgentRunSpec``); holds no secret values."""
    MODEL_API_KEY = "AGENTRUN_MODEL_API_KEY"
    APPROVAL_DECISION = "AGENTRUN_APPROVAL_DECISION"
    """When resuming from a pause: one of :data:`APPROVAL_DECISIONS`."""
    APPROVAL_CALL_ID = "AGENTRUN_APPROVAL_CALL_ID"
    APPROVAL_REASON = "AGENTRUN_APPROVAL_REASON"
    APPROVAL_BY = "AGENTRUN_APPROVAL_BY"
    APPROVAL_ARGUMENTS_SHA256 = "AGENTRUN_APPROVAL_ARGUMENTS_SHA256"
    """The digest of the full arguments the decision is bound to (``status.approval.argumentsSha256``):
    the lap refuses to execute a pending call whose arguments digest differs."""
    APPROVAL_TARGET_SHA256 = "AGENTRUN_APPROVAL_TARGET_SHA256"
    """Of an approval: the target digest it is bound to (``status.approval.targetSha256``,
    ``agentrun.api.approval.target_sha256``): the lap does not send a call whose target under its
    spec and image differs, and asks again instead."""
    IMAGE = "AGENTRUN_IMAGE"
    """The lap container's image as the operator set it (the effective ``spec.agent.image``): part of
    the target digest the lap computes."""
    LOG_FORMAT = "AGENTRUN_LOG_FORMAT"
    """``json`` (default) or ``text``."""
    SCRIPT_FILE = "AGENTRUN_SCRIPT_FILE"
    """Scripted provider only: a YAML file of responses (demos)."""
    TEST_CRASH_AT = "AGENTRUN_TEST_CRASH_AT"
    """Test hook only: the runner SIGKILLs itself at a named point of the lap."""
    TERMINATION_MESSAGE_PATH = "AGENTRUN_TERMINATION_MESSAGE_PATH"
    """Optional: where the runner writes the cause of a failure (default :data:`TERMINATION_MESSAGE_PATH`)."""
    ADDRESS_RULES = "AGENTRUN_ADDRESS_RULES"
    """What the lap checks the address of each model and tool connection against (JSON of
    ``agentrun.api.addresses.AddressRules``: the denied ranges of the run's AgentRunPolicies and
    whether loopback is allowed), made by the operator from the policies it resolved for the run.
    Unset (no policy known): the always-denied ranges only."""
    REWINDS = "AGENTRUN_REWINDS"
    """The run's rewinds in place (``status.lifecycle.rewinds``), comma-separated laps in order, e.g.
    ``"4,2"``: where each history of the run starts (:func:`history_of`). Unset or empty: the run was
    never rewound, every object is in history 0 (the layout of every earlier release)."""
    APPROVAL_DECIDED_AT = "AGENTRUN_APPROVAL_DECIDED_AT"
    """When resuming from a pause: when the decision was recorded (``status.approval.decidedAt``,
    RFC 3339), where the lap's span of the approval wait ends (``lap/tracing``). Unset (a Job of an
    earlier release): the span ends when the lap starts."""


TOOL_HEADERS_PREFIX = "AGENTRUN_TOOL_HEADERS_"
APPROVAL_DECISIONS: tuple[str, ...] = ("approved", "rejected", "timed-out")


def tool_headers_env(tool: str) -> str:
    """``AGENTRUN_TOOL_HEADERS_<TOOL>`` of a tool's ``http.headersSecretRef``: upper-cased, ``-`` -> ``_``."""
    return TOOL_HEADERS_PREFIX + tool.upper().replace("-", "_")


MCP_HEADERS_PREFIX = "AGENTRUN_MCP_HEADERS_"


def mcp_headers_env(server: str) -> str:
    """``AGENTRUN_MCP_HEADERS_<SERVER>`` of an MCP server's ``headersSecretRef`` (``spec.agent.mcpServers[]``):
    upper-cased, ``-`` -> ``_``. Its value, a JSON object of header names to values, is sent with every
    request to that server; never logged or stored."""
    return MCP_HEADERS_PREFIX + server.upper().replace("-", "_")


IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
"""The HTTP header that carries a side-effecting call's idempotency key (HTTP and MCP tools)."""

MCP_IDEMPOTENCY_META_KEY: Final = "agentrun.dev/idempotency-key"
"""The ``_meta`` key of an MCP ``tools/call`` request that carries the call's idempotency key (the same
value the ``Idempotency-Key`` HTTP header carries): the lap sends it, ``agentrun.toolkit.mcp`` reads it
(docs/tools.md)."""

MCP_NOT_EXECUTED_META_KEY: Final = "agentrun.dev/not-executed"
"""The ``_meta`` key of an MCP ``tools/call`` *result* (``isError``) by which a tool server says that the
call was not executed and the same key may be sent again; its value names why (the toolkit's
``idempotency-key-in-progress``: a concurrent duplicate still running). The lap retries such a
result with the same key, as it retries an HTTP tool's 409, instead of handing the model an error it
could answer with a new call under a new key (docs/tools.md)."""


CALL_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A tool call id as the lap journals it (``journal/<lap>/tool-<callId>.json``) and as a decision
names it (annotation ``agentrun.dev/call-id``)."""


class AttemptReason(StrEnum):
    """``reason`` of an attempt report (``attempts/<lap>-<attempt>.json``) that the operator turns
    into the run's condition reason."""

    CHECKPOINT_UNREADABLE = "CheckpointUnreadable"
    """A corrupt or unknown-version checkpoint object."""
    CHECKPOINT_TOO_LARGE = "CheckpointTooLarge"
    """The lap's checkpoint would pass spec.checkpoint.maxLapBytes / maxRunBytes."""
    STORE_ACCESS_DENIED = "StoreAccessDenied"
    """The store refused the lap's credentials."""


# -- tracing (lap/tracing, docs/observability.md#traces) ------------------------------------------


class OtelEnv(StrEnum):
    """The standard OpenTelemetry variables of tracing. The operator passes those of
    :data:`LAP_OTEL_ENV` from its own environment (the chart's ``tracing`` values) to every lap Job;
    the lap traces when an endpoint is set (``lap/tracing``)."""

    ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
    TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
    TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    SDK_DISABLED = "OTEL_SDK_DISABLED"
    TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
    TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
    TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
    RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
    CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    """``true``: spans carry the messages, tool arguments and results (the GenAI conventions' opt-in)."""


LAP_OTEL_ENV: tuple[OtelEnv, ...] = tuple(OtelEnv)
"""What the operator copies from its environment into lap Jobs (set ones only). Never
``OTEL_EXPORTER_OTLP_HEADERS``: headers may hold a collector's token, and a Job's env is readable."""


TRACES_PATH: Final = "/v1/traces"


def otel_true(value: str | None) -> bool:
    """An OTEL_* boolean: ``true`` in any case."""
    return (value or "").strip().lower() == "true"


def traces_endpoint(env: Mapping[str, str]) -> str | None:
    """Where spans go, by the OTLP exporter's rules: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``; None when tracing is off (no endpoint,
    ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``)."""
    if otel_true(env.get(OtelEnv.SDK_DISABLED)) or (env.get(OtelEnv.TRACES_EXPORTER) or "").strip().lower() == "none":
        return None
    signal = (env.get(OtelEnv.TRACES_ENDPOINT) or "").strip()
    if signal:
        return signal
    base = (env.get(OtelEnv.ENDPOINT) or "").strip()
    return base.rstrip("/") + TRACES_PATH if base else None


def run_trace_id(uid: str) -> str:
    """The trace id of a run (32 hex digits): the 128 bits of its uid (a UUID), else the first 128
    bits of the uid's sha256. Every lap, retry and restart of the run lands in this trace."""
    try:
        value = uuid.UUID(uid).hex
    except ValueError:
        value = hashlib.sha256(uid.encode()).hexdigest()[:32]
    return value if int(value, 16) else "0" * 31 + "1"


def run_span_id(uid: str) -> str:
    """The span id (16 hex digits) of a run's root span, which its lap spans are children of: the
    first 64 bits of ``sha256("agentrun.dev/run:" + uid)``."""
    value = hashlib.sha256(f"agentrun.dev/run:{uid}".encode()).hexdigest()[:16]
    return value if int(value, 16) else "0" * 15 + "1"


LAP_SPAN_NAME: Final = "lap"
"""The name of a lap attempt's span (the lap's own, or the operator's for an attempt that did not end by itself)."""


def lap_span_id(uid: str, lap: int, attempt: int) -> str:
    """The span id (16 hex digits) of a lap attempt's span: the first 64 bits of
    ``sha256("agentrun.dev/lap:<uid>/<lap>/<attempt>")``. The lap process gives its span this id;
    when the attempt is killed before it exports it (SIGKILL, OOM, its pod gone), the operator
    sends the span with the same id, so the spans the attempt did export (its model calls) have
    their parent in the trace."""
    value = hashlib.sha256(f"agentrun.dev/lap:{uid}/{lap}/{attempt}".encode()).hexdigest()[:16]
    return value if int(value, 16) else "0" * 15 + "1"


# -- the termination message --------------------------------------------------------------------

FAILURE_LOG_MESSAGES: tuple[str, ...] = ("lap failed", "lap configuration refused")
"""The ``msg`` of the runner's last log line on a failed lap; its ``error`` field is the cause
(already redacted). The lap Job's ``terminationMessagePolicy: FallbackToLogsOnError`` makes the log
tail the pod's termination message, where the operator reads it."""
FAILURE_LOG_ERROR_FIELD = "error"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""The container's ``terminationMessagePath`` (Kubernetes' default). On a failed lap the runner writes
there, when the file exists (the kubelet creates it), the same JSON line as its last log line
(``{"msg": "lap failed", "error": <cause>}``, the cause one line, redacted, at most
:data:`MAX_TERMINATION_MESSAGE_CHARS`); the kubelet then reports that line instead of the log tail,
and a reader of either finds the cause the same way."""
MAX_TERMINATION_MESSAGE_CHARS = 900
"""Characters of the cause in the termination message (UTF-8: within the kubelet's 4096 bytes)."""

# -- the store layout -----------------------------------------------------------------------------

LAPS_DIR = "laps/"
SNAPSHOTS_DIR = "snapshots/"
JOURNAL_DIR = "journal/"
ATTEMPTS_DIR = "attempts/"
AGENTS_DIR = "agents/"
HISTORIES_DIR = "histories/"
REWINDS_DIR = "rewinds/"
MAX_LAP = 99_999_999
MAX_ATTEMPT = 999
MAX_REWINDS = 32
"""Most rewinds in place of one run (``agentrun retry --from-lap``); after that, fork it."""


def run_prefix(prefix: str, namespace: str, name: str, uid: str) -> str:
    """``<prefix>/<namespace>/<name>/<uid>/``: every object of a run lives under it."""
    head = prefix.strip("/")
    return f"{head}/{namespace}/{name}/{uid}/" if head else f"{namespace}/{name}/{uid}/"


def lap_object(lap: int) -> str:
    """``laps/<lap:08d>.json``: the LapRecord (conditional put, ``If-None-Match: *``)."""
    return f"{LAPS_DIR}{lap:08d}.json"


def snapshot_object(lap: int) -> str:
    """``snapshots/<lap:08d>.json``: the RunState after that lap, every ``snapshotEvery`` laps."""
    return f"{SNAPSHOTS_DIR}{lap:08d}.json"


def journal_dir(lap: int) -> str:
    """``journal/<lap:08d>/``: the journal entries of one lap."""
    return f"{JOURNAL_DIR}{lap:08d}/"


def journal_object(lap: int, name: str) -> str:
    """``journal/<lap:08d>/<name>.json``: ``model``, ``tool-<callId>``, ``tool-approved-<callId>``."""
    return f"{journal_dir(lap)}{name}.json"


MODEL_JOURNAL_NAME: Final = "model"
"""The journal entry of a lap's model response (written before any tool call of it is sent)."""


def tool_journal_name(call_id: str) -> str:
    """The journal entry of a tool call of the lap's model response: ``tool-<callId>`` (its result)."""
    return f"tool-{call_id}"


def attempt_object(lap: int, attempt: int) -> str:
    """``attempts/<lap:08d>-<attempt:03d>.json``: the failure report of a lap attempt (best effort)."""
    return f"{ATTEMPTS_DIR}{lap:08d}-{attempt:03d}.json"


# -- histories: a rewind in place (agentrun retry --from-lap N) -----------------------------------
#
# Every object is written once, so a run rewound to lap N cannot write its new laps N+1.. where the
# abandoned ones are. Each rewind starts a new *history* h (1, 2, ...): the objects of the laps it
# writes (laps/, snapshots/, journal/, attempts/) live under ``histories/<h:03d>/`` with the same
# layout as history 0, the run prefix itself (so a run never rewound has the layout of every earlier
# release). The run's *rewinds* ``(b_1, ..., b_H)`` (``status.lifecycle.rewinds``, the lap by
# :attr:`Env.REWINDS`) say which history holds lap L: the newest h whose rewind point b_h is before
# L (:func:`history_of`). Laps of an older history after a later rewind point are abandoned: kept,
# never read. Each history h >= 1 also has a marker ``rewinds/<h:03d>.json`` (its rewind point),
# written create-only by its first lap before any other object, so a reader without the run's status
# (a fork of the run, ``agentrun trace --uid``) finds the rewinds in the store.


def history_of(rewinds: tuple[int, ...] | list[int], lap: int) -> int:
    """The history that holds lap ``lap`` of a run with these rewinds: the newest h (1-based) with
    ``rewinds[h-1] < lap``, else 0."""
    for h in range(len(rewinds), 0, -1):
        if rewinds[h - 1] < lap:
            return h
    return 0


def history_dir(history: int) -> str:
    """``""`` for history 0, ``histories/<h:03d>/`` for a later one: the prefix of its objects."""
    if history < 0 or history > MAX_REWINDS:
        raise ValueError(f"history must be in 0..{MAX_REWINDS}, got {history}")
    return f"{HISTORIES_DIR}{history:03d}/" if history else ""


def rewind_object(history: int) -> str:
    """``rewinds/<h:03d>.json``: the marker of history h >= 1 (its rewind point; create-only)."""
    if history < 1 or history > MAX_REWINDS:
        raise ValueError(f"a rewind's history must be in 1..{MAX_REWINDS}, got {history}")
    return f"{REWINDS_DIR}{history:03d}.json"


def format_rewinds(rewinds: tuple[int, ...] | list[int]) -> str:
    """The :attr:`Env.REWINDS` value of these rewinds (``""`` for none)."""
    return ",".join(str(b) for b in rewinds)


def parse_rewinds(value: str | None) -> tuple[int, ...]:
    """The rewinds of an :attr:`Env.REWINDS` value; ValueError naming it when it is not laps."""
    text = (value or "").strip()
    if not text:
        return ()
    parts = text.split(",")
    if len(parts) > MAX_REWINDS or not all(p.strip().isdigit() and len(p.strip()) <= 8 for p in parts):
        raise ValueError(f"{Env.REWINDS} must be at most {MAX_REWINDS} comma-separated laps, got {text[:80]!r}")
    return tuple(int(p) for p in parts)


def agent_object(digest: str) -> str:
    """``agents/<sha256>.json``: a resolved Agent copy of a run of an Agent (``spec.agentRef``),
    content-addressed by the sha256 of its canonical JSON (``status.agent.digest``; create-only)."""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"an Agent copy's digest is 64 hex characters, got {digest[:80]!r}")
    return f"{AGENTS_DIR}{digest}.json"


def describe() -> str:
    """The contract as text (``python -m agentrun.api.contract``): what docs/contracts.md points at."""
    out = ["Lap Job environment (operator -> runner):"]
    out += [f"  {e.value:<34} Env.{e.name}" for e in Env]
    out.append(f"  {TOOL_HEADERS_PREFIX + '<TOOL>':<34} tool_headers_env(tool)")
    out.append(f"  {MCP_HEADERS_PREFIX + '<SERVER>':<34} mcp_headers_env(server)")
    out.append("Tracing (operator environment -> lap Job, when set): " + ", ".join(LAP_OTEL_ENV))
    out.append("Exit codes (runner -> operator):")
    out += [f"  {c.value:<4} ExitCode.{c.name}" for c in ExitCode]
    out.append("Attempt report reasons (attempts/...):")
    out += [f"  {r.value:<24} AttemptReason.{r.name}" for r in AttemptReason]
    out.append("Store layout, under " + run_prefix("PREFIX", "<namespace>", "<name>", "<uid>") + ":")
    out += [f"  {lap_object(1)}", f"  {snapshot_object(10)}", f"  {journal_object(1, 'model')}",
            f"  {attempt_object(1, 1)}", f"  {AGENTS_DIR}<sha256>.json", f"  {rewind_object(1)}",
            f"  {history_dir(1)}{lap_object(5)}  (laps after a rewind: every object of history 1 under histories/001/)"]
    out.append("Failure log line (termination message): msg in " + ", ".join(repr(m) for m in FAILURE_LOG_MESSAGES)
               + f", cause in field {FAILURE_LOG_ERROR_FIELD!r}")
    return "\n".join(out)


if __name__ == "__main__":
    print(describe())
