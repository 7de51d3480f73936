"""The checkpoint store's integration tests run against two independent S3 implementations:
moto (Python) and versitygw (Go, built from the Go module proxy by e2e/versitygw/build.sh and
cached under ~/.cache/agentrun/versitygw): ``s3_server`` is parametrized over both here (the
servers themselves are the session fixtures of tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # e2e/ (the S3 shim, versitygw)
    sys.path.insert(0, ROOT)

S3_IMPLEMENTATIONS = ("moto", "versitygw")


@pytest.fixture(scope="session", params=S3_IMPLEMENTATIONS)
def s3_server(request: pytest.FixtureRequest) -> object:
    """Each store test once against moto and once against versitygw."""
    return request.getfixturevalue(f"{request.param}_s3_server")
