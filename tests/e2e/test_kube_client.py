"""The operator's API-server client (``agentrun.kube.client.Client``, aiohttp on the event loop)
against the real kube-apiserver: the JSON document back, an ``ApiException`` with the server's
status and body, every request counted with its verb, resource and code, the credentials made again
after a 401, with a bearer token and with a client certificate signed by the cluster's CA (TLS built
from the kubernetes client's configuration); the informer and the Lease elector over it."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes import config as kconfig
from kubernetes.client import Configuration
from kubernetes.client.exceptions import ApiException

from agentrun.kube.client import Client

pytestmark = pytest.mark.e2e


def _api(kubeconfig: str) -> object:
    return kconfig.new_client_from_config(config_file=kubeconfig)


def test_writes_reads_errors_and_counts_with_a_token(cluster, namespace) -> None:
    counted: list[tuple[str, str, int | str]] = []
    ak = Client(_api(cluster.kubeconfig), 4, lambda v, r, c: counted.append((v, r, c)))
    cms = f"/api/v1/namespaces/{namespace}/configmaps"

    async def go() -> None:
        try:
            made = await ak.request("POST", cms, body={"metadata": {"name": "a"}, "data": {"k": "v"}})
            assert made["metadata"]["name"] == "a" and made["data"] == {"k": "v"}
            patched = await ak.request("PATCH", f"{cms}/a", body={"data": {"k": "w"}},
                                       content_type="application/merge-patch+json")
            assert patched["data"] == {"k": "w"}
            assert int(patched["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
            listed = await ak.request("GET", cms, query={"labelSelector": None, "fieldSelector": "metadata.name=a"})
            assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
            # a json-patch test of the resourceVersion that fails: the API server's 422, as it said it
            with pytest.raises(ApiException) as e:
                await ak.request("PATCH", f"{cms}/a", body=[{"op": "test", "path": "/metadata/resourceVersion",
                                                             "value": made["metadata"]["resourceVersion"]}],
                                 content_type="application/json-patch+json")
            assert e.value.status == 422
            with pytest.raises(ApiException) as e:  # the server's reason and body, for the callers' messages
                await ak.request("POST", cms, body={"metadata": {"name": "Not_Valid"}})
            assert e.value.status == 422 and "metadata.name" in e.value.body
            assert json.loads(e.value.body)["details"]["causes"]
            with pytest.raises(ApiException) as e:
                await ak.request("GET", f"{cms}/missing")
            assert e.value.status == 404
            await ak.request("DELETE", f"{cms}/a")
            # a list answered in chunks (over 2 kB): the same documents
            for i in range(8):
                await ak.request("POST", cms, body={"metadata": {"name": f"big{i}"}, "data": {"k": "x" * 1000}})
            big = await ak.request("GET", cms, query={"labelSelector": None})
            assert sorted(i["metadata"]["name"] for i in big["items"] if i["metadata"]["name"].startswith("big")) == [
                f"big{i}" for i in range(8)]
        finally:
            await ak.close()

    asyncio.run(go())
    assert counted[:7] == [("create", "configmaps", 201), ("patch", "configmaps", 200), ("list", "configmaps", 200),
                       ("patch", "configmaps", 422), ("create", "configmaps", 422), ("get", "configmaps", 404),
                       ("delete", "configmaps", 200)]


def test_a_401_drops_the_credentials_and_connection_errors_are_counted(cluster, tmp_path) -> None:
    kc = tmp_path / "bad.kubeconfig"
    doc = Path(cluster.kubeconfig).read_text()
    kc.write_text(doc.replace(cluster.admin_token, "not-a-token"))
    counted: list = []
    ak = k = Client(_api(str(kc)), 2, lambda v, r, c: counted.append((v, r, c)))

    async def go() -> None:
        try:
            with pytest.raises(ApiException) as e:
                await ak.request("GET", "/api/v1/namespaces")
            assert e.value.status == 401 and k.fresh_base() is None
        finally:
            await ak.close()

    asyncio.run(go())
    assert counted == [("list", "namespaces", 401)]
    # nothing listens: the connection error propagates (the reconcile's backoff), counted as <error>
    conf = Configuration()
    conf.host, conf.verify_ssl = "https://127.0.0.1:1", False
    from kubernetes.client import ApiClient

    gone = Client(ApiClient(conf), 1, lambda v, r, c: counted.append((v, r, c)))

    async def refused() -> None:
        try:
            with pytest.raises(OSError):
                await gone.request("GET", "/api/v1/namespaces", timeout=5)
        finally:
            await gone.close()

    asyncio.run(refused())
    assert counted[-1] == ("list", "namespaces", "<error>")


def _client_cert_kubeconfig(cluster, tmp_path: Path, user: str) -> str:
    """A kubeconfig whose user is a client certificate (CN=user, O=system:masters) signed by the CA
    the API server trusts (--client-ca-file)."""
    pki = Path(cluster.ca_file).parent
    key, csr, crt = tmp_path / "u.key", tmp_path / "u.csr", tmp_path / "u.crt"
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "genrsa", "-out", str(key), "2048")
    run("openssl", "req", "-new", "-key", str(key), "-subj", f"/O=system:masters/CN={user}", "-out", str(csr))
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "1", "-out", str(crt))
    b64 = lambda p: base64.b64encode(Path(p).read_bytes()).decode()  # noqa: E731
    kc = tmp_path / "cert.kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "l", "cluster": {"server": cluster.server, "certificate-authority-data": b64(cluster.ca_file)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "l", "user": user}}]}))
    return str(kc)


def test_a_client_certificate_user_is_who_the_api_server_sees(cluster, tmp_path) -> None:
    user = f"kube-client-{uuid.uuid4().hex[:6]}"
    ak = Client(_api(_client_cert_kubeconfig(cluster, tmp_path, user)), 2)
    assert ak.api_client.configuration.cert_file  # the kubernetes client wrote the cert to a file

    async def go() -> dict:
        try:
            return await ak.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        finally:
            await ak.close()

    review = asyncio.run(go())
    info = review["status"]["userInfo"]
    assert info["username"] == user and "system:masters" in info["groups"]


class _Sink:
    """What an informer tells its cache, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def replace(self, kind: str, scope: str | None, items: list[dict]) -> None:
        self.told.append(("replace", *sorted(i["metadata"]["name"] for i in items)))

    def event(self, kind: str, type_: str, obj: dict) -> None:
        self.told.append((type_, obj["metadata"]["name"], (obj.get("data") or {}).get("k", "")))


def test_the_informer_on_the_loop_lists_and_watches_the_real_api_server(cluster, namespace) -> None:
    """The watch cache's transport without a thread: the list, then a watch whose events (a create,
    a patch, a delete, made while it watches) arrive in order; the list and the watch are counted;
    a watch the server ends gives what it sent and stops."""
    from agentrun.kube.informer import Informer

    counted: list[tuple[str, str, int | str]] = []
    ak = Client(_api(cluster.kubeconfig), 4, lambda v, r, c: counted.append((v, r, c)))
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    sink = _Sink()

    async def until(pred, what: str) -> None:
        for _ in range(3000):
            if pred():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{what}: the informer told {sink.told}")

    async def go() -> list:
        try:
            await ak.request("POST", cms, body={"metadata": {"name": "before", "labels": {"t": "inf"}}})
            threads = set(threading.enumerate())  # (other tests' blocked fake watches may live on)
            inf = Informer(ak, "configmaps", namespace, "t=inf", sink, asyncio.get_running_loop(),
                           resource=("/api/v1", "configmaps"))
            inf.start()
            await asyncio.wait_for(inf.synced.wait(), 30)
            assert sink.told == [("replace", "before")] and set(threading.enumerate()) <= threads
            await until(lambda: ("watch", "configmaps", 200) in counted, "the watch begins")
            await ak.request("POST", cms, body={"metadata": {"name": "a", "labels": {"t": "inf"}}, "data": {"k": "1"}})
            await ak.request("PATCH", f"{cms}/a", body={"data": {"k": "2"}}, content_type="application/merge-patch+json")
            await ak.request("DELETE", f"{cms}/a")
            await ak.request("POST", cms, body={"metadata": {"name": "unlabelled"}})  # not selected
            await until(lambda: len(sink.told) >= 4, "three events")
            inf.stop()
            await inf.stopped()
            # a watch the server ends (its timeoutSeconds): the events so far, then the end, no error
            return [ev async for ev in ak.stream(cms, {"labelSelector": "t=inf", "timeoutSeconds": 1}, (10.0, 30.0))]
        finally:
            await ak.close()

    events = asyncio.run(go())
    assert sink.told == [("replace", "before"), ("ADDED", "a", "1"), ("MODIFIED", "a", "2"), ("DELETED", "a", "2")]
    assert counted[:2] == [("create", "configmaps", 201), ("list", "configmaps", 200)]
    assert counted.count(("watch", "configmaps", 200)) == 2
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "before")]
    assert counted.count(("watch", "configmaps", 200)) == 2


def test_the_lease_elector_on_the_loop_takes_renews_and_releases_a_real_lease(cluster, namespace) -> None:
    """The Lease calls (``KubeLeaseAPI``) against the real API server: a missing
    Lease reads as None, the elector creates it, renews with one update each (no read), a stale
    resourceVersion is a conflict (None), and a release clears the holder."""
    from agentrun.kube.lease import KubeLeaseAPI, LeaseElector

    counted: list[tuple[str, str, int | str]] = []
    ak = Client(_api(cluster.kubeconfig), 2, lambda v, r, c: counted.append((v, r, c)))
    api = KubeLeaseAPI(ak)

    async def go() -> tuple[dict, dict | None, dict | None]:
        try:
            assert await api.read("agentrun-test", namespace, 5.0) is None  # 404: None
            e = LeaseElector("agentrun-test", namespace, "me", 1.5, api=api)
            task = asyncio.create_task(e.run())
            for _ in range(3000):
                if sum(1 for c in counted if c[:2] == ("update", "leases")) >= 3:
                    break
                await asyncio.sleep(0.01)
            held = await api.read("agentrun-test", namespace, 5.0)
            assert held is not None and e.is_leader
            stale = {**held, "metadata": {**held["metadata"], "resourceVersion": "1"}}
            conflict = await api.replace("agentrun-test", namespace, stale, 5.0)  # 409: None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await e.release()
            return held, conflict, await api.read("agentrun-test", namespace, 5.0)
        finally:
            await ak.close()

    held, conflict, released = asyncio.run(go())
    assert held["spec"]["holderIdentity"] == "me" and conflict is None
    assert released is not None and not released["spec"].get("holderIdentity")
    calls = [c[:2] for c in counted]
    first_update = calls.index(("update", "leases"))
    assert calls[:first_update] == [("get", "leases"), ("get", "leases"), ("create", "leases")]
    renewals = calls[first_update:first_update + 3]
    assert renewals == [("update", "leases")] * 3  # one request per renewal: no read before it
    assert ("update", "leases", 409) in counted and ("patch", "leases", 200) in counted
