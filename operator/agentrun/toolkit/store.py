"""Where the toolkit keeps responses by idempotency key: SQLite (default), memory (tests), any SQL
database through SQLAlchemy (``agentrun.toolkit.sqlstore``, the ``toolkit`` extra).

A store holds one row per key: the fingerprint of the request that first used the key (method,
path and canonical arguments), who is executing it (a random token) and since when, and, once the
handler answered, the stored response (status, content type, body, the body's original size).
The unique key is what makes concurrent duplicates execute once: the first ``claim`` inserts the
in-progress row, every other ``claim`` of the key finds it and waits (docs/tools.md, "Concurrent
duplicates").

Every method is synchronous and short (one statement or transaction); the ASGI middleware and the
async decorators call them on a worker thread.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["MemoryStore", "Record", "SQLiteStore", "Store", "StoredResponse", "open_store"]

DEFAULT_SQLITE_PATH = "agentrun-idempotency.sqlite3"
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class StoredResponse:
    """What a repeated key is answered with."""

    status: int
    content_type: str
    body: bytes
    size: int
    """The body's size as the handler produced it: more than ``len(body)`` when the store cut it."""


@dataclass(frozen=True)
class Record:
    """One key's row. ``response`` is None while the first request is executing."""

    key: str
    fingerprint: str
    token: str
    started_at: float
    response: StoredResponse | None


class Store(Protocol):
    """The interface a store implements (MemoryStore, SQLiteStore, sqlstore.SQLStore)."""

    def claim(self, key: str, fingerprint: str, token: str, now: float, lease_seconds: float | None) -> Record | None:
        """Take ``key`` for ``token``: None when the caller now executes it (it inserted the in-progress
        row, or took over an in-progress row with the same fingerprint started more than
        ``lease_seconds`` ago); otherwise the row that is there."""
        ...

    def get(self, key: str) -> Record | None: ...

    def complete(self, key: str, token: str, response: StoredResponse, now: float) -> bool:
        """Store the response of the execution ``token`` owns; False if it no longer owns the key."""
        ...

    def release(self, key: str, token: str) -> None:
        """Forget the in-progress row ``token`` owns (the handler failed: nothing to store)."""
        ...

    def purge(self, completed_before: float) -> int:
        """Delete the rows completed before that time (epoch seconds); how many."""
        ...

    def close(self) -> None: ...


def _stale(rec: Record, now: float, lease_seconds: float | None) -> bool:
    return rec.response is None and lease_seconds is not None and rec.started_at < now - lease_seconds


class MemoryStore:
    """A dict behind a lock: for tests and single-process demos (lost at exit)."""

    def __init__(self) -> None:
        self._rows: dict[str, Record] = {}
        self._completed: dict[str, float] = {}
        self._lock = threading.Lock()

    def claim(self, key: str, fingerprint: str, token: str, now: float, lease_seconds: float | None) -> Record | None:
        with self._lock:
            rec = self._rows.get(key)
            if rec is None or (rec.fingerprint == fingerprint and _stale(rec, now, lease_seconds)):
                self._rows[key] = Record(key, fingerprint, token, now, None)
                return None
            return rec

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._rows.get(key)

    def complete(self, key: str, token: str, response: StoredResponse, now: float) -> bool:
        with self._lock:
            rec = self._rows.get(key)
            if rec is None or rec.token != token or rec.response is not None:
                return False
            self._rows[key] = Record(key, rec.fingerprint, token, rec.started_at, response)
            self._completed[key] = now
            return True

    def release(self, key: str, token: str) -> None:
        with self._lock:
            rec = self._rows.get(key)
            if rec is not None and rec.token == token and rec.response is None:
                del self._rows[key]

    def purge(self, completed_before: float) -> int:
        with self._lock:
            old = [k for k, t in self._completed.items() if t < completed_before]
            for k in old:
                del self._rows[k], self._completed[k]
            return len(old)

    def close(self) -> None:
        pass


class SQLiteStore:
    """A SQLite file (stdlib ``sqlite3``) in WAL mode; the default store.

    One connection per thread. ``key`` is the table's primary key, so of N concurrent claims of one
    key exactly one inserts; the others read the row. ``synchronous=FULL`` (default) makes every
    stored response durable when ``complete`` returns, power loss included; ``NORMAL`` keeps it
    across a crash of the process but may lose the last commits on power loss. Several processes
    (workers) may share the file on one host; not over a network file system.
    """

    def __init__(self, path: str | Path = DEFAULT_SQLITE_PATH, *, table: str = "agentrun_idempotency",
                 synchronous: str = "FULL", busy_timeout_seconds: float = 30.0) -> None:
        if not _TABLE.match(table):
            raise ValueError(f"SQLiteStore table: {table!r} is not an SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"SQLiteStore synchronous: {synchronous!r} is not FULL, NORMAL or EXTRA")
        self.path = str(path)
        self._table = table
        self._sync = synchronous.upper()
        self._timeout = busy_timeout_seconds
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # SQLite has one writer at a time; threads of this process queue on a lock instead of on
        # SQLite's busy handler, whose sleeps (up to 100 ms each) would make the tail latency
        self._write = threading.Lock()
        self._conn().execute(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            " key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, token TEXT NOT NULL, started_at REAL NOT NULL,"
            " completed_at REAL, status INTEGER, content_type TEXT, body BLOB, size INTEGER)")

    def _conn(self) -> sqlite3.Connection:
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(f"PRAGMA synchronous={self._sync}")
            self._local.conn = c
            with self._lock:
                self._all.append(c)
        return c

    def _row(self, c: sqlite3.Connection, key: str) -> Record | None:
        row = c.execute(f"SELECT key, fingerprint, token, started_at, status, content_type, body, size"
                        f" FROM {self._table} WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        resp = None if row[4] is None else StoredResponse(int(row[4]), str(row[5]), bytes(row[6]), int(row[7]))
        return Record(row[0], row[1], row[2], float(row[3]), resp)

    def claim(self, key: str, fingerprint: str, token: str, now: float, lease_seconds: float | None) -> Record | None:
        with self._write:
            return self._claim(key, fingerprint, token, now, lease_seconds)

    def _claim(self, key: str, fingerprint: str, token: str, now: float, lease_seconds: float | None) -> Record | None:
        c = self._conn()
        cur = c.execute(f"INSERT INTO {self._table} (key, fingerprint, token, started_at) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT(key) DO NOTHING", (key, fingerprint, token, now))
        if cur.rowcount == 1:
            return None
        rec = self._row(c, key)
        if rec is None:  # released between the two statements (by another process): try once more
            return self._claim(key, fingerprint, token, now, lease_seconds)
        if rec.fingerprint == fingerprint and _stale(rec, now, lease_seconds):
            cur = c.execute(f"UPDATE {self._table} SET token = ?, started_at = ?"
                            " WHERE key = ? AND token = ? AND status IS NULL", (token, now, key, rec.token))
            if cur.rowcount == 1:
                return None
            return self._row(c, key) or rec
        return rec

    def get(self, key: str) -> Record | None:
        return self._row(self._conn(), key)

    def complete(self, key: str, token: str, response: StoredResponse, now: float) -> bool:
        with self._write:
            cur = self._conn().execute(
                f"UPDATE {self._table} SET completed_at = ?, status = ?, content_type = ?, body = ?, size = ?"
                " WHERE key = ? AND token = ? AND status IS NULL",
                (now, response.status, response.content_type, response.body, response.size, key, token))
        return cur.rowcount == 1

    def release(self, key: str, token: str) -> None:
        with self._write:
            self._conn().execute(f"DELETE FROM {self._table} WHERE key = ? AND token = ? AND status IS NULL",
                                 (key, token))

    def purge(self, completed_before: float) -> int:
        with self._write:
            cur = self._conn().execute(f"DELETE FROM {self._table} WHERE completed_at < ?", (completed_before,))
        return cur.rowcount

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()


def open_store(url: str | Path | Store | None = None) -> Store:
    """A store from a URL: None or a path or ``sqlite:///PATH`` -> SQLiteStore; ``memory:`` ->
    MemoryStore; any other ``dialect://...`` -> SQLStore through SQLAlchemy (``pip install
    'agentrun[toolkit]'``); a Store is returned as is."""
    if url is None:
        return SQLiteStore()
    if not isinstance(url, str | Path):
        return url
    s = str(url)
    if s == "memory:":
        return MemoryStore()
    if s.startswith("sqlite:///"):
        return SQLiteStore(s[len("sqlite:///"):])
    if "://" in s:
        from agentrun.toolkit.sqlstore import SQLStore

        return SQLStore(s)
    return SQLiteStore(s)
