"""Errors of a lap. Each carries ``permanent``: the CLI maps it to exit 2 (permanent) or 75 (retryable)."""

from __future__ import annotations


class LapError(Exception):
    """A lap could not produce its checkpoint."""

    permanent: bool = False


class RetryableLapError(LapError):
    """Transient: model/tool timeout, 429/5xx, connection error. The operator retries the lap."""

    permanent = False


class PermanentLapError(LapError):
    """Retrying cannot help: bad configuration, removed tool, missing decision, provider 4xx."""

    permanent = True


class ConfigError(PermanentLapError):
    """Bad lap configuration (environment, spec). The message names the variable or field."""


class LapTerminated(RetryableLapError):
    """SIGTERM arrived (the Job deleted: a cancel, a passed deadline, a drain): the journal entry in
    flight was written, and the lap stops before its next call. Exit 143 (``ExitCode.TERMINATED``)."""

    permanent = False
