#!/usr/bin/env python3
"""The real Kueue (https://github.com/kubernetes-sigs/kueue, Apache-2.0) on the local control plane.

``e2e/kueue/build.sh`` builds Kueue's controller manager (``sigs.k8s.io/kueue/cmd/kueue``) from
the Go module proxy at a pinned version and caches it with that module's CRDs and webhook
manifests. :func:`start_kueue` runs it as a host process against a cluster from
``e2e/cluster.py``:

* applies Kueue's CRDs (server-side), their conversion webhook pointed at the process;
* writes a Kueue ``Configuration``: leader election off, health probes and the webhook server on
  free 127.0.0.1 ports, the metrics server off, internal cert management off (a self-signed
  certificate for 127.0.0.1 generated here), integrations ``batch/job`` only,
  ``manageJobsWithoutQueueName: false``, the ``VisibilityOnDemand`` gate off (its extension API
  server would bind 0.0.0.0:8082 and needs an APIService routed through a Service);
* registers Kueue's own Mutating/ValidatingWebhookConfigurations, taken from the module's
  manifests and rewritten to ``clientConfig.url: https://127.0.0.1:<port>/<path>`` with the
  certificate as caBundle. Only the webhooks of Kueue's own kinds and of the enabled
  integration (``batch`` Jobs) are registered: the others (pods, deployments, statefulsets, ...)
  would put every pod of the shared session cluster behind a webhook for integrations that
  are off;
* waits for its ``/readyz`` and for a webhook to answer through the API server (a server-side
  dry-run create of a ResourceFlavor), and stops it cleanly (webhook configurations removed
  first, so the cluster's Jobs are not left behind a dead webhook).

Kueue v0.17 reads its metrics server's certificate from the fixed path
``/etc/kueue/metrics/certs/tls.{crt,key}`` whenever internal cert management is off (a Secret
mounted there in its Deployment), even with the metrics server disabled: a self-signed pair is
written there if none exists (needs root, as the e2e machines are).

Usage: python e2e/kueue_server.py build      # print the cache directory (building if needed)
       python e2e/kueue_server.py run DIR    # on the cluster in $LOCALKUBE_DIR (default .localkube)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

try:
    from .cluster import Cluster, ClusterError, _free_port, _tail
    from .gobuild import cached_build
except ImportError:  # run as a script: e2e/ is on sys.path
    from cluster import Cluster, ClusterError, _free_port, _tail  # type: ignore[no-redef]
    from gobuild import cached_build  # type: ignore[no-redef]

BUILD_SH = Path(__file__).resolve().parent / "kueue" / "build.sh"

#: The label that puts a Job into a LocalQueue (Kueue's ``constants.QueueLabel``).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The label Kueue sets on a Job's Workload: the Job's uid (``controller/constants.JobUIDLabel``).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
API = "kueue.x-k8s.io/v1beta2"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
#: API groups whose webhooks are registered: Kueue's own kinds and the enabled integration.
WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
#: CRDs that Kueue's kustomize config serves through its conversion webhook
#: (config/components/crd/kustomization.yaml).
CONVERSION_CRDS = frozenset({"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"})
MUTATING_NAME = "kueue-mutating-webhook-configuration"
VALIDATING_NAME = "kueue-validating-webhook-configuration"


#: libyaml's safe loader where PyYAML has it: the Workload CRD is 1.4 MB (1.3 s in pure Python).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class KueueError(RuntimeError):
    pass


def workload_name(job_name: str, job_uid: str, kind: str = "Job", group: str = "batch") -> str:
    """The name Kueue gives the Workload of a Job (jobframework.GetWorkloadNameForOwnerWithGVK, with
    the ShortWorkloadNames gate off as by default in v0.17): ``<kind>-<name>`` lower-cased, cut to
    247 characters, ``-`` and the first 5 hex digits of sha1(kind, group, name, uid joined by \\n)."""
    import hashlib
    digest = hashlib.sha1("\n".join((kind, group, job_name, job_uid)).encode()).hexdigest()
    return f"{(kind.lower() + '-' + job_name)[:253 - 1 - 5]}-{digest[:5]}"


def build_kueue() -> Path:
    """Build (or reuse the cached) Kueue; return the cache directory (``kueue``, ``crds/``,
    ``webhook/manifests.yaml``). ``KUEUE_DIR`` overrides (a directory of that shape)."""
    return Path(cached_build("kueue", BUILD_SH, os.environ.get("KUEUE_DIR")))


# ------------------------------------------------------------------ certificates


def self_signed(cert_dir: Path) -> bytes:
    """Write ``tls.crt``/``tls.key`` (EC P-256, self-signed, for 127.0.0.1 and localhost, CA so
    that it is its own caBundle) into cert_dir; return the certificate's PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-e2e-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(pem)
    (cert_dir / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    os.chmod(cert_dir / "tls.key", 0o600)
    return pem


def _ensure_metrics_cert(src: Path) -> None:
    """Kueue's fixed metrics certificate path (see the module docstring): copy ``src``'s pair there
    unless a pair is present (another session's is as good: the metrics server is off)."""
    if (METRICS_CERT_DIR / "tls.crt").exists() and (METRICS_CERT_DIR / "tls.key").exists():
        return
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for f in ("tls.key", "tls.crt"):  # each written whole, then renamed into place
            tmp = METRICS_CERT_DIR / f".{f}.{os.getpid()}"
            tmp.write_bytes((src / f).read_bytes())
            os.chmod(tmp, 0o600)
            os.replace(tmp, METRICS_CERT_DIR / f)
    except OSError as e:
        raise KueueError(f"Kueue (internal cert management off) reads a certificate from {METRICS_CERT_DIR}; "
                         f"could not write one there ({e}): run as root") from e


# ------------------------------------------------------------------ manifests


def _b64(data: bytes) -> str:
    import base64
    return base64.b64encode(data).decode()


def crds(kueue_dir: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    """The module's CRDs; those Kueue converts get ``spec.conversion`` through ``url/convert``."""
    out = []
    for f in sorted((kueue_dir / "crds").glob("*.yaml")):
        for doc in yaml.load_all(f.read_text(), Loader=_Loader):
            if not doc:
                continue
            if doc["spec"]["names"]["plural"] in CONVERSION_CRDS:
                doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"{url}/convert", "caBundle": _b64(ca)}}}
            out.append(doc)
    return out


def webhook_configurations(kueue_dir: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations from the module's manifests, limited to
    WEBHOOK_GROUPS and rewritten to call ``url`` with ``ca``."""
    out = []
    for doc in yaml.load_all((kueue_dir / "webhook" / "manifests.yaml").read_text(), Loader=_Loader):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        hooks = []
        for h in doc["webhooks"]:
            groups = {g for rule in h.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = h["clientConfig"]["service"]["path"]
            h["clientConfig"] = {"url": f"{url}{path}", "caBundle": _b64(ca)}
            hooks.append(h)
        if not hooks:
            raise KueueError(f"no webhooks for {sorted(WEBHOOK_GROUPS)} in {doc['metadata']['name']}")
        doc["webhooks"] = hooks
        doc["metadata"] = {"name": MUTATING_NAME if doc["kind"] == "MutatingWebhookConfiguration"
                           else VALIDATING_NAME}
        out.append(doc)
    return out


def configuration(*, health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
        "clientConnection": {"qps": 100, "burst": 200},
    }


# ------------------------------------------------------------------ the process


@dataclass
class Kueue:
    cluster: Cluster
    dir: Path
    proc: subprocess.Popen[bytes]
    health_url: str
    webhook_url: str
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.dir / "kueue.log"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl_run(*args, input=input, check=check)

    def apply(self, *objs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        r = self.kubectl("get", kind, name, "-o", "json", *(["-n", namespace] if namespace else []), check=False)
        if r.returncode != 0:
            if "NotFound" in r.stderr:
                return None
            raise KueueError(r.stderr)
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    # ---- queues

    def resource_flavor(self, name: str = "default-flavor") -> str:
        self.apply({"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}})
        return name

    def cluster_queue(self, name: str, *, cpu: str, memory: str, flavor: str = "default-flavor",
                      namespace_selector: dict[str, Any] | None = None) -> str:
        """A ClusterQueue with nominalQuota ``cpu``/``memory`` in ``flavor`` (all namespaces unless
        ``namespace_selector``). Waits until Kueue reports it Active."""
        self.apply({"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "namespaceSelector": namespace_selector or {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                              {"name": "memory", "nominalQuota": memory}]}]}]}})
        self._wait_active("clusterqueue", name)
        return name

    def local_queue(self, namespace: str, name: str, cluster_queue: str) -> str:
        self.apply({"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"clusterQueue": cluster_queue}})
        self._wait_active("localqueue", name, namespace)
        return name

    def _wait_active(self, kind: str, name: str, namespace: str | None = None, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = self.get(kind, name, namespace)
            conds = ((last or {}).get("status") or {}).get("conditions") or []
            if any(c["type"] == "Active" and c["status"] == "True" for c in conds):
                return
            time.sleep(0.1)
        raise KueueError(f"{kind} {name} not Active within {timeout}s: {(last or {}).get('status')}")

    # ---- workloads

    def workloads_of(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """The Workloads Kueue made for the Job with this uid (label ``kueue.x-k8s.io/job-uid``)."""
        r = self.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-l", f"{JOB_UID_LABEL}={job_uid}",
                         "-o", "json")
        return json.loads(r.stdout)["items"]  # type: ignore[no-any-return]

    # ---- lifecycle

    def stop(self) -> None:
        """Remove the webhook configurations (the session's Jobs must not hang on a dead webhook),
        then stop the process (SIGTERM, SIGKILL after 15 s)."""
        try:
            remove_webhooks(self.cluster)
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise KueueError(f"kueue did not stop on SIGTERM within 15s:\n{_tail(self.log)}") from None


def remove_webhooks(cluster: Cluster) -> None:
    """Delete Kueue's webhook configurations (Jobs are admitted without Kueue again)."""
    cluster.kubectl_run("delete", "mutatingwebhookconfiguration", MUTATING_NAME, "--ignore-not-found", check=False)
    cluster.kubectl_run("delete", "validatingwebhookconfiguration", VALIDATING_NAME, "--ignore-not-found",
                        check=False)


def _get_ok(url: str, context: Any = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start_kueue(cluster: Cluster, base_dir: str | os.PathLike[str], timeout: float = 120) -> Kueue:
    """Start Kueue on ``cluster`` with its files (configuration, certificate, log) in base_dir.
    Returns once it is ready and its webhooks answer through the API server; raises KueueError
    (with its log's tail) otherwise, after stopping what it started."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    kueue_dir = build_kueue()
    timings["build"] = time.monotonic() - t0
    d = Path(base_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    cert_dir = d / "certs"
    ca = self_signed(cert_dir)
    _ensure_metrics_cert(cert_dir)
    health_port, webhook_port = _free_port(), _free_port()
    url = f"https://127.0.0.1:{webhook_port}"
    (d / "config.yaml").write_text(yaml.safe_dump(configuration(health_port=health_port, webhook_port=webhook_port,
                                                               cert_dir=cert_dir)))

    # The CRDs must be established before the manager starts (its informers need them). The webhook
    # configurations go in the same request (one kubectl call): until Kueue serves, a Job or Kueue
    # object created in the cluster is refused (failurePolicy Fail), as in a real cluster.
    t1 = time.monotonic()
    crd_list = crds(kueue_dir, url, ca)
    items = [*crd_list, *webhook_configurations(kueue_dir, url, ca)]
    try:
        cluster.kubectl_run("apply", "--server-side", "--force-conflicts", "--field-manager=agentrun-e2e-kueue",
                            "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                            timeout=120)
        cluster.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                            *[f"crd/{c['metadata']['name']}" for c in crd_list], timeout=90)
    except BaseException:
        remove_webhooks(cluster)
        raise
    timings["crds"] = time.monotonic() - t1

    env = cluster.env()
    log = open(d / "kueue.log", "ab")  # noqa: SIM115 (kept open for the process)
    proc = subprocess.Popen([str(kueue_dir / "kueue"), f"--config={d / 'config.yaml'}",
                             f"--kubeconfig={cluster.kubeconfig}", "--zap-log-level=info"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, cwd=d)
    log.close()
    (d / "kueue.pid").write_text(f"{proc.pid}\n")
    k = Kueue(cluster=cluster, dir=d, proc=proc, health_url=f"http://127.0.0.1:{health_port}",
              webhook_url=url, timings=timings)
    try:
        t2 = time.monotonic()
        end = time.monotonic() + timeout
        while not _get_ok(f"{k.health_url}/readyz"):
            if proc.poll() is not None:
                raise KueueError(f"kueue exited with code {proc.returncode} before it was ready:\n{_tail(k.log)}")
            if time.monotonic() > end:
                raise KueueError(f"kueue not ready within {timeout}s:\n{_tail(k.log)}")
            time.sleep(0.05)
        timings["readyz"] = time.monotonic() - t2
        # A webhook answering through the API server: a server-side dry run goes through
        # mresourceflavor/vresourceflavor (failurePolicy Fail), so it fails unless Kueue answers.
        probe = json.dumps({"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "e2e-webhook-probe"}})
        while True:
            r = cluster.kubectl_run("create", "--dry-run=server", "-f", "-", input=probe, check=False)
            if r.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > end:
                raise KueueError(f"kueue's webhook did not answer through the API server: {r.stderr.strip()}\n"
                                 f"{_tail(k.log)}")
            time.sleep(0.1)
        timings["webhook"] = time.monotonic() - t2
        timings["total"] = time.monotonic() - t0
        (d / "startup-seconds.json").write_text(json.dumps(timings, indent=2) + "\n")
        return k
    except BaseException:
        k.stop()
        raise


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    run = sub.add_parser("run")
    run.add_argument("dir")
    a = ap.parse_args()
    if a.cmd == "build":
        print(build_kueue())
        return 0
    cdir = os.environ.get("LOCALKUBE_DIR", ".localkube")
    try:
        c = Cluster.load(cdir)
    except FileNotFoundError:
        print(f"no cluster in {cdir} (make cluster-up, or set LOCALKUBE_DIR)", file=sys.stderr)
        return 1
    try:
        k = start_kueue(c, a.dir)
    except (KueueError, ClusterError) as e:
        print(e, file=sys.stderr)
        return 1

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    print(f"kueue ready ({k.timings['total']:.1f}s): health {k.health_url}, webhooks {k.webhook_url}, "
          f"log {k.log}", file=sys.stderr, flush=True)
    try:
        return k.proc.wait()
    except KeyboardInterrupt:
        k.stop()
        return 0


if __name__ == "__main__":
    sys.exit(main())
