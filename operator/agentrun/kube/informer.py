"""List, then watch, one resource (client-go's reflector): every change is handed to a sink on
the event loop, a watch that expires (410 Gone) lists again, a failing list or watch is retried with
backoff. One task on the loop per informer, reading over :class:`~agentrun.kube.client.Client`: a
watch event wakes only the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from .client import Client, Headers, path

log = logging.getLogger("agentrun.kube")

#: Server-side timeout of a watch (the operator's default of AGENTRUN_WATCH_TIMEOUT_SECONDS), and how
#: much longer than it the client waits on a silent watch connection before it drops it.
WATCH_SECONDS, WATCH_READ_MARGIN_SECONDS = 120, 30.0
LIST_PAGE = 500
#: Longest wait between two tries of a failing list/watch (the API server restarting): the sink
#: lags the API server by at most this much once it is back.
WATCH_RETRY_MAX = 5.0
#: Wait before listing again a kind an optional informer may not read (403: no RBAC; 404: not served).
REFUSED_RETRY = 60.0


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what no reader needs (``metadata.managedFields``: memory and copies)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def rv_int(obj: dict[str, Any] | None) -> int | None:
    """The object's resourceVersion as an integer (None: unset or not a number)."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")
    except (TypeError, ValueError):
        return None


def is_newer(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """True when ``new`` is a later version than ``old`` (or there is no ``old``): a write's answer
    kept before an older watch event is not replaced by it."""
    if old is None:
        return True
    a, b = rv_int(new), rv_int(old)
    if a is None or b is None:
        return ((new.get("metadata") or {}).get("resourceVersion")
                != (old.get("metadata") or {}).get("resourceVersion"))
    return a > b


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Informer:
    """List, then watch, one resource in one namespace (None: cluster-wide); every change is handed
    to ``sink`` on ``loop``. ``synced`` is set after the first list is applied. ``start`` is called
    on the loop.

    ``sink`` is any object with ``replace(kind, scope, items)`` and ``event(kind, type, obj)``;
    ``kind`` is the name the sink knows the resource by, ``resource`` its (prefix, plural);
    ``transform`` is applied to every object before it reaches the sink (client-go's transform);
    ``field_selector`` narrows the list and watch (``metadata.name=X``: one object, which RBAC can
    grant by ``resourceNames``), and ``scope`` is then what a relist replaces (passed to
    ``replace`` instead of the namespace). An ``optional`` informer whose first list is refused
    (403, or 404: not served) tells the sink (``refused(kind, status, scope)``), counts as synced and
    lists again every :data:`REFUSED_RETRY` seconds; once it has listed, a refusal is an error like
    any other (retried with backoff, the sink keeps what it was told last). With ``stop_refused``
    a refusal (401, 403) of its list or watch, before or after it listed, tells the sink
    (``refused``) and ends the informer: a reader whose access is not its own to restore (a person
    impersonated) does not ask again. ``headers`` go with its every request (``Impersonate-User``)."""

    def __init__(self, client: Client, kind: str, namespace: str | None, selector: str | None,
                 sink: Any, loop: asyncio.AbstractEventLoop, *, resource: tuple[str, str],
                 transform: Callable[[dict[str, Any]], dict[str, Any]] = strip, optional: bool = False,
                 field_selector: str | None = None, scope: str | None = None,
                 watch_seconds: int = WATCH_SECONDS, headers: Headers | None = None,
                 stop_refused: bool = False) -> None:
        self.client, self.kind, self.namespace, self.selector = client, kind, namespace, selector
        #: The server ends each watch after this long (the informer watches again from its
        #: resourceVersion); the client drops a watch silent for WATCH_READ_MARGIN_SECONDS more.
        self.watch_seconds = watch_seconds
        self.field_selector, self.scope = field_selector, (namespace if scope is None else scope)
        self._listed = False
        self._failures = 0
        self.last_error: str | None = None  # the last list/watch error (status and reason)
        #: Since when (monotonic) the API server has refused this informer's list or watch (401,
        #: 403) after it had listed: its part of the cache no longer moves. None once it lists again.
        self.refused_since: float | None = None
        self.sink, self.loop, self.optional, self.transform = sink, loop, optional, transform
        self.headers, self.stop_refused = headers, stop_refused
        self._own: dict[str, Any] = {"headers": headers} if headers else {}  # the requests' own headers, if any
        self.synced = asyncio.Event()
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self.path = path(resource, namespace)

    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name=f"informer-{self.kind}-{self.namespace or 'all'}")

    def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)

    async def stopped(self) -> None:
        """Wait for the task of a stopped informer to end (its watch closed)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ what a list or watch means

    def _list_query(self, cont: str | None) -> dict[str, Any]:
        return {"labelSelector": self.selector, "fieldSelector": self.field_selector, "limit": LIST_PAGE,
                "continue": cont}

    def _watch_query(self, rv: str) -> dict[str, Any]:
        return {"labelSelector": self.selector, "fieldSelector": self.field_selector, "resourceVersion": rv,
                "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_seconds}

    def _listed_all(self, items: list[dict[str, Any]]) -> None:
        self._apply(self.sink.replace, self.kind, self.scope, [self.transform(o) for o in items])
        self._listed = True
        self.refused_since = None
        self.synced.set()

    def _event(self, ev: dict[str, Any], rv: str) -> str:
        """Apply one watch event; the resourceVersion to resume from. :class:`_Expired` on a 410."""
        from kubernetes.client.exceptions import ApiException

        type_, obj = ev.get("type"), ev.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ApiException(status=obj.get("code") or 0, reason=str(obj.get("message")))
        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
        if type_ in ("ADDED", "MODIFIED", "DELETED"):
            self._apply(self.sink.event, self.kind, type_, self.transform(obj))
        return rv

    def _failed(self, exc: Exception) -> tuple[float, bool]:
        """(seconds to wait, list again) after a list or watch ended with ``exc``."""
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, _Expired):
            return 0.0, True
        if isinstance(exc, ApiException):
            if exc.status == 410:
                return 0.0, True
            if self.optional and not self._listed and exc.status in (403, 404):
                self._apply(self.sink.refused, self.kind, exc.status, self.scope)
                self.synced.set()
                return REFUSED_RETRY, True
            self._failures += 1
            self.last_error = f"{exc.status} {exc.reason}"  # the controller's "not synced" warning names it
            (log.warning if self._failures % 60 == 1 else log.debug)(  # rate-limited: the first, then ~every 5 min
                "watch of %s in %s failed: %s %s", self.kind, self.namespace or "all namespaces",
                exc.status, exc.reason)
            wait = min(WATCH_RETRY_MAX, 0.5 * 2 ** min(self._failures, 6))
            if exc.status in (401, 403) and self._listed:
                # its access was taken away after it listed: list again (only a list proves it is back)
                if self.refused_since is None:
                    self.refused_since = time.monotonic()
                return wait, True
            return wait, False
        self._failures += 1  # connection dropped, timed out: watch again from rv
        log.info("watch of %s in %s interrupted (%s); resuming", self.kind, self.namespace or "all namespaces",
                 str(exc) or type(exc).__name__)
        return min(WATCH_RETRY_MAX, 0.2 * 2 ** min(self._failures, 7)), False

    # ------------------------------------------------------------------ the loop

    async def _get(self, query: dict[str, Any]) -> Any:
        return await self.client.request("GET", self.path, query=query, timeout=(10.0, 120.0), **self._own)

    def _watch(self, rv: str) -> AsyncGenerator[dict[str, Any], None]:
        return self.client.stream(self.path, self._watch_query(rv), (10.0, self.watch_seconds + WATCH_READ_MARGIN_SECONDS),
                                  **self._own)

    def _apply(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a bad object never stops the informer
            log.exception("informer: cannot apply a %s event", self.kind)

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont = None
        while True:
            doc = await self._get(self._list_query(cont))
            items += doc.get("items") or []
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items, doc["metadata"]["resourceVersion"]

    async def _run(self) -> None:
        rv: str | None = None
        while not self._stopped:
            try:
                if rv is None:
                    items, rv = await self._list()
                    self._listed_all(items)
                async with contextlib.aclosing(self._watch(rv)) as events:
                    async for ev in events:
                        try:
                            rv = self._event(ev, rv)
                        except _Expired:
                            rv = None
                            break
                self._failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an informer never stops but by stop() (or a refusal)
                status = getattr(exc, "status", None)
                if self.stop_refused and status in (401, 403):
                    self._apply(self.sink.refused, self.kind, status, self.scope)
                    self.synced.set()
                    self._stopped = True
                    return
                wait, relist = self._failed(exc)
                if relist:
                    rv = None
                if wait:
                    await asyncio.sleep(wait)


