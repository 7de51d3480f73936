#!/usr/bin/env python3
"""versitygw (https://github.com/versity/versitygw, Apache-2.0) as a second, independent S3 server
for the checkpoint store's tests, beside moto: a Go implementation with its own conditional-write
code (flock-serialized If-None-Match / If-Match on its posix backend).

The binary is built from the Go module proxy and cached by ``e2e/versitygw/build.sh`` (like the
control plane's ``e2e/localkube/build.sh``). It serves on loopback with its posix backend in a
directory (one sub-directory per bucket; object metadata in sidecar files, so the directory's
file system needs no extended attributes).

Usage: python e2e/versitygw_server.py build        # print the binary's path (building it if needed)
       python e2e/versitygw_server.py run DIR [--port N]   # serve until SIGTERM
"""

from __future__ import annotations

import argparse
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

try:
    from .gobuild import cached_build
    from .ports import free_port as _free_port
except ImportError:  # run as a script: e2e/ is on sys.path
    from gobuild import cached_build  # type: ignore[no-redef]
    from ports import free_port as _free_port  # type: ignore[no-redef]

BUILD_SH = Path(__file__).resolve().parent / "versitygw" / "build.sh"
HEALTH = "/agentrun-health"


class VersityError(RuntimeError):
    pass


def build_versitygw() -> str:
    """Build (or reuse the cached) versitygw binary; return its path. ``VERSITYGW_BIN`` overrides."""
    return cached_build("versitygw", BUILD_SH, os.environ.get("VERSITYGW_BIN"))



def start_versitygw(base_dir: Path, access_key: str, secret_key: str, port: int | None = None,
                    region: str = "us-east-1", timeout: float = 60.0,
                    tls: tuple[Path, Path] | None = None,
                    keep_alive: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """Start versitygw on ``127.0.0.1:<free port>`` with its posix backend in ``base_dir/data``
    (root user ``access_key``/``secret_key``). Returns the process and its endpoint URL; its log
    is ``base_dir/versitygw.log``. Raises ``VersityError`` if it does not answer in ``timeout``.
    ``tls``: (certificate, key) files: it serves https with them (the certificate, self-signed, is
    also what the readiness check trusts). ``keep_alive``: keep connections open between requests
    (``--keep-alive``), as AWS S3, MinIO and Ceph do; versitygw's default, like moto's server, answers
    every request with ``Connection: close``."""
    binary = build_versitygw()
    data, meta = base_dir / "data", base_dir / "meta"
    data.mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOT_", "VGW_"))}
    cmd = [binary, "--port", f"127.0.0.1:{port}", "--access", access_key, "--secret", secret_key,
           "--region", region, "--health", HEALTH, "--quiet", *(["--keep-alive"] if keep_alive else []),
           *(["--cert", str(tls[0]), "--key", str(tls[1])] if tls else []),
           "posix", "--sidecar", str(meta), str(data)]
    context = ssl.create_default_context(cafile=str(tls[0])) if tls else None
    log = open(base_dir / "versitygw.log", "ab")  # noqa: SIM115 (kept open for the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (base_dir / "versitygw.log").read_text(errors="replace")[-2000:]
            raise VersityError(f"versitygw exited with code {proc.returncode} before it was ready:\n{tail}")
        try:
            with urllib.request.urlopen(endpoint + HEALTH, timeout=1, context=context):
                return proc, endpoint
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise VersityError(f"versitygw did not answer on {endpoint} within {timeout}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    run = sub.add_parser("run")
    run.add_argument("dir")
    run.add_argument("--port", type=int, default=None)
    a = ap.parse_args()
    if a.cmd == "build":
        print(build_versitygw())
        return 0
    proc, endpoint = start_versitygw(Path(a.dir), os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
                                     os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"), a.port)
    print(f"versitygw serving at {endpoint}", file=sys.stderr, flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return 0


if __name__ == "__main__":
    sys.exit(main())
