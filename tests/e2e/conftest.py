"""Fixtures for end-to-end tests on a real local control plane (e2e/cluster.py).

``cluster`` (session): etcd + kube-apiserver + kube-controller-manager (one
``localkube`` binary, built and cached by e2e/localkube/build.sh) and the
process kubelet (e2e/proc_kubelet.py), started once per session in a temp dir,
stopped at the end; the teardown fails if any process was left behind.

``s3`` (session): moto's S3 server on loopback with the bucket ``agentrun``.

``kueue`` (session, lazy: started by the first test that asks for it): the real Kueue controller
manager (e2e/kueue_server.py, built and cached by e2e/kueue/build.sh) on the session ``cluster``,
with its CRDs and webhooks; stopped (webhooks removed first) before the cluster.

``jaeger`` (session, started on first use): Jaeger all-in-one, the OTLP receiver of the traces test.

Tests are marked ``@pytest.mark.e2e``. They are skipped only when
``AGENTRUN_SKIP_E2E=1``; otherwise a failure to build or start the cluster is
an error of every test that needs it, never a silent skip.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e.cluster import Cluster, S3Server, leftover_processes, start_cluster, start_s3  # noqa: E402
from e2e.jaeger_server import Jaeger, start_jaeger  # noqa: E402
from e2e.kueue_server import Kueue, start_kueue  # noqa: E402

SKIP_E2E = os.environ.get("AGENTRUN_SKIP_E2E") == "1"


#: pytest-timeout for an e2e test without its own ``@pytest.mark.timeout``: the global 600 s
#: (pyproject.toml) is for unit tests. An e2e test waits on conditions with generous deadlines
#: (up to 240 s each, several in a row, plus the session's control plane start for the first
#: test), so its own deadlines, which name what they waited for, must fail before this does.
E2E_TIMEOUT = 1200


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="AGENTRUN_SKIP_E2E=1")
    for item in items:
        if item.get_closest_marker("e2e") is None:
            continue
        if SKIP_E2E:
            item.add_marker(skip)
        elif item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if SKIP_E2E:
        pytest.skip("AGENTRUN_SKIP_E2E=1")
    d = tmp_path_factory.mktemp("localkube")
    c = start_cluster(d)  # raises (test error) on any failure: no silent skip
    try:
        yield c
    finally:
        c.stop()  # raises if processes had to be SIGKILLed as leftovers
        left = leftover_processes(d)
        assert not left, f"processes left behind after cluster stop: {left}"


@pytest.fixture(scope="session")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    """Jaeger all-in-one (e2e/jaeger_server.py, built and cached by e2e/jaeger/build.sh): the real OTLP
    receiver of tests/e2e/test_traces.py. Started on first use only."""
    if SKIP_E2E:
        pytest.skip("AGENTRUN_SKIP_E2E=1")
    j = start_jaeger(tmp_path_factory.mktemp("jaeger"))
    try:
        yield j
    finally:
        j.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if SKIP_E2E:
        pytest.skip("AGENTRUN_SKIP_E2E=1")
    d = tmp_path_factory.mktemp("s3")
    s = start_s3(d)
    try:
        yield s
    finally:
        s.stop()
        left = leftover_processes(d)
        assert not left, f"S3 server processes left behind: {left}"


@pytest.fixture(scope="session")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    d = tmp_path_factory.mktemp("kueue")
    k = start_kueue(cluster, d)  # raises (test error) on any failure: no silent skip
    print(f"\nkueue started in {k.timings['total']:.1f}s: {k.timings}", file=sys.stderr)
    try:
        yield k
    finally:
        k.stop()
        left = leftover_processes(d)
        assert not left, f"kueue processes left behind: {left}"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods can be created)."""
    import time

    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl_run("create", "namespace", ns)
    deadline = time.time() + 60
    while cluster.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode != 0:
        assert time.time() < deadline, f"default ServiceAccount never appeared in {ns}"
        time.sleep(0.2)
    yield ns
    cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
