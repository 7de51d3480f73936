"""An independent reader of the checkpoint store, for the chaos invariants.

It does NOT use ``agentrun.checkpoint`` (no ``CheckpointStore``, no ``fold``, no pydantic models,
no migrations): it GETs the raw bytes of every lap object with boto3, straight from the S3 server
(not through the chaos proxy), checks each object's ``x-amz-meta-sha256`` against its bytes,
decodes the bytes itself and reads the few fields the invariants need. So a bug in the store or
fold code cannot hide a bug in what was written.

Extending it (a new encoding or schema version, e.g. the gzip-compressed schema v3 planned in
another branch) is meant to be a one-line change:

* ``DECODERS`` maps a content encoding to a function ``bytes -> bytes``. The encoding is taken
  from the object's ``ContentEncoding`` (or an ``encoding`` user metadata field) and, when none is
  given, detected from the content itself (gzip magic ``1f 8b``, zstd magic ``28 b5 2f fd``). An
  unknown encoding is an error naming it, never a silent skip.
* ``FIELDS`` maps a ``schemaVersion`` to the paths of the fields read (lap, run uid, prevSha256,
  usage, costUSD, totals, tool call keys). An unknown version is an error naming it: add its
  entry (usually a copy of the latest one).
* The sha256 in the metadata may cover the stored bytes (schema 2) or the decoded bytes (a
  compressed format may choose either): both are accepted, and the one that matched is the
  digest the next lap's ``prevSha256`` must carry.
* Lap keys are ``<prefix>/<ns>/<name>/<uid>/laps/<lap:08d>.json`` with an optional compression
  suffix (``.gz``, ``.zst``): ``LAP_KEY``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

LAP_KEY = re.compile(r"laps/(\d{8})\.json(?:\.(gz|zst))?$")


def _zstd(data: bytes) -> bytes:
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError as e:  # pragma: no cover - not installed here
        raise ValueError("zstd-encoded checkpoint, but the zstandard module is not installed") from e
    return zstandard.ZstdDecompressor().decompress(data, max_output_size=256 << 20)


DECODERS = {
    "identity": lambda b: b,
    "gzip": gzip.decompress,
    "zstd": _zstd,
}
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"))

# schemaVersion -> field paths (dotted, in the stored JSON's own names)
_V2 = {
    "lap": "lap", "uid": "run.uid", "prev": "prevSha256", "in": "usage.inputTokens", "out": "usage.outputTokens",
    "cost": "costUSD", "t_laps": "totals.laps", "t_in": "totals.inputTokens", "t_out": "totals.outputTokens",
    "t_cost": "totals.costUSD", "calls": "toolCalls", "call_key": "idempotencyKey", "outcome": "outcome.type",
}
FIELDS: dict[int, dict[str, str]] = {2: _V2, 3: _V2}


class RawStoreError(ValueError):
    pass


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def detect_encoding(data: bytes, content_encoding: str | None = None, metadata: dict | None = None) -> str:
    enc = (content_encoding or (metadata or {}).get("encoding") or "").strip().lower()
    if enc in ("", "identity"):
        for magic, name in MAGIC:
            if data.startswith(magic):
                return name
        return "identity"
    return enc


def decode(data: bytes, content_encoding: str | None = None, metadata: dict | None = None) -> tuple[dict, bytes]:
    """(document, decoded bytes). Raises RawStoreError naming what it cannot decode."""
    enc = detect_encoding(data, content_encoding, metadata)
    if enc not in DECODERS:
        raise RawStoreError(f"unknown content encoding {enc!r}: add a decoder to rawstore.DECODERS")
    try:
        plain = DECODERS[enc](data)
        doc = json.loads(plain)
    except (OSError, EOFError, ValueError) as e:
        raise RawStoreError(f"cannot decode ({enc}): {type(e).__name__}: {e}") from None
    if not isinstance(doc, dict):
        raise RawStoreError("not a JSON object")
    return doc, plain


def get_path(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


@dataclass
class RawLap:
    """One lap object as stored, and the fields read from it."""

    key: str
    lap_in_key: int
    size: int
    digest: str  # the sha256 the metadata names (verified against the stored or the decoded bytes)
    problems: list[str] = field(default_factory=list)
    doc: dict = field(default_factory=dict)

    def f(self, name: str) -> Any:
        version = self.doc.get("schemaVersion")
        fields = FIELDS.get(version) if isinstance(version, int) else None
        if fields is None:
            raise RawStoreError(f"{self.key}: schemaVersion {version!r} unknown to the chaos decoder: "
                                f"add it to rawstore.FIELDS")
        return get_path(self.doc, fields[name])


def read_lap(key: str, body: bytes, metadata: dict | None, content_encoding: str | None = None) -> RawLap:
    m = LAP_KEY.search(key)
    lap = int(m[1]) if m else -1
    meta_sha = (metadata or {}).get("sha256") or ""
    stored = sha256_hex(body)
    out = RawLap(key=key, lap_in_key=lap, size=len(body), digest=meta_sha)
    try:
        out.doc, plain = decode(body, content_encoding, metadata)
    except RawStoreError as e:
        out.problems.append(f"{key}: {e}")
        return out
    if not meta_sha:
        out.problems.append(f"{key}: no x-amz-meta-sha256")
    elif meta_sha not in (stored, sha256_hex(plain)):
        out.problems.append(f"{key}: x-amz-meta-sha256 {meta_sha[:12]}… matches neither its {len(body)} stored "
                            f"bytes ({stored[:12]}…) nor their decoded form")
    return out


def list_laps(s3, bucket: str, run_prefix: str) -> list[RawLap]:
    """Every lap object under ``run_prefix`` (``<prefix>/<ns>/<name>/<uid>/``), raw, in key order."""
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=run_prefix + "laps/"):
        for o in page.get("Contents", []):
            if not LAP_KEY.search(o["Key"]):
                continue
            r = s3.get_object(Bucket=bucket, Key=o["Key"])
            out.append(read_lap(o["Key"], r["Body"].read(), r.get("Metadata"), r.get("ContentEncoding")))
    return sorted(out, key=lambda x: x.key)
