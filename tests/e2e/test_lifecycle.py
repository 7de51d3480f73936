"""History lifecycle and store safety on the real local control plane with a real S3 server:

* spec.ttlSecondsAfterFinished deletes a finished run; its checkpoints go with retention Delete
  and stay with Retain;
* ``agentrun gc`` lists the prefix of a deleted run (an orphan) with its objects and bytes, leaves
  a live run's prefix alone, and deletes only with ``--delete``;
* a run whose store ignores ``If-None-Match: *`` (the S3 shim in "ignore" mode) fails before any
  lap, with the condition naming the endpoint.

Every wait is on a condition (the run gone, a phase, an object listing), never on elapsed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster import install_api, operator_env
from e2e.s3_shim import S3Shim
from e2e_support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class Env:
    def __init__(self, cluster: Any, s3: Any, tmp: Path) -> None:
        self.cluster, self.s3, self.tmp = cluster, s3, tmp
        self.ns = f"e2e-lc-{uuid.uuid4().hex[:6]}"
        self.prefix = f"lifecycle-{self.ns}"
        self.log = tmp / "operator.log"
        self.proc: subprocess.Popen | None = None
        self.client = _client(s3)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl_run(*args, check=check, input=input)

    def create(self, name: str, **spec: Any) -> str:
        """Create a one-lap run (the scripted model answers "done"); return its uid."""
        doc = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
               "spec": {"task": f"lifecycle {name}",
                        "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "done"}]}},
                        "budget": {"maxLaps": 3}, "lapTimeout": "60s", **spec}}
        r = self.kubectl("create", "-n", self.ns, "-o", "json", "-f", "-", input=yaml.safe_dump(doc))
        return json.loads(r.stdout)["metadata"]["uid"]

    def get(self, name: str) -> dict | None:
        r = self.kubectl("get", "agentrun", name, "-n", self.ns, "-o", "json", check=False)
        if r.returncode != 0:
            assert "NotFound" in r.stderr, r.stderr
            return None
        return json.loads(r.stdout)

    def gone(self, name: str) -> bool:
        return self.get(name) is None

    def keys(self, name: str, uid: str) -> list[str]:
        prefix = f"{self.prefix}/{self.ns}/{name}/{uid}/"
        resp = self.client.list_objects_v2(Bucket=self.s3.bucket, Prefix=prefix)
        return [o["Key"][len(prefix):] for o in resp.get("Contents", [])]

    def reasons(self, name: str) -> list[str]:
        r = self.kubectl("get", "events", "-n", self.ns, "--field-selector", f"involvedObject.name={name}",
                         "-o", "json")
        return [e["reason"] for e in json.loads(r.stdout)["items"]]

    def gc(self, *flags: str) -> subprocess.CompletedProcess:
        env = {**self.cluster.env(), "AWS_ACCESS_KEY_ID": self.s3.access_key,
               "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}
        for k in ("AGENTRUN_CHECKPOINT_URI", "AGENTRUN_S3_ENDPOINT", "AGENTRUN_S3_REGION", "AGENTRUN_S3_PATH_STYLE"):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "agentrun.cli.main", "gc", "-n", self.ns,
               "--uri", f"s3://{self.s3.bucket}/{self.prefix}", "--endpoint", self.s3.endpoint_url,
               "--region", self.s3.region, "--path-style", *flags]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _client(s3: Any) -> Any:
    return _client_for(s3.endpoint_url, s3)


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    e = Env(cluster, s3, tmp_path_factory.mktemp("lifecycle"))
    install_api(cluster)  # the CRDs and the admission policies: without them the operator starts no lap
    cluster.kubectl_run("create", "namespace", e.ns)
    cluster.kubectl_run("create", "serviceaccount", "agentrun-lap", "-n", e.ns)
    cluster.kubectl_run("create", "secret", "generic", "s3-creds", "-n", e.ns,
                        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
                        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}")
    settings = {"AGENTRUN_LEASE_DURATION": "3", "AGENTRUN_RESYNC_SECONDS": "5", "AGENTRUN_JOB_TTL_SECONDS": "-1"}
    fh = open(e.log, "ab")  # noqa: SIM115 (the operator's log for its lifetime)
    e.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"],
                              env=operator_env(cluster, s3, namespace=e.ns, prefix=e.prefix, **settings),
                              stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    yield e
    if e.proc.poll() is None:
        os.killpg(e.proc.pid, signal.SIGKILL)
        e.proc.wait(10)
    fh.close()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request, env):
    offset = env.log.stat().st_size if env.log.exists() else 0
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        return
    with open(env.log, "rb") as fh:
        fh.seek(offset)
        lines = fh.read().decode(errors="replace").splitlines()
    out = [f"\n===== diagnostics of {request.node.name} (namespace {env.ns}) =====", "--- operator log ---"]
    out += lines[-200:]
    for what in (["get", "agentruns,jobs,pods", "-o", "wide"], ["get", "events", "--sort-by=.lastTimestamp"]):
        r = env.kubectl(*what, "-n", env.ns, check=False)
        out += [f"--- kubectl {' '.join(what)} ---", r.stdout + r.stderr]
    sys.__stderr__.write("\n".join(out) + "\n")


def test_ttl_with_retention_delete_takes_the_run_and_its_checkpoints(env):
    uid = env.create("ttl-delete", ttlSecondsAfterFinished=0, checkpoint={"retention": "Delete"})
    wait_for("ttl-delete deleted after it finished", lambda: env.gone("ttl-delete"), timeout=180)
    reasons = env.reasons("ttl-delete")
    assert "LapCheckpointed" in reasons and "Succeeded" in reasons and "TTLExpired" in reasons, reasons
    # the finalizer is removed only after the objects were deleted: nothing is left
    assert env.keys("ttl-delete", uid) == []


def test_ttl_with_retention_retain_keeps_the_checkpoints_and_gc_finds_them(env):
    kept_uid = env.create("ttl-retain", ttlSecondsAfterFinished=2)
    live_uid = env.create("live")  # no ttl: stays, and its prefix is never an orphan
    wait_for("live succeeded", lambda: ((env.get("live") or {}).get("status") or {}).get("phase") == "Succeeded",
             timeout=180)
    wait_for("ttl-retain deleted after its ttl", lambda: env.gone("ttl-retain"), timeout=180)
    kept = env.keys("ttl-retain", kept_uid)
    assert "laps/00000001.json" in kept, kept
    assert "laps/00000001.json" in env.keys("live", live_uid)

    # dry run (the default and --dry-run): listed with objects and bytes, nothing deleted
    for flags in ((), ("--dry-run",)):
        r = env.gc(*flags, "-o", "json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["dryRun"] is True
        (orphan,) = doc["orphans"]
        assert (orphan["namespace"], orphan["name"], orphan["uid"]) == (env.ns, "ttl-retain", kept_uid)
        assert orphan["objects"] == len(kept) and orphan["bytes"] > 0
        assert env.keys("ttl-retain", kept_uid) == kept
    text = env.gc()
    assert text.returncode == 0 and kept_uid in text.stdout and "nothing deleted (dry run)" in text.stdout
    assert live_uid not in text.stdout

    r = env.gc("--delete")
    assert r.returncode == 0, r.stderr
    assert f"deleted {len(kept)} objects" in r.stdout
    assert env.keys("ttl-retain", kept_uid) == []
    assert "laps/00000001.json" in env.keys("live", live_uid), "gc touched a live run's checkpoints"
    after = json.loads(env.gc("-o", "json").stdout)
    assert after["orphans"] == []


def test_a_store_that_ignores_if_none_match_fails_the_run_before_any_lap(env):
    with S3Shim("ignore") as shim:
        _client_for(shim.endpoint_url, env.s3).create_bucket(Bucket="unsafe")
        env.create("unsafe-store", checkpoint={"uri": "s3://unsafe/ckpt", "endpoint": shim.endpoint_url,
                                               "pathStyle": True})
        st = wait_for("unsafe-store failed",
                      lambda: (s := (env.get("unsafe-store") or {}).get("status") or {}).get("phase") == "Failed" and s,
                      timeout=120)
        failed = {c["type"]: c for c in st["conditions"]}["Failed"]
        assert failed["status"] == "True" and failed["reason"] == "StoreUnsafe", failed
        assert shim.endpoint_url in failed["message"] and "If-None-Match" in failed["message"]
        assert st.get("lap", 0) == 0 and not st.get("activeJob")
        jobs = env.kubectl("get", "jobs", "-n", env.ns, "-l", "agentrun.dev/run=unsafe-store", "-o", "json")
        assert json.loads(jobs.stdout)["items"] == []
        assert "StoreUnsafe" in env.reasons("unsafe-store")
        assert shim.state.objects == {}, "the probe object was not cleaned up"


def _client_for(endpoint: str, s3: Any) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session(aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key).client(
        "s3", endpoint_url=endpoint, region_name=s3.region, config=Config(s3={"addressing_style": "path"}))
