"""The runc node's local image store (e2e/image_store.py) with small hand-made OCI archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from e2e.image_store import ImageError, ImageStore  # noqa: E402


def _tar(entries: dict[str, bytes | None]) -> bytes:
    """A layer: path -> file content, or None for a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in entries.items():
            ti = tarfile.TarInfo(name)
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _archive(path: Path, layers: list[bytes], ref: str | None, corrupt: bool = False) -> Path:
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> dict:
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return {"digest": d, "size": len(data)}

    layer_descs = [dict(add(gzip.compress(b)), mediaType="application/vnd.oci.image.layer.v1.tar+gzip")
                   for b in layers]
    config = {"architecture": "amd64", "os": "linux",
              "config": {"User": "65532:65532", "Entrypoint": ["agentrun"], "Env": ["PATH=/usr/bin"]},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]}}
    cdesc = add(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "config": dict(cdesc, mediaType="application/vnd.oci.image.config.v1+json"),
                "layers": layer_descs}
    mdesc = dict(add(json.dumps(manifest).encode()), mediaType="application/vnd.oci.image.manifest.v1+json")
    if ref:
        mdesc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = {"schemaVersion": 2, "manifests": [mdesc]}
    with tarfile.open(path, "w") as tf:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           ("index.json", json.dumps(index).encode())] + \
                          [(f"blobs/sha256/{d.split(':')[1]}", b) for d, b in blobs.items()]:
            if corrupt and name == f"blobs/sha256/{layer_descs[0]['digest'].split(':')[1]}":
                data = gzip.compress(b"tampered")
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def test_load_applies_layers_with_whiteouts_and_maps_the_reference(tmp_path):
    base = _tar({"etc": None, "etc/passwd": b"root:x:0:0::/root:/bin/sh\n", "etc/old": b"x",
                 "var": None, "var/cache": None, "var/cache/a": b"a", "var/cache/b": b"b"})
    app = _tar({"etc": None, "etc/.wh.old": b"", "var/cache": None, "var/cache/.wh..wh..opq": b"",
                "var/cache/c": b"c", "opt": None, "opt/app": b"app"})
    store = ImageStore(tmp_path / "store")
    img = store.load(_archive(tmp_path / "img.tar", [base, app], "example.com/agentrun:1"))
    root = img.rootfs
    assert (root / "etc/passwd").exists() and not (root / "etc/old").exists()
    assert sorted(p.name for p in (root / "var/cache").iterdir()) == ["c"]
    assert (root / "opt/app").read_text() == "app"
    assert not list(root.rglob(".wh.*"))
    assert img.user == "65532:65532" and img.config["Entrypoint"] == ["agentrun"]
    assert store.lookup("example.com/agentrun:1") == img
    assert store.lookup("example.com/agentrun:2") is None
    # loading the same image again under a second name unpacks nothing new
    again = store.load(tmp_path / "img.tar", ref="example.com/agentrun:latest")
    assert again.rootfs == img.rootfs and store.lookup("example.com/agentrun") is not None
    # a rebuilt image under the same name: the old one is unreferenced, prune removes only it
    new = store.load(_archive(tmp_path / "img2.tar", [base], "example.com/agentrun:1"))
    store.load(tmp_path / "img2.tar", ref="example.com/agentrun:latest")
    assert new.rootfs != img.rootfs and img.rootfs.exists()
    assert store.prune() == [img.rootfs.parent] and not img.rootfs.exists() and new.rootfs.exists()


def test_a_blob_not_matching_its_digest_is_refused(tmp_path):
    store = ImageStore(tmp_path / "store")
    path = _archive(tmp_path / "bad.tar", [_tar({"a": b"a"})], "example.com/x:1", corrupt=True)
    with pytest.raises(ImageError, match="does not match its digest"):
        store.load(path)
    assert store.refs() == {} and not list((tmp_path / "store").glob("sha256/*"))


def test_an_archive_without_a_reference_needs_one(tmp_path):
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match="--ref"):
        store.load(_archive(tmp_path / "noref.tar", [_tar({"a": b"a"})], None))
