#!/usr/bin/env python3
"""image_store: the local OCI images of the runc node (e2e/runc_node.py), unpacked.

A directory (``AGENTRUN_IMAGE_STORE``, default ``~/.cache/agentrun/images``) that maps image
references to unpacked root filesystems, like a container runtime's image store::

    STORE/refs.json                     {"ghcr.io/agentrun/agentrun:0.1.0": "sha256:<config digest>", ...}
    STORE/sha256/<hex>/config.json      the OCI image config (User, Entrypoint, Cmd, Env, WorkingDir)
    STORE/sha256/<hex>/rootfs/          the layers, applied in order (whiteouts honoured)

``load`` reads an OCI image archive (``oci-archive``, what ``make image`` writes) or an OCI layout
directory, checks each blob's sha256 against its digest, unpacks the layers into a new directory
and renames it into place, then points the reference at it (refs.json is replaced atomically), so
a kubelet starting a container never sees a half-unpacked image. An image already in the store
(same config digest) is not unpacked again. Unpacked images are never changed afterwards: the
runc node mounts them as the read-only lower layer of each container's root.

CLI::

    python3 e2e/image_store.py load build/image/agentrun.oci.tar [--ref REF] [--store DIR]
    python3 e2e/image_store.py list [--store DIR]
    python3 e2e/image_store.py prune [--store DIR]   # unpacked images no reference points at
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

STORE_ENV = "AGENTRUN_IMAGE_STORE"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


def default_store() -> Path:
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    cache = os.environ.get("AGENTRUN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentrun")
    return Path(cache) / "images"


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Image:
    ref: str
    id: str  # sha256:<config digest>
    rootfs: Path
    config: dict  # the OCI image config's "config" object (User, Entrypoint, Cmd, Env, WorkingDir)

    @property
    def user(self) -> str:
        return self.config.get("User") or ""

    @property
    def env(self) -> list[str]:
        return list(self.config.get("Env") or [])


def normalize_ref(ref: str) -> list[str]:
    """The names a pod's ``image`` may match: as written, and with the defaults a runtime adds
    (``docker.io/library/`` for a bare name, ``:latest`` without a tag or digest)."""
    out = [ref]
    name, tag = ref, ""
    if "@" not in ref:
        last = ref.rsplit("/", 1)[-1]
        if ":" not in last:
            tag = ":latest"
            out.append(ref + tag)
    first = name.split("/", 1)[0]
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        full = ("docker.io/" + ("library/" if "/" not in name else "") + name) + tag
        out.append(full)
    return out


class ImageStore:
    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root else default_store()

    # ------------------------------------------------------------------ read
    def refs(self) -> dict[str, str]:
        try:
            return json.loads((self.root / "refs.json").read_text())
        except (OSError, ValueError):
            return {}

    def lookup(self, ref: str) -> Image | None:
        """The unpacked image of a pod's ``image`` reference, or None when it is not in the store."""
        refs = self.refs()
        for name in normalize_ref(ref):
            if name in refs:
                digest = refs[name]
                d = self.root / "sha256" / digest.split(":", 1)[1]
                try:
                    cfg = json.loads((d / "config.json").read_text())
                except (OSError, ValueError):
                    return None
                if not (d / "rootfs").is_dir():
                    return None
                return Image(ref=name, id=digest, rootfs=d / "rootfs", config=cfg.get("config") or {})
        return None

    # ------------------------------------------------------------------ load
    def load(self, source: str | os.PathLike, ref: str | None = None) -> Image:
        source = Path(source)
        with tempfile.TemporaryDirectory(prefix="oci-", dir=self._tmpdir()) as tmp:
            layout = source
            if source.is_file():
                layout = Path(tmp) / "layout"
                layout.mkdir()
                with tarfile.open(source) as tf:
                    tf.extractall(layout, filter="data")
            index = json.loads((layout / "index.json").read_text())
            manifests = index.get("manifests") or []
            if not manifests:
                raise ImageError(f"{source}: index.json lists no manifest")
            desc = manifests[0]
            if ref is None:
                ref = (desc.get("annotations") or {}).get(REF_ANNOTATION)
            if not ref:
                raise ImageError(f"{source}: no reference name in index.json: pass --ref")
            manifest = json.loads(self._blob(layout, desc["digest"]).read_bytes())
            if "manifests" in manifest:  # an image index: take the linux/amd64 one
                desc = next((m for m in manifest["manifests"]
                             if (m.get("platform") or {}).get("architecture") in (None, "amd64")), None)
                if desc is None:
                    raise ImageError(f"{source}: no linux/amd64 image in the index")
                manifest = json.loads(self._blob(layout, desc["digest"]).read_bytes())
            config_digest = manifest["config"]["digest"]
            config = json.loads(self._blob(layout, config_digest).read_bytes())
            target = self.root / "sha256" / config_digest.split(":", 1)[1]
            if not (target / "rootfs").is_dir():
                staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=self._tmpdir()))
                try:
                    (staging / "rootfs").mkdir()
                    for layer in manifest.get("layers") or []:
                        self._apply_layer(self._blob(layout, layer["digest"]), staging / "rootfs")
                    (staging / "config.json").write_text(json.dumps(config, indent=2))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if target.exists() and not (target / "rootfs").is_dir():  # a leftover without rootfs/
                        shutil.rmtree(target)
                    try:
                        os.rename(staging, target)
                    except OSError:
                        if not (target / "rootfs").is_dir():
                            raise
                        shutil.rmtree(staging, ignore_errors=True)  # a concurrent load won
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
            refs = self.refs()
            refs[ref] = config_digest
            tmp_refs = self.root / f"refs.json.{os.getpid()}"
            tmp_refs.write_text(json.dumps(refs, indent=2, sort_keys=True))
            os.replace(tmp_refs, self.root / "refs.json")
        img = self.lookup(ref)
        assert img is not None
        return img

    def prune(self) -> list[Path]:
        """Remove unpacked images no reference points at (a rebuilt image leaves its predecessor).
        Only while no runc-node container runs from them: their roots are the containers' lower layer."""
        keep = {d.split(":", 1)[1] for d in self.refs().values()}
        gone = []
        for d in sorted((self.root / "sha256").glob("*")):
            if d.name not in keep:
                shutil.rmtree(d)
                gone.append(d)
        return gone

    def _tmpdir(self) -> str:
        d = self.root / "tmp"
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    @staticmethod
    def _blob(layout: Path, digest: str) -> Path:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
            raise ImageError(f"unsupported digest {digest!r}")
        p = layout / "blobs" / "sha256" / hexd
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != hexd:
            raise ImageError(f"blob {digest}: content does not match its digest")
        return p

    @staticmethod
    def _apply_layer(blob: Path, rootfs: Path) -> None:
        """Apply one layer (tar, gzip or not): whiteouts first, then extract with owners kept."""
        with tarfile.open(blob) as tf:  # transparent gzip
            names = tf.getnames()
        for n in names:
            base = os.path.basename(n)
            parent = os.path.dirname(n)
            if base == ".wh..wh..opq":
                d = rootfs / parent
                if d.is_dir():
                    for child in d.iterdir():
                        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            elif base.startswith(".wh."):
                victim = rootfs / parent / base[len(".wh."):]
                if victim.is_dir() and not victim.is_symlink():
                    shutil.rmtree(victim)
                elif victim.exists() or victim.is_symlink():
                    victim.unlink()
        # GNU tar: keeps owners/modes (as root), handles hard links and device nodes
        r = subprocess.run(["tar", "-xf", str(blob), "-C", str(rootfs), "--numeric-owner", "-p",
                            "--wildcards", "--exclude=.wh.*", "--exclude=*/.wh.*"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ImageError(f"unpacking layer {blob.name}: {r.stderr.strip()[-500:]}")


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/image_store.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=None, help=f"store directory (default ${STORE_ENV} or ~/.cache/agentrun/images)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("load", help="unpack an oci-archive or OCI layout into the store")
    p.add_argument("source")
    p.add_argument("--ref", default=None, help="reference name (default: the archive's ref.name annotation)")
    sub.add_parser("list", help="the references in the store")
    sub.add_parser("prune", help="remove unpacked images no reference points at (no runc-node cluster running)")
    a = ap.parse_args(argv)
    store = ImageStore(a.store)
    if a.cmd == "load":
        img = store.load(a.source, a.ref)
        print(f"loaded {img.ref} ({img.id[:19]}) into {store.root}: rootfs {img.rootfs}")
    elif a.cmd == "prune":
        for d in store.prune():
            print(f"removed {d}")
    else:
        for ref, digest in sorted(store.refs().items()):
            print(f"{ref}\t{digest}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
