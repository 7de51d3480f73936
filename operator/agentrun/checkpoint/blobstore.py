"""``BlobStore``: the object store under the checkpoint store, and its in-memory backend.

The checkpoint store (``checkpoint/store.py``: layout, codec, sha256 metadata, fencing) needs five
operations of a bucket, and nothing else:

- ``get(key)``: the bytes as stored, the user metadata, the write time; ``CheckpointNotFound``
  naming the key when there is no such object;
- ``head(key)``: size, metadata and write time without the bytes; None when absent;
- ``put(key, data, metadata, content_type, if_absent=True)``: a create-only write (S3's
  ``If-None-Match: *``, the fence of every lap record). True when written, False when the key
  exists (the existing object is untouched); decided atomically: of racing writers exactly one
  gets True. ``if_absent=False`` overwrites (attempt reports);
- ``list_keys(prefix, start_after)``: the keys under a prefix in ascending (UTF-8 byte) order, after
  ``start_after`` when given;
- ``delete(keys)``: delete each of ``keys`` (absent ones are not an error); returns the
  ``(key, code)`` of each object not deleted.

Every backend raises only the store's errors (``checkpoint/errors.py``): ``CheckpointNotFound``,
``StoreUnavailable`` (retryable), ``StoreConfigError`` (permanent). The backends are
``s3store.S3BlobStore`` (botocore's client, any S3-compatible endpoint) and
:class:`MemoryBlobStore` here; ``tests/checkpoint/test_blobstore.py`` is the one conformance
suite every backend passes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Protocol

from agentrun.checkpoint.codec import MAX_DECODED_BYTES
from agentrun.checkpoint.errors import CheckpointNotFound, CorruptCheckpoint

MAX_STORED_BYTES = MAX_DECODED_BYTES
"""No stored object of the layout is bigger than what it may inflate to, so a bigger one is refused
as corrupt before it is read into memory (an object written by a compromised lap must not exhaust
the operator): every backend's ``get`` enforces it."""


def too_large(key: str, size: int) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"checkpoint object {key} is {size} bytes, more than any object of the layout "
                             f"may be ({MAX_STORED_BYTES}): not read", key)


@dataclass(frozen=True)
class BlobInfo:
    """What a ``head`` says of a stored object."""

    key: str
    size: int
    metadata: Mapping[str, str]
    last_modified: datetime | None


@dataclass(frozen=True)
class Blob(BlobInfo):
    """A stored object: its bytes as stored (never content-decoded) and what ``head`` says."""

    data: bytes = field(default=b"", repr=False)


class BlobStore(Protocol):
    """The operations the checkpoint store needs of a bucket (see the module docstring)."""

    def get(self, key: str) -> Blob: ...

    def head(self, key: str) -> BlobInfo | None: ...

    def put(self, key: str, data: bytes, metadata: Mapping[str, str], content_type: str, *,
            if_absent: bool = True) -> bool: ...

    def list_keys(self, prefix: str, start_after: str | None = None) -> Iterator[str]: ...

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]: ...

    def close(self) -> None: ...


class MemoryBlobStore:
    """A bucket in this process's memory: a dict under one lock, so a create-only put is decided
    atomically, as S3 decides it. For tests and tools that need a store without a server; the
    checkpoint store behaves on it as on S3 (the conformance suite checks both)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, Blob] = {}

    def get(self, key: str) -> Blob:
        with self._lock:
            blob = self._objects.get(key)
        if blob is None:
            raise CheckpointNotFound(key)
        if blob.size > MAX_STORED_BYTES:
            raise too_large(key, blob.size)
        return blob

    def head(self, key: str) -> BlobInfo | None:
        with self._lock:
            blob = self._objects.get(key)
        return None if blob is None else BlobInfo(blob.key, blob.size, blob.metadata, blob.last_modified)

    def put(self, key: str, data: bytes, metadata: Mapping[str, str], content_type: str, *,
            if_absent: bool = True) -> bool:
        meta = MappingProxyType({k.lower(): v for k, v in metadata.items()})  # S3 lower-cases the names too
        blob = Blob(key, len(data), meta, datetime.now(UTC), bytes(data))
        with self._lock:
            if if_absent and key in self._objects:
                return False
            self._objects[key] = blob
        return True

    def list_keys(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._objects if k.startswith(prefix)]
        after = (start_after or "").encode()
        yield from (k for k in sorted(keys, key=str.encode) if k.encode() > after)

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        with self._lock:
            for key in keys:
                self._objects.pop(key, None)
        return []

    def close(self) -> None:
        pass
