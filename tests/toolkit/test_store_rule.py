"""The toolkit's stores and its rule, in process: claim/complete/release/lease on the SQLite and
memory stores, the function decorator (sync and async), and the constants shared with the lap."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from agentrun.toolkit import (
    KeyInProgress,
    KeyReused,
    MemoryStore,
    ResultNotStored,
    SQLiteStore,
    Store,
    StoredResponse,
    idempotent,
    open_store,
)
from agentrun.toolkit.core import HEADER, NOT_STORED_STATUS, storable

RESP = StoredResponse(201, "application/json", b'{"ok":true}', 11)


@pytest.fixture(params=["sqlite", "memory", "sqlalchemy"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlalchemy":
        pytest.importorskip("sqlalchemy")
        # through SQLAlchemy (the toolkit extra), here on SQLite's driver: any URL SQLAlchemy knows
        return open_store(f"sqlite+pysqlite:///{tmp_path / 'k.sqlite3'}")
    return SQLiteStore(tmp_path / "k.sqlite3") if request.param == "sqlite" else MemoryStore()


def test_claim_complete_release_and_lease(store: Store) -> None:
    assert store.claim("k", "fp", "t1", 100.0, 300.0) is None  # inserted: t1 executes
    rec = store.claim("k", "fp", "t2", 101.0, 300.0)
    assert rec is not None and rec.token == "t1" and rec.response is None  # in progress
    assert not store.complete("k", "t2", RESP, 102.0)  # only the owner stores
    assert store.complete("k", "t1", RESP, 102.0)
    rec = store.claim("k", "other", "t3", 103.0, 300.0)
    assert rec is not None and rec.fingerprint == "fp" and rec.response == RESP
    # release forgets an in-progress row of its owner only; a stored row stays
    store.release("k", "t1")
    assert store.get("k") is not None
    assert store.claim("j", "fp", "t1", 100.0, 10.0) is None
    store.release("j", "t9")
    assert store.get("j") is not None
    store.release("j", "t1")
    assert store.get("j") is None
    # an abandoned in-progress row is taken over after the lease, by the same fingerprint only
    assert store.claim("m", "fp", "t1", 100.0, 10.0) is None
    assert store.claim("m", "fp", "t2", 105.0, 10.0) is not None
    assert store.claim("m", "other", "t2", 200.0, 10.0) is not None
    assert store.claim("m", "fp", "t2", 200.0, None) is not None  # lease None: never
    assert store.claim("m", "fp", "t2", 200.0, 10.0) is None
    assert not store.complete("m", "t1", RESP, 201.0) and store.complete("m", "t2", RESP, 201.0)
    assert store.purge(150.0) == 1 and store.get("k") is None and store.get("m") is not None


def test_sqlite_rows_outlive_the_store_object(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "k.sqlite3")
    assert s.claim("k", "fp", "t1", 1.0, None) is None and s.complete("k", "t1", RESP, 2.0)
    s.close()
    rec = open_store(f"sqlite:///{tmp_path / 'k.sqlite3'}").get("k")
    assert rec is not None and rec.response == RESP


def test_sqlite_concurrent_claims_have_one_winner(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "k.sqlite3")
    barrier = threading.Barrier(16)

    def claim(i: int) -> bool:
        barrier.wait()
        return s.claim("k", "fp", f"t{i}", time.time(), 300.0) is None

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(claim, range(16))) == 1


def test_bad_store_settings_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="table"):
        SQLiteStore(tmp_path / "x", table="x; drop")
    with pytest.raises(ValueError, match="lease_seconds"):
        idempotent(MemoryStore(), lease_seconds=0)


def test_function_decorator_runs_once_per_key_under_threads(tmp_path: Path) -> None:
    runs: list[int] = []

    @idempotent(SQLiteStore(tmp_path / "k.sqlite3"))
    def book(invoice: str, amount: int) -> dict[str, object]:
        time.sleep(0.2)
        runs.append(amount)
        return {"invoice": invoice, "n": len(runs)}

    with ThreadPoolExecutor(20) as pool:
        out = list(pool.map(lambda _: book("INV-1", amount=5, idempotency_key="k1"), range(20)))
    assert runs == [5] and out == [{"invoice": "INV-1", "n": 1}] * 20
    with pytest.raises(KeyReused, match="'k1' was already used with different arguments"):
        book("INV-1", amount=6, idempotency_key="k1")
    assert book("INV-1", amount=6)["n"] == 2  # no key: runs


def test_async_decorator_exceptions_release_and_in_progress_times_out() -> None:
    calls = 0
    gate = anyio.Event()

    @idempotent(MemoryStore(), wait_seconds=0.2)
    async def flaky(x: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient")
        await gate.wait()
        return x * 2

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await flaky(2, idempotency_key="k")
        async with anyio.create_task_group() as tg:
            results: list[int] = []

            async def first() -> None:
                results.append(await flaky(2, idempotency_key="k"))

            tg.start_soon(first)
            await anyio.sleep(0.05)
            with pytest.raises(KeyInProgress, match="still being executed"):
                await flaky(2, idempotency_key="k")
            gate.set()
        assert results == [4] and await flaky(2, idempotency_key="k") == 4

    anyio.run(main)
    assert calls == 2


def test_a_result_over_the_bound_is_returned_once_and_a_repeat_is_refused() -> None:
    runs = 0

    @idempotent(MemoryStore(), max_body_bytes=64)
    def dump() -> str:
        nonlocal runs
        runs += 1
        return "x" * 100

    assert dump(idempotency_key="k") == "x" * 100
    with pytest.raises(ResultNotStored, match="102 bytes, over the store's limit of 64 bytes"):
        dump(idempotency_key="k")
    assert runs == 1


def test_the_toolkit_and_the_lap_agree_on_the_wire() -> None:
    """The statuses the kit does not store are the ones the lap retries with the same key, and the
    header is the one the lap sends."""
    import inspect

    from agentrun.lap.tools import http

    assert NOT_STORED_STATUS == http.RETRYABLE_STATUS
    assert f'headers["{HEADER}"] = key' in inspect.getsource(http.HTTPToolRunner._send)
    assert [s for s in (200, 201, 400, 404, 408, 409, 422, 425, 429, 500, 503) if storable(s)] == [200, 201, 400,
                                                                                                  404, 422]
