"""The S3 checkpoint store (any S3-compatible endpoint), layout as in ``docs/contracts.md``::

    PREFIX/<namespace>/<name>/<uid>/
        laps/<lap:08d>.json                    LapRecord (conditional put, If-None-Match: *)
        snapshots/<lap:08d>.json               RunState after that lap, every K laps (conditional put)
        journal/<lap:08d>/<name>.json          JournalEntry (conditional put)
        attempts/<lap:08d>-<attempt:03d>.json  AttemptFailure (best effort, overwrite)
        agents/<sha256>.json                   ResolvedAgent of a run of an Agent (content-addressed,
                                               create-only; written by the operator, status.agent.digest)
        rewinds/<h:03d>.json                   the rewind point of history h >= 1 (create-only)
        histories/<h:03d>/laps/..., snapshots/..., journal/..., attempts/...
                                               the objects of the laps of history h (a rewind in place)

A store bound to a run's rewinds (:meth:`CheckpointStore.along`, ``status.lifecycle.rewinds``) reads
and writes every lap object in the history that holds that lap (``contract.history_of``): the run's
current history, never an abandoned one; unbound, it sees history 0 only (a run never rewound).

Every object is canonical JSON (sorted keys, compact separators), gzip-compressed since schema 3
(``checkpoint/codec.py``, docs/checkpoint-format.md), with the sha256 of its stored bytes in the
user metadata ``x-amz-meta-sha256``, verified on every read.

The objects live in a ``BlobStore`` (``checkpoint/blobstore.py``: get, head, create-only put, list,
delete): S3 through botocore's client (``checkpoint/s3store.py``; credentials from its standard
chain, never read, passed or logged here), or memory. This module is everything above it: the
layout, the codec, the sha256 metadata and the fence (a lap record is written create-only).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError, field_validator

from agentrun.api import contract
from agentrun.api.contract import Env
from agentrun.api.types import redact_url
from agentrun.checkpoint.blobstore import BlobStore
from agentrun.checkpoint.codec import (
    ENCODING_GZIP,
    canonical_json,  # noqa: F401  (re-exported: tests and tools build stored bytes with it)
    encode_object,
    inflate,
    pack_lap,
    unpack_lap,
)
from agentrun.checkpoint.errors import (
    CheckpointError,
    CheckpointNotFound,
    CheckpointTooLarge,
    CorruptCheckpoint,
    LapAlreadyCheckpointed,
    StoreConfigError,
    StoreUnavailable,
)
from agentrun.checkpoint.fold import fold, fork_state
from agentrun.checkpoint.migrations import migrate, schema_version_of
from agentrun.checkpoint.s3store import S3BlobStore
from agentrun.checkpoint.s3store import make_client as make_client  # re-exported: the operator warms it
from agentrun.checkpoint.schema import (
    SCHEMA_VERSION,
    AttemptFailure,
    JournalEntry,
    LapRecord,
    RunRef,
    RunState,
    Storage,
    ToolCallRecord,
)

if TYPE_CHECKING:  # imported where used: a lap pod's start does not build the Agent models
    from agentrun.api.agent import ResolvedAgent

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_JOURNAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
_LAP_FILE = re.compile(r"(\d{8})\.json$")
_REWIND_FILE = re.compile(r"rewinds/(\d{3})\.json$")
REWIND_KIND = "Rewind"
_RESUME_READERS = 10
"""Parallel GETs of a resume at a known lap (the snapshot and up to K-1 lap records)."""

_readers_lock = threading.Lock()
_readers: ThreadPoolExecutor | None = None


def _reader_pool() -> ThreadPoolExecutor:
    """The process's pool of resume readers (at most ``_RESUME_READERS`` threads, shared by every
    store), started on first use and kept, so a resume starts no thread (each start is a round
    trip through the scheduler, slow on a loaded node). Its
    workers only read and decode one object each and never wait on the pool, so concurrent
    resumes queue behind each other instead of deadlocking. Idle workers end at interpreter exit
    (``concurrent.futures`` joins them); a forked child starts its own pool (``_forget_readers``)."""
    global _readers
    pool = _readers
    if pool is None:
        with _readers_lock:
            if _readers is None:
                _readers = ThreadPoolExecutor(max_workers=_RESUME_READERS, thread_name_prefix="agentrun-s3-read")
            pool = _readers
    return pool


def _forget_readers() -> None:
    """After ``fork``: the parent's reader threads do not exist in the child, so neither does its pool."""
    global _readers, _readers_lock
    _readers, _readers_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_readers)


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


class StoreConfig(BaseModel):
    """Where the checkpoints of a run live and how to reach the store."""

    uri: str = Field(description='"s3://bucket/prefix" (the prefix may be empty).')
    endpoint_url: str | None = Field(default=None, description="S3 endpoint URL; None: AWS.")
    region: str | None = None
    path_style: bool = Field(default=False, description="Path-style addressing (MinIO, moto, Ceph).")
    snapshot_every: int = Field(default=10, ge=1, le=1000, description="Snapshot every K laps.")
    max_lap_bytes: int | None = Field(default=None, ge=1, description="Ceiling of one lap record object.")
    max_run_bytes: int | None = Field(default=None, ge=1, description="Ceiling of a run's stored bytes.")

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        if not _URI.match(value):
            raise ValueError(
                f"checkpoint uri {value!r} is not of the form s3://bucket/prefix "
                "(bucket: 3-63 lower-case letters, digits, dots, hyphens)"
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"S3 endpoint {redact_url(value)!r} is not an http(s) URL")
        return value

    @property
    def bucket(self) -> str:
        match = _URI.match(self.uri)
        assert match is not None
        return match["bucket"]

    @property
    def prefix(self) -> str:
        """The key prefix without leading/trailing slashes ("" for none)."""
        match = _URI.match(self.uri)
        assert match is not None
        return (match["prefix"] or "").strip("/")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], snapshot_every: int | None = None,
        max_lap_bytes: int | None = None, max_run_bytes: int | None = None,
    ) -> StoreConfig:
        """Read ``AGENTRUN_CHECKPOINT_URI``, ``AGENTRUN_S3_ENDPOINT``, ``AGENTRUN_S3_REGION`` and
        ``AGENTRUN_S3_PATH_STYLE``; ``snapshot_every`` comes from the spec (default 10)."""
        uri = env.get(Env.CHECKPOINT_URI, "").strip()
        if not uri:
            raise StoreConfigError(f"{Env.CHECKPOINT_URI} is not set (expected s3://bucket/prefix)")
        flag = env.get(Env.S3_PATH_STYLE, "").strip().lower()
        if flag not in ("", "true", "false", "1", "0", "yes", "no"):
            raise StoreConfigError(f"{Env.S3_PATH_STYLE} must be true or false, got {flag!r}")
        try:
            return cls(
                uri=uri,
                endpoint_url=env.get(Env.S3_ENDPOINT, "").strip() or None,
                region=env.get(Env.S3_REGION, "").strip() or None,
                path_style=flag in ("true", "1", "yes"),
                snapshot_every=snapshot_every if snapshot_every is not None else 10,
                max_lap_bytes=max_lap_bytes,
                max_run_bytes=max_run_bytes,
            )
        except ValidationError as e:
            err = e.errors()[0]
            names = {"uri": str(Env.CHECKPOINT_URI), "endpoint_url": str(Env.S3_ENDPOINT)}
            field = names.get(str(err["loc"][0]), str(err["loc"][0])) if err["loc"] else "store config"
            raise StoreConfigError(f"{field}: {err['msg']}") from None


# --------------------------------------------------------------------------------------------
# pure helpers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    """A stored checkpoint object: its key, the sha256 of its bytes, size and write time."""

    key: str
    sha256: str
    size: int
    written_at: datetime


@dataclass(frozen=True)
class LoadResult:
    """The state of a run through a lap, and how many objects were read to build it.

    ``keys_read`` lists every object fetched, in order, including corrupt snapshots that were
    skipped; those are also in ``skipped_snapshots`` (newest first)."""

    state: RunState
    objects_read: int
    keys_read: tuple[str, ...] = ()
    skipped_snapshots: tuple[str, ...] = ()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_prefix(prefix: str, run: RunRef) -> str:
    """``PREFIX/<namespace>/<name>/<uid>/`` (no leading slash when the prefix is empty)."""
    for field in ("namespace", "name", "uid"):
        value = getattr(run, field)
        if not _SEGMENT.match(value):
            raise ValueError(f"run {field} {value!r} cannot be used in a checkpoint key")
    return contract.run_prefix(prefix, run.namespace, run.name, run.uid)


def _check_lap(lap: int) -> int:
    if isinstance(lap, bool) or not isinstance(lap, int) or not 1 <= lap <= contract.MAX_LAP:
        raise ValueError(f"lap must be an integer in 1..99999999, got {lap!r}")
    return lap


def lap_of_key(key: str) -> int | None:
    """The lap number of a ``laps/`` or ``snapshots/`` key, None for other keys."""
    match = _LAP_FILE.search(key)
    return int(match[1]) if match else None


def _field_path(err: Mapping[str, Any]) -> str:
    loc = err.get("loc") or ()
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


def parse_model(model: type[M], doc: Mapping[str, Any], key: str) -> M:
    """Validate a (migrated) document, or raise ``CorruptCheckpoint`` naming the key and field."""
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise CorruptCheckpoint(
            f"checkpoint {key}: field {_field_path(err)}: {err['msg']}{more}", key
        ) from None


def decode_document(data: bytes, key: str) -> dict[str, Any]:
    """The JSON object of a stored object's bytes (gunzipped first when they are gzip)."""
    try:
        doc = json.loads(inflate(data, key))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpoint(f"checkpoint {key} is not valid JSON: {e}", key) from None
    if not isinstance(doc, dict):
        raise CorruptCheckpoint(f"checkpoint {key} is not a JSON object", key)
    return doc


def verify_sha256(data: bytes, expected: str | None, key: str) -> str:
    actual = sha256_hex(data)
    if not expected:
        raise CorruptCheckpoint(f"checkpoint {key} has no sha256 user metadata (x-amz-meta-sha256)", key)
    if actual != expected:
        raise CorruptCheckpoint(
            f"checkpoint {key}: sha256 of its {len(data)} bytes is {actual} but its x-amz-meta-sha256 "
            f"says {expected}; the object was changed or truncated after it was written",
            key,
        )
    return actual


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------


class CheckpointStore:
    """Reads and writes the checkpoint objects of runs in ``blobs`` (default: the S3 bucket of
    ``config``, through ``client`` or a client made from ``config``). Thread-safe."""

    def __init__(self, config: StoreConfig, client: Any = None, *, blobs: BlobStore | None = None) -> None:
        self.config = config
        self.blobs: BlobStore = blobs if blobs is not None else S3BlobStore(config, client)
        self.rewinds: tuple[int, ...] = ()
        """The rewinds in place of the run this store is bound to (:meth:`along`); () for none."""

    def along(self, rewinds: tuple[int, ...] | list[int] | None) -> CheckpointStore:
        """This store (the same backend and configuration) bound to a run's rewinds in place
        (``status.lifecycle.rewinds``): each lap's objects are read and written in the history that
        holds the lap. ``self`` when the rewinds are the same."""
        bound = tuple(rewinds or ())
        if bound == self.rewinds:
            return self
        if len(bound) > contract.MAX_REWINDS or any(not 0 <= b <= contract.MAX_LAP for b in bound):
            raise ValueError(f"rewinds {bound!r}: at most {contract.MAX_REWINDS} laps in 0..{contract.MAX_LAP}")
        other = copy.copy(self)
        other.rewinds = bound
        return other

    @property
    def client(self) -> Any:
        """The S3 backend's botocore client (the conditional-write probe, ``agentrun gc``, tests)."""
        if not isinstance(self.blobs, S3BlobStore):
            raise TypeError(f"this checkpoint store is not on S3 ({type(self.blobs).__name__})")
        return self.blobs.client

    def close(self) -> None:
        """Close the backend's connections."""
        self.blobs.close()

    # ---- keys ------------------------------------------------------------------------------

    def run_prefix(self, run: RunRef) -> str:
        return run_prefix(self.config.prefix, run)

    def history_prefix(self, run: RunRef, history: int) -> str:
        """Where the lap objects of ``history`` live: the run prefix (0), or under ``histories/<h>/``."""
        return self.run_prefix(run) + contract.history_dir(history)

    def _lap_prefix(self, run: RunRef, lap: int) -> str:
        return self.history_prefix(run, contract.history_of(self.rewinds, _check_lap(lap)))

    def lap_key(self, run: RunRef, lap: int) -> str:
        return self._lap_prefix(run, lap) + contract.lap_object(lap)

    def snapshot_key(self, run: RunRef, lap: int) -> str:
        return self._lap_prefix(run, lap) + contract.snapshot_object(lap)

    def journal_key(self, run: RunRef, lap: int, name: str) -> str:
        if not _JOURNAL_NAME.match(name):
            raise ValueError(
                f"journal name {name!r} must be 1-200 characters of letters, digits, '.', '_', ':', '-'"
            )
        return self._lap_prefix(run, lap) + contract.journal_object(lap, name)

    def attempt_key(self, run: RunRef, lap: int, attempt: int) -> str:
        if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= contract.MAX_ATTEMPT:
            raise ValueError(f"attempt must be an integer in 1..999, got {attempt!r}")
        return self._lap_prefix(run, lap) + contract.attempt_object(lap, attempt)

    # ---- objects ---------------------------------------------------------------------------

    def _put(self, key: str, data: bytes, sha: str, *, create_only: bool) -> bool:
        """Write ``data`` with its sha256 (and, gzip, its encoding) in the user metadata. False:
        ``create_only`` and the key exists."""
        gz = data.startswith(b"\x1f\x8b")
        return self.blobs.put(key, data, {"sha256": sha, "encoding": ENCODING_GZIP} if gz else {"sha256": sha},
                              "application/gzip" if gz else "application/json", if_absent=create_only)

    def _put_once(self, key: str, data: bytes) -> tuple[StoredObject, bool]:
        """Conditional put. Returns (object, True) if we wrote it, or (existing object, False)
        if it existed. A retried put whose first try landed (same bytes) counts as written."""
        sha = sha256_hex(data)
        if not self._put(key, data, sha, create_only=True):
            existing = self._head(key)
            if existing is not None and existing.sha256 == sha:
                return existing, True
            return existing or StoredObject(key, "", 0, _now()), False
        return StoredObject(key, sha, len(data), _now()), True

    def _head(self, key: str) -> StoredObject | None:
        info = self.blobs.head(key)
        if info is None:
            return None
        return StoredObject(key=key, sha256=str(info.metadata.get("sha256", "")), size=info.size,
                            written_at=info.last_modified or _now())

    def _read(self, key: str) -> tuple[dict[str, Any], StoredObject, int]:
        """GET, verify sha256, parse JSON, migrate to the current schema. Returns the migrated
        document, the object, and the schema version it was written with."""
        blob = self.blobs.get(key)
        data = blob.data
        sha = verify_sha256(data, blob.metadata.get("sha256"), key)
        raw = decode_document(data, key)
        version = schema_version_of(raw, key)
        doc = migrate(raw, key)
        if doc.get("kind") == "LapRecord":
            doc = unpack_lap(doc, key, in_place=True)  # doc is ours: parsed from these bytes just now
        return doc, StoredObject(key, sha, len(data), blob.last_modified or _now()), version

    def _read_optional(self, key: str) -> tuple[dict[str, Any], StoredObject, int] | None:
        try:
            return self._read(key)
        except CheckpointNotFound:
            return None

    def _list_laps(self, prefix: str, start_after: str | None = None) -> list[int]:
        laps = (lap_of_key(k) for k in self.blobs.list_keys(prefix, start_after))
        return sorted(lap for lap in laps if lap is not None)

    def _snapshot_laps(self, run: RunRef) -> list[int]:
        """The laps with a snapshot in the run's current history (of each history, the laps it holds)."""
        return self._lineage_laps(run, contract.SNAPSHOTS_DIR)

    def _lineage_laps(self, run: RunRef, folder: str, start: int = 1) -> list[int]:
        """The laps from ``start`` on with an object in ``folder`` (``laps/``, ``snapshots/``) of the
        history that holds them: one LIST per history (one for a run never rewound)."""
        out: list[int] = []
        for h in range(len(self.rewinds) + 1):
            base = self.history_prefix(run, h) + folder
            start_after = base + f"{start - 1:08d}.json" if start > 1 else None
            out += [n for n in self._list_laps(base, start_after)
                    if n >= start and contract.history_of(self.rewinds, n) == h]
        return sorted(out)

    # ---- laps ------------------------------------------------------------------------------

    def put_lap(self, record: LapRecord, state_before: RunState | None = None) -> StoredObject:
        """Write a lap's record once (If-None-Match: *). Raises ``LapAlreadyCheckpointed`` if
        another writer has written this lap. When ``record.lap`` is a multiple of K, also writes
        the snapshot (``fold(state_before, record)``; ``state_before`` is loaded when not given;
        a snapshot that cannot be written is logged, not raised). Writing byte-identical content
        again (a retried PUT whose first try landed) returns the existing object instead of raising.
        With ``state_before``, ``record.prevSha256`` must equal ``state_before.lastSha256``.
        """
        if record.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"put_lap writes schema version {SCHEMA_VERSION}, the record says {record.schema_version}"
            )
        if state_before is not None and state_before.lap == record.lap - 1:
            if record.prev_sha256 != state_before.last_sha256:
                raise ValueError(
                    f"lap {record.lap}: prevSha256 {record.prev_sha256} is not the sha256 of lap "
                    f"{state_before.lap} ({state_before.last_sha256}): set it from state_before.last_sha256"
                )
        key = self.lap_key(record.run, record.lap)
        data = encode_object(pack_lap(record.to_api()))
        self._check_size(record, key, len(data))
        stored, written = self._put_once(key, data)
        if not written:
            raise LapAlreadyCheckpointed(key)
        if record.lap % self.config.snapshot_every == 0:
            self._write_snapshot_after(record, stored, state_before)
        return stored

    def _check_size(self, record: LapRecord, key: str, size: int) -> None:
        """Refuse (``CheckpointTooLarge``, nothing written) a lap record over ``max_lap_bytes``, or
        one that would bring the run's stored bytes over ``max_run_bytes``."""
        limit = self.config.max_lap_bytes
        if limit is not None and size > limit:
            raise CheckpointTooLarge(
                f"lap {record.lap}: its checkpoint is {size} bytes (compressed), over the limit of {limit} "
                f"bytes per lap (spec.checkpoint.maxLapBytes); the lap record was not written",
                key, record.lap, size, limit, "maxLapBytes",
            )
        limit = self.config.max_run_bytes
        before = record.storage.bytes if record.storage is not None else 0
        if limit is not None and before + size > limit:
            raise CheckpointTooLarge(
                f"lap {record.lap}: the run's checkpoints would reach {before + size} bytes ({before} stored "
                f"before this lap's record + {size}), over the limit of {limit} bytes per run "
                f"(spec.checkpoint.maxRunBytes); the lap record was not written",
                key, record.lap, before + size, limit, "maxRunBytes",
            )

    def _write_snapshot_after(
        self, record: LapRecord, stored: StoredObject, state_before: RunState | None
    ) -> None:
        """Best effort: a missing snapshot only makes the next resume read more objects."""
        try:
            if state_before is None or state_before.lap != record.lap - 1 or state_before.run != record.run:
                state_before = self.load_state(record.run, through_lap=record.lap - 1).state
            self.put_snapshot(fold(state_before, record, stored.sha256, stored.size))
        except CheckpointError as e:
            log.warning("snapshot after %s not written: %s", stored.key, e)

    def put_snapshot(self, state: RunState) -> StoredObject | None:
        """Write the snapshot of ``state`` (conditional). None if a snapshot of that lap exists."""
        stored, written = self._put_once(self.snapshot_key(state.run, state.lap), encode_object(state.to_api()))
        return stored if written else None

    def get_lap(self, run: RunRef, lap: int) -> tuple[LapRecord, StoredObject]:
        """Read, verify, migrate and validate a lap record. Raises ``CheckpointNotFound``,
        ``CorruptCheckpoint``, ``UnsupportedSchemaVersion`` or ``StoreUnavailable``."""
        record, stored, _ = self._get_lap(run, lap)
        return record, stored

    def _get_lap(self, run: RunRef, lap: int) -> tuple[LapRecord, StoredObject, int]:
        key = self.lap_key(run, lap)
        doc, stored, version = self._read(key)
        record = parse_model(LapRecord, doc, key)
        if record.run != run or record.lap != lap:
            raise CorruptCheckpoint(
                f"checkpoint {key} holds lap {record.lap} of {record.run.namespace}/{record.run.name} "
                f"(uid {record.run.uid}): not the object this key names",
                key,
            )
        return record, stored, version

    def get_snapshot(self, run: RunRef, lap: int) -> tuple[RunState, StoredObject]:
        key = self.snapshot_key(run, lap)
        doc, stored, _ = self._read(key)
        state = parse_model(RunState, doc, key)
        if state.run != run or state.lap != lap:
            raise CorruptCheckpoint(f"checkpoint {key} holds the state of another run or lap", key)
        return state, stored

    def head_lap(self, run: RunRef, lap: int) -> StoredObject | None:
        return self._head(self.lap_key(run, lap))

    def has_state(self, run: RunRef, lap: int) -> bool:
        """True if the state through ``lap`` was checkpointed: its lap record, or a (fork) snapshot."""
        return self.head_lap(run, lap) is not None or self._head(self.snapshot_key(run, lap)) is not None

    def fork(self, source: RunRef, lap: int, target: RunRef) -> tuple[RunState, StoredObject]:
        """Write ``target``'s fork snapshot ``snapshots/<lap>.json``: the source's state through
        ``lap`` (``fold.fork_state``). Idempotent: when the snapshot exists it is read (and
        verified) instead. Only reads the source. Raises ``CheckpointNotFound`` when the source's
        lap was never checkpointed, ``CorruptCheckpoint`` / ``UnsupportedSchemaVersion`` when it
        cannot be read, ``StoreUnavailable`` on transient errors."""
        key = self.snapshot_key(target, lap)
        if self._head(key) is None:
            base = self.along(self.read_rewinds(source)).load_state(source, through_lap=lap).state
            self._put_once(key, encode_object(fork_state(base, target).to_api()))
        state, stored = self.get_snapshot(target, lap)
        if state.forked_from is None:
            raise CorruptCheckpoint(f"{key} exists but is not a fork snapshot (no forkedFrom)", key)
        return state, stored

    def latest_lap(self, run: RunRef) -> int:
        """The newest checkpointed lap (0: none). Lists the snapshots (one per K laps) and then
        only the lap keys after the newest snapshot: cost does not grow with laps per snapshot."""
        return self._latest(run, self._snapshot_laps(run))

    def _latest(self, run: RunRef, snapshots: list[int]) -> int:
        if self.rewinds:  # the newest history's laps, else its rewind point (checkpointed by then)
            newest = self._list_laps(self.history_prefix(run, len(self.rewinds)) + contract.LAPS_DIR)
            return newest[-1] if newest else self.rewinds[-1]
        start_after = self.lap_key(run, snapshots[-1]) if snapshots else None
        laps = self._list_laps(self.run_prefix(run) + contract.LAPS_DIR, start_after)
        if laps:
            return laps[-1]
        return snapshots[-1] if snapshots else 0

    def load_state(self, run: RunRef, through_lap: int | None = None) -> LoadResult:
        """The state after ``through_lap`` (default: the latest lap): the newest snapshot at or
        before it, then the lap records after the snapshot, folded with the hash chain checked.

        Snapshots are derived data: a corrupt one (sha256 mismatch, bad JSON, invalid fields) is
        logged and skipped, and the next older snapshot (or the initial state) is used instead, so
        more than K+1 objects are read. The corrupt object is left as it is. A snapshot of an
        unsupported (newer) schema version is not skipped: ``UnsupportedSchemaVersion`` is raised,
        as for any object. A corrupt lap record (the source of truth) raises ``CorruptCheckpoint``.
        """
        if through_lap is not None and through_lap < 0:
            raise ValueError(f"through_lap must be >= 0, got {through_lap}")
        if through_lap is not None and through_lap >= self.config.snapshot_every:
            fast = self._load_from_expected_snapshot(run, through_lap)
            if fast is not None:
                return fast
        snapshots = self._snapshot_laps(run)
        through = self._latest(run, snapshots) if through_lap is None else through_lap
        state, base = RunState(run=run), 0
        keys: list[str] = []
        skipped: list[str] = []
        for lap in sorted((s for s in snapshots if s <= through), reverse=True):
            key = self.snapshot_key(run, lap)
            keys.append(key)
            try:
                state, snap = self.get_snapshot(run, lap)
            except CorruptCheckpoint as e:
                if self.head_lap(run, lap) is None:
                    # No lap record behind it: a fork snapshot, the base of this run, not derived
                    # data. There is nothing older to fall back to.
                    raise CorruptCheckpoint(
                        f"fork snapshot {key} (the base this run starts from) cannot be read: {e}", key
                    ) from None
                skipped.append(key)
                log.warning(
                    "snapshot %s is corrupt, falling back to an older snapshot and the lap records: %s",
                    key,
                    e,
                )
                continue
            base = lap
            if lap == through:  # the snapshot after the last lap counts in the run's storage
                state = state.model_copy(update={"storage": Storage(
                    bytes=state.storage.bytes + snap.size, objects=state.storage.objects + 1)})
            break
        for lap in range(base + 1, through + 1):
            record, stored, version = self._get_lap(run, lap)
            self._check_link(run, state, record, version)
            state = fold(state, record, stored.sha256, stored.size)
            keys.append(stored.key)
        return LoadResult(
            state=state, objects_read=len(keys), keys_read=tuple(keys), skipped_snapshots=tuple(skipped)
        )

    def _load_from_expected_snapshot(self, run: RunRef, through: int) -> LoadResult | None:
        """``load_state`` without listing: the snapshot a run writes every K laps, at
        ``through // K * K``, read directly, then the lap records after it (so a resume at a
        known lap costs one GET per object read, no LIST; the GETs run in parallel, so a resume
        K-1 laps after a snapshot waits for about one GET, not K). None, to take the listing
        path, when that snapshot is absent or unreadable (a fork, K changed, a failed snapshot
        write) or a lap record after it is missing. Errors are raised in lap order, as the
        sequential fold would."""
        lap = through // self.config.snapshot_every * self.config.snapshot_every
        laps = list(range(lap + 1, through + 1))
        if not laps:
            return self._fold_expected(run, lap, through, lambda: self.get_snapshot(run, lap), [])
        pool = _reader_pool()
        futures: list[Future[Any]] = [pool.submit(self.get_snapshot, run, lap)]
        try:
            futures += [pool.submit(self._get_lap, run, n) for n in laps]
            return self._fold_expected(run, lap, through, futures[0].result, [f.result for f in futures[1:]])
        finally:
            for f in futures:  # when the fold stopped early: the reads not started are not needed
                f.cancel()

    def _fold_expected(
        self, run: RunRef, lap: int, through: int, snapshot: Callable[[], tuple[RunState, StoredObject]],
        records: list[Callable[[], tuple[LapRecord, StoredObject, int]]],
    ) -> LoadResult | None:
        try:
            state, snap = snapshot()
        except (CheckpointNotFound, CorruptCheckpoint):
            return None
        keys = [snap.key]
        if lap == through:
            state = state.model_copy(update={"storage": Storage(
                bytes=state.storage.bytes + snap.size, objects=state.storage.objects + 1)})
        for read in records:
            try:
                record, stored, version = read()
            except CheckpointNotFound:
                return None
            self._check_link(run, state, record, version)
            state = fold(state, record, stored.sha256, stored.size)
            keys.append(stored.key)
        return LoadResult(state=state, objects_read=len(keys), keys_read=tuple(keys))

    def _check_link(self, run: RunRef, state: RunState, record: LapRecord, version: int) -> None:
        """Records written with the hash chain (schema >= 2) must point at the previous lap."""
        if version < 2 or state.last_sha256 is None or record.prev_sha256 == state.last_sha256:
            return
        prev_key = self.lap_key(run, state.lap) if state.lap else "(none)"
        key = self.lap_key(run, record.lap)
        raise CorruptCheckpoint(
            f"hash chain broken: {key} has prevSha256 {record.prev_sha256 or '(none)'} but "
            f"{prev_key} has sha256 {state.last_sha256}",
            key,
        )

    def iter_laps(self, run: RunRef, start: int = 1) -> Iterator[tuple[LapRecord, StoredObject]]:
        """The lap records from ``start`` on, in order (for the trace reader)."""
        if self.rewinds:
            laps = self._lineage_laps(run, contract.LAPS_DIR, start)
        else:
            start_after = self.lap_key(run, start - 1) if start > 1 else None
            laps = self._list_laps(self.run_prefix(run) + contract.LAPS_DIR, start_after)
        for lap in laps:
            if lap >= start:
                yield self.get_lap(run, lap)

    # ---- journal and attempt reports -------------------------------------------------------

    def put_journal(
        self, run: RunRef, lap: int, name: str, body: dict[str, Any], agent_version: str | None = None
    ) -> bool:
        """Write a journal entry once. True if written; False if it already existed (then use
        ``get_journal``'s value, never ours)."""
        return self.put_journal_entry(run, lap, name, body, agent_version)[1]

    def put_journal_entry(
        self, run: RunRef, lap: int, name: str, body: dict[str, Any], agent_version: str | None = None
    ) -> tuple[StoredObject, bool]:
        """``put_journal`` that also returns the object (its size counts in the run's storage).
        Schema 3 leaves ``run`` out of the stored entry: the key names the run."""
        key = self.journal_key(run, lap, name)
        entry = JournalEntry(agent_version=agent_version, run=run, lap=lap, name=name, body=body)
        doc = entry.to_api()
        del doc["run"]
        return self._put_once(key, encode_object(doc))

    def get_journal(self, run: RunRef, lap: int, name: str) -> dict[str, Any] | None:
        found = self.get_journal_entry(run, lap, name)
        return None if found is None else found[0].body

    def get_journal_entry(self, run: RunRef, lap: int, name: str) -> tuple[JournalEntry, StoredObject, int] | None:
        """The journal entry, its object and the schema version it was written with; None if absent."""
        key = self.journal_key(run, lap, name)
        found = self._read_optional(key)
        if found is None:
            return None
        doc, stored, version = found
        doc.setdefault("run", run.to_api())
        entry = parse_model(JournalEntry, doc, key)
        if entry.run != run or entry.lap != lap:
            raise CorruptCheckpoint(f"checkpoint {key} holds a journal entry of another run or lap", key)
        return entry, stored, version

    def put_attempt_failure(
        self, run: RunRef, lap: int, attempt: int, body: dict[str, Any], agent_version: str | None = None
    ) -> None:
        """Best effort (overwrites; store errors are logged, not raised)."""
        key = self.attempt_key(run, lap, attempt)
        entry = AttemptFailure(agent_version=agent_version, run=run, lap=lap, attempt=attempt, body=body)
        data = encode_object(entry.to_api())
        try:
            self._put(key, data, sha256_hex(data), create_only=False)
        except CheckpointError as e:
            log.warning("attempt report %s not written: %s", key, e)

    def delete_journal(
        self, run: RunRef, lap: int, names: list[str] | None = None, *, lap_written: bool = False
    ) -> int:
        """Delete the journal entries of a checkpointed lap (``names``, or all found under
        ``journal/<lap>/``): the lap record holds everything they held, so every byte stays stored
        once. Only once ``laps/<lap>`` exists: checked with a HEAD unless the caller just wrote it
        (``lap_written``). Best effort: a store error is logged and
        the entries stay (a later runner of the lap, which exits 3, deletes them). Returns how many
        were deleted."""
        try:
            if not lap_written and self.head_lap(run, lap) is None:
                raise ValueError(f"lap {lap} is not checkpointed: its journal is still needed")
            if names is None:
                keys = list(self.blobs.list_keys(self._lap_prefix(run, lap) + contract.journal_dir(lap)))
            else:
                keys = [self.journal_key(run, lap, n) for n in names]
            if not keys:
                return 0
            failed = self.blobs.delete(keys)
            if failed:
                log.warning("journal of lap %s: %d entries not deleted", lap, len(failed))
            return len(keys) - len(failed)
        except CheckpointError as e:
            log.warning("journal of lap %s not deleted: %s", lap, e)
            return 0

    def get_attempt_failure(self, run: RunRef, lap: int, attempt: int) -> dict[str, Any] | None:
        key = self.attempt_key(run, lap, attempt)
        found = self._read_optional(key)
        if found is None:
            return None
        return parse_model(AttemptFailure, found[0], key).body

    # ---- rewinds in place ------------------------------------------------------------------

    def rewind_key(self, run: RunRef, history: int) -> str:
        return self.run_prefix(run) + contract.rewind_object(history)

    def put_rewind(self, run: RunRef) -> None:
        """Write the marker of this store's newest history (``rewinds/<h>.json``: its rewind point),
        create-only, before any object of the history: what :meth:`read_rewinds` finds. A no-op for a
        run never rewound; the same marker again is a no-op; another one raises ``CorruptCheckpoint``."""
        if not self.rewinds:
            return
        h = len(self.rewinds)
        key = self.rewind_key(run, h)
        doc = {"kind": REWIND_KIND, "schemaVersion": SCHEMA_VERSION, "history": h, "fromLap": self.rewinds[-1]}
        _, written = self._put_once(key, encode_object(doc))
        if not written:
            raise CorruptCheckpoint(f"checkpoint {key}: another rewind point holds history {h} (this lap was told "
                                    f"{contract.Env.REWINDS}={contract.format_rewinds(self.rewinds)})", key)

    def read_rewinds(self, run: RunRef) -> tuple[int, ...]:
        """The run's rewinds as its markers in the store say (one LIST; no GET for a run never
        rewound): for a reader without the run's status (a fork of it, ``agentrun trace --uid``).
        A history whose first lap has not started has no marker yet: it holds no lap either. A
        missing marker before a present one (a history that never ran a lap) gets a rewind point
        past every lap, so it holds none."""
        found: dict[int, int] = {}
        for key in self.blobs.list_keys(self.run_prefix(run) + contract.REWINDS_DIR):
            m = _REWIND_FILE.search(key)
            if m is None:
                continue
            blob = self.blobs.get(key)
            verify_sha256(blob.data, blob.metadata.get("sha256"), key)
            doc = decode_document(blob.data, key)
            point = doc.get("fromLap")
            if doc.get("kind") != REWIND_KIND or not isinstance(point, int) or not 0 <= point <= contract.MAX_LAP:
                raise CorruptCheckpoint(f"checkpoint {key} is not a rewind marker", key)
            found[int(m[1])] = point
        top = max(found, default=0)
        if top > contract.MAX_REWINDS:
            raise CorruptCheckpoint(f"checkpoint {self.rewind_key(run, 1)}: history {top} is past {contract.MAX_REWINDS}",
                                    self.run_prefix(run) + contract.REWINDS_DIR)
        return tuple(found.get(h, contract.MAX_LAP) for h in range(1, top + 1))

    def executed_after(self, run: RunRef, after: int, through: int) -> list[tuple[int, ToolCallRecord]]:
        """The tool calls sent to a tool after lap ``after`` in the run's current history, in order:
        those of the lap records ``after+1..through`` and those the unfinished lap ``through+1``
        journaled (its calls that executed before it failed or was cancelled), or its record when it
        was checkpointed after all (stopped right after its checkpoint, before the operator read it).
        A call whose record has no start time was never sent (unknown tool, invalid arguments,
        awaiting approval)."""
        out: list[tuple[int, ToolCallRecord]] = []
        for lap in range(after + 1, through + 1):
            record, _ = self.get_lap(run, lap)
            out += [(lap, c) for c in record.tool_calls if c.started_at is not None]
        lap = through + 1
        if lap > contract.MAX_LAP:
            return out
        try:
            record, _ = self.get_lap(run, lap)
            return out + [(lap, c) for c in record.tool_calls if c.started_at is not None]
        except CheckpointNotFound:
            pass
        folder = self._lap_prefix(run, lap) + contract.journal_dir(lap)
        journaled: list[ToolCallRecord] = []
        for key in sorted(self.blobs.list_keys(folder)):
            name = key[len(folder):].removesuffix(".json")
            if not name.startswith("tool-"):
                continue
            found = self.get_journal_entry(run, lap, name)
            body = (found[0].body if found else {}).get("record")
            if isinstance(body, dict):
                call = parse_model(ToolCallRecord, body, key)
                if call.started_at is not None:
                    journaled.append(call)
        journaled.sort(key=lambda c: c.started_at or _now())
        return out + [(lap, c) for c in journaled]

    def requested_unanswered(self, run: RunRef, lap: int) -> list[tuple[str, str]]:
        """(call id, tool) of each tool call the journaled model response of the unfinished lap
        ``lap`` asked for whose result was never journaled: it may have been sent (the lap stopped
        between sending it and journaling the answer). Nothing when the lap was checkpointed or
        journaled no model response (no call is sent before the response is journaled)."""
        if lap > contract.MAX_LAP or self.head_lap(run, lap) is not None:
            return []
        found = self.get_journal_entry(run, lap, contract.MODEL_JOURNAL_NAME)
        response = (found[0].body if found else {}).get("response")
        calls = response.get("toolCalls") if isinstance(response, dict) else None
        if not isinstance(calls, list):
            return []
        folder = self._lap_prefix(run, lap) + contract.journal_dir(lap)
        answered = {key[len(folder):].removesuffix(".json") for key in self.blobs.list_keys(folder)}
        out = []
        for call in calls:
            if isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(call.get("name"), str) \
                    and contract.tool_journal_name(call["id"]) not in answered:
                out.append((call["id"], call["name"]))
        return out

    # ---- the pinned Agent copy of a run of an Agent (api/agent.py) ------------------------

    def agent_key(self, run: RunRef, digest: str) -> str:
        return self.run_prefix(run) + contract.agent_object(digest)

    def put_agent(self, run: RunRef, resolved: ResolvedAgent) -> StoredObject:
        """Store the resolved copy under its digest, create-only (the same copy stored again is a
        no-op); CorruptCheckpoint when other bytes sit under that digest."""
        digest = resolved.digest()
        key = self.agent_key(run, digest)
        stored, written = self._put_once(key, encode_object(resolved.to_api()))
        if not written:
            raise CorruptCheckpoint(f"checkpoint {key}: another object holds this Agent copy's digest", key)
        return stored

    def get_agent(self, run: RunRef, digest: str) -> ResolvedAgent:
        """The resolved copy of that digest, verified (its bytes' sha256, then the digest of its
        content); CheckpointNotFound, CorruptCheckpoint, StoreUnavailable."""
        from agentrun.api.agent import ResolvedAgent

        key = self.agent_key(run, digest)
        blob = self.blobs.get(key)
        verify_sha256(blob.data, blob.metadata.get("sha256"), key)
        resolved = parse_model(ResolvedAgent, decode_document(blob.data, key), key)
        if resolved.digest() != digest:
            raise CorruptCheckpoint(f"checkpoint {key}: its content's sha256 is {resolved.digest()}, not {digest}", key)
        return resolved

    # ---- retention -------------------------------------------------------------------------

    def delete_run(self, run: RunRef) -> int:
        """Delete every object of the run (retention: Delete). Returns how many were deleted."""
        prefix = self.run_prefix(run)
        keys = list(self.blobs.list_keys(prefix))
        failed = self.blobs.delete(keys)
        if failed:
            raise StoreUnavailable(
                f"S3 DeleteObjects {prefix}: {len(failed)} objects not deleted, e.g. {failed[0][0]}: {failed[0][1]}",
                prefix,
            )
        return len(keys)


def _now() -> datetime:
    return datetime.now(UTC)
