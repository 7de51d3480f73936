"""The chaos suite's world: its own restartable control plane, S3 server behind a cuttable proxy,
recording tool server and operator subprocess, plus the clients the checks use.

Nothing here is shared with the pytest session fixtures: a chaos run restarts the apiserver and cuts
S3, which other tests must never see.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client, config

from e2e.chaos.proxy import CuttableProxy
from e2e.cluster import Cluster, leftover_processes, operator_env, start_restartable_cluster, start_s3
from e2e.proc_kubelet import pid_has_marker

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))
import tool_server  # noqa: E402

from agentrun.checkpoint.schema import RunRef  # noqa: E402
from agentrun.checkpoint.store import CheckpointStore, StoreConfig  # noqa: E402

GROUP, VERSION, PLURAL = "agentrun.dev", "v1alpha1", "agentruns"
PREFIX = "chaos"
REQ_TIMEOUT = 15


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class World:
    def __init__(self, tmp: str | os.PathLike) -> None:
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cluster: Cluster | None = None
        self.s3 = None
        self.proxy: CuttableProxy | None = None
        self.tools = None
        self.operator: subprocess.Popen | None = None
        self.operator_log: Path | None = None
        self.operator_ns = ""
        self.operator_n = 0
        self.killed_operators: set[int] = set()

    # ------------------------------------------------------------------ start / stop
    def start(self) -> None:
        t0 = time.time()
        self.cluster = start_restartable_cluster(self.tmp / "kube")
        say(f"control plane up in {time.time() - t0:.1f}s ({self.cluster.server})")
        self.s3 = start_s3(self.tmp / "s3")
        self.proxy = CuttableProxy(int(self.s3.endpoint_url.rsplit(":", 1)[1]))
        say(f"S3 {self.s3.endpoint_url}, reached by the operator and laps through {self.proxy.url}")
        self.record = self.tmp / "tool-calls.jsonl"
        self.tools = tool_server.serve(0, str(self.record))
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        api = config.new_client_from_config(config_file=self.cluster.kubeconfig)
        api.configuration.retries = False
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.s3c = boto3.client("s3", endpoint_url=self.s3.endpoint_url, region_name=self.s3.region,
                                aws_access_key_id=self.s3.access_key, aws_secret_access_key=self.s3.secret_key)
        self.store = CheckpointStore(StoreConfig(uri=f"s3://{self.s3.bucket}/{PREFIX}", endpoint_url=self.s3.endpoint_url,
                                                 region=self.s3.region, path_style=True), client=self.s3c)
        self.kubectl("apply", "-f", str(ROOT / "crds" / "agentrun.dev_agentruns.yaml"))
        self.kubectl("wait", "--for=condition=Established", "crd/agentruns.agentrun.dev", "--timeout=60s")

    def stop(self) -> list[str]:
        """Stop everything; return problems (processes left behind)."""
        problems: list[str] = []
        self.kill_operator()
        if self.tools is not None:
            self.tools.shutdown()
        if self.proxy is not None:
            self.proxy.close()
        if self.s3 is not None:
            self.s3.stop()
        if self.cluster is not None:
            try:
                self.cluster.stop()
            except Exception as e:  # noqa: BLE001
                problems.append(f"cluster stop: {e}")
        for d in ("kube", "s3"):
            left = leftover_processes(self.tmp / d)
            if left:
                problems.append(f"processes left behind in {self.tmp / d}: {left}")
        return problems

    # ------------------------------------------------------------------ kubectl / namespaces
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        assert self.cluster is not None
        return self.cluster.kubectl_run(*args, check=check, input=input, timeout=120)

    def new_namespace(self, name: str) -> str:
        ns = name
        self.kubectl("create", "namespace", ns)
        self.kubectl("create", "serviceaccount", "agentrun-lap", "-n", ns)
        self.kubectl("create", "secret", "generic", "s3-creds", "-n", ns,
                     f"--from-literal=AWS_ACCESS_KEY_ID={self.s3.access_key}",
                     f"--from-literal=AWS_SECRET_ACCESS_KEY={self.s3.secret_key}")
        end = time.time() + 60
        while self.kubectl("get", "sa", "default", "-n", ns, check=False).returncode != 0:
            if time.time() > end:
                raise RuntimeError(f"default ServiceAccount never appeared in {ns}")
            time.sleep(0.3)
        return ns

    # ------------------------------------------------------------------ operator
    def operator_env(self, ns: str, identity: str) -> dict[str, str]:
        assert self.cluster is not None
        return operator_env(
            self.cluster, self.s3, namespace=ns, prefix=PREFIX, endpoint=self.proxy.url,
            AGENTRUN_LEASE_DURATION="3", AGENTRUN_RESYNC_SECONDS="5", AGENTRUN_STORE_RETRY_SECONDS="3",
            AGENTRUN_JOB_TTL_SECONDS="20", AGENTRUN_IDENTITY=identity,
        )

    def start_operator(self, ns: str) -> None:
        self.kill_operator()  # never two: the one we track is the only one
        self.operator_n += 1
        self.operator_ns = ns
        identity = f"chaos-op-{self.operator_n}"
        self.operator_log = self.tmp / f"operator-{ns}.log"
        with open(self.operator_log, "ab") as fh:
            fh.write(f"===== chaos: starting operator {identity} at {time.strftime('%H:%M:%S')}\n".encode())
            fh.flush()
            self.operator = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"],
                                             env=self.operator_env(ns, identity), stdout=fh,
                                             stderr=subprocess.STDOUT, start_new_session=True)

    def kill_operator(self) -> None:
        p = self.operator
        if p is not None and p.poll() is None:
            self.killed_operators.add(p.pid)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def operator_exited_by_itself(self) -> int | None:
        p = self.operator
        if p is not None and p.poll() is not None and p.pid not in self.killed_operators:
            return p.returncode
        return None

    # ------------------------------------------------------------------ reads
    def list_runs(self, ns: str) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                         _request_timeout=REQ_TIMEOUT)["items"]

    def list_jobs(self, ns: str) -> list[Any]:
        return self.batch.list_namespaced_job(ns, _request_timeout=REQ_TIMEOUT).items

    def list_pods(self, ns: str) -> list[Any]:
        return self.core.list_namespaced_pod(ns, _request_timeout=REQ_TIMEOUT).items

    def executed_calls(self) -> list[dict]:
        with tool_server._lock:
            return list(tool_server._calls)

    def run_ref(self, run: dict) -> RunRef:
        md = run["metadata"]
        return RunRef(namespace=md["namespace"], name=md["name"], uid=md["uid"])

    def pod_pid(self, ns: str, pod: Any) -> int | None:
        assert self.cluster is not None
        f = self.cluster.pods_dir / f"{ns}_{pod.metadata.name}_{pod.metadata.uid}" / "lap.pid"
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_has_marker(pid, pod.metadata.uid) else None

    def live_lap_processes(self, ns: str) -> list[int]:
        """Processes of this namespace's lap pods that are still alive."""
        assert self.cluster is not None
        out = []
        for d in self.cluster.pods_dir.glob(f"{ns}_*"):
            uid = d.name.rsplit("_", 1)[-1]
            for f in d.glob("*.pid"):
                try:
                    pid = int(f.read_text().strip())
                except (OSError, ValueError):
                    continue
                if pid_has_marker(pid, uid):
                    out.append(pid)
        return out
