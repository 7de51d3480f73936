"""Invalid Helm values refused by values.schema.json (the bad-input table, docs/bad-input.md):
``helm template`` and ``helm lint`` both fail, naming the value's path; valid values at the edges
of the same rules render (negative control, so the table cannot pass vacuously)."""

from __future__ import annotations

import subprocess

import pytest
from helm_support import CHART, template

# (case, helm flags, text the error must contain: the value's path, and what is wrong)
REFUSED = [
    ("replicas-not-an-integer", ["--set-string", "replicas=two"], ["/replicas", "got string, want integer"]),
    ("negative-lap-job-ttl", ["--set", "lap.jobTTLSeconds=-5"], ["/lap/jobTTLSeconds", "minimum"]),
    ("pull-policy-wrong-case", ["--set", "image.pullPolicy=always"], ["/image/pullPolicy", "value must be one of"]),
    ("service-type-unknown", ["--set", "metrics.service.type=Ingress"], ["/metrics/service/type", "value must be one of"]),
    ("metrics-port-zero", ["--set", "metrics.port=0"], ["/metrics/port", "minimum"]),
    ("pod-config-grace-negative", ["--set", "podConfigGraceSeconds=-1"], ["/podConfigGraceSeconds"]),
    ("watch-timeout-over-30-min", ["--set", "watchTimeoutSeconds=3600"], ["/watchTimeoutSeconds", "maximum"]),
    ("s3-settings-missing", ["--set", "checkpoint.s3=null"], ["/checkpoint", "missing property 's3'"]),
    ("s3-endpoint-not-http", ["--set", "checkpoint.s3.endpoint=ftp://minio:9000"], ["/checkpoint/s3/endpoint"]),
    ("s3-endpoint-without-host", ["--set", "checkpoint.s3.endpoint=http://"], ["/checkpoint/s3/endpoint"]),
    ("s3-region-with-spaces", ["--set", "checkpoint.s3.region=us east 1"], ["/checkpoint/s3/region"]),
    ("s3-path-style-not-a-boolean", ["--set-string", "checkpoint.s3.pathStyle=yes"],
     ["/checkpoint/s3/pathStyle", "want boolean"]),
    ("s3-secret-name-not-dns", ["--set", "checkpoint.s3.credentialsSecretName=S3_Creds"],
     ["/checkpoint/s3/credentialsSecretName"]),
    ("lap-cpu-not-a-quantity", ["--set", "lap.resources.requests.cpu=lots"], ["/lap/resources/requests/cpu"]),
    ("operator-memory-in-gb", ["--set", "resources.limits.memory=1GB"], ["/resources/limits/memory"]),
    ("image-tag-with-a-space", ["--set", "image.tag=v1 beta"], ["/image/tag"]),
    ("lease-name-not-dns", ["--set", "leaderElection.leaseName=Agent_Lease"], ["/leaderElection/leaseName"]),
    ("lease-duration-zero", ["--set", "leaderElection.leaseDurationSeconds=0"], ["/leaderElection/leaseDurationSeconds"]),
    ("scrape-interval-in-words", ["--set", "serviceMonitor.interval=30 seconds"], ["/serviceMonitor/interval"]),
    ("extra-env-without-a-name", ["--set", "extraEnv[0].value=x"], ["/extraEnv/0", "missing property 'name'"]),
    ("extra-env-unknown-field", ["--set", "extraEnv[0].name=A", "--set", "extraEnv[0].secret=x"],
     ["/extraEnv/0", "'secret' not allowed"]),
    ("unknown-top-level-key", ["--set", "replicaCont=2"], ["additional properties 'replicaCont' not allowed"]),
    ("unknown-nested-key", ["--set", "checkpoint.bucket=agentrun"], ["/checkpoint", "'bucket' not allowed"]),
]


@pytest.mark.parametrize("flags,expect", [(f, e) for _, f, e in REFUSED], ids=[c for c, _, _ in REFUSED])
def test_invalid_values_are_refused_naming_the_path(helm, flags, expect):
    proc, _ = template(helm, *flags, check=False)
    assert proc.returncode != 0, f"helm template accepted {flags}"
    for text in expect:
        assert text in proc.stderr, proc.stderr
    lint = subprocess.run([helm, "lint", str(CHART), *flags], capture_output=True, text=True)
    assert lint.returncode != 0 and expect[0] in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_valid_values_at_the_edges_render(helm):
    flags = ["--set", "checkpoint.s3.endpoint=http://minio.storage:9000", "--set", "checkpoint.s3.region=eu-west-1",
             "--set", "checkpoint.s3.credentialsSecretName=s3.creds", "--set", "lap.resources.requests.cpu=0.5",
             "--set", "resources.limits.memory=1.5Gi", "--set", "image.tag=v1.2.3-rc.1", "--set", "lap.jobTTLSeconds=-1",
             "--set", "extraEnv[0].name=HTTPS_PROXY", "--set", "extraEnv[0].value=http://proxy:3128",
             "--set", "leaderElection.leaseName=agentrun.lease", "--set", "replicas=2",
             "--set", "watchTimeoutSeconds=1800"]
    proc, docs = template(helm, *flags, check=False)
    assert proc.returncode == 0, proc.stderr
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_S3_ENDPOINT"] == "http://minio.storage:9000" and env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["AGENTRUN_POD_CONFIG_GRACE_SECONDS"] == "30" and env["AGENTRUN_WATCH_TIMEOUT_SECONDS"] == "1800"
