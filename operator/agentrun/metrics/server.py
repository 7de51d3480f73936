"""The HTTP endpoint of the operator: ``/metrics`` (Prometheus text format) and ``/readyz`` (200
while the process serves; the readiness check registered by the operator turns it 503). Liveness
is not here: it is Kopf's endpoint, on the operator's event loop (controller/process.py)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

HealthCheck = Callable[[], bool]


#: How often the serving thread wakes with no request, only to see whether it should stop
#: (socketserver's default is 0.5 s: two wake-ups a second of an idle operator, each a GIL hand-off).
#: A request wakes it at once, and :meth:`_ThreadingWSGIServer.shutdown` wakes it with a connection.
POLL_SECONDS = 300.0


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def shutdown(self) -> None:
        """Stop serving (and wait for it), without waiting out :data:`POLL_SECONDS`: a connection
        of its own wakes the serving thread once the stop is asked for."""
        poke = threading.Timer(0.05, self._poke)
        poke.start()
        try:
            super().shutdown()
        finally:
            poke.cancel()

    def _poke(self) -> None:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1" if host in ("0.0.0.0", "") else host, port), timeout=2).close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # scrapes and probes every few seconds would flood the operator's log


def make_app(registry: CollectorRegistry, checks: dict[str, HealthCheck]) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/readyz":
            check = checks.get("readyz")
            ok = True
            if check is not None:
                try:
                    ok = bool(check())
                except Exception:
                    log.exception("health check %s raised", path)
                    ok = False
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if ok else b"not ok\n"]
        if path in ("/metrics", "/"):
            out: Iterable[bytes] = metrics_app(environ, start_response)
            return out
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics, /readyz\n"]

    return app


def serve(registry: CollectorRegistry, port: int, addr: str, checks: dict[str, HealthCheck]) -> WSGIServer:
    """Start serving in a daemon thread; returns the server (``server.server_port`` is the bound
    port, useful with ``port=0``)."""
    httpd = make_server(addr, port, make_app(registry, checks), _ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, args=(POLL_SECONDS,), name="agentrun-metrics", daemon=True)
    thread.start()
    log.info("metrics: serving /metrics, /readyz on %s:%d", addr, httpd.server_port)
    return httpd
