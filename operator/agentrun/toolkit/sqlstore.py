"""Any SQL database as the toolkit's store, through SQLAlchemy Core (``pip install 'agentrun[toolkit]'``).

    store = SQLStore("postgresql+psycopg://ledger@db/ledger")    # the driver is yours to install
    app = IdempotencyMiddleware(app, store)   # or: IdempotencyMiddleware(app, "postgresql+psycopg://...")

The same table and rule as :class:`~agentrun.toolkit.store.SQLiteStore`: ``key`` is the primary key,
so of N concurrent claims of one key (from any number of processes or hosts sharing the database)
exactly one INSERT succeeds; the others get the unique violation and read the row. Each method is
one short transaction on a pooled connection.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from agentrun.toolkit.store import Record, StoredResponse, _stale

__all__ = ["SQLStore"]


class SQLStore:
    def __init__(self, url: str, *, table: str = "agentrun_idempotency", **engine_kw: Any) -> None:
        self.engine = create_engine(url, **engine_kw)
        md = MetaData()
        self.t = Table(
            table, md,
            Column("key", String(255), primary_key=True),
            Column("fingerprint", String(64), nullable=False),
            Column("token", String(32), nullable=False),
            Column("started_at", Float, nullable=False),
            Column("completed_at", Float),
            Column("status", Integer),
            Column("content_type", String(255)),
            Column("body", LargeBinary),
            Column("size", Integer),
        )
        md.create_all(self.engine)

    def _row(self, conn: Any, key: str) -> Record | None:
        t = self.t
        row = conn.execute(select(t.c.key, t.c.fingerprint, t.c.token, t.c.started_at, t.c.status,
                                  t.c.content_type, t.c.body, t.c.size).where(t.c.key == key)).first()
        if row is None:
            return None
        resp = None if row[4] is None else StoredResponse(int(row[4]), str(row[5]), bytes(row[6]), int(row[7]))
        return Record(row[0], row[1], row[2], float(row[3]), resp)

    def claim(self, key: str, fingerprint: str, token: str, now: float, lease_seconds: float | None) -> Record | None:
        t = self.t
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(t).values(key=key, fingerprint=fingerprint, token=token, started_at=now))
            return None
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            rec = self._row(conn, key)
            if rec is None:
                return self.claim(key, fingerprint, token, now, lease_seconds)
            if rec.fingerprint == fingerprint and _stale(rec, now, lease_seconds):
                n = conn.execute(update(t).where(t.c.key == key, t.c.token == rec.token, t.c.status.is_(None))
                                 .values(token=token, started_at=now)).rowcount
                if n == 1:
                    return None
            return rec

    def get(self, key: str) -> Record | None:
        with self.engine.connect() as conn:
            return self._row(conn, key)

    def complete(self, key: str, token: str, response: StoredResponse, now: float) -> bool:
        t = self.t
        with self.engine.begin() as conn:
            n = conn.execute(update(t).where(t.c.key == key, t.c.token == token, t.c.status.is_(None)).values(
                completed_at=now, status=response.status, content_type=response.content_type, body=response.body,
                size=response.size)).rowcount
        return bool(n == 1)

    def release(self, key: str, token: str) -> None:
        t = self.t
        with self.engine.begin() as conn:
            conn.execute(delete(t).where(t.c.key == key, t.c.token == token, t.c.status.is_(None)))

    def purge(self, completed_before: float) -> int:
        t = self.t
        with self.engine.begin() as conn:
            return int(conn.execute(delete(t).where(t.c.completed_at < completed_before)).rowcount)

    def close(self) -> None:
        self.engine.dispose()
