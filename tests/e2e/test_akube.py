"""The operator's writes on the event loop (``agentrun.controller.akube.AsyncKube``) against the real
kube-apiserver: the contract of the blocking ``Kube`` (the JSON document back, an ``ApiException``
with the server's status and body, every request counted with its verb, resource and code, the
credentials made again after a 401), with a bearer token and with a client certificate signed by
the cluster's CA (TLS built from the kubernetes client's configuration)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import uuid
from pathlib import Path

import pytest
from kubernetes import config as kconfig
from kubernetes.client import Configuration
from kubernetes.client.exceptions import ApiException

from agentrun.controller.akube import AsyncKube, unsupported
from agentrun.controller.kube import Kube

pytestmark = pytest.mark.e2e


def _kube(kubeconfig: str) -> Kube:
    api = kconfig.new_client_from_config(config_file=kubeconfig)
    assert unsupported(api.configuration) is None
    return Kube(api)


def test_writes_reads_errors_and_counts_with_a_token(cluster, namespace) -> None:
    counted: list[tuple[str, str, int | str]] = []
    ak = AsyncKube(_kube(cluster.kubeconfig), 4, lambda v, r, c: counted.append((v, r, c)))
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
        finally:
            await ak.close()

    asyncio.run(go())
    assert counted == [("create", "configmaps", 201), ("patch", "configmaps", 200), ("list", "configmaps", 200),
                       ("patch", "configmaps", 422), ("create", "configmaps", 422), ("get", "configmaps", 404),
                       ("delete", "configmaps", 200)]


def test_a_401_drops_the_credentials_and_connection_errors_are_counted(cluster, tmp_path) -> None:
    kc = tmp_path / "bad.kubeconfig"
    doc = Path(cluster.kubeconfig).read_text()
    kc.write_text(doc.replace(cluster.admin_token, "not-a-token"))
    counted: list = []
    k = _kube(str(kc))
    ak = AsyncKube(k, 2, lambda v, r, c: counted.append((v, r, c)))

    async def go() -> None:
        try:
            with pytest.raises(ApiException) as e:
                await ak.request("GET", "/api/v1/namespaces")
            assert e.value.status == 401 and k._prepared is None
        finally:
            await ak.close()

    asyncio.run(go())
    assert counted == [("list", "namespaces", 401)]
    # nothing listens: the connection error propagates (the reconcile's backoff), counted as <error>
    conf = Configuration()
    conf.host, conf.verify_ssl = "https://127.0.0.1:1", False
    from kubernetes.client import ApiClient

    gone = AsyncKube(Kube(ApiClient(conf)), 1, lambda v, r, c: counted.append((v, r, c)))

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
    user = f"akube-{uuid.uuid4().hex[:6]}"
    k = _kube(_client_cert_kubeconfig(cluster, tmp_path, user))
    assert k.api_client.configuration.cert_file  # the kubernetes client wrote the cert to a file
    ak = AsyncKube(k, 2)

    async def go() -> dict:
        try:
            return await ak.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        finally:
            await ak.close()

    review = asyncio.run(go())
    info = review["status"]["userInfo"]
    assert info["username"] == user and "system:masters" in info["groups"]
