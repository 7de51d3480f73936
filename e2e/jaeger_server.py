#!/usr/bin/env python3
"""Jaeger (https://github.com/jaegertracing/jaeger, Apache-2.0) all-in-one as the real OTLP receiver
of the tracing e2e test (tests/e2e/test_traces.py): in-memory storage, its OTLP/HTTP receiver and
its query API on free loopback ports, nothing else listening (no gRPC, no Zipkin, no own metrics).

The binary is built from the Go module proxy and cached by ``e2e/jaeger/build.sh`` (like
``e2e/versitygw/build.sh``). Traces are read back through Jaeger's own query API
(``/api/traces/<trace id>``), as its UI reads them.

Usage: python e2e/jaeger_server.py build        # print the binary's path (building it if needed)
       python e2e/jaeger_server.py run DIR      # serve until SIGTERM (prints the endpoints)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from .gobuild import cached_build
    from .ports import free_port as _free_port
except ImportError:  # run as a script: e2e/ is on sys.path
    from gobuild import cached_build  # type: ignore[no-redef]
    from ports import free_port as _free_port  # type: ignore[no-redef]

BUILD_SH = Path(__file__).resolve().parent / "jaeger" / "build.sh"

CONFIG = """
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}{ui}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


class JaegerError(RuntimeError):
    pass


def build_jaeger() -> str:
    """Build (or reuse the cached) jaeger binary; return its path. ``JAEGER_BIN`` overrides."""
    return cached_build("jaeger", BUILD_SH, os.environ.get("JAEGER_BIN"))



@dataclass
class Jaeger:
    proc: subprocess.Popen[bytes]
    otlp_endpoint: str
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` of the senders (spans go to ``<it>/v1/traces``)."""
    query_url: str
    """Jaeger's query API and UI (``/api/traces/<id>``)."""

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as the query API returns it (``data[0]``: ``spans``, ``processes``), or None."""
        try:
            with urllib.request.urlopen(f"{self.query_url}/api/traces/{trace_id}", timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        data = body.get("data") or []
        return data[0] if data else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


UI_ASSETS_ENV = "JAEGER_UI_ASSETS"
"""Optional: a directory of built Jaeger UI assets (jaeger-ui's ``packages/jaeger-ui/build``) that the
query server then serves at ``/`` (the binary built from the Go module has none). Only for the docs'
screenshot (e2e/jaeger/screenshot.py); the tests read the query API and need no UI."""


def start_jaeger(base_dir: Path, timeout: float = 60.0) -> Jaeger:
    """Start Jaeger all-in-one on free loopback ports (config and log in ``base_dir``); raises
    ``JaegerError`` when its query API does not answer within ``timeout``."""
    binary = build_jaeger()
    base_dir.mkdir(parents=True, exist_ok=True)
    ports = {"otlp_port": _free_port(), "query_port": _free_port(), "query_grpc_port": _free_port()}
    assets = os.environ.get(UI_ASSETS_ENV)
    ui = f"\n    ui:\n      assets_path: {json.dumps(str(Path(assets).resolve()))}" if assets else ""
    config = base_dir / "jaeger.yaml"
    config.write_text(CONFIG.format(ui=ui, **ports))
    log_path = base_dir / "jaeger.log"
    log = open(log_path, "ab")  # noqa: SIM115 (kept open for the process)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.Popen([binary, "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    jaeger = Jaeger(proc, f"http://127.0.0.1:{ports['otlp_port']}", f"http://127.0.0.1:{ports['query_port']}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise JaegerError(f"jaeger exited with code {proc.returncode} before it was ready:\n"
                              f"{log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{jaeger.query_url}/api/services", timeout=1):
                pass
            with socket.create_connection(("127.0.0.1", ports["otlp_port"]), timeout=1):
                return jaeger
        except OSError:
            time.sleep(0.1)
    jaeger.stop()
    raise JaegerError(f"jaeger did not answer on {jaeger.query_url} within {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    run = sub.add_parser("run")
    run.add_argument("dir")
    a = ap.parse_args()
    if a.cmd == "build":
        print(build_jaeger())
        return 0
    jaeger = start_jaeger(Path(a.dir))
    print(f"jaeger: OTLP/HTTP {jaeger.otlp_endpoint}, query API and UI {jaeger.query_url}", file=sys.stderr, flush=True)
    try:
        return jaeger.proc.wait()
    except KeyboardInterrupt:
        jaeger.stop()
        return 0


if __name__ == "__main__":
    sys.exit(main())
