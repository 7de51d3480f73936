"""A small OTLP/HTTP traces receiver for the lap's unit tests: it decodes each
``ExportTraceServiceRequest`` (protobuf, opentelemetry-proto) into plain span dicts. The e2e test
(tests/e2e/test_traces.py) uses a real Jaeger instead."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpSink:
    """``spans``: every span received, ``{"name", "trace_id", "span_id", "parent", "attrs", "status",
    "resource", "start", "end"}`` (ids as hex, times in Unix nanoseconds)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.posts = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with threading.Lock():
                    sink.posts += 1
                    for rs in req.resource_spans:
                        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                sink.spans.append({
                                    "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                    "parent": s.parent_span_id.hex(), "status": s.status.code,
                                    "status_message": s.status.message,
                                    "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                    "attrs": {a.key: _value(a.value) for a in s.attributes}, "resource": resource,
                                })
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def named(self, prefix: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"].startswith(prefix)]

    def __enter__(self) -> OtlpSink:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
