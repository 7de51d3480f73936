"""Schema versions of stored checkpoint objects, and the explicit migrations between them.

Every stored object carries its schema version. Reading an object applies the migrations in
``MIGRATIONS`` step by step (``{1: migrate_v1_to_v2, 2: migrate_v2_to_v3}``) on the parsed
JSON document, before it is validated against the current models in ``schema.py``. Migrations work
on plain dicts and never import the current models, so later schema changes cannot break them.

Schema version 1 (frozen; written by agentrun 0.0.x; its shape is pinned by
``tests/fixtures/checkpoints/v1``):

* snake_case keys; ``schema_version`` / ``agent_version``; ``kind`` is ``"lap"`` or ``"snapshot"``;
* ``outcome`` a bare string (``continue``, ``done``, ``awaiting_approval``, ``failed``) with an
  optional ``outcome_message``; snapshots hold ``last_outcome`` / ``last_outcome_message``;
* messages in the OpenAI wire form: ``tool_calls: [{id, type: "function", function: {name,
  arguments: "<json string>"}}]``;
* tool executions under ``tool_results``, with ``arguments`` a JSON string and snake_case statuses
  (``unknown_tool``, ``invalid_arguments``, ``awaiting_approval``, ``timed_out``);
* ``usage: {prompt_tokens, completion_tokens}``, ``cost`` a float in USD, ``totals: {laps,
  prompt_tokens, completion_tokens, cost}``;
* flat timings: ``started_at``, ``finished_at``, ``model_seconds``, ``tools_seconds``;
* no hash chain (no ``prev_sha256`` / ``last_sha256``), no journal, no attempt reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun.api.types import format_usd
from agentrun.checkpoint.errors import CorruptCheckpoint, UnsupportedSchemaVersion
from agentrun.checkpoint.schema import SCHEMA_VERSION

MIN_SCHEMA_VERSION = 1
"""The oldest schema version this code reads."""

Doc = dict[str, Any]


class MigrationError(ValueError):
    """A v(n) document does not have the v(n) shape; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field}: {problem}")
        self.field = field
        self.problem = problem


# ---------------------------------------------------------------------------------------------
# v1 -> v2
# ---------------------------------------------------------------------------------------------

_V1_LAP_KEYS = {
    "kind", "schema_version", "agent_version", "run", "lap", "attempt", "outcome", "outcome_message",
    "messages", "tool_results", "plan", "pending_approval", "approval_decision", "usage", "cost",
    "totals", "compaction", "started_at", "finished_at", "model_seconds", "tools_seconds",
}  # fmt: skip
_V1_SNAPSHOT_KEYS = {
    "kind", "schema_version", "agent_version", "run", "lap", "summary", "pinned_facts",
    "compacted_through_lap", "messages", "plan", "pending_approval", "last_outcome",
    "last_outcome_message", "totals",
}  # fmt: skip
_V1_OUTCOMES = {"continue": "continue", "done": "done", "awaiting_approval": "awaiting-approval", "failed": "failed"}
_V1_STATUSES = {
    "ok": "ok", "error": "error", "unknown_tool": "unknown-tool", "invalid_arguments": "invalid-arguments",
    "awaiting_approval": "awaiting-approval", "rejected": "rejected", "timed_out": "timed-out",
}  # fmt: skip
_V1_DECISIONS = {"approved": "approved", "rejected": "rejected", "timed_out": "timed-out"}


def _req(doc: Doc, key: str, where: str) -> Any:
    if key not in doc:
        raise MigrationError(f"{where}{key}", "required in schema version 1")
    return doc[key]


def _obj(value: Any, field: str) -> Doc:
    if not isinstance(value, dict):
        raise MigrationError(field, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise MigrationError(field, f"expected a list, got {type(value).__name__}")
    return value


def _check_keys(doc: Doc, allowed: set[str], where: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise MigrationError(f"{where}{unknown[0]}", "not a field of schema version 1")


def _json_arguments(text: Any, field: str) -> Doc:
    """v1 kept tool arguments as the model's raw JSON string; v2 keeps the parsed object."""
    if isinstance(text, dict):
        return text
    if not isinstance(text, str):
        raise MigrationError(field, f"expected a JSON string, got {type(text).__name__}")
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise MigrationError(field, f"not valid JSON ({e.msg})") from None
    return _obj(value, field)


def _usd(value: Any, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MigrationError(field, f"expected a number, got {type(value).__name__}")
    try:
        amount = Decimal(repr(float(value)))
    except InvalidOperation:
        raise MigrationError(field, f"not a finite number: {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise MigrationError(field, f"not a non-negative finite number: {value!r}")
    return format_usd(amount)


def _map(value: Any, table: dict[str, str], field: str) -> str:
    if value not in table:
        raise MigrationError(field, f"unknown value {value!r}; schema version 1 knows {sorted(table)}")
    return table[value]


def _v1_message(m: Any, where: str) -> Doc:
    m = _obj(m, where)
    _check_keys(m, {"role", "content", "tool_calls", "tool_call_id", "lap"}, where + ".")
    out: Doc = {"role": _req(m, "role", where + "."), "lap": _req(m, "lap", where + ".")}
    if m.get("content") is not None:
        out["content"] = m["content"]
    if m.get("tool_call_id") is not None:
        out["toolCallId"] = m["tool_call_id"]
    calls = []
    for j, c in enumerate(_list(m.get("tool_calls") or [], f"{where}.tool_calls")):
        cw = f"{where}.tool_calls[{j}]"
        c = _obj(c, cw)
        fn = _obj(_req(c, "function", cw + "."), cw + ".function")
        calls.append(
            {
                "id": _req(c, "id", cw + "."),
                "name": _req(fn, "name", cw + ".function."),
                "arguments": _json_arguments(fn.get("arguments", "{}"), cw + ".function.arguments"),
            }
        )
    if calls:
        out["toolCalls"] = calls
    return out


def _v1_tool_result(t: Any, where: str) -> Doc:
    t = _obj(t, where)
    allowed = {"call_id", "tool", "arguments", "idempotency_key", "status", "result", "http_status",
               "replayed", "started_at", "finished_at"}  # fmt: skip
    _check_keys(t, allowed, where + ".")
    out: Doc = {
        "callId": _req(t, "call_id", where + "."),
        "tool": _req(t, "tool", where + "."),
        "arguments": _json_arguments(t.get("arguments", "{}"), where + ".arguments"),
        "idempotencyKey": _req(t, "idempotency_key", where + "."),
        "status": _map(_req(t, "status", where + "."), _V1_STATUSES, where + ".status"),
        "replayed": bool(t.get("replayed", False)),
    }
    for src, dst in (("result", "result"), ("http_status", "httpStatus"),
                     ("started_at", "startedAt"), ("finished_at", "finishedAt")):  # fmt: skip
        if t.get(src) is not None:
            out[dst] = t[src]
    return out


def _v1_pending(p: Any, where: str) -> Doc | None:
    if p is None:
        return None
    p = _obj(p, where)
    _check_keys(p, {"call_id", "tool", "arguments", "idempotency_key", "lap", "requested_at"}, where + ".")
    return {
        "callId": _req(p, "call_id", where + "."),
        "tool": _req(p, "tool", where + "."),
        "arguments": _json_arguments(p.get("arguments", "{}"), where + ".arguments"),
        "idempotencyKey": _req(p, "idempotency_key", where + "."),
        "lap": _req(p, "lap", where + "."),
        "requestedAt": _req(p, "requested_at", where + "."),
    }


def _v1_decision(d: Any, where: str) -> Doc | None:
    if d is None:
        return None
    d = _obj(d, where)
    _check_keys(d, {"call_id", "decision", "reason", "decided_by", "decided_at"}, where + ".")
    out: Doc = {
        "callId": _req(d, "call_id", where + "."),
        "decision": _map(_req(d, "decision", where + "."), _V1_DECISIONS, where + ".decision"),
    }
    for src, dst in (("reason", "reason"), ("decided_by", "decidedBy"), ("decided_at", "decidedAt")):
        if d.get(src) is not None:
            out[dst] = d[src]
    return out


def _v1_totals(t: Any, where: str) -> Doc:
    t = _obj(t if t is not None else {}, where)
    _check_keys(t, {"laps", "prompt_tokens", "completion_tokens", "cost"}, where + ".")
    return {
        "laps": t.get("laps", 0),
        "inputTokens": t.get("prompt_tokens", 0),
        "outputTokens": t.get("completion_tokens", 0),
        "costUSD": _usd(t.get("cost", 0.0), where + ".cost"),
    }


def _v1_compaction(c: Any, where: str) -> Doc | None:
    if c is None:
        return None
    c = _obj(c, where)
    _check_keys(c, {"through_lap", "summary", "pinned_facts"}, where + ".")
    return {
        "throughLap": _req(c, "through_lap", where + "."),
        "summary": _req(c, "summary", where + "."),
        "pinnedFacts": list(_list(c.get("pinned_facts", []), where + ".pinned_facts")),
    }


def _v1_outcome(doc: Doc, key: str, message_key: str) -> Doc:
    out: Doc = {"type": _map(_req(doc, key, ""), _V1_OUTCOMES, key)}
    if doc.get(message_key) is not None:
        out["message"] = doc[message_key]
    return out


def _v1_run(doc: Doc) -> Doc:
    run = _obj(_req(doc, "run", ""), "run")
    _check_keys(run, {"namespace", "name", "uid"}, "run.")
    return {k: _req(run, k, "run.") for k in ("namespace", "name", "uid")}


def _v1_messages(doc: Doc) -> list[Doc]:
    return [_v1_message(m, f"messages[{i}]") for i, m in enumerate(_list(doc.get("messages", []), "messages"))]


def _v1_lap_to_v2(doc: Doc) -> Doc:
    _check_keys(doc, _V1_LAP_KEYS, "")
    usage = _obj(doc.get("usage") or {}, "usage")
    _check_keys(usage, {"prompt_tokens", "completion_tokens"}, "usage.")
    out: Doc = {
        "kind": "LapRecord",
        "schemaVersion": 2,
        "agentVersion": _req(doc, "agent_version", ""),
        "run": _v1_run(doc),
        "lap": _req(doc, "lap", ""),
        "attempt": doc.get("attempt", 1),
        "outcome": _v1_outcome(doc, "outcome", "outcome_message"),
        "messages": _v1_messages(doc),
        "toolCalls": [
            _v1_tool_result(t, f"tool_results[{i}]")
            for i, t in enumerate(_list(doc.get("tool_results", []), "tool_results"))
        ],
        "usage": {
            "inputTokens": usage.get("prompt_tokens", 0),
            "outputTokens": usage.get("completion_tokens", 0),
        },
        "costUSD": _usd(doc.get("cost", 0.0), "cost"),
        "totals": _v1_totals(doc.get("totals"), "totals"),
        "timings": {
            "startedAt": _req(doc, "started_at", ""),
            "finishedAt": _req(doc, "finished_at", ""),
            "modelSeconds": doc.get("model_seconds", 0.0),
            "toolsSeconds": doc.get("tools_seconds", 0.0),
        },
    }
    if doc.get("plan") is not None:
        out["plan"] = list(_list(doc["plan"], "plan"))
    optional = {
        "pendingApproval": _v1_pending(doc.get("pending_approval"), "pending_approval"),
        "approvalDecision": _v1_decision(doc.get("approval_decision"), "approval_decision"),
        "compaction": _v1_compaction(doc.get("compaction"), "compaction"),
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _v1_snapshot_to_v2(doc: Doc) -> Doc:
    _check_keys(doc, _V1_SNAPSHOT_KEYS, "")
    out: Doc = {
        "kind": "Snapshot",
        "schemaVersion": 2,
        "agentVersion": doc.get("agent_version"),
        "run": _v1_run(doc),
        "lap": _req(doc, "lap", ""),
        "pinnedFacts": list(_list(doc.get("pinned_facts", []), "pinned_facts")),
        "compactedThroughLap": doc.get("compacted_through_lap", 0),
        "messages": _v1_messages(doc),
        "plan": list(_list(doc.get("plan") or [], "plan")),
        "totals": _v1_totals(doc.get("totals"), "totals"),
    }
    if doc.get("summary") is not None:
        out["summary"] = doc["summary"]
    if doc.get("last_outcome") is not None:
        out["lastOutcome"] = _v1_outcome(doc, "last_outcome", "last_outcome_message")
    pending = _v1_pending(doc.get("pending_approval"), "pending_approval")
    if pending is not None:
        out["pendingApproval"] = pending
    return {k: v for k, v in out.items() if v is not None}


def migrate_v1_to_v2(doc: Doc) -> Doc:
    """Schema version 1 -> 2 (see the module docstring for the v1 format)."""
    kind = doc.get("kind")
    if kind == "lap":
        return _v1_lap_to_v2(doc)
    if kind == "snapshot":
        return _v1_snapshot_to_v2(doc)
    raise MigrationError("kind", f"expected 'lap' or 'snapshot' in schema version 1, got {kind!r}")


# ---------------------------------------------------------------------------------------------
# v2 -> v3
# ---------------------------------------------------------------------------------------------

_V2_KINDS = {"LapRecord", "Snapshot", "JournalEntry", "AttemptFailure"}


def migrate_v2_to_v3(doc: Doc) -> Doc:
    """Schema version 2 -> 3. The document shape is unchanged (schema 3 changes the stored bytes:
    gzip, and the compact lap record of ``codec.pack_lap``, both undone before migrations run);
    what v3 adds is the run's idempotency key scheme. Lap records and snapshots written by v2
    derived their keys as ``r_<uid8>``: they get ``keyScheme: uid8`` so the run keeps deriving
    the same keys (issue 11, item 5). ``storage`` stays absent (not counted before v3)."""
    kind = doc.get("kind")
    if kind not in _V2_KINDS:
        raise MigrationError("kind", f"expected one of {sorted(_V2_KINDS)} in schema version 2, got {kind!r}")
    out = dict(doc)
    out["schemaVersion"] = 3
    if kind in ("LapRecord", "Snapshot"):
        out["keyScheme"] = "uid8"
    return out


MIGRATIONS: dict[int, Callable[[Doc], Doc]] = {1: migrate_v1_to_v2, 2: migrate_v2_to_v3}
"""``MIGRATIONS[n]`` turns a version-n document into a version-(n+1) document."""


# ---------------------------------------------------------------------------------------------


def schema_version_of(doc: Doc, key: str) -> int:
    """The schema version a stored document declares (v1 spelled it ``schema_version``)."""
    version = doc.get("schemaVersion", doc.get("schema_version"))
    if version is None:
        raise CorruptCheckpoint(f"checkpoint {key}: field schemaVersion is missing", key)
    if isinstance(version, bool) or not isinstance(version, int):
        raise CorruptCheckpoint(f"checkpoint {key}: field schemaVersion must be an integer, got {version!r}", key)
    return version


def check_supported(version: int, key: str) -> None:
    """Raise ``UnsupportedSchemaVersion`` unless this code reads ``version``."""
    if not MIN_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(key, version, MIN_SCHEMA_VERSION, SCHEMA_VERSION)


def migrate(doc: Doc, key: str) -> Doc:
    """Bring a stored document to the current schema version, one step at a time.

    Raises ``UnsupportedSchemaVersion`` for an unknown version and ``CorruptCheckpoint`` (naming
    ``key`` and the field) for a document that does not have the shape of its declared version.
    Never returns a partial result.
    """
    version = schema_version_of(doc, key)
    check_supported(version, key)
    while version < SCHEMA_VERSION:
        try:
            doc = MIGRATIONS[version](doc)
        except MigrationError as e:
            raise CorruptCheckpoint(
                f"checkpoint {key} (schemaVersion {version}): field {e.field}: {e.problem}", key
            ) from None
        version += 1
        if schema_version_of(doc, key) != version:  # a migration must advance exactly one version
            raise AssertionError(f"migration from schema version {version - 1} did not produce {version}")
    return doc
