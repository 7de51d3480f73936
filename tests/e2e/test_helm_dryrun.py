"""The chart's rendered manifests, for every ci/*-values.yaml scenario, are accepted by the real
kube-apiserver of the local control plane (`kubectl apply --dry-run=server`): schema, RBAC
objects, CRD, Deployment, Service and, with monitoring on, ServiceMonitor/PrometheusRule.

The prometheus-operator is not installed there, so minimal CRD stubs of
monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule (schema: preserve unknown fields)
are created first; the dry-run then checks those objects' apiVersion/kind/metadata only."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "helm"))
from helm_support import ADMISSION_APIS, CHART, MONITORING_APIS, ROOT  # noqa: E402

pytestmark = pytest.mark.e2e

STUB = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: {kind}, plural: {plural}, singular: {singular}, listKind: {kind}List}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture(scope="module")
def helm() -> str:
    out = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def prepared(cluster):
    stubs = STUB.format(kind="ServiceMonitor", plural="servicemonitors", singular="servicemonitor") + "---\n" + \
        STUB.format(kind="PrometheusRule", plural="prometheusrules", singular="prometheusrule")
    cluster.kubectl_run("apply", "-f", "-", input=stubs)
    # the chart renders the admission policies (the cluster serves both kinds) and the AgentRunPolicy "default"
    cluster.kubectl_run("apply", "-f", str(ROOT / "crds" / "agentrun.dev_agentrunpolicies.yaml"))
    for ns in ("agentrun-system", "team-a", "team-b"):
        cluster.kubectl_run("create", "namespace", ns, check=False)
    cluster.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
                        "crd/agentrunpolicies.agentrun.dev")
    return cluster


@pytest.mark.parametrize("values", sorted((CHART / "ci").glob("*-values.yaml")), ids=lambda p: p.name)
def test_rendered_chart_passes_server_side_dry_run(helm, prepared, values):
    rendered = subprocess.run(
        [helm, "template", "agentrun-operator", str(CHART), "--namespace", "agentrun-system",
         "-f", str(values), *MONITORING_APIS, *ADMISSION_APIS],
        check=True, capture_output=True, text=True).stdout
    proc = prepared.kubectl_run("apply", "--dry-run=server", "-f", "-", input=rendered, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "deployment.apps/agentrun-operator created (server dry run)" in proc.stdout
    if "monitoring" in values.name:
        assert "servicemonitor.monitoring.coreos.com/agentrun-operator created (server dry run)" in proc.stdout
        assert "prometheusrule.monitoring.coreos.com/agentrun-operator created (server dry run)" in proc.stdout


def test_chart_crd_passes_server_side_dry_run(prepared):
    """The CRD Helm installs from the chart's crds/ (a copy of the generated crds/)."""
    proc = prepared.kubectl_run("apply", "--dry-run=server", "-f", str(CHART / "crds"), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_server_refuses_a_broken_manifest(helm, prepared):
    """The dry-run can fail: a Deployment with a bad replica count is refused by the server."""
    rendered = subprocess.run(
        [helm, "template", "agentrun-operator", str(CHART), "--namespace", "agentrun-system",
         *ADMISSION_APIS, "--show-only", "templates/deployment.yaml"], check=True, capture_output=True, text=True).stdout
    broken = rendered.replace("replicas: 1", "replicas: -3")
    proc = prepared.kubectl_run("apply", "--dry-run=server", "-f", "-", input=broken, check=False)
    assert proc.returncode != 0 and "replicas" in proc.stderr
