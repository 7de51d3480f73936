"""Errors of the checkpoint store.

Every error says whether it is ``permanent`` (retrying cannot help: stop the run, exit code 2) or
retryable (exit code 75). Messages name the object key and, for bad bodies, the field; they never
carry credentials, request signatures or response bodies.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of the checkpoint errors."""

    permanent: bool = False

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __str__(self) -> str:
        return self.message


class LapAlreadyCheckpointed(CheckpointError):
    """The lap object exists already: another writer (e.g. a zombie pod) won the conditional put.

    Not a failure: read the lap object that exists (runner exit code 3).
    """

    permanent = False

    def __init__(self, key: str) -> None:
        super().__init__(f"checkpoint {key} already exists: another writer checkpointed this lap", key)


class CorruptCheckpoint(CheckpointError):
    """A stored object does not verify: sha256 mismatch, unparsable JSON, invalid field, broken chain."""

    permanent = True


class UnsupportedSchemaVersion(CheckpointError):
    """An object was written by a newer (or unknown) schema version than this code reads."""

    permanent = True

    def __init__(self, key: str, found: object, min_supported: int, max_supported: int) -> None:
        super().__init__(
            f"checkpoint {key} has schemaVersion {found}; this agentrun reads schema versions "
            f"{min_supported}..{max_supported} — upgrade the operator/runner image",
            key,
        )
        self.found = found
        self.min_supported = min_supported
        self.max_supported = max_supported


class CheckpointNotFound(CheckpointError):
    """The object does not exist."""

    permanent = False

    def __init__(self, key: str) -> None:
        super().__init__(f"checkpoint {key} not found", key)


class StoreUnavailable(CheckpointError):
    """The store could not be reached or answered with a retryable error (5xx, throttling, timeout)."""

    permanent = False


class StoreConfigError(CheckpointError):
    """The store refuses us for a reason retrying cannot fix: no such bucket, access denied,
    no credentials, a malformed checkpoint URI."""

    permanent = True


class CheckpointTooLarge(CheckpointError):
    """A lap's checkpoint would pass a size ceiling (``spec.checkpoint.maxLapBytes`` or
    ``maxRunBytes``). Permanent: the same lap would be as large again. Nothing is written."""

    permanent = True

    def __init__(self, message: str, key: str, lap: int, size: int, limit: int, field: str) -> None:
        super().__init__(message, key)
        self.lap, self.size, self.limit, self.field = lap, size, limit, field
