"""Shared fixtures.

``s3_server``: a real S3 API server (moto's server mode) on a free loopback port, started once per
test session as a subprocess and spoken to over HTTP. ``s3_bucket``: a fresh, empty bucket on it per
test. ``s3_env``: the lap Job environment variables pointing at that bucket. ``s3_client``: a raw
boto3 client (path-style) for tests that poke at objects directly.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

S3_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """A running S3 API server."""

    endpoint_url: str
    region: str = S3_REGION

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 2}),
        )


@dataclass(frozen=True)
class S3Bucket:
    """A fresh bucket on the test S3 server."""

    server: S3Server
    name: str

    @property
    def uri(self) -> str:
        return f"s3://{self.name}/checkpoints"

    @property
    def env(self) -> dict[str, str]:
        """The lap Job's store variables (docs/contracts.md) for this bucket."""
        return {
            "AGENTRUN_CHECKPOINT_URI": self.uri,
            "AGENTRUN_S3_ENDPOINT": self.server.endpoint_url,
            "AGENTRUN_S3_REGION": self.server.region,
            "AGENTRUN_S3_PATH_STYLE": "true",
        }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# moto 5.2.1 checks If-None-Match / If-Match and then writes, without a lock, while its server
# handles requests in threads: two racing conditional PUTs of one key can BOTH succeed (seen in
# tests/checkpoint/test_store.py::test_racing_writers_of_the_same_lap_exactly_one_wins). Real S3
# (and MinIO) decide conditional writes atomically. So we serve moto's own WSGI app with werkzeug,
# exactly as `moto_server` does, but run requests carrying a precondition header one at a time.
_MOTO_LAUNCHER = """
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()

def atomic_conditional_writes(environ, start_response):
    if "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ:
        with lock:
            return list(app(environ, start_response))
    return app(environ, start_response)

run_simple(sys.argv[1], int(sys.argv[2]), atomic_conditional_writes, threaded=True)
"""


def _moto_command(port: int) -> list[str]:
    return [sys.executable, "-c", _MOTO_LAUNCHER, "127.0.0.1", str(port)]


def start_moto_server(timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start moto's S3 server on a free loopback port; return the process and its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(_moto_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout}s")


@pytest.fixture(scope="session")
def s3_server(moto_s3_server: S3Server) -> S3Server:
    """A real S3 API server over HTTP for the whole session: moto (tests/checkpoint overrides it to
    run the store's tests against moto and versitygw)."""
    return moto_s3_server


@pytest.fixture(scope="session")
def moto_s3_server() -> Iterator[S3Server]:
    """moto's server app (see above) over HTTP for the whole session. Sets dummy AWS credentials in
    the environment so boto3's standard chain finds some."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", S3_REGION)
    proc, endpoint = start_moto_server()
    try:
        yield S3Server(endpoint_url=endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def versitygw_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """versitygw (Go; e2e/versitygw_server.py) over HTTP for the whole session, posix backend in a
    temp dir: the second, independent S3 implementation of the store's tests (tests/checkpoint).
    A failure to build or start it is an error, never a silent skip; ``AGENTRUN_SKIP_VERSITYGW=1``
    skips explicitly (a machine without Go)."""
    if os.environ.get("AGENTRUN_SKIP_VERSITYGW") == "1":
        pytest.skip("AGENTRUN_SKIP_VERSITYGW=1")
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from e2e.versitygw_server import start_versitygw, stop

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", S3_REGION)
    # the suite's keys, not whatever the environment holds when the first test asks for the server
    # (a test's monkeypatched key would otherwise become the session server's, refusing the rest)
    proc, endpoint = start_versitygw(tmp_path_factory.mktemp("versitygw"), "testing", "testing", region=S3_REGION)
    try:
        yield S3Server(endpoint_url=endpoint)
    finally:
        stop(proc)


@pytest.fixture
def s3_client(s3_server: S3Server) -> Any:
    """A raw boto3 client for the test server."""
    return s3_server.client()


@pytest.fixture
def s3_bucket(s3_server: S3Server, s3_client: Any) -> S3Bucket:
    """A fresh, empty bucket for one test."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=name)
    return S3Bucket(server=s3_server, name=name)


@pytest.fixture
def s3_env(s3_bucket: S3Bucket) -> dict[str, str]:
    """The lap Job's store environment variables for a fresh bucket."""
    return s3_bucket.env
