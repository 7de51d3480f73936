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

``image_ref`` and ``rcluster`` (session, started on first use): the image of ``make image`` (built or
reused from the cache by tools/image/build.sh, loaded into the local image store) and a second control
plane whose process kubelet runs pods of that store under runc (``start_cluster(node="runc")``). Its
tests (tests/e2e/test_image_runc.py, tests/e2e/test_release.py) are run one after the other and the
runc cluster is stopped after the last of them, not at the end of the session.

Tests are marked ``@pytest.mark.e2e``. They are skipped only when
``AGENTRUN_SKIP_E2E=1``; otherwise a failure to build or start the cluster is
an error of every test that needs it, never a silent skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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

from e2e import image_store, runc_node  # noqa: E402

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
    # the modules of the runc cluster's tests together, where the first of them is: one cluster,
    # stopped after their last test
    modules = {i.nodeid.split("::")[0] for i in items if RUNC_CLUSTER in getattr(i, "fixturenames", ())}
    group = [i for i in items if i.nodeid.split("::")[0] in modules]
    if group:
        first = items.index(group[0])
        rest = [i for i in items if i.nodeid.split("::")[0] not in modules]
        items[:] = rest[:first] + group + rest[first:]
        _runc_group.update(i.nodeid for i in group)


RUNC_CLUSTER = "rcluster"
_runc_group: set[str] = set()  # node ids of the tests of the modules using it
_runc_stop: list = []  # the runc cluster's stop, while it runs


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the runc cluster once the last test using it is torn down (its module fixtures first)."""
    try:
        return (yield)
    finally:
        if _runc_stop and item.nodeid in _runc_group and (nextitem is None or nextitem.nodeid not in _runc_group):
            _runc_stop.pop()()


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


@pytest.fixture(scope="session")
def image_ref(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The reference of ``make image``'s image, in the local image store (tests/e2e/test_image_runc.py).
    Skipped (with the reason) only where runc cannot run at all or the image cannot be built here."""
    why = runc_node.unusable_reason()
    if why:
        pytest.skip(why)
    missing = [t for t in ("mmdebstrap", "buildah") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: run tools/install-image-tools.sh")
    r = subprocess.run(["bash", str(ROOT / "tools" / "image" / "build.sh")],
                       env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"make image failed:\n{r.stdout[-2000:]}\n{r.stderr[-5000:]}"
    archive = ROOT / "build" / "image" / "agentrun.oci.tar"
    index = json.loads(subprocess.run(["tar", "-xOf", str(archive), "index.json"], capture_output=True,
                                      check=True).stdout)
    ref: str = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    img = image_store.ImageStore().lookup(ref)
    assert img is not None, f"{ref} not in the image store after make image"
    probe = runc_node.run_image(img, ["/bin/true"], tmp_path_factory.mktemp("probe"), minimal=True)
    if probe.returncode != 0:
        pytest.skip(f"runc cannot run a container on this machine at all: {probe.stdout}{probe.stderr}")
    return ref


@pytest.fixture(scope="session")
def rcluster(image_ref: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane whose kubelet runs the image store's pods under runc; stopped after its last test."""
    d = tmp_path_factory.mktemp("localkube-runc")
    c = start_cluster(d, node="runc")

    def stop() -> None:
        c.stop()
        mounts = [ln for ln in open("/proc/self/mountinfo") if str(d) in ln]
        assert not mounts, f"container mounts left behind: {mounts}"

    _runc_stop.append(stop)
    try:
        yield c
    finally:
        if _runc_stop:
            _runc_stop.pop()()


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
