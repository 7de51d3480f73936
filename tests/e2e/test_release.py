"""``make release`` end to end (issue 37): push to a local OCI registry, install from it, run.

* ``make release VERSION=0.0.0-test REGISTRY=127.0.0.1:PORT/agentrun`` against the CNCF distribution
  registry of Debian's ``docker-registry`` package (e2e/registry_server.py: plain HTTP on a free
  loopback port, storage in the test's directory): build/release/0.0.0-test/ holds the image's
  oci-archive, its CycloneDX SBOM, the packaged chart, release.json and SHA256SUMS, every checksum
  right; the registry serves the image under the digest release.json records and the chart as
  ``agentrun-operator:0.0.0-test``;
* the image is pulled from the registry into the runc node's image store (the node has no registry
  client: e2e/registry_server.py ``pull`` is its image pull), then ``helm install
  oci://127.0.0.1:PORT/agentrun/agentrun-operator --version 0.0.0-test --plain-http`` in clean
  namespaces of the runc cluster, with no image values: the packaged chart's default image is the
  pushed reference;
* the operator pod and every lap pod run that reference under runc, and a run Succeeds.

Fixtures ``image_ref`` and ``rcluster`` (session, shared with tests/e2e/test_image_runc.py, whose
tests run right before these) and ``s3``: tests/e2e/conftest.py. The image build is cached
(tools/image/build.sh): ``make release`` reuses what ``image_ref`` built.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import note_run

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e import image_store, registry_server  # noqa: E402

# the first of the runc modules may build the image (image_ref): as long as test_image_runc allows
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

VERSION = "0.0.0-test"
CHART = "agentrun-operator"
OUT = ROOT / "build" / "release" / VERSION


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    why = registry_server.unusable_reason()
    if why:
        pytest.skip(why)
    reg = registry_server.start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def released(registry, image_ref) -> dict[str, Any]:
    """``make release`` against the local registry; release.json."""
    t0 = time.monotonic()
    r = subprocess.run(["make", "-s", "release", f"VERSION={VERSION}", f"REGISTRY={registry.host}/agentrun",
                        f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"make release failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    print(f"\nmake release: {time.monotonic() - t0:.1f}s\n{r.stderr[-1500:]}")
    return json.loads((OUT / "release.json").read_text())


def test_release_artifacts_are_in_the_registry(released, registry, image_ref):
    image = f"{registry.host}/agentrun/agentrun:{VERSION}"
    assert released["pushed"] is True and released["image"]["ref"] == image, released
    # every artifact under its checksum
    sums = dict(reversed(ln.split(None, 1)) for ln in (OUT / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {f"agentrun-{VERSION}.oci.tar", f"agentrun-{VERSION}.sbom.cdx.json",
                         f"{CHART}-{VERSION}.tgz", "release.json"}, sums
    subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=OUT, check=True, capture_output=True)
    # the registry serves the image under the recorded digest, and the chart
    digest, manifest = registry.manifest("agentrun/agentrun", VERSION)
    assert digest == released["image"]["digest"], (digest, released)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json", manifest
    chart_digest, chart_manifest = registry.manifest(f"agentrun/{CHART}", VERSION)
    assert chart_digest == released["chart"]["digest"], (chart_digest, released)
    assert chart_manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json", chart_manifest
    # the archive is make image's image, renamed: same config (what a container runs)
    archived = json.loads(subprocess.run(["tar", "-xOf", str(OUT / f"agentrun-{VERSION}.oci.tar"), "index.json"],
                                         capture_output=True, check=True).stdout)["manifests"][0]
    assert archived["annotations"]["org.opencontainers.image.ref.name"] == image, archived
    built = image_store.ImageStore().lookup(image_ref)
    assert built is not None and built.id == manifest["config"]["digest"], (built, manifest["config"])
    # the SBOM: CycloneDX, the image by digest, what is installed in it (Debian and Python)
    sbom = json.loads((OUT / f"agentrun-{VERSION}.sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.5", sbom["bomFormat"]
    assert sbom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": digest.split(":", 1)[1]}]
    purls = {c["purl"].split("@")[0]: c["version"] for c in sbom["components"]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert purls["pkg:pypi/agentrun"] == project, project
    pins = [ln.split("==") for ln in (ROOT / "tools" / "image" / "requirements.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    for name, version in pins:  # every pinned dependency, at its pin
        key = "pkg:pypi/" + name.lower().replace("_", "-").replace(".", "-")
        assert purls.get(key) == version, (name, version, purls.get(key))
    debs = [p for p in purls if p.startswith("pkg:deb/debian/")]
    assert {"pkg:deb/debian/python3", "pkg:deb/debian/ca-certificates", "pkg:deb/debian/libc6"} <= set(debs), debs


def test_helm_install_from_the_registry_runs_under_runc(released, registry, rcluster, s3, tmp_path_factory):
    from test_helm_install import CHART as CHART_DIR
    from test_helm_install import HelmEnv

    image = released["image"]["ref"]
    # the node's image pull: from the registry into its store, as the pods name it
    pulled = registry.pull(image)
    assert pulled.ref == image and pulled.id == registry.manifest("agentrun/agentrun", VERSION)[1]["config"]["digest"]
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    chart_ref = f"oci://{registry.host}/agentrun/{CHART}"
    assert released["chart"]["ref"] == chart_ref, released

    class RegistryHelmEnv(HelmEnv):
        installed_from: str = ""

        def write_values(self) -> None:
            super().write_values()
            values = yaml.safe_load(self.values.read_text())
            values["lap"].pop("command")  # the image's `agentrun lap`; no image values: the chart's default
            assert "image" not in values
            self.values.write_text(yaml.safe_dump(values))

        def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
            if args[:2] == ("install", "agentrun-operator") and args[2] == str(CHART_DIR):
                args = (*args[:2], chart_ref, "--version", VERSION, "--plain-http", *args[3:])
                self.installed_from = chart_ref
            return super().helm(*args, **kw)

    h = RegistryHelmEnv(rcluster, s3, tmp_path_factory.mktemp("helm-release"), helm)
    try:
        t0 = time.monotonic()
        h.install()  # clean namespaces; helm install --wait, then an operator pod holds the Lease
        assert h.installed_from == chart_ref
        listed = json.loads(h.helm("list", "-n", h.sys_ns, "-o", "json").stdout)
        assert [(r["chart"], r["app_version"]) for r in listed] == [(f"{CHART}-{VERSION}", VERSION)], listed
        pod = next(p for p in h.operator_pods() if p["status"].get("phase") == "Running")
        assert pod["spec"]["containers"][0]["image"] == image, pod["spec"]["containers"][0]
        op_cfg = next(iter(rcluster.pods_dir.glob(f"{h.sys_ns}_{pod['metadata']['name']}_*/runc/operator/config.json")))
        assert json.loads(op_cfg.read_text())["process"]["args"] == ["agentrun", "operator"]
        print(f"\nhelm install from {chart_ref}: operator leading in {time.monotonic() - t0:.1f}s")

        name = "from-registry"
        doc = note_run(name, "installed from the registry", h.tool_url)
        h.kubectl("apply", "-n", h.ns, "-f", "-", input=yaml.safe_dump(doc))
        st = h.wait_phase(name, "Succeeded", "Failed", "BudgetExceeded", timeout=300)
        assert st["phase"] == "Succeeded" and st["lap"] == 2, (st, h.diagnostics())
        assert len(h.calls("/note")) == 1
        # every lap pod ran the pushed image, under runc
        jobs = h.jobs(name)
        assert len(jobs) >= 2 and {j["spec"]["template"]["spec"]["containers"][0]["image"] for j in jobs} == {image}
        lap_cfgs = sorted(rcluster.pods_dir.glob(f"{h.ns}_*/runc/lap/config.json"))
        assert len(lap_cfgs) == len(jobs), (lap_cfgs, len(jobs))
        for p in lap_cfgs:
            cfg = json.loads(p.read_text())
            assert cfg["process"]["args"] == ["agentrun", "lap"] and cfg["process"]["user"]["uid"] == 65532, cfg
        print(f"run {name}: Succeeded at lap {st['lap']}, {time.monotonic() - t0:.1f}s after the install began")
    finally:
        h.tools.shutdown()
        h.uninstall()
