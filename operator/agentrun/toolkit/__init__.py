"""agentrun.toolkit: make a tool honour ``Idempotency-Key`` in a few lines (docs/tools.md).

- :class:`IdempotencyMiddleware` (``agentrun.toolkit.asgi``): any ASGI app (Starlette, FastAPI);
- :func:`idempotent` (``agentrun.toolkit.functions``): a plain handler function, sync or async;
- ``agentrun.toolkit.mcp.idempotent_tool``: a tool of an ``mcp`` SDK server (``pip install 'agentrun[toolkit]'``);
- stores: :class:`SQLiteStore` (default, stdlib), :class:`MemoryStore` (tests),
  ``agentrun.toolkit.sqlstore.SQLStore`` (any SQL database via SQLAlchemy, the ``toolkit`` extra);
  :func:`open_store` picks one from a URL.

Used by tool servers, never by the operator or the lap (an import-linter contract says so); it
imports nothing from them either.
"""

from agentrun.toolkit.asgi import IdempotencyMiddleware
from agentrun.toolkit.core import HEADER, IdempotencyError, KeyInProgress, KeyInvalid, KeyReused, ResultNotStored
from agentrun.toolkit.functions import idempotent
from agentrun.toolkit.store import MemoryStore, Record, SQLiteStore, Store, StoredResponse, open_store

__all__ = ["HEADER", "IdempotencyError", "IdempotencyMiddleware", "KeyInProgress", "KeyInvalid", "KeyReused",
           "MemoryStore", "Record", "ResultNotStored", "SQLiteStore", "Store", "StoredResponse", "idempotent",
           "open_store"]
