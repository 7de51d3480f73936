"""The S3 backend of ``BlobStore`` (``checkpoint/blobstore.py``): botocore's S3 client, the one S3
path of the operator, the lap and the CLI.

Credentials come from botocore's standard chain (the one boto3 uses); this module never reads,
passes or logs them. botocore's errors become the store's (``checkpoint/errors.py``), each naming
the operation and the object key, never the credentials, the signature or the response body.
botocore is imported when a client is made or an error is translated, not by importing this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentrun.api.addresses import AddressRefusal
from agentrun.api.types import redact_url
from agentrun.checkpoint.blobstore import MAX_STORED_BYTES, Blob, BlobInfo, too_large
from agentrun.checkpoint.errors import CheckpointError, CheckpointNotFound, StoreConfigError, StoreUnavailable

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

    from agentrun.checkpoint.store import StoreConfig

T = TypeVar("T")

_RETRYABLE_CODES = {
    "Throttling", "ThrottlingException", "SlowDown", "RequestTimeout", "RequestTimeTooSkewed",
    "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests",
}  # fmt: skip
_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404"}
#: Retries of a create-only PUT answered 409 ConditionalRequestConflict (another conditional write
#: of the key is in flight); then StoreUnavailable (retryable).
CONFLICT_RETRIES = 4
CONFLICT_BACKOFF_SECONDS = 0.1
#: Keys per DeleteObjects request (S3's limit).
DELETE_BATCH = 1000


def make_client(config: StoreConfig) -> Any:
    """An S3 client using the standard credential chain: the botocore client that
    ``boto3.session.Session().client("s3", ...)`` returns (same session defaults, configuration,
    credential chain and API), made from a botocore session directly. boto3's session layer adds
    only resources and S3 transfer helpers (``upload_file`` ...), which the store does not use.

    The session is ``checkpoint/s3model.py``'s: its data loader reads the trimmed copy of what an
    S3 client loads, its credentials and token come from botocore's standard chain."""
    from botocore.config import Config

    from agentrun.checkpoint.s3model import session

    botocore_config = Config(
        s3={"addressing_style": "path" if config.path_style else "auto"},
        retries={"mode": "standard", "max_attempts": 4},
        connect_timeout=5,
        read_timeout=30,
    )
    return session(config.endpoint_url, config.region).create_client(
        "s3", endpoint_url=config.endpoint_url, region_name=config.region, config=botocore_config
    )


class _ConditionFailed(Exception):
    """A create-only put was refused because the object exists (412 PreconditionFailed)."""


class _ConditionalConflict(StoreUnavailable):
    """409 ConditionalRequestConflict: a concurrent conditional write of the key is still in
    flight. Retryable: the outcome of that write is not known yet, so it never means "exists"."""


class S3BlobStore:
    """One bucket through botocore's S3 client (thread-safe, as the client is)."""

    def __init__(self, config: StoreConfig, client: Any = None, *, page_size: int | None = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.client = client if client is not None else make_client(config)
        self.page_size = page_size
        """Keys per ListObjectsV2 page (None: the server's, 1000 on S3)."""

    # ---- the interface ---------------------------------------------------------------------

    def get(self, key: str) -> Blob:
        def get() -> tuple[bytes, dict[str, Any]]:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            body = resp["Body"]
            size = int(resp.get("ContentLength") or 0)
            data = b"" if size > MAX_STORED_BYTES else body.read(MAX_STORED_BYTES + 1)  # bounded, whatever
            if size > MAX_STORED_BYTES or len(data) > MAX_STORED_BYTES:  # the length header said
                body.close()  # not drained: the connection is dropped, not pooled
                raise too_large(key, max(size, len(data)))
            return data, resp

        data, resp = self._call("GetObject", key, get)
        return Blob(key, len(data), resp.get("Metadata", {}), resp.get("LastModified"), data)

    def head(self, key: str) -> BlobInfo | None:
        try:
            resp = self._call("HeadObject", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except CheckpointNotFound:
            return None
        return BlobInfo(key, int(resp.get("ContentLength", 0)), resp.get("Metadata", {}), resp.get("LastModified"))

    def put(self, key: str, data: bytes, metadata: Mapping[str, str], content_type: str, *,
            if_absent: bool = True) -> bool:
        """``PutObject``; with ``if_absent``, ``If-None-Match: *``, retried a few times with backoff
        while the store answers 409 ConditionalRequestConflict (then that StoreUnavailable)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data, "ContentType": content_type,
                                  "Metadata": dict(metadata)}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self._call("PutObject", key, lambda: self.client.put_object(**kwargs))
                return True
            except _ConditionFailed:
                return False
            except _ConditionalConflict:
                if attempt == CONFLICT_RETRIES:
                    raise
                time.sleep(CONFLICT_BACKOFF_SECONDS * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def list_keys(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        if self.page_size:
            kwargs["MaxKeys"] = self.page_size
        while True:
            resp = self._call("ListObjectsV2", prefix, lambda: self.client.list_objects_v2(**kwargs))
            for item in resp.get("Contents", []):
                yield item["Key"]
            if not resp.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]
            kwargs.pop("StartAfter", None)

    def delete(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        failed: list[tuple[str, str]] = []
        for i in range(0, len(keys), DELETE_BATCH):
            batch = {"Objects": [{"Key": k} for k in keys[i : i + DELETE_BATCH]], "Quiet": True}
            resp = self._call("DeleteObjects", keys[i],
                              lambda b=batch: self.client.delete_objects(Bucket=self.bucket, Delete=b))  # type: ignore[misc]
            failed += [(str(e.get("Key")), str(e.get("Code"))) for e in resp.get("Errors") or []]
        return failed

    def close(self) -> None:
        """Close the client's connections (botocore >= 1.33)."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    # ---- botocore's errors, as the store's -------------------------------------------------

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run one S3 call, translating botocore errors into checkpoint errors."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            return fn()
        except ClientError as e:
            raise self._client_error(op, key, e) from None
        except (NoCredentialsError, PartialCredentialsError):
            raise StoreConfigError(
                f"S3 {op} {key}: no usable credentials found by the standard AWS credential chain", key
            ) from None
        except BotoCoreError as e:
            refused = getattr(e, "kwargs", {}).get("error")
            if isinstance(refused, AddressRefusal):  # the lap's connect-time check: nothing was sent
                raise StoreConfigError(f"S3 {op} {key}: {refused}", key) from None
            where = redact_url(self.config.endpoint_url or "AWS S3")
            raise StoreUnavailable(
                f"S3 {op} {key}: cannot reach the store at {where} ({type(e).__name__})", key
            ) from None

    def _client_error(self, op: str, key: str, e: ClientError) -> CheckpointError | _ConditionFailed:
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if status == 412 or code == "PreconditionFailed":
            return _ConditionFailed()
        what = f"S3 {op} {key}: {code or 'error'} (HTTP {status})"
        if status == 409 or code == "ConditionalRequestConflict":
            return _ConditionalConflict(
                f"{what}: a concurrent conditional write of this key is in flight; retry", key)
        if code == "NoSuchBucket":
            return StoreConfigError(f"{what}: bucket {self.bucket!r} does not exist", key)
        if code in _NOT_FOUND_CODES or status == 404:
            return CheckpointNotFound(key)
        if status >= 500 or status in (408, 429) or code in _RETRYABLE_CODES:
            return StoreUnavailable(what, key)
        return StoreConfigError(what, key)
