"""A decorator for plain handler functions (sync or async): one execution per idempotency key.

    store = SQLiteStore("keys.sqlite3")

    @idempotent(store)
    def book(invoice: str, amount: int) -> dict: ...

    book(invoice="INV-1", amount=5, idempotency_key=key)   # runs once per key; a repeat returns the
                                                           # stored result (as JSON round-trips it)

The decorated function takes one more keyword, ``idempotency_key``; None (or absent) runs it
plainly. The arguments (positional and keyword, as canonical JSON) and the function's qualified
name are the fingerprint: the same key with other arguments raises :class:`KeyReused`, a concurrent
duplicate that outlives ``wait_seconds`` raises :class:`KeyInProgress`. The result must be JSON
serialisable; it is stored as JSON and a repeat returns ``json.loads`` of it. An exception is not
stored: the key is released and the next call with it executes again.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agentrun.toolkit.core import (
    Policy,
    ResultNotStored,
    begin_async,
    begin_sync,
    canonical_json,
    check_key,
    execute_async,
    execute_sync,
    fingerprint,
    off_loop,
)
from agentrun.toolkit.store import Store, StoredResponse, open_store

F = TypeVar("F", bound=Callable[..., Any])
NOT_STORED_CONTENT_TYPE = "application/vnd.agentrun.not-stored+json"


def encode_result(value: Any, limit: int) -> StoredResponse:
    body = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > limit:
        return StoredResponse(200, NOT_STORED_CONTENT_TYPE, b"", len(body))
    return StoredResponse(200, "application/json", body, len(body))


def decode_result(key: str, r: StoredResponse, limit: int) -> Any:
    if r.content_type == NOT_STORED_CONTENT_TYPE:
        raise ResultNotStored(key, r.size, limit)
    return json.loads(r.body)


def idempotent(store: Store | str | Path | None = None, *, wait_seconds: float = 10.0,
               lease_seconds: float | None = 300.0, max_body_bytes: int = Policy.max_body_bytes) -> Callable[[F], F]:
    """Make a function run once per ``idempotency_key`` (see the module's text)."""
    st = open_store(store)
    policy = Policy(wait_seconds=wait_seconds, lease_seconds=lease_seconds, max_body_bytes=max_body_bytes)

    def deco(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}".encode()

        def fp(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            return fingerprint(name, canonical_json({"args": list(args), "kwargs": kwargs}))

        def encode(value: Any) -> StoredResponse:
            return encode_result(value, policy.max_body_bytes)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*args: Any, idempotency_key: str | None = None, **kwargs: Any) -> Any:
                if idempotency_key is None:
                    return await fn(*args, **kwargs)
                check_key(idempotency_key)
                token, stored = await begin_async(st, idempotency_key, fp(args, kwargs), policy, off_loop)
                if token is None:
                    assert stored is not None
                    return decode_result(idempotency_key, stored, policy.max_body_bytes)
                return await execute_async(st, idempotency_key, token, lambda: fn(*args, **kwargs), encode)

            awrapper.store = st  # type: ignore[attr-defined]
            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, idempotency_key: str | None = None, **kwargs: Any) -> Any:
            if idempotency_key is None:
                return fn(*args, **kwargs)
            check_key(idempotency_key)
            token, stored = begin_sync(st, idempotency_key, fp(args, kwargs), policy)
            if token is None:
                assert stored is not None
                return decode_result(idempotency_key, stored, policy.max_body_bytes)
            return execute_sync(st, idempotency_key, token, lambda: fn(*args, **kwargs), encode)

        wrapper.store = st  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco
