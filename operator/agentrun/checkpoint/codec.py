"""The bytes of a stored checkpoint object (schema 3), and the compact form of a lap record.

Schema 3 objects are gzip-compressed canonical JSON (RFC 1952, header mtime 0, level 9, so the
same document always gives the same bytes and a retried PUT is recognised by its sha256). The
encoding is recorded in the object itself: gzip's magic bytes ``1f 8b`` open every schema-3
object, while schema 1-2 objects are plain JSON (they open with ``{``); the S3 user metadata
``x-amz-meta-encoding: gzip`` says the same for tools that only HEAD. Decoding needs the Python
standard library only (``gzip`` + ``json``); the layout is documented in docs/checkpoint-format.md.

Inside a lap record every byte is stored once (``pack_lap`` / ``unpack_lap``):

* a tool call's arguments live in the assistant message's ``toolCalls``; the call record and the
  pending approval that have the same arguments say ``"argumentsFrom": "message"`` instead;
* a tool result lives in its call record (``toolCalls[].result``); the tool message that answers it
  with exactly the text the model saw (``result``, or ``"<status>: <result>"``) says
  ``"contentFrom": "toolCall"`` instead of repeating it;
* an idempotency key that is the one this lap derives for the call (``<run id>:<lap>:<tool>:<callId>``,
  the run id from ``run`` and ``keyScheme``) is left out of the call record and of the pending
  approval (``"idempotencyKey"`` absent = derived); keys of other laps (an approved call) stay.

Both are removed only when equal, and restored by the same lookup; empty ``toolCalls`` lists of
messages (the model's default) are left out. ``unpack_lap(pack_lap(d))`` validates to the same
``LapRecord`` as ``d`` (tested with hypothesis).
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from typing import Any

from pydantic import ValidationError

from agentrun.checkpoint.errors import CorruptCheckpoint
from agentrun.checkpoint.schema import KEY_SCHEME_UID8, KEY_SCHEME_UID128, RunRef

ENCODING_GZIP = "gzip"
GZIP_MAGIC = b"\x1f\x8b"
MAX_DECODED_BYTES = 256 * 1024 * 1024
"""A stored object never inflates past this (a gzip bomb is refused as corrupt, not read into memory)."""

Doc = dict[str, Any]


def canonical_json(doc: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, compact, UTF-8) so that sha256 is reproducible."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_object(doc: Any) -> bytes:
    """The stored bytes of a schema-3 object: gzip(canonical JSON), deterministic."""
    return gzip.compress(canonical_json(doc), compresslevel=9, mtime=0)


def inflate(data: bytes, key: str, limit: int = MAX_DECODED_BYTES) -> bytes:
    """The JSON bytes of a stored object: gunzipped when it opens with the gzip magic, else as is."""
    if not data.startswith(GZIP_MAGIC):
        return data
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise CorruptCheckpoint(f"checkpoint {key} is not valid gzip: {e}", key) from None
    if len(out) > limit:
        raise CorruptCheckpoint(f"checkpoint {key} inflates to more than {limit} bytes", key)
    if not d.eof or d.unused_data:
        raise CorruptCheckpoint(f"checkpoint {key} is a truncated or padded gzip stream", key)
    return out


def tool_message_text(status: str, result: str | None) -> str:
    """The text the model sees for a tool call's answer: the result, or ``<status>: <result>``."""
    text = result if result is not None else ""
    return text if status == "ok" else f"{status}: {text}"


def _message_arguments(doc: Doc) -> dict[str, Any]:
    """call id -> arguments of the first assistant tool call with that id."""
    found: dict[str, Any] = {}
    for m in doc.get("messages") or []:
        for c in m.get("toolCalls") or []:
            found.setdefault(c.get("id"), c.get("arguments", {}))
    return found


def _call_texts(doc: Doc) -> dict[str, str]:
    """call id -> the tool message text derived from the first call record with that id."""
    found: dict[str, str] = {}
    for c in doc.get("toolCalls") or []:
        found.setdefault(c.get("callId"), tool_message_text(c.get("status", ""), c.get("result")))
    return found


def pack_lap(doc: Doc) -> Doc:
    """The compact stored form of a lap record document (see the module docstring)."""
    out = copy.deepcopy(doc)
    args = _message_arguments(out)
    for item in [*(out.get("toolCalls") or []), *([out["pendingApproval"]] if out.get("pendingApproval") else [])]:
        cid = item.get("callId")
        if "arguments" in item and cid in args and args[cid] == item["arguments"]:
            del item["arguments"]
            item["argumentsFrom"] = "message"
    for item in [*(out.get("toolCalls") or []), *([out["pendingApproval"]] if out.get("pendingApproval") else [])]:
        if "idempotencyKey" in item and item["idempotencyKey"] == _derived_key(out, item):
            del item["idempotencyKey"]
    texts = _call_texts(out)
    for m in out.get("messages") or []:
        if m.get("toolCalls") == []:
            del m["toolCalls"]
        cid = m.get("toolCallId")
        if m.get("role") == "tool" and cid in texts and m.get("content") == texts[cid]:
            del m["content"]
            m["contentFrom"] = "toolCall"
    return out


def unpack_lap(doc: Doc, key: str, *, in_place: bool = False) -> Doc:
    """Restore what ``pack_lap`` replaced by references. A reference that resolves to nothing is
    ``CorruptCheckpoint`` naming the field. ``doc`` is left as it is (the result is a copy) unless
    ``in_place``: then it is restored in place, for a caller that owns it (the store, on the
    document it just parsed from the stored bytes, which nothing else holds: copying it would be
    work of the order of decoding it). Restored arguments are copies either way (never shared with the message's)."""
    if not _has_refs(doc):
        return doc
    out = doc if in_place else copy.deepcopy(doc)
    texts = _call_texts(out)
    args = _message_arguments(out)
    for i, m in enumerate(out.get("messages") or []):
        if m.get("contentFrom") == "toolCall":
            cid = m.get("toolCallId")
            if cid not in texts:
                raise CorruptCheckpoint(
                    f"checkpoint {key}: field messages[{i}].contentFrom: no tool call {cid!r} in toolCalls", key
                )
            del m["contentFrom"]
            m["content"] = texts[cid]
    items = [(f"toolCalls[{i}]", c) for i, c in enumerate(out.get("toolCalls") or [])]
    if out.get("pendingApproval"):
        items.append(("pendingApproval", out["pendingApproval"]))
    for where, item in items:
        if "idempotencyKey" not in item:
            key_ = _derived_key(out, item)
            if key_ is None:
                raise CorruptCheckpoint(f"checkpoint {key}: field {where}.idempotencyKey is missing", key)
            item["idempotencyKey"] = key_
        if item.get("argumentsFrom") == "message":
            cid = item.get("callId")
            if cid not in args:
                raise CorruptCheckpoint(
                    f"checkpoint {key}: field {where}.argumentsFrom: no assistant tool call {cid!r} in messages", key
                )
            del item["argumentsFrom"]
            item["arguments"] = copy.deepcopy(args[cid])
    return out


def _derived_key(doc: Doc, item: Doc) -> str | None:
    """The key this lap derives for a call: ``<run id>:<lap>:<tool>:<callId>`` (None if unknown)."""
    scheme = doc.get("keyScheme")
    if scheme not in (KEY_SCHEME_UID8, KEY_SCHEME_UID128):
        return None
    try:
        run = RunRef.model_validate(doc.get("run"))
    except ValidationError:
        return None
    return f"{run.key_id(scheme)}:{doc.get('lap')}:{item.get('tool')}:{item.get('callId')}"


def _has_refs(doc: Doc) -> bool:
    if any("contentFrom" in m for m in doc.get("messages") or []):
        return True
    if any("argumentsFrom" in c or "idempotencyKey" not in c for c in doc.get("toolCalls") or []):
        return True
    pa = doc.get("pendingApproval")
    return bool(pa and ("argumentsFrom" in pa or "idempotencyKey" not in pa))
