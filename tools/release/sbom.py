#!/usr/bin/env python3
"""A CycloneDX 1.5 SBOM (JSON) of the agentrun image, read from the image itself.

``python3 tools/release/sbom.py IMAGE.oci.tar --ref REF -o SBOM.cdx.json``

It reads the OCI archive that ``make release`` pushes (index.json -> manifest -> layers, every blob
checked against its digest), applies the layers in order (OCI whiteouts honoured) without unpacking
them to disk, and lists what the resulting root filesystem has installed:

* every Debian package dpkg records as installed (``var/lib/dpkg/status``), as
  ``pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=debian-N`` (N from the image's os-release);
* every Python distribution installed in a ``site-packages`` or ``dist-packages`` directory (its
  ``*.dist-info/METADATA``: what ``pip inspect`` reads), as ``pkg:pypi/NAME@VERSION``, with its
  declared license (``License-Expression``, else ``License``, else the license classifiers).

The image is the SBOM's ``metadata.component`` (type container, ``pkg:oci`` purl with the manifest
digest). The output is deterministic: the serial number derives from the manifest digest and the
timestamp is the image config's ``created``.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import IO, Any
from urllib.parse import quote

TOOL = "agentrun tools/release/sbom.py"
DPKG_STATUS = "var/lib/dpkg/status"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
METADATA_RE = re.compile(r"(^|/)(site|dist)-packages/[^/]+\.dist-info/METADATA$")


class SbomError(RuntimeError):
    pass


def _norm(name: str) -> str:
    name = name[2:] if name.startswith("./") else name
    return name.strip("/")


class OciArchive:
    """An oci-archive (a tar of an OCI image layout), read in place."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tar = tarfile.open(path)  # noqa: SIM115 (closed by close())
        self.members = {_norm(m.name): m for m in self.tar.getmembers()}

    def close(self) -> None:
        self.tar.close()

    def _open(self, name: str) -> IO[bytes]:
        m = self.members.get(name)
        f = self.tar.extractfile(m) if m else None
        if f is None:
            raise SbomError(f"{self.path}: no {name}")
        return f

    def blob(self, digest: str) -> IO[bytes]:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
            raise SbomError(f"unsupported digest {digest!r}")
        h = hashlib.sha256()
        f = self._open(f"blobs/sha256/{hexd}")
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        if h.hexdigest() != hexd:
            raise SbomError(f"blob {digest}: content does not match its digest")
        return self._open(f"blobs/sha256/{hexd}")

    def json_blob(self, digest: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.blob(digest).read())
        return doc

    def image(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(index descriptor, manifest, config) of the archive's (linux/amd64) image."""
        index = json.loads(self._open("index.json").read())
        manifests = index.get("manifests") or []
        if not manifests:
            raise SbomError(f"{self.path}: index.json lists no manifest")
        desc = manifests[0]
        manifest = self.json_blob(desc["digest"])
        if "manifests" in manifest:  # an image index: the linux/amd64 image
            desc = next((m for m in manifest["manifests"]
                         if (m.get("platform") or {}).get("architecture") in (None, "amd64")), None)
            if desc is None:
                raise SbomError(f"{self.path}: no linux/amd64 image in the index")
            manifest = self.json_blob(desc["digest"])
        return desc, manifest, self.json_blob(manifest["config"]["digest"])


def wanted(path: str) -> bool:
    return path == DPKG_STATUS or path in OS_RELEASE or bool(METADATA_RE.search(path))


def apply_layers(archive: OciArchive, layers: list[dict[str, Any]]) -> dict[str, bytes]:
    """The files of interest (``wanted``) of the root filesystem the layers make, in order."""
    files: dict[str, bytes] = {}
    for layer in layers:
        with tarfile.open(fileobj=archive.blob(layer["digest"]), mode="r|*") as tf:  # gzip or plain
            for m in tf:
                path = _norm(m.name)
                base = PurePosixPath(path).name
                parent = str(PurePosixPath(path).parent).strip(".")
                if base == ".wh..wh..opq":  # opaque directory: nothing below it from earlier layers
                    prefix = parent + "/" if parent else ""
                    for p in [p for p in files if p.startswith(prefix)]:
                        del files[p]
                    continue
                if base.startswith(".wh."):
                    victim = (parent + "/" if parent else "") + base[len(".wh."):]
                    for p in [p for p in files if p == victim or p.startswith(victim + "/")]:
                        del files[p]
                    continue
                if m.isfile() and wanted(path):
                    f = tf.extractfile(m)
                    files[path] = f.read() if f else b""
                elif m.issym() or m.islnk():
                    files.pop(path, None)  # a link over a file: not a file we read any more
    return files


def dpkg_installed(status: str) -> Iterator[dict[str, str]]:
    """The paragraphs of a dpkg status file whose package is installed."""
    for para in re.split(r"\n\s*\n", status):
        fields: dict[str, str] = {}
        key = ""
        for line in para.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            yield fields


def os_release(files: dict[str, bytes]) -> dict[str, str]:
    for p in OS_RELEASE:
        if p in files:
            out = {}
            for line in files[p].decode(errors="replace").splitlines():
                k, sep, v = line.partition("=")
                if sep:
                    out[k.strip()] = v.strip().strip('"')
            return out
    return {}


def _purl_part(s: str) -> str:
    return quote(s, safe=".-_~")


def deb_component(p: dict[str, str], distro: str) -> dict[str, Any]:
    name, version, arch = p["Package"], p.get("Version", ""), p.get("Architecture", "")
    purl = f"pkg:deb/debian/{_purl_part(name)}@{_purl_part(version)}?arch={_purl_part(arch)}"
    if distro:
        purl += f"&distro={_purl_part(distro)}"
    props = [{"name": "agentrun:package:type", "value": "deb"}]
    if p.get("Source"):
        props.append({"name": "agentrun:deb:source", "value": p["Source"]})
    c: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
                         "properties": props}
    if p.get("Maintainer"):
        c["supplier"] = {"name": p["Maintainer"]}
    return c


def _license(meta: email.message.Message) -> list[dict[str, Any]]:
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        return [{"expression": expr}]
    lic = (meta.get("License") or "").strip()
    if lic and "\n" not in lic and len(lic) <= 100:
        return [{"license": {"name": lic}}]
    names = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return [{"license": {"name": n}} for n in dict.fromkeys(names)]


def pypi_component(path: str, text: str) -> dict[str, Any]:
    meta = email.parser.Parser().parsestr(text, headersonly=True)
    name, version = (meta.get("Name") or "").strip(), (meta.get("Version") or "").strip()
    if not name or not version:
        raise SbomError(f"{path}: no Name/Version")
    purl = f"pkg:pypi/{_purl_part(re.sub(r'[-_.]+', '-', name).lower())}@{_purl_part(version)}"
    c: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
                         "properties": [{"name": "agentrun:package:type", "value": "python"},
                                        {"name": "agentrun:python:location", "value": "/" + path.rsplit("/", 2)[0]}]}
    licenses = _license(meta)
    if licenses:
        c["licenses"] = licenses
    return c


def build_sbom(archive_path: str, ref: str) -> dict[str, Any]:
    archive = OciArchive(archive_path)
    try:
        desc, manifest, config = archive.image()
        files = apply_layers(archive, manifest.get("layers") or [])
    finally:
        archive.close()
    osr = os_release(files)
    distro = f"{osr['ID']}-{osr['VERSION_ID']}" if osr.get("ID") and osr.get("VERSION_ID") else ""
    if DPKG_STATUS not in files:
        raise SbomError(f"{archive_path}: the image has no {DPKG_STATUS}")
    debs = [deb_component(p, distro) for p in dpkg_installed(files[DPKG_STATUS].decode(errors="replace"))]
    pys = [pypi_component(p, files[p].decode(errors="replace")) for p in files if METADATA_RE.search(p)]
    if not pys:
        raise SbomError(f"{archive_path}: no Python distribution found in the image")
    components: dict[str, dict[str, Any]] = {}
    for c in sorted(debs + pys, key=lambda c: (c["purl"].split("/", 1)[0], c["name"].lower(), c["version"])):
        components.setdefault(c["bom-ref"], c)  # one entry per purl
    digest = desc["digest"]
    repo, _, tag = ref.rpartition(":") if "@" not in ref else (ref.split("@")[0], "", "")
    name = repo.rsplit("/", 1)[-1]
    image_purl = f"pkg:oci/{name}@{_purl_part(digest)}?repository_url={_purl_part(repo)}"
    if tag:
        image_purl += f"&tag={_purl_part(tag)}"
    labels = (config.get("config") or {}).get("Labels") or {}
    image: dict[str, Any] = {
        "type": "container", "bom-ref": image_purl, "name": repo, "purl": image_purl,
        "hashes": [{"alg": "SHA-256", "content": digest.split(":", 1)[1]}],
        "properties": [{"name": "oci:image:ref", "value": ref},
                       {"name": "oci:image:config.digest", "value": manifest["config"]["digest"]}],
    }
    if tag:
        image["version"] = tag
    if labels.get("org.opencontainers.image.source"):
        image["externalReferences"] = [{"type": "vcs", "url": labels["org.opencontainers.image.source"]}]
    if osr.get("PRETTY_NAME"):
        image["properties"].append({"name": "oci:image:os", "value": osr["PRETTY_NAME"]})
    created = config.get("created") or "1970-01-01T00:00:00Z"
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, image_purl)}",
        "version": 1,
        "metadata": {
            "timestamp": re.sub(r"\.\d+", "", created),
            "tools": {"components": [{"type": "application", "name": TOOL}]},
            "component": image,
        },
        "components": list(components.values()),
        "dependencies": [{"ref": image_purl, "dependsOn": list(components)}],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/release/sbom.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", help="the image's oci-archive")
    ap.add_argument("--ref", required=True, help="the image reference it is pushed as (REGISTRY/agentrun:VERSION)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    try:
        sbom = build_sbom(a.archive, a.ref)
    except (SbomError, OSError, tarfile.TarError, KeyError, ValueError) as e:
        print(f"tools/release/sbom.py: {e}", file=sys.stderr)
        return 1
    with open(a.output, "w") as f:
        json.dump(sbom, f, indent=1, sort_keys=False)
        f.write("\n")
    kinds = [p["value"] for c in sbom["components"] for p in c["properties"] if p["name"] == "agentrun:package:type"]
    print(f"SBOM {a.output}: {kinds.count('deb')} Debian packages, {kinds.count('python')} Python distributions "
          f"(CycloneDX {sbom['specVersion']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
