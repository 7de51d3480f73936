"""tools/release (make release): the chart's image edit and the SBOM read from an image's layers.

The whole release (push, install from the registry, a run) is tests/e2e/test_release.py; these are
the parts that decide what a release says, on small inputs made here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "release"))
import chart  # noqa: E402
import sbom  # noqa: E402

VALUES = ROOT / "helm" / "agentrun-operator" / "values.yaml"


def test_the_release_chart_points_at_the_pushed_repository_and_keeps_the_rest():
    before = VALUES.read_text()
    after = chart.set_repository(before, "registry.example:5000/team/agentrun")
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert changed == [("  repository: ghcr.io/agentrun/agentrun", "  repository: registry.example:5000/team/agentrun")]
    doc = yaml.safe_load(after)
    assert doc["image"] == {**yaml.safe_load(before)["image"], "repository": "registry.example:5000/team/agentrun"}
    assert doc["image"]["tag"] == ""  # the tag is the appVersion that helm package sets


def _chart_tgz(tmp_path: Path, version: str, app_version: str, image: dict) -> str:
    out = tmp_path / "c.tgz"
    with tarfile.open(out, "w:gz") as tf:
        for name, doc in (("Chart.yaml", {"name": "agentrun-operator", "version": version, "appVersion": app_version}),
                          ("values.yaml", {"image": image})):
            data = yaml.safe_dump(doc).encode()
            info = tarfile.TarInfo(f"agentrun-operator/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(out)


def test_the_packaged_chart_check_names_what_is_wrong(tmp_path):
    repo = "r.example/agentrun"
    good = _chart_tgz(tmp_path, "1.2.3", "1.2.3", {"repository": repo, "tag": ""})
    assert chart.check(good, repo, "1.2.3") == []
    bad = _chart_tgz(tmp_path, "1.2.3", "0.1.0", {"repository": "ghcr.io/agentrun/agentrun", "tag": "0.1.0"})
    errors = chart.check(bad, repo, "1.2.3")
    assert len(errors) == 3 and "appVersion '0.1.0'" in errors[0] and "image.repository" in errors[1] \
        and "image.tag" in errors[2], errors


STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u10
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>

Package: removed-pkg
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1
Description: interactive high-level object-oriented language
 a continuation line: Status: install ok installed
"""
SITE = "opt/agentrun/lib/python3.11/site-packages"


def _layer(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _archive(tmp_path: Path, layers: list[bytes], tamper: bool = False) -> str:
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> dict:
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return {"digest": d, "size": len(data)}

    config = put(json.dumps({"created": "2026-01-02T03:04:05.123Z", "config": {
        "Labels": {"org.opencontainers.image.source": "https://github.com/agentrun/agentrun"}}}).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
                "layers": [{**put(x), "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"} for x in layers]}
    mdesc = put(json.dumps(manifest).encode())
    if tamper:
        first = manifest["layers"][0]["digest"]
        blobs[first] = _layer({"etc/evil": b"x"})
    out = tmp_path / "image.oci.tar"
    with tarfile.open(out, "w") as tf:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                           ("index.json", json.dumps({"schemaVersion": 2, "manifests": [mdesc]}).encode()),
                           *[(f"blobs/sha256/{d.split(':')[1]}", b) for d, b in blobs.items()]]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(out)


def _meta(name: str, version: str, extra: str = "") -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{extra}\nlong description\n".encode()


def _layers() -> list[bytes]:
    return [
        _layer({"etc/os-release": b'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
                "var/lib/dpkg/status": STATUS.encode(),
                f"{SITE}/old_pkg-1.0.dist-info/METADATA": _meta("old_pkg", "1.0"),
                f"{SITE}/Typing_Extensions-4.0.dist-info/METADATA": _meta("Typing_Extensions", "4.0",
                                                                          "Classifier: License :: OSI Approved :: Python Software Foundation License\n")}),
        _layer({f"{SITE}/.wh.old_pkg-1.0.dist-info": b"",  # removed by the later layer
                f"{SITE}/agentrun-0.1.0.dist-info/METADATA": _meta("agentrun", "0.1.0", "License-Expression: Apache-2.0"),
                f"{SITE}/agentrun-0.1.0.dist-info/RECORD": b"not read"}),
    ]


def test_the_sbom_lists_what_the_layers_leave_installed(tmp_path):
    path = _archive(tmp_path, _layers())
    doc = sbom.build_sbom(path, "reg.example:5000/agentrun/agentrun:1.2.3")
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    purls = {c["purl"]: c for c in doc["components"]}
    assert sorted(purls) == [
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12",
        "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64&distro=debian-12",
        "pkg:pypi/agentrun@0.1.0",
        "pkg:pypi/typing-extensions@4.0",
    ]
    assert purls["pkg:pypi/agentrun@0.1.0"]["licenses"] == [{"expression": "Apache-2.0"}]
    assert purls["pkg:pypi/typing-extensions@4.0"]["licenses"] == [
        {"license": {"name": "Python Software Foundation License"}}]
    image = doc["metadata"]["component"]
    digest = json.loads(tarfile.open(path).extractfile("index.json").read())["manifests"][0]["digest"]
    assert image["hashes"] == [{"alg": "SHA-256", "content": digest.split(":")[1]}]
    assert image["version"] == "1.2.3" and image["name"] == "reg.example:5000/agentrun/agentrun"
    assert image["purl"].startswith("pkg:oci/agentrun@sha256%3A") and "tag=1.2.3" in image["purl"]
    assert doc["metadata"]["timestamp"] == "2026-01-02T03:04:05Z"
    # deterministic: the same image gives the same document
    assert sbom.build_sbom(path, "reg.example:5000/agentrun/agentrun:1.2.3") == doc


def test_the_sbom_refuses_a_blob_that_does_not_match_its_digest(tmp_path):
    with pytest.raises(sbom.SbomError, match="does not match its digest"):
        sbom.build_sbom(_archive(tmp_path, _layers(), tamper=True), "r/agentrun:1")


def test_the_sbom_refuses_an_image_without_dpkg_status(tmp_path):
    path = _archive(tmp_path, [_layer({f"{SITE}/a-1.dist-info/METADATA": _meta("a", "1")})])
    with pytest.raises(sbom.SbomError, match="var/lib/dpkg/status"):
        sbom.build_sbom(path, "r/agentrun:1")
