"""The rule every front of the toolkit (ASGI middleware, function decorator, MCP decorator) applies.

For a request carrying key K and arguments whose fingerprint is F:

1. ``claim(K)``: nobody has K -> this request executes it (an in-progress row is inserted first);
2. K is stored with fingerprint F -> answer the stored response, do not execute;
3. K is known with another fingerprint -> refuse: :class:`KeyReused` (HTTP 409, code
   ``idempotency-key-reused``);
4. K is in progress (a concurrent duplicate) -> wait, polling the store, up to ``wait_seconds``
   for the stored response; still in progress then -> :class:`KeyInProgress` (HTTP 409, code
   ``idempotency-key-in-progress``, ``Retry-After: 1``). The lap retries a 409 with the same key.
   An in-progress row older than ``lease_seconds`` (its executor died mid-call) is taken over by the
   next request with the same fingerprint, which executes the handler again.

After executing: a response is stored (before it is sent) unless its status says "try again"
(:func:`storable`); otherwise, and when the handler raises, the in-progress row is deleted and the
next request with K executes again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from agentrun.toolkit.store import Record, Store, StoredResponse

__all__ = ["HEADER", "IdempotencyError", "KeyInProgress", "KeyInvalid", "KeyReused", "Policy", "ResultNotStored",
           "canonical_json", "fingerprint", "storable"]

HEADER = "Idempotency-Key"
"""The header the lap sends a side-effecting tool's key in (lap/tools/http.py)."""
KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
"""A key the toolkit accepts: 1-255 visible ASCII characters. The lap's keys
(``r_<32 hex>:<lap>:<tool>:<callId>``) are at most 173."""
NOT_STORED_STATUS = frozenset({408, 409, 425, 429})
"""Statuses (with every 5xx) that mean "try again": the lap retries them with the same key
(``RETRYABLE_STATUS`` in lap/tools/http.py), so they are not stored."""
DEFAULT_MAX_BODY_BYTES = 1 << 20
"""Stored bytes of one response: the lap never reads more than 1 MiB of a tool's answer
(``maxResultBytes`` is at most 1 MiB)."""


def storable(status: int) -> bool:
    """Whether a response with this status is stored under its key (a final answer)."""
    return status < 500 and status not in NOT_STORED_STATUS


@dataclass(frozen=True)
class Policy:
    wait_seconds: float = 10.0
    """How long a concurrent duplicate waits for the first request's stored response."""
    lease_seconds: float | None = 300.0
    """After how long an in-progress row is taken to be abandoned (None: never; the key then answers
    409 in-progress until the row is deleted by hand)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Stored bytes of one response body."""

    def __post_init__(self) -> None:
        if self.wait_seconds < 0:
            raise ValueError(f"wait_seconds: {self.wait_seconds} is negative")
        if self.lease_seconds is not None and self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds: {self.lease_seconds} must be positive or None")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes: {self.max_body_bytes} must be at least 1")


class IdempotencyError(Exception):
    """A refusal, answered as ``{"error": {"code", "message", "idempotencyKey"}}`` with ``status``."""

    status = 409
    code = "idempotency"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message

    def body(self) -> bytes:
        return json.dumps({"error": {"code": self.code, "message": self.message, "idempotencyKey": self.key}},
                          separators=(",", ":")).encode()


class KeyReused(IdempotencyError):
    code = "idempotency-key-reused"

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Idempotency-Key {key!r} was already used with different arguments; "
                              "a key names one call: send a new key for a new call")


class KeyInProgress(IdempotencyError):
    code = "idempotency-key-in-progress"

    def __init__(self, key: str, since: float) -> None:
        age = max(0.0, time.time() - since)
        super().__init__(key, f"a request with Idempotency-Key {key!r} is still being executed (for {age:.1f}s); "
                              "retry with the same key")


class KeyInvalid(IdempotencyError):
    status = 400
    code = "idempotency-key-invalid"

    def __init__(self, key: str) -> None:
        shown = key if len(key) <= 80 else key[:80] + "..."
        super().__init__(shown, f"Idempotency-Key must be 1-255 visible ASCII characters, got {len(key)} "
                                f"characters: {shown!r}")


class ResultNotStored(IdempotencyError):
    """A function's result was over ``max_body_bytes``: it was returned once, and a repeated key is
    refused with this error instead of executing again."""

    status = 500
    code = "idempotency-result-not-stored"

    def __init__(self, key: str, size: int, limit: int) -> None:
        super().__init__(key, f"the result of the call with Idempotency-Key {key!r} was {size} bytes, over the "
                              f"store's limit of {limit} bytes (max_body_bytes): it was returned once and is "
                              "not stored; the call is not executed again")


def check_key(key: str) -> None:
    if not KEY_PATTERN.match(key):
        raise KeyInvalid(key)


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: the same arguments in any key order give the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr).encode()


def fingerprint(*parts: bytes) -> str:
    """sha256 over length-prefixed parts (no two different part lists collide by concatenation)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


Begun = tuple[str | None, StoredResponse | None]
"""What :func:`begin_sync`/:func:`begin_async` return: ``(token, None)`` or ``(None, stored response)``."""


def _settled(rec: Record | None, key: str, fp: str, token: str, deadline: float) -> Begun | None:
    """The outcome for the key's row ``rec`` (after a claim or a look), or None to wait and look
    again: no row means ours was inserted (execute); another fingerprint is refused; a stored
    response is answered; an in-progress row past ``deadline`` is refused as in progress."""
    if rec is None:
        return token, None
    if rec.fingerprint != fp:
        raise KeyReused(key)
    if rec.response is not None:
        return None, rec.response
    if time.monotonic() >= deadline:
        raise KeyInProgress(key, rec.started_at)
    return None


def _claimable(rec: Record | None, policy: Policy) -> bool:
    """Whether to claim the key again after a look: its row is gone (released) or has been in
    progress longer than ``lease_seconds`` (its executor died mid-call)."""
    return rec is None or (rec.response is None and policy.lease_seconds is not None
                           and rec.started_at < time.time() - policy.lease_seconds)


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread: a store's methods block, the event loop must not."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


async def begin_async(store: Store, key: str, fp: str, policy: Policy,
                      call: Callable[..., Awaitable[Any]]) -> Begun:
    """(token, None): execute and then ``complete``/``release`` with the token; (None, response):
    answer the stored response. ``call(fn, *args)`` runs a store method off the event loop."""
    token = uuid.uuid4().hex
    deadline = time.monotonic() + policy.wait_seconds
    delay = 0.002
    rec = await call(store.claim, key, fp, token, time.time(), policy.lease_seconds)
    while (done := _settled(rec, key, fp, token, deadline)) is None:
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.05)
        rec = await call(store.get, key)
        if _claimable(rec, policy):
            rec = await call(store.claim, key, fp, token, time.time(), policy.lease_seconds)
    return done


def begin_sync(store: Store, key: str, fp: str, policy: Policy) -> Begun:
    """:func:`begin_async` for synchronous callers."""
    token = uuid.uuid4().hex
    deadline = time.monotonic() + policy.wait_seconds
    delay = 0.002
    rec = store.claim(key, fp, token, time.time(), policy.lease_seconds)
    while (done := _settled(rec, key, fp, token, deadline)) is None:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        rec = store.get(key)
        if _claimable(rec, policy):
            rec = store.claim(key, fp, token, time.time(), policy.lease_seconds)
    return done


def execute_sync(store: Store, key: str, token: str, call: Callable[[], Any],
                 encode: Callable[[Any], StoredResponse]) -> Any:
    """Run the call :func:`begin_sync` let through with ``token`` and return its value, stored
    under ``key`` as ``encode(value)``; when the call or ``encode`` raises, the key is released
    (the next request with it executes again) and the exception goes on."""
    try:
        value = call()
        resp = encode(value)
    except BaseException:
        store.release(key, token)
        raise
    store.complete(key, token, resp, time.time())
    return value


async def execute_async(store: Store, key: str, token: str, call: Callable[[], Awaitable[Any]],
                        encode: Callable[[Any], StoredResponse]) -> Any:
    """:func:`execute_sync` for async callers: the store is written off the event loop and shielded
    from cancellation, so a cancelled call still leaves its key released (or stored)."""
    try:
        value = await call()
        resp = encode(value)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await off_loop(store.release, key, token)
        raise
    with anyio.CancelScope(shield=True):
        await off_loop(store.complete, key, token, resp, time.time())
    return value
