"""The store's conditional-write probe: does it honour ``If-None-Match: *``?

Fencing rests on it: a lap record is written with ``PUT ... If-None-Match: *``, so a zombie lap
pod can never overwrite the lap a newer attempt wrote (``docs/concepts.md``). Some S3-compatible
servers (older MinIO, some Ceph RGW releases, gateways) ignore the header silently: both writes
succeed, and the fence is gone without a trace. Before a run's first lap the operator probes its
store once:

1. ``PUT <prefix>/.agentrun-probe/<random>`` with ``If-None-Match: *`` must succeed (a fresh key);
2. the same PUT again must be refused: 412 PreconditionFailed. A 409 ConditionalRequestConflict
   (the first write still in flight) is retried a few times;
3. the probe object is deleted (best effort: a leftover is a few bytes under ``.agentrun-probe/``,
   which no run prefix can collide with, since a namespace name never starts with ".").

A store whose second write succeeds ("ignored"), or that refuses the conditional header itself
(501 NotImplemented, 400 InvalidArgument, ...), is unsafe. Transient errors (5xx, throttling, cannot
connect) and configuration errors (no bucket, access denied) raise the store's usual errors; only
definite answers (safe / unsafe) are cached, per endpoint and bucket, for the life of the process.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from agentrun.api.types import redact_url
from agentrun.checkpoint.errors import StoreConfigError, StoreUnavailable

log = logging.getLogger(__name__)

PROBE_DIR = ".agentrun-probe"
#: Retries of the second PUT while the store answers 409 ConditionalRequestConflict.
CONFLICT_RETRIES = 4
_CONFIG_CODES = {
    "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
    "InvalidBucketName", "AuthorizationHeaderMalformed", "PermanentRedirect", "ExpiredToken", "InvalidToken",
}  # fmt: skip


@dataclass(frozen=True)
class ProbeResult:
    """The probe's verdict for one store (endpoint + bucket)."""

    safe: bool
    endpoint: str
    """The endpoint, redacted (no credentials in it), or "AWS S3"."""
    bucket: str
    detail: str
    """What the store answered, for the run's condition and the operator's log."""


def store_where(config: Any) -> str:
    """``http://host:port`` (redacted) or ``AWS S3`` for a StoreConfig."""
    return redact_url(config.endpoint_url) if config.endpoint_url else "AWS S3"


def probe_key(prefix: str) -> str:
    head = f"{prefix}/" if prefix else ""
    return f"{head}{PROBE_DIR}/{uuid.uuid4().hex}"


def probe_conditional_writes(client: Any, config: Any, sleep: Any = time.sleep) -> ProbeResult:
    """Probe the store of ``config`` (a ``StoreConfig``) through ``client`` (boto3 S3).

    Returns the verdict; raises ``StoreUnavailable`` (retryable: 5xx, throttling, unreachable, a
    conflict that does not settle) or ``StoreConfigError`` (no bucket, no or refused credentials)."""
    where, bucket = store_where(config), config.bucket
    key = probe_key(config.prefix)

    def verdict(safe: bool, detail: str) -> ProbeResult:
        return ProbeResult(safe=safe, endpoint=where, bucket=bucket, detail=detail)

    def put(body: bytes) -> tuple[int, str]:
        """(HTTP status, error code) of one conditional PUT; 200 and "" when it was written."""
        try:
            client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*", ContentType="text/plain")
            return 200, ""
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            return status, code
        except (NoCredentialsError, PartialCredentialsError):
            raise StoreConfigError(
                f"probe of {where} bucket {bucket!r}: no usable credentials found by the standard AWS "
                "credential chain", key) from None
        except BotoCoreError as e:
            raise StoreUnavailable(f"probe of {where}: cannot reach the store ({type(e).__name__})", key) from None

    def refused(step: str, status: int, code: str) -> ProbeResult:
        what = f"{code or 'error'} (HTTP {status})"
        if code in _CONFIG_CODES or status in (401, 403):
            raise StoreConfigError(f"probe of {where} bucket {bucket!r}: {step} PUT {key}: {what}", key)
        if status == 501 or code in ("NotImplemented", "InvalidArgument", "InvalidRequest"):
            return verdict(False, f"the store refuses conditional writes: the {step} PUT with If-None-Match: * "
                                  f"was answered {what}")
        if status >= 500 or status in (0, 408, 409, 429):
            raise StoreUnavailable(f"probe of {where}: {step} PUT {key}: {what}", key)
        return verdict(False, f"the {step} PUT with If-None-Match: * was answered {what}, not the expected "
                              f"{'success' if step == 'first' else '412 PreconditionFailed'}")

    try:
        status, code = put(b"agentrun conditional-write probe 1\n")
        if status != 200:
            if status == 412 or code == "PreconditionFailed":
                return verdict(False, f"the first PUT with If-None-Match: * of a fresh key ({key}) was refused "
                                      "412 PreconditionFailed although the key did not exist")
            return refused("first", status, code)
        for attempt in range(CONFLICT_RETRIES + 1):
            status, code = put(b"agentrun conditional-write probe 2\n")
            if status == 409 and attempt < CONFLICT_RETRIES:
                sleep(0.1 * 2**attempt)
                continue
            break
        if status == 200:
            return verdict(False, "a second PUT with If-None-Match: * of an existing object succeeded: "
                                  "the store ignores the condition")
        if status == 412 or code == "PreconditionFailed":
            return verdict(True, "a second PUT with If-None-Match: * was refused 412 PreconditionFailed")
        return refused("second", status, code)
    finally:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as e:
            log.warning("store probe: cannot delete the probe object %s at %s: %s", key, where, type(e).__name__)


class ProbeCache:
    """Definite probe results per (endpoint, bucket), for the life of the process. Thread-safe; one
    probe at a time per store (concurrent callers wait for it instead of probing too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[tuple[str | None, str], ProbeResult] = {}
        self._store_locks: dict[tuple[str | None, str], threading.Lock] = {}

    def check(self, store: Any) -> ProbeResult:
        """The verdict for ``store`` (a ``CheckpointStore``), probing it on first use. Raises like
        :func:`probe_conditional_writes` (nothing is cached then)."""
        key = (store.config.endpoint_url, store.config.bucket)
        with self._lock:
            if key in self._results:
                return self._results[key]
            store_lock = self._store_locks.setdefault(key, threading.Lock())
        with store_lock:
            with self._lock:
                if key in self._results:
                    return self._results[key]
            result = probe_conditional_writes(store.client, store.config)
            level = logging.INFO if result.safe else logging.ERROR
            log.log(level, "store probe of %s bucket %s: %s: %s", result.endpoint, result.bucket,
                    "honours If-None-Match" if result.safe else "UNSAFE", result.detail)
            with self._lock:
                self._results[key] = result
            return result

    def clear(self) -> None:
        with self._lock:
            self._results.clear()


#: The process-wide cache the operator uses.
PROBES = ProbeCache()
