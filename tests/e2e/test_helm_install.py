"""The Helm chart, installed for real on the local control plane (issue 5).

``helm install`` of helm/agentrun-operator into a fresh namespace; the operator pod is run by the
process kubelet (e2e/proc_kubelet.py) as a host process (`agentrun operator`, images ignored)
with a TokenRequest token of the chart's ServiceAccount in a per-pod kubeconfig. So the operator
talks to the API server under the chart's RBAC, not as admin.

* the RBAC the chart grants is exactly what the controller uses (``kubectl auth can-i --list``);
  the lap ServiceAccount has nothing beyond what every authenticated user has;
* an approval run goes to Succeeded under that RBAC; ``/metrics`` (host loopback, the chart's
  ``metrics.port``) shows the pending approval with its owner, the lap count and a cost equal
  to the sum of the LapRecords' costs in S3; after the end, counters agree with S3 and the
  per-run series are gone;
* ``helm upgrade`` (log format, resources) with a lap in flight does not disturb the run.

Fixtures ``cluster`` and ``s3``: tests/e2e/conftest.py. Helm: tools/install-helm.sh (cached).
Run with ``-s`` to see the scrape excerpt and the can-i listings.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster import API_MANIFESTS, TENANCY_CRD
from e2e_support import ToolGate, wait_for

from agentrun.api import admission
from agentrun.api.tenancy_admission import LOCAL_POLICY

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"
sys.path.insert(0, str(ROOT / "examples"))
import tool_server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELEASE = "agentrun-operator"  # fullname = release name: SA, Lease, Deployment all "agentrun-operator"
OPERATOR_SA = RELEASE
LAP_SA = "agentrun-lap"


_wait = wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def parse_can_i(text: str) -> dict[str, set[str]]:
    """``kubectl auth can-i --list`` -> {"resource[ names]" or "url:/path": verbs}."""
    rules: dict[str, set[str]] = {}
    row = re.compile(r"^\s*(?:(\S+)\s+)?\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$")
    for line in text.splitlines()[1:]:
        m = row.match(line)
        assert m, f"unparsed can-i line: {line!r}"
        res, urls, names, verbs = m.groups()
        key = f"{res} [{names}]" if res else f"url:{urls}"
        rules.setdefault(key, set()).update(verbs.split())
    return rules


def forbidden_requests(log_text: str) -> list[str]:
    """Log lines of the operator reporting a refused request (403 / Forbidden), none tolerated.

    With exact ``watchNamespaces`` the operator disables Kopf's scanning, so Kopf no longer lists
    namespaces at the cluster scope (it used to: eight 403s and ~55 s before the watches started).
    """
    refused = re.compile(r"(?<![\d.:])403(?!\d)|forbidden", re.IGNORECASE)

    def text(line: str) -> str:  # a JSON log line's message, not its timestamp (".403+00:00")
        try:
            doc = json.loads(line)
        except ValueError:
            return line
        return f"{doc.get('msg', '')} {doc.get('error', '')}" if isinstance(doc, dict) else line

    return [ln for ln in log_text.splitlines() if refused.search(text(ln))]


class HelmEnv:
    def __init__(self, cluster: Any, s3: Any, tmp: Path, helm: str) -> None:
        self.cluster, self.s3, self.tmp, self.helm_bin = cluster, s3, tmp, helm
        suffix = uuid.uuid4().hex[:6]
        self.sys_ns = f"ar-sys-{suffix}"  # release namespace
        self.ns = f"ar-runs-{suffix}"  # where AgentRuns live (watchNamespaces)
        self.metrics_port = _free_port()
        self.liveness_port = _free_port()  # the chart's 8081 would collide between host-process operators
        self.prefix = f"helm-e2e-{suffix}"
        self.record = tmp / "tool-calls.jsonl"
        self.tools = tool_server.serve(0, str(self.record))
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        self.values = tmp / "values.yaml"
        # distinctive credentials (moto accepts any), so their absence from logs/metrics/status means something
        self.access_key = f"AKIAHELME2E{suffix.upper()}"
        self.secret_key = f"helm-e2e-secret-{uuid.uuid4().hex}"
        self.scrapes: list[str] = []

    # ------------------------------------------------------------------ helpers
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl_run(*args, check=check, input=input, timeout=120)

    def helm(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
        p = subprocess.run([self.helm_bin, *args, "--kubeconfig", self.cluster.kubeconfig],
                           capture_output=True, text=True, timeout=timeout, env=self.cluster.env())
        if check and p.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}\n"
                                 f"{self.diagnostics()}")
        return p

    def get(self, kind: str, name: str, ns: str) -> dict:
        r = self.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def status(self, name: str) -> dict:
        return self.get("agentrun", name, self.ns).get("status") or {}

    def wait_phase(self, name: str, *phases: str, timeout: float = 240) -> dict:
        return _wait(f"{name} phase in {phases}", lambda: (s := self.status(name)).get("phase") in phases and s,
                     timeout=timeout)

    def jobs(self, name: str) -> list[dict]:
        r = self.kubectl("get", "jobs", "-n", self.ns, "-l", f"agentrun.dev/run={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def operator_pods(self) -> list[dict]:
        r = self.kubectl("get", "pods", "-n", self.sys_ns, "-l", "app.kubernetes.io/component=operator",
                         "-o", "json")
        return json.loads(r.stdout)["items"]

    def lease_holder(self) -> str | None:
        return (self.get("lease", RELEASE, self.sys_ns).get("spec") or {}).get("holderIdentity")

    def calls(self, path: str) -> list[dict]:
        if not self.record.exists():
            return []
        return [c for c in map(json.loads, self.record.read_text().splitlines()) if c["path"] == path]

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        self.scrapes.append(text)
        return text

    def operator_logs(self) -> str:
        out = []
        for d in sorted(self.cluster.pods_dir.glob(f"{self.sys_ns}_*")):
            for f in sorted(d.glob("*.log")):
                out.append(f"===== {d.name}/{f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-80:]))
        return "\n".join(out) or "(no operator pod logs)"

    def full_operator_logs(self) -> str:
        """Every line of every operator pod's log (operator_logs keeps only the last 80 per file)."""
        return "\n".join(f.read_text(errors="replace") for d in sorted(self.cluster.pods_dir.glob(f"{self.sys_ns}_*"))
                         for f in sorted(d.glob("*.log")))

    def diagnostics(self) -> str:
        parts = ["--- operator pod logs:", self.operator_logs()]
        if self.scrapes:
            parts += ["--- last scrape (agentrun_* lines):",
                      "\n".join(ln for ln in self.scrapes[-1].splitlines() if ln.startswith("agentrun_"))]
        pods = self.kubectl("get", "pods", "-n", self.sys_ns, "-o", "wide", check=False)
        parts += ["--- operator pods:", pods.stdout + pods.stderr]
        return "\n".join(parts)

    def store(self) -> Any:
        import boto3

        from agentrun.checkpoint.store import CheckpointStore, StoreConfig

        cfg = StoreConfig(uri=f"s3://{self.s3.bucket}/{self.prefix}", endpoint_url=self.s3.endpoint_url,
                          region=self.s3.region, path_style=True)
        client = boto3.session.Session().client(
            "s3", endpoint_url=self.s3.endpoint_url, region_name=self.s3.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)
        return CheckpointStore(cfg, client=client)

    def lap_records(self, name: str) -> list[Any]:
        from agentrun.checkpoint.schema import RunRef

        uid = self.get("agentrun", name, self.ns)["metadata"]["uid"]
        return [rec for rec, _ in self.store().iter_laps(RunRef(namespace=self.ns, name=name, uid=uid))]

    def can_i(self, user: str, ns: str, *extra: str) -> str:
        return self.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", ns, *extra).stdout

    # ------------------------------------------------------------------ install
    def write_values(self) -> None:
        agentrun_bin = shutil.which("agentrun") or "agentrun"
        values = {
            "watchNamespaces": [self.ns],
            "logFormat": "json",
            "leaderElection": {"leaseDurationSeconds": 5},
            # Far longer than any wait of this module: lap 1's Job of test_approval_run_... can only
            # come from the operator's watch (or the resync on acquiring the Lease, which ran before the run
            # existed), never from the periodic resync.
            "resyncSeconds": 3600,
            "storeRetrySeconds": 2,
            "checkpoint": {
                "uri": f"s3://{self.s3.bucket}/{self.prefix}",
                "s3": {"endpoint": self.s3.endpoint_url, "region": self.s3.region, "pathStyle": True,
                       "credentialsSecretName": "s3-creds"},
            },
            # images are ignored by the process kubelet: lap pods run this command on the host
            "lap": {"command": [agentrun_bin, "lap"], "jobTTLSeconds": -1},
            "metrics": {"port": self.metrics_port},
            "livenessPort": self.liveness_port,
            # the local control plane's AgentRunPolicy (tool servers and S3 on 127.0.0.1, intended here)
            "tenancy": {"policy": LOCAL_POLICY.model_dump(by_alias=True, exclude_none=True, mode="json")},
            # The operator reads lap checkpoints from S3 itself: its credentials come from a Secret
            # of the release namespace, resolved by the kubelet (secretKeyRef), not by the operator.
            "extraEnv": [
                {"name": "AWS_ACCESS_KEY_ID",
                 "valueFrom": {"secretKeyRef": {"name": "operator-s3", "key": "AWS_ACCESS_KEY_ID"}}},
                {"name": "AWS_SECRET_ACCESS_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "operator-s3", "key": "AWS_SECRET_ACCESS_KEY"}}},
            ],
        }
        self.values.write_text(yaml.safe_dump(values))

    def install(self) -> None:
        for ns in (self.sys_ns, self.ns):
            self.kubectl("create", "namespace", ns)
        creds = [f"--from-literal=AWS_ACCESS_KEY_ID={self.access_key}",
                 f"--from-literal=AWS_SECRET_ACCESS_KEY={self.secret_key}"]
        self.kubectl("create", "secret", "generic", "s3-creds", "-n", self.ns, *creds)
        self.kubectl("create", "secret", "generic", "operator-s3", "-n", self.sys_ns, *creds)
        self.write_values()
        # The chart renders the approval admission policies (cluster-scoped, fixed names): remove
        # the copies other modules applied from crds/ (install_api) so the release can own them;
        # those modules apply them again. The operator then runs under them with the chart's RBAC.
        # (the AgentRunPolicy CRD first: the local AgentRunPolicy is among them, and Helm skips a CRD it finds)
        self.kubectl("apply", "-f", str(ROOT / "crds" / TENANCY_CRD))
        self.kubectl("wait", "--for=condition=Established", "crd/agentrunpolicies.agentrun.dev", "--timeout=60s")
        self.kubectl("delete", "--ignore-not-found", *[a for f in API_MANIFESTS[1:]
                                                       for a in ("-f", str(ROOT / "crds" / f))])
        self.helm("install", RELEASE, str(CHART), "-n", self.sys_ns, "-f", str(self.values),
                  "--wait", "--timeout", "3m")
        self.wait_leader()

    def wait_leader(self, exclude: str | None = None) -> str:
        def leader() -> str | None:
            names = {p["metadata"]["name"] for p in self.operator_pods()
                     if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
            h = self.lease_holder()
            return h if h in names and h != exclude else None
        try:
            return _wait("an operator pod holding the Lease", leader, timeout=240)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.diagnostics()}") from None

    def uninstall(self) -> None:
        self.helm("uninstall", RELEASE, "-n", self.sys_ns, "--wait", "--timeout", "2m", check=False)
        for ns in (self.ns, self.sys_ns):
            self.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def helm_bin() -> str:
    out = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def henv(cluster, s3, helm_bin, tmp_path_factory):
    e = HelmEnv(cluster, s3, tmp_path_factory.mktemp("helm-install"), helm_bin)
    try:
        e.install()
        yield e
    finally:
        e.tools.shutdown()
        e.uninstall()


@pytest.fixture
def diag(henv, request):
    """Print the operator's log and the last scrape when the test fails."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print(henv.diagnostics())


# ---------------------------------------------------------------------------------------------- RBAC

# What the controller calls (operator/agentrun/controller/execute.py, lease.py) and what its
# watch cache needs (controller/cache.py: list/watch AgentRuns, Jobs and pods). Nothing else, and nothing cluster-scoped: with
# exact watchNamespaces Kopf's scanning is disabled (no namespace list, no CRD list/watch).
EXPECTED_RUN_NS = {
    # create: the schedule controller creates a schedule's runs (agentrun.schedule)
    "agentruns.agentrun.dev []": {"list", "watch", "patch", "delete", "create"},
    "agentruns.agentrun.dev/status []": {"patch", "operate"},  # operate: docs/security.md
    "agents.agentrun.dev []": {"list", "watch"},  # runs of an Agent are resolved from the watch cache
    "agentschedules.agentrun.dev []": {"list", "watch"},
    "agentschedules.agentrun.dev/status []": {"patch"},
    "agentschedules.agentrun.dev/finalizers []": {"update"},  # blockOwnerDeletion on a schedule's runs
    "jobs.batch []": {"create", "list", "watch", "delete"},
    "pods []": {"list", "watch"},  # watch: the lap pods that exited 0 (field selector status.phase=Succeeded)
    "workloads.kueue.x-k8s.io []": {"list"},  # status.kueue (controller/kueueview.py)
    "events []": {"create"},
}
EXPECTED_RELEASE_NS = {
    "leases.coordination.k8s.io []": {"create"},
    f"leases.coordination.k8s.io [{RELEASE}]": {"get", "update", "patch"},
}


def expected_tenancy_reader(run_ns: str) -> dict[str, set[str]]:
    """Cluster-wide, the tenancy re-check's watches (ClusterRole <release>-tenancy-reader): seen in
    every namespace; the namespaces only by name (watchNamespaces: resourceNames)."""
    return {
        f"namespaces [{run_ns}]": {"get", "list", "watch"},
        "validatingadmissionpolicybindings.admissionregistration.k8s.io []": {"list", "watch"},
        "agentrunpolicies.agentrun.dev []": {"list", "watch"},
    }


#: The admission policy check (controller/policycheck.py; ClusterRole <release>-admission-reader): a list
#: and watch of each of the operator's own policies and bindings, by name.
VALIDATING_NAMES = ("agentrun-agent-guard", "agentrun-approval-guard", "agentrun-decisions", "agentrun-lifecycle",
                    "agentrun-status-owner", "agentrun-tenancy")
MUTATING_NAMES = ("agentrun-stamp-canceller", "agentrun-stamp-creator", "agentrun-stamp-decider",
                  "agentrun-stamp-decider-status", "agentrun-stamp-retry-requester")
EXPECTED_ADMISSION_READER = {
    f"{res}.admissionregistration.k8s.io [{name}]": {"list", "watch"}
    for res, names in (("validatingadmissionpolicies", VALIDATING_NAMES), ("validatingadmissionpolicybindings", VALIDATING_NAMES),
                       ("mutatingadmissionpolicies", MUTATING_NAMES), ("mutatingadmissionpolicybindings", MUTATING_NAMES))
    for name in names
}


def test_rbac_is_exactly_what_the_operator_uses(henv, diag):
    sa_user = f"system:serviceaccount:{henv.sys_ns}:{OPERATOR_SA}"
    # baseline: a user with only the groups every service account has, and no bindings
    base_user = f"system:serviceaccount:{henv.sys_ns}:nobody-{uuid.uuid4().hex[:4]}"
    listings = {}
    for label, ns in (("run namespace", henv.ns), ("release namespace", henv.sys_ns)):
        text = henv.can_i(sa_user, ns)
        base = henv.can_i(base_user, ns)
        listings[label] = text
        print(f"\n--- kubectl auth can-i --list --as={sa_user} -n {ns}\n{text}")
        rules, defaults = parse_can_i(text), parse_can_i(base)
        extra = {k: v - defaults.get(k, set()) for k, v in rules.items()}
        extra = {k: v for k, v in extra.items() if v}
        expected = {**(EXPECTED_RUN_NS if ns == henv.ns else EXPECTED_RELEASE_NS), **expected_tenancy_reader(henv.ns),
                    **EXPECTED_ADMISSION_READER}
        assert extra == expected, f"{label}: granted beyond the defaults: {extra}"
        assert not any("*" in k or "*" in v for k, v in rules.items() if not k.startswith("url:")), rules
        assert not any(k.startswith("secrets") for k in rules), rules
    for verb in ("get", "list", "watch"):
        r = henv.kubectl("auth", "can-i", verb, "secrets", f"--as={sa_user}", "--all-namespaces", check=False)
        assert r.stdout.strip() == "no", (verb, r.stdout, r.stderr)
    # nothing cluster-scoped but the re-check's three reads and the admission check's watches by name: no
    # CRD access, no listing of namespaces, two ClusterRoleBindings (the tenancy and admission readers)
    for verb, res in (("list", "customresourcedefinitions.apiextensions.k8s.io"),
                      ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
                      ("list", "namespaces"), ("list", "agentruns.agentrun.dev")):
        r = henv.kubectl("auth", "can-i", verb, res, f"--as={sa_user}", "--all-namespaces", check=False)
        assert r.stdout.strip() == "no", (verb, res, r.stdout, r.stderr)
    crbs = json.loads(henv.kubectl("get", "clusterrolebindings", "-o", "json").stdout)["items"]
    assert [b["roleRef"]["name"] for b in crbs
            if any(sj.get("name") == OPERATOR_SA and sj.get("namespace") == henv.sys_ns
                   for sj in b.get("subjects") or [])] == [f"{RELEASE}-admission-reader", f"{RELEASE}-tenancy-reader"]
    # leases in the watched namespace or another name: no
    r = henv.kubectl("auth", "can-i", "update", "leases/someone-else", f"--as={sa_user}", "-n", henv.sys_ns,
                     check=False)
    assert r.stdout.strip() == "no"

    lap_user = f"system:serviceaccount:{henv.ns}:{LAP_SA}"
    lap = henv.can_i(lap_user, henv.ns)
    base = henv.can_i(f"system:serviceaccount:{henv.ns}:nobody-{uuid.uuid4().hex[:4]}", henv.ns)
    print(f"\n--- kubectl auth can-i --list --as={lap_user} -n {henv.ns}\n{lap}")
    assert parse_can_i(lap) == parse_can_i(base), "the lap ServiceAccount has rules beyond the defaults"
    # the lap ServiceAccount exists (the chart made it) and mounts no token
    sa = henv.get("serviceaccount", LAP_SA, henv.ns)
    assert sa and sa.get("automountServiceAccountToken") is False, sa


# ---------------------------------------------------------------------------------------------- runs

def _approval_doc(henv: HelmEnv) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "approval-run.yaml").read_text())
    for tool in doc["spec"]["agent"]["tools"]:
        tool["http"]["url"] = tool["http"]["url"].replace("http://127.0.0.1:8765", henv.tool_url)
    doc["spec"]["retry"]["backoff"] = {"initial": "1s", "max": "2s", "factor": 2}
    return doc


def _series(m: dict, metric: str, /, **labels: str) -> float | None:
    return m.get((metric, frozenset(labels.items())))


def _excerpt(text: str, *needles: str) -> str:
    return "\n".join(ln for ln in text.splitlines()
                     if ln.startswith("agentrun_") and any(n in ln for n in needles))


def test_approval_run_succeeds_under_chart_rbac_with_metrics(henv, diag):
    doc = _approval_doc(henv)
    name = doc["metadata"]["name"]
    applied = time.monotonic()
    henv.kubectl("apply", "-n", henv.ns, "-f", "-", input=yaml.safe_dump(doc))
    # The operator's watch starts as soon as it is up and resyncSeconds is an hour: lap 1's Job
    # can only come from the watch. How soon is a figure (printed), not asserted.
    try:
        _wait("lap 1's Job", lambda: henv.jobs(name), timeout=240)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{henv.diagnostics()}") from None
    print(f"\n--- lap 1's Job created {time.monotonic() - applied:.1f}s after apply")
    st = henv.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded", "BudgetExceeded")
    assert st["phase"] == "AwaitingApproval", st
    owner = doc["spec"]["approval"]["owner"]
    run = {"namespace": henv.ns, "name": name}

    records = henv.lap_records(name)
    assert [r.lap for r in records] == list(range(1, st["lap"] + 1)), (st, [r.lap for r in records])
    s3_cost = sum(Decimal(r.cost_usd) for r in records)
    s3_in = sum(r.usage.input_tokens for r in records)
    assert s3_cost > 0 and Decimal(st["cost"]["usd"]) == s3_cost, (st["cost"], s3_cost)

    def scraped() -> dict | None:
        m = parse_metrics(henv.scrape())
        return m if _series(m, "agentrun_run_lap", **run) == st["lap"] else None
    m = _wait("the scrape to show the awaiting run", scraped, timeout=120)
    text = henv.scrapes[-1]
    print("\n--- scrape while awaiting approval:\n" + _excerpt(
        text, "approvals_pending", f'name="{name}"', 'agentrun_runs{'))
    assert _series(m, "agentrun_approvals_pending") == 1
    assert _series(m, "agentrun_runs", phase="AwaitingApproval") == 1
    assert _series(m, "agentrun_run_phase", **run, phase="AwaitingApproval") == 1
    assert _series(m, "agentrun_run_phase", **run, phase="Running") == 0
    requested = _series(m, "agentrun_approval_requested_timestamp_seconds", **run, owner=owner)
    assert requested is not None, "no per-run approval series with the owner label"
    from agentrun.metrics.core import parse_timestamp
    assert requested == parse_timestamp(st["approval"]["requestedAt"])
    assert _series(m, "agentrun_approval_age_seconds", **run, owner=owner) >= 0
    assert _series(m, "agentrun_run_lap", **run) == len(records) == st["lap"]
    assert Decimal(str(_series(m, "agentrun_run_cost_usd", **run))) == s3_cost
    assert _series(m, "agentrun_run_tokens", **run, direction="input") == s3_in
    assert _series(m, "agentrun_run_budget_usd", **run) == 1.0
    assert henv.secret_key not in text and henv.access_key not in text
    # the chart's livenessProbe target: Kopf's endpoint on livenessPort (controller/process.py)
    with urllib.request.urlopen(f"http://127.0.0.1:{henv.liveness_port}/healthz", timeout=5) as r:
        assert r.status == 200 and json.loads(r.read())["lease"] == "ticking"

    henv.kubectl("annotate", "agentrun", name, "-n", henv.ns, "approved=true", "agentrun.dev/reason=verified")
    st = henv.wait_phase(name, "Succeeded", "Failed", "BudgetExceeded")
    assert st["phase"] == "Succeeded", st
    assert st["approval"]["state"] == "Approved"
    records = henv.lap_records(name)
    assert [r.lap for r in records] == list(range(1, st["lap"] + 1))
    total = sum(Decimal(r.cost_usd) for r in records)
    assert Decimal(st["cost"]["usd"]) == total

    jobs = henv.jobs(name)
    keys = [(j["metadata"]["labels"]["agentrun.dev/lap"], j["metadata"]["labels"]["agentrun.dev/attempt"])
            for j in jobs]
    assert len(keys) == len(set(keys)), keys
    for path in ("/orders/lookup", "/tickets/note", "/payments/refund"):
        assert len(henv.calls(path)) == 1, (path, henv.calls(path))

    def final() -> dict | None:
        m = parse_metrics(henv.scrape())
        return m if _series(m, "agentrun_runs", phase="Succeeded") == 1 else None
    m = _wait("the scrape to show the run Succeeded", final, timeout=120)
    text = henv.scrapes[-1]
    print("--- scrape after Succeeded:\n" + _excerpt(
        text, "approvals_pending", f'name="{name}"', "agentrun_runs{", "agentrun_cost_usd_total",
        "agentrun_tokens_total", "lap_duration_seconds_count"))
    # terminal: per-run and per-approval series are gone (docs/operations.md, Cardinality)
    assert not [k for k in m if ("name", name) in k[1]], [k for k in m if ("name", name) in k[1]]
    assert _series(m, "agentrun_approvals_pending") == 0
    assert _series(m, "agentrun_runs", phase="AwaitingApproval") == 0
    # counters: this operator process saw the run from its start, so they equal S3's totals
    assert Decimal(str(round(_series(m, "agentrun_cost_usd_total"), 9))) == total, (
        _series(m, "agentrun_cost_usd_total"), total)
    assert _series(m, "agentrun_tokens_total", direction="input") == sum(r.usage.input_tokens for r in records)
    assert _series(m, "agentrun_tokens_total", direction="output") == sum(r.usage.output_tokens for r in records)
    laps = {o: _series(m, "agentrun_lap_duration_seconds_count", outcome=o) for o in
            ("continue", "done", "awaiting_approval")}
    finished = sum(v for (n, _), v in m.items() if n == "agentrun_lap_duration_seconds_count")
    assert finished == len(jobs) == len(records), (laps, len(jobs), len(records))
    assert laps["done"] == 1 and laps["awaiting_approval"] == 1, laps
    # the operator ran under its ServiceAccount token: no request it makes was refused
    logs = henv.full_operator_logs()
    assert logs.strip(), "no operator log to check"
    assert not forbidden_requests(logs), forbidden_requests(logs)
    assert henv.secret_key not in logs and henv.access_key not in logs
    assert henv.secret_key not in json.dumps(henv.get("agentrun", name, henv.ns))
    events = henv.kubectl("get", "events", "-n", henv.ns, "-o", "json").stdout
    assert henv.secret_key not in events and henv.access_key not in events


def test_helm_upgrade_with_a_lap_in_flight(henv, diag):
    name = "slow-upgrade"
    script = [
        {"content": "slow tool", "toolCalls": [{"name": "slow", "arguments": {}}],
         "usage": {"inputTokens": 100, "outputTokens": 10}},
        {"content": "done", "usage": {"inputTokens": 100, "outputTokens": 10}},
    ]
    # the tool call is held at a gate until the upgrade is done and the new pod leads: lap 1 is in
    # flight across the upgrade however long the upgrade takes (not a 15 s call it must outlast)
    gate = ToolGate(henv.tool_url)
    doc = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"task": "helm upgrade in flight",
                    "agent": {"version": "v1", "model": {"provider": "scripted", "script": script},
                              "tools": [{"name": "slow", "http": {"url": f"{gate.url}/slow", "timeout": "10m"}}]},
                    "budget": {"maxLaps": 5}, "lapTimeout": "15m",
                    "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s", "factor": 2}}}}
    old_leader = henv.lease_holder()
    try:
        henv.kubectl("apply", "-n", henv.ns, "-f", "-", input=yaml.safe_dump(doc))
        _wait("lap 1's tool call held at the gate", gate.arrived, timeout=240)

        henv.helm("upgrade", RELEASE, str(CHART), "-n", henv.sys_ns, "--reuse-values",
                  "--set", "logFormat=text", "--set", "resources.requests.cpu=150m", "--wait", "--timeout", "5m",
                  timeout=420)
        assert henv.status(name).get("phase") not in ("Succeeded", "Failed"), "the lap ended before the upgrade"
        new_leader = henv.wait_leader(exclude=old_leader)
        gate.open()
    finally:
        gate.close()
    dep = henv.get("deployment", RELEASE, henv.sys_ns)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "AGENTRUN_LOG_FORMAT", "value": "text"} in c["env"]
    assert c["resources"]["requests"]["cpu"] == "150m"

    st = henv.wait_phase(name, "Succeeded", "Failed", "BudgetExceeded")
    assert st["phase"] == "Succeeded", st
    jobs = henv.jobs(name)
    keys = sorted((j["metadata"]["labels"]["agentrun.dev/lap"], j["metadata"]["labels"]["agentrun.dev/attempt"])
                  for j in jobs)
    assert keys == [("1", "1"), ("2", "1")], keys  # one Job per lap, no retry caused by the upgrade
    assert len(henv.calls("/slow")) == 1, henv.calls("/slow")
    assert st["lap"] == 2 and st.get("totalRetries", 0) == 0, st
    records = henv.lap_records(name)
    assert [r.lap for r in records] == [1, 2]
    assert Decimal(st["cost"]["usd"]) == sum(Decimal(r.cost_usd) for r in records)
    pods = [p["metadata"]["name"] for p in henv.operator_pods() if not p["metadata"].get("deletionTimestamp")]
    assert old_leader not in pods and new_leader in pods, (old_leader, new_leader, pods)
    # the new pod got the new value: text logs, not JSON
    new_log = next(henv.cluster.pods_dir.glob(f"{henv.sys_ns}_{new_leader}_*")) / "operator.log"
    first = new_log.read_text().splitlines()[0]
    assert not first.lstrip().startswith("{"), first


def test_chart_installs_the_approval_policies_where_served(henv, diag):
    """The local control plane serves both admissionregistration.k8s.io/v1 kinds: the chart installs
    every generated policy and binding (docs/security.md), owned by the release; the operator's
    status writes above passed agentrun-status-owner with the chart's `operate` verb."""
    for f in API_MANIFESTS[1:]:
        for doc in yaml.safe_load_all((ROOT / "crds" / f).read_text()):
            if not doc:
                continue
            got = json.loads(henv.kubectl("get", doc["kind"], doc["metadata"]["name"], "-o", "json").stdout)
            assert got["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm", got["metadata"]
            # the chart names its ServiceAccount as the operator (admission.OPERATOR_USERNAMES_VAR, [] in crds/)
            for v in got["spec"].get("variables") or []:
                if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                    assert v["expression"] == json.dumps([f"system:serviceaccount:{henv.sys_ns}:{OPERATOR_SA}"])
                    v["expression"] = "[]"
            for key in ("policyName", "validations", "mutations", "variables"):  # the API server adds defaults elsewhere
                assert got["spec"].get(key) == doc["spec"].get(key), (doc["metadata"]["name"], key)
