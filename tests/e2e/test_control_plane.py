"""The local control plane itself: real etcd, kube-apiserver, kube-controller-manager and the
process kubelet (e2e/). No mocks: every assertion goes through the API server or the host's
process table."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from e2e.cluster import Cluster, sa_kubeconfig
from e2e_support import wait_for as _wait_for

pytestmark = pytest.mark.e2e


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 90, interval: float = 0.3) -> Any:
    return _wait_for(what, fn, timeout, interval)


def apply(cluster: Cluster, obj: dict, ns: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", ns] if ns else [])
    cluster.kubectl_run(*args, input=yaml.safe_dump(obj))


def get(cluster: Cluster, kind: str, name: str, ns: str | None = None) -> dict | None:
    args = ["get", kind, name, "-o", "json"] + (["-n", ns] if ns else [])
    r = cluster.kubectl_run(*args, check=False)
    if r.returncode != 0:
        if "NotFound" in r.stderr or "not found" in r.stderr:
            return None
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def pods_of_job(cluster: Cluster, ns: str, job: str) -> list[dict]:
    r = cluster.kubectl_run("get", "pods", "-n", ns, "-l", f"job-name={job}", "-o", "json")
    return json.loads(r.stdout)["items"]


def job_condition(job: dict | None, typ: str) -> dict | None:
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == typ and c["status"] == "True":
            return c
    return None


def job(name: str, command: list[str], backoff_limit: int = 0, **pod_spec: Any) -> dict:
    spec = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "ignored", "command": command}]}
    spec.update(pod_spec)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": backoff_limit, "template": {"spec": spec}}}


def pod(name: str, command: list[str], **spec: Any) -> dict:
    s = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
         "containers": [{"name": "main", "image": "ignored", "command": command}]}
    s.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s}


def pod_dir(cluster: Cluster, p: dict) -> str:
    md = p["metadata"]
    return str(cluster.pods_dir / f"{md['namespace']}_{md['name']}_{md['uid']}")


def container_pid(p: dict) -> int:
    cid = p["status"]["containerStatuses"][0]["containerID"]
    assert cid.startswith("proc://"), cid
    return int(cid.removeprefix("proc://"))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------


def test_version_and_node(cluster: Cluster) -> None:
    out = cluster.kubectl_run("version", "-o", "json").stdout
    v = json.loads(out)
    assert v["serverVersion"]["gitVersion"] == "v1.36.3"
    assert v["clientVersion"]["gitVersion"] == "v1.36.3"
    node = get(cluster, "node", "agentrun-local")
    assert node is not None
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert not node["spec"].get("taints")


def test_job_runs_to_complete(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job("hello", ["sh", "-c", "echo hi"]), namespace)
    j = wait_for("job Complete", lambda: job_condition(get(cluster, "job", "hello", namespace), "Complete") and
                 get(cluster, "job", "hello", namespace))
    assert j["status"]["succeeded"] == 1
    out = cluster.kubectl_run("get", "job", "hello", "-n", namespace).stdout
    assert "Complete" in out and "1/1" in out, out
    pods = pods_of_job(cluster, namespace, "hello")
    assert len(pods) == 1
    p = pods[0]
    assert p["status"]["phase"] == "Succeeded"
    assert p["spec"]["nodeName"] == "agentrun-local"
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    # the Job controller removed its tracking finalizer from the finished pod
    wait_for("tracking finalizer removed", lambda: not (get(cluster, "pod", p["metadata"]["name"], namespace)
                                                           or {}).get("metadata", {}).get("finalizers"))
    with open(os.path.join(pod_dir(cluster, p), "main.log")) as f:
        assert f.read() == "hi\n"
    # kubectl logs goes apiserver -> the process kubelet's logs endpoint
    assert cluster.kubectl_run("logs", "-n", namespace, "job/hello").stdout == "hi\n"
    logs = cluster.kubectl_run("get", "pod", p["metadata"]["name"], "-n", namespace,
                               "-o", "jsonpath={.status.podIP}").stdout
    assert logs == "127.0.0.1"


def test_failing_job_is_retried_to_backoff_limit(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job("fails", ["sh", "-c", "echo about to fail; exit 3"], backoff_limit=2), namespace)
    j = wait_for("job Failed", lambda: job_condition(get(cluster, "job", "fails", namespace), "Failed") and
                 get(cluster, "job", "fails", namespace), timeout=150)
    assert job_condition(j, "Failed")["reason"] == "BackoffLimitExceeded"
    assert j["status"]["failed"] == 3
    pods = pods_of_job(cluster, namespace, "fails")
    assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
    for p in pods:
        assert p["status"]["phase"] == "Failed"
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 3 and term["reason"] == "Error"


def test_fallback_to_logs_on_error_sets_termination_message(cluster: Cluster, namespace: str) -> None:
    p = pod("tmsg", ["sh", "-c", "echo first; echo the-last-words >&2; exit 7"])
    p["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    apply(cluster, p, namespace)
    got = wait_for("pod Failed", lambda: (x := get(cluster, "pod", "tmsg", namespace)) and
                   x["status"].get("phase") == "Failed" and x)
    term = got["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 7
    assert term["message"].rstrip().endswith("the-last-words")


def test_garbage_collector_deletes_dependents(cluster: Cluster, namespace: str) -> None:
    apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}, "data": {"a": "1"}},
          namespace)
    owner = get(cluster, "configmap", "owner", namespace)
    apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "dependent",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                             "uid": owner["metadata"]["uid"]}]}, "data": {"b": "2"}}, namespace)
    assert get(cluster, "configmap", "dependent", namespace) is not None
    cluster.kubectl_run("delete", "configmap", "owner", "-n", namespace)
    wait_for("dependent ConfigMap garbage-collected",
             lambda: get(cluster, "configmap", "dependent", namespace) is None, timeout=180)


def test_deleting_a_job_garbage_collects_its_running_pod_and_kills_it(cluster: Cluster, namespace: str) -> None:
    apply(cluster, job("sleeper", ["sleep", "300"], terminationGracePeriodSeconds=5), namespace)
    p = wait_for("pod Running", lambda: [x for x in pods_of_job(cluster, namespace, "sleeper")
                                         if x["status"].get("phase") == "Running"])[0]
    pid = container_pid(p)
    assert pid_alive(pid)
    cluster.kubectl_run("delete", "job", "sleeper", "-n", namespace, "--cascade=background")
    wait_for("job pods garbage-collected", lambda: not pods_of_job(cluster, namespace, "sleeper"), timeout=180)
    wait_for(f"pid {pid} gone", lambda: not pid_alive(pid), timeout=120)


def test_deleting_a_running_pod_kills_its_process_group(cluster: Cluster, namespace: str) -> None:
    # sh with two background children: the whole process group must die
    apply(cluster, pod("victim", ["sh", "-c", "sleep 301 & sleep 302 & echo started; wait"]), namespace)
    p = wait_for("pod Running", lambda: (x := get(cluster, "pod", "victim", namespace)) and
                 x["status"].get("phase") == "Running" and x)
    pid = container_pid(p)
    wait_for("children started", lambda: "started" in open(os.path.join(pod_dir(cluster, p), "main.log")).read())
    group = [int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pid]
    assert len(group) >= 3, group  # sh + 2 sleeps
    cluster.kubectl_run("delete", "pod", "victim", "-n", namespace, "--wait=false")
    wait_for("pod object gone", lambda: get(cluster, "pod", "victim", namespace) is None, timeout=180)
    wait_for("whole process group gone", lambda: not [q for q in group if pid_alive(q)], timeout=120)


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def test_active_deadline_seconds_kills_and_fails_the_pod(cluster: Cluster, namespace: str) -> None:
    apply(cluster, pod("slowpoke", ["sleep", "300"], activeDeadlineSeconds=2), namespace)
    got = wait_for("pod DeadlineExceeded", lambda: (x := get(cluster, "pod", "slowpoke", namespace)) and
                   x["status"].get("reason") == "DeadlineExceeded" and x, timeout=180)
    assert got["status"]["phase"] == "Failed"
    assert not pid_alive(container_pid(got))


def test_env_resolution_reaches_the_process(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl_run("create", "secret", "generic", "creds", "-n", namespace, "--from-literal=token=s3kr3t")
    cluster.kubectl_run("create", "configmap", "settings", "-n", namespace, "--from-literal=mode=fast",
                        "--from-literal=level=9")
    p = pod("envy", ["sh", "-c", 'echo "ARG=$1"; env | grep -E "^(V_|CM_)" | sort', "--", "$(V_PLAIN)+$$(NOPE)"])
    p["spec"]["containers"][0]["env"] = [
        {"name": "V_PLAIN", "value": "plain"},
        {"name": "V_EXPANDED", "value": "$(V_PLAIN)-x-$(UNDEFINED)"},
        {"name": "V_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "V_CM", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "V_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "V_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "V_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "V_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    p["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "settings"}, "prefix": "CM_"}]
    apply(cluster, p, namespace)
    got = wait_for("pod Succeeded", lambda: (x := get(cluster, "pod", "envy", namespace)) and
                   x["status"].get("phase") == "Succeeded" and x)
    out = open(os.path.join(pod_dir(cluster, got), "main.log")).read().splitlines()
    assert out[0] == "ARG=plain+$(NOPE)"
    env = dict(line.split("=", 1) for line in out[1:])
    assert env == {
        "V_PLAIN": "plain",
        "V_EXPANDED": "plain-x-$(UNDEFINED)",
        "V_SECRET": "s3kr3t",
        "V_CM": "fast",
        "V_NAME": "envy",
        "V_NS": namespace,
        "V_UID": got["metadata"]["uid"],
        "V_NODE": "agentrun-local",
        "CM_mode": "fast",
        "CM_level": "9",
    }


def test_pod_gets_a_service_account_kubeconfig(cluster: Cluster, namespace: str) -> None:
    apply(cluster, pod("whoami", ["kubectl", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]),
          namespace)
    got = wait_for("pod done", lambda: (x := get(cluster, "pod", "whoami", namespace)) and
                   x["status"].get("phase") in ("Succeeded", "Failed") and x)
    log = open(os.path.join(pod_dir(cluster, got), "main.log")).read()
    assert got["status"]["phase"] == "Succeeded", log
    assert log == f"system:serviceaccount:{namespace}:default"


def test_crd_cel_validation_refuses_invalid_object(cluster: Cluster) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.e2e.agentrun.dev"},
        "spec": {
            "group": "e2e.agentrun.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "properties": {"replicas": {"type": "integer"}, "maxReplicas": {"type": "integer"}},
                    "x-kubernetes-validations": [{"rule": "self.replicas <= self.maxReplicas",
                                                  "message": "replicas must not exceed maxReplicas"}],
                }},
            }}}],
        },
    }
    apply(cluster, crd)
    cluster.kubectl_run("wait", "--for=condition=Established", "crd/widgets.e2e.agentrun.dev", "--timeout=60s")

    def widget(name: str, r: int, m: int) -> str:
        return yaml.safe_dump({"apiVersion": "e2e.agentrun.dev/v1", "kind": "Widget",
                               "metadata": {"name": name, "namespace": "default"},
                               "spec": {"replicas": r, "maxReplicas": m}})

    # discovery of a brand-new CRD can lag a moment behind Established
    wait_for("widget accepted", lambda: cluster.kubectl_run("apply", "-f", "-", input=widget("ok", 1, 2),
                                                            check=False).returncode == 0, timeout=120)
    bad = cluster.kubectl_run("apply", "-f", "-", input=widget("bad", 5, 2), check=False)
    assert bad.returncode != 0
    assert "replicas must not exceed maxReplicas" in bad.stderr, bad.stderr
    assert "Invalid" in bad.stderr, bad.stderr
    assert get(cluster, "widgets.e2e.agentrun.dev", "bad", "default") is None
    cluster.kubectl_run("delete", "crd", "widgets.e2e.agentrun.dev", "--wait=false")


def test_service_account_kubeconfig_rbac(cluster: Cluster, namespace: str, tmp_path) -> None:
    cluster.kubectl_run("create", "serviceaccount", "reader", "-n", namespace)
    cluster.kubectl_run("create", "role", "cm-reader", "-n", namespace, "--verb=get,list,watch",
                        "--resource=configmaps")
    cluster.kubectl_run("create", "rolebinding", "reader-cm", "-n", namespace, "--role=cm-reader",
                        f"--serviceaccount={namespace}:reader")
    cluster.kubectl_run("create", "configmap", "visible", "-n", namespace, "--from-literal=k=v")
    kc = sa_kubeconfig(cluster, namespace, "reader", tmp_path / "reader.kubeconfig")

    ok = cluster.kubectl_run("get", "configmap", "visible", "-n", namespace, "-o", "name", kubeconfig=kc)
    assert ok.stdout.strip() == "configmap/visible"
    who = cluster.kubectl_run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=kc)
    assert who.stdout == f"system:serviceaccount:{namespace}:reader"

    denied = cluster.kubectl_run("get", "secrets", "-n", namespace, kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = cluster.kubectl_run("create", "configmap", "nope", "-n", namespace, "--from-literal=a=b",
                                 kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = cluster.kubectl_run("get", "configmaps", "-n", "default", kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr


def test_kubelet_crash_and_restart(cluster: Cluster, namespace: str) -> None:
    """A SIGKILLed process kubelet leaves its pod processes behind; the next one kills them and
    marks their pods Failed (KubeletRestarted), then runs new pods as usual."""
    import signal

    apply(cluster, pod("survivor", ["sleep", "300"]), namespace)
    p = wait_for("pod Running", lambda: (x := get(cluster, "pod", "survivor", namespace)) and
                 x["status"].get("phase") == "Running" and x)
    pid = container_pid(p)
    cluster.stop_kubelet(signal.SIGKILL)
    assert pid_alive(pid), "the pod process should outlive a crashed kubelet"
    cluster.start_kubelet()
    got = wait_for("pod marked KubeletRestarted", lambda: (x := get(cluster, "pod", "survivor", namespace)) and
                   x["status"].get("reason") == "KubeletRestarted" and x)
    assert got["status"]["phase"] == "Failed"
    assert not pid_alive(pid)
    apply(cluster, pod("after", ["true"]), namespace)
    wait_for("new pod Succeeded", lambda: (x := get(cluster, "pod", "after", namespace)) and
             x["status"].get("phase") == "Succeeded")


def test_restart_policy_on_failure_restarts_in_place(cluster: Cluster, namespace: str) -> None:
    # the working dir is the pod's dir, so a marker file survives the in-place restart
    script = "if [ -f marker ]; then echo second-try-ok; else touch marker; echo first-try-fails; exit 1; fi"
    apply(cluster, job("flaky", ["sh", "-c", script], backoff_limit=3, restartPolicy="OnFailure"), namespace)
    wait_for("job Complete", lambda: job_condition(get(cluster, "job", "flaky", namespace), "Complete"), timeout=180)
    pods = pods_of_job(cluster, namespace, "flaky")
    assert len(pods) == 1
    cs = pods[0]["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1
    assert cs["state"]["terminated"]["exitCode"] == 0
    log = open(os.path.join(pod_dir(cluster, pods[0]), "main.log")).read()
    assert log == "first-try-fails\nsecond-try-ok\n"
