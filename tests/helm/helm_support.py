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


def template(helm: str, *args: str, check: bool = True, release: str = "agentrun-operator", namespace: str = "agentrun-system"):
    """helm template; returns (CompletedProcess, list of rendered docs)."""
    proc = subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace, *args],
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else []
    return proc, docs
