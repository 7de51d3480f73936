"""Helpers of the chart tests (imported by the test modules; fixtures are in conftest.py)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"
MONITORING_APIS = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
                   "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
#: The admission kinds a current cluster (>= 1.36) serves. Plain `helm template` knows no kind, and
#: the chart then refuses to guess whether the admission policies can be installed
#: (admissionPolicies.validating/mutating: auto): ``template`` passes these unless told otherwise.
ADMISSION_APIS = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                  "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
#: What Helm knows of a real cluster that serves neither admission kind: kinds (from discovery).
CLUSTER_WITHOUT_ADMISSION = ["--api-versions", "v1/Namespace", "--api-versions", "apps/v1/Deployment"]


@pytest.fixture(scope="session")
def helm() -> str:
    out = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        out = subprocess.run([str(ROOT / "tools" / "install-promtool.sh")], check=True, capture_output=True, text=True)
        path = out.stdout.strip().splitlines()[-1]
    return path


def template(helm: str, *args: str, check: bool = True, release: str = "agentrun-operator", namespace: str = "agentrun-system",
             admission_apis: bool = True):
    """helm template; returns (CompletedProcess, list of rendered docs). ``admission_apis``: as for a
    cluster that serves both admission kinds (:data:`ADMISSION_APIS`); False: only ``args``."""
    apis = ADMISSION_APIS if admission_apis else []
    proc = subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace, *apis, *args],
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else []
    return proc, docs
