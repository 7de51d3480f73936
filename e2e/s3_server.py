#!/usr/bin/env python3
"""A local S3 API server for agentrun's tests: moto's server mode on loopback.

moto (``pip install 'moto[server]'``) answers ``PUT`` with ``If-None-Match: *``
with 412 PreconditionFailed when the key exists, and ``If-Match`` with a wrong
ETag with 412. Its check-then-write is not atomic across the threaded
server's threads, so this wrapper serializes every request that carries a
conditional header (and every write to the same server while one is running)
behind one lock, which makes create-if-absent races behave like real S3.

Usage: python e2e/s3_server.py --port 9000 [--host 127.0.0.1] [--bucket agentrun]

State is in memory only: a restart loses all objects.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import urllib.request

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server


def make_app():
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def wsgi(environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method in ("PUT", "POST", "DELETE") or "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ:
            with lock:
                return list(app(environ, start_response))
        return app(environ, start_response)

    return wsgi


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--bucket", default="agentrun")
    ap.add_argument("--dir", default=None, help="unused; marks the process as belonging to DIR")
    a = ap.parse_args()
    srv = make_server(a.host, a.port, make_app(), threaded=True)

    def create_bucket():
        req = urllib.request.Request(f"http://{a.host}:{a.port}/{a.bucket}", method="PUT", data=b"")
        urllib.request.urlopen(req, timeout=10).read()
        print(f"s3_server: bucket {a.bucket} ready at http://{a.host}:{a.port}", file=sys.stderr, flush=True)

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Timer(0.1, create_bucket).start()
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
