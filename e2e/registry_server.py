#!/usr/bin/env python3
"""A local OCI registry for the release test (tests/e2e/test_release.py): the CNCF distribution
registry from Debian's ``docker-registry`` package (``/usr/bin/docker-registry``; installed by
tools/test-deps.sh), with its own config, storage in a directory of the test, plain HTTP on a free
loopback port, no authentication. Debian's package ships a service that listens on :5000 with an
htpasswd file: it is not used (the config here is the registry's whole configuration).

``make release REGISTRY=127.0.0.1:PORT/agentrun`` pushes to it (skopeo and ``helm push
--plain-http``: tools/release/release.sh treats a loopback registry as plain HTTP), and
``helm install oci://127.0.0.1:PORT/agentrun/agentrun-operator --plain-http`` installs from it.

The runc node (e2e/runc_node.py) runs only images of its local store (e2e/image_store.py): it has
no registry client. ``pull`` is what a kubelet's image pull does here: ``skopeo copy`` of the
reference from the registry into an OCI layout, then ``ImageStore.load`` of that layout under the
same reference, so the pods' ``image`` resolves to exactly what the registry serves (every blob is
checked against its digest on the way in).

Usage: python e2e/registry_server.py run DIR     # serve until SIGTERM (prints the address)
       python e2e/registry_server.py pull REF    # pull REF (plain HTTP) into the runc node's store
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from . import image_store
    from .ports import free_port as _free_port
except ImportError:  # run as a script: e2e/ is on sys.path
    import image_store  # type: ignore[no-redef]
    from ports import free_port as _free_port  # type: ignore[no-redef]

BINARY_ENV = "AGENTRUN_REGISTRY_BIN"  # default: docker-registry on PATH

CONFIG = """version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: agentrun-e2e-local-registry
"""

ACCEPT = ", ".join(("application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))


class RegistryError(RuntimeError):
    pass


def binary() -> str | None:
    return os.environ.get(BINARY_ENV) or shutil.which("docker-registry")


def unusable_reason() -> str:
    """Why the release test cannot run here ("" when it can): the registry or skopeo is missing."""
    missing = [t for t, have in (("docker-registry", binary()), ("skopeo", shutil.which("skopeo"))) if not have]
    return f"{', '.join(missing)} not installed: run tools/test-deps.sh (apt-get install docker-registry skopeo)" \
        if missing else ""



@dataclass
class Registry:
    proc: subprocess.Popen[bytes]
    host: str
    """``127.0.0.1:PORT``: the host part of the references pushed to it."""
    dir: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def get(self, path: str, accept: str = ACCEPT) -> tuple[dict[str, str], bytes]:
        req = urllib.request.Request(f"{self.url}{path}", headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=10) as r:
            return dict(r.headers.items()), r.read()

    def tags(self, repository: str) -> list[str]:
        try:
            _, body = self.get(f"/v2/{repository}/tags/list", accept="application/json")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise
        return sorted(json.loads(body).get("tags") or [])

    def manifest(self, repository: str, reference: str) -> tuple[str, dict[str, Any]]:
        """(digest, manifest) of ``repository:reference`` as the registry serves it."""
        headers, body = self.get(f"/v2/{repository}/manifests/{reference}")
        digest = next((v for k, v in headers.items() if k.lower() == "docker-content-digest"), "")
        return digest, json.loads(body)

    def pull(self, ref: str, store: image_store.ImageStore | None = None) -> image_store.Image:
        """Pull ``ref`` (``HOST/repo:tag`` of this registry) into the runc node's image store."""
        if not ref.startswith(self.host + "/"):
            raise RegistryError(f"{ref} is not in this registry ({self.host})")
        return pull(ref, store, tmpdir=self.dir)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def pull(ref: str, store: image_store.ImageStore | None = None, *, tls_verify: bool = False,
         tmpdir: Path | None = None) -> image_store.Image:
    """The runc node's image pull: ``skopeo copy docker://REF`` into an OCI layout, then
    ``ImageStore.load`` of it under the same reference (plain HTTP unless ``tls_verify``)."""
    store = store or image_store.ImageStore()
    with tempfile.TemporaryDirectory(prefix="pull-", dir=tmpdir) as tmp:
        layout = Path(tmp) / "layout"
        r = subprocess.run(["skopeo", "copy", "--quiet", f"--src-tls-verify={str(tls_verify).lower()}",
                            f"docker://{ref}", f"oci:{layout}:{ref}"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RegistryError(f"skopeo copy docker://{ref}: {r.stderr.strip()[-1000:]}")
        return store.load(layout, ref)


def start_registry(base_dir: Path, timeout: float = 30.0) -> Registry:
    """Start the registry on a free loopback port (config, storage and log in ``base_dir``); raises
    ``RegistryError`` when ``/v2/`` does not answer within ``timeout``."""
    exe = binary()
    if not exe:
        raise RegistryError(unusable_reason())
    base_dir = base_dir.resolve()
    (base_dir / "data").mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = base_dir / "config.yml"
    config.write_text(CONFIG.format(root=base_dir / "data", port=port))
    log_path = base_dir / "registry.log"
    with open(log_path, "ab") as log:
        # no REGISTRY_* from the environment: they would override this config
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, cwd=base_dir)
    reg = Registry(proc, f"127.0.0.1:{port}", base_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RegistryError(f"docker-registry exited with code {proc.returncode} before it was ready:\n"
                                f"{log_path.read_text(errors='replace')[-2000:]}")
        try:
            reg.get("/v2/", accept="application/json")
            return reg
        except OSError:
            time.sleep(0.1)
    reg.stop()
    raise RegistryError(f"the registry did not answer on {reg.url}/v2/ within {timeout}s:\n"
                        f"{log_path.read_text(errors='replace')[-2000:]}")


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/registry_server.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="serve until SIGTERM/SIGINT")
    p.add_argument("dir")
    p = sub.add_parser("pull", help="pull an image (plain HTTP) into the runc node's image store")
    p.add_argument("ref")
    a = ap.parse_args(argv)
    if a.cmd == "pull":
        img = pull(a.ref)
        print(f"pulled {img.ref} ({img.id[:19]}) into {image_store.ImageStore().root}")
        return 0
    reg = start_registry(Path(a.dir))
    print(f"registry on {reg.url} (storage {reg.dir / 'data'}); REGISTRY={reg.host}/agentrun", flush=True)
    # only terminate here: the main thread is in proc.wait() (a second wait would wait for its lock)
    signal.signal(signal.SIGTERM, lambda *_: reg.proc.terminate())
    try:
        reg.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
