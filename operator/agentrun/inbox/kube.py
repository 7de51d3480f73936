"""The inbox's API server client: every request for a person carries ``Impersonate-User`` and
``Impersonate-Group`` so the API server authorizes (RBAC) and admits (the approval policies) it as
that person. The inbox's own identity (its ServiceAccount) is used for two things only: the
impersonation itself and TokenReview.

A thin layer over httpx (a dependency of the project already): the kubernetes client cannot send
per-request impersonation headers from many threads at once without sharing state.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrun.api.crdgen import GROUP, PLURAL, VERSION

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RUNS = f"/apis/{GROUP}/{VERSION}"


class ApiError(Exception):
    """An API server answer that is not 2xx: ``status`` and ``body`` (the Status JSON as text, like
    the kubernetes client's ApiException, so ``cli.approvals.refusal`` reads it)."""

    def __init__(self, status: int, body: str, what: str) -> None:
        self.status, self.body, self.what = status, body, what
        super().__init__(f"{what}: HTTP {status}: {self.message}")

    @property
    def message(self) -> str:
        try:
            msg = json.loads(self.body).get("message")
        except (ValueError, AttributeError):
            msg = None
        return (msg or self.body or "").strip()[:1000]


@dataclass(frozen=True)
class User:
    """A person as the API server knows them (from TokenReview or the auth proxy)."""

    name: str
    groups: tuple[str, ...] = ()

    def headers(self) -> list[tuple[str, str]]:
        return [("Impersonate-User", self.name), *(("Impersonate-Group", g) for g in self.groups)]


@dataclass
class Connection:
    """How the inbox reaches the API server as itself: host, CA, client certificate or token."""

    host: str
    verify: Any = True
    cert: tuple[str, str] | None = None
    token: str | None = None
    token_file: str | None = None
    _token_read: float = field(default=0.0, repr=False)

    def bearer(self) -> str | None:
        if self.token_file:  # a projected ServiceAccount token is rotated on disk: re-read it each minute
            now = time.monotonic()
            if self.token is None or now - self._token_read > 60:
                with open(self.token_file) as fh:
                    self.token = fh.read().strip()
                self._token_read = now
        return self.token


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """In a pod (no kubeconfig given or set): the ServiceAccount; else the kubeconfig."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(f"{SA_DIR}/token"):
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        return Connection(host=f"https://{host}:{port}", verify=f"{SA_DIR}/ca.crt", token_file=f"{SA_DIR}/token")
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=path.split(":")[0] if path else None, context=context,
                            client_configuration=cfg)
    keys = cfg.api_key or {}
    auth = keys.get("BearerToken") or keys.get("authorization") or ""  # the key name differs across client versions
    token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
    verify: Any = cfg.ssl_ca_cert or True
    if not cfg.verify_ssl:
        verify = False
    cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file and cfg.key_file else None
    return Connection(host=cfg.host.rstrip("/"), verify=verify, cert=cert, token=token)


class Kube:
    """API calls as a ``User`` (impersonated) or, for TokenReview only, as the inbox itself."""

    def __init__(self, conn: Connection, timeout: float = 15.0) -> None:
        self.conn = conn
        self._local = threading.local()
        self.timeout = timeout

    def _client(self) -> httpx.Client:
        c = getattr(self._local, "client", None)
        if c is None:
            c = httpx.Client(base_url=self.conn.host, verify=self.conn.verify, cert=self.conn.cert,
                             timeout=self.timeout)
            self._local.client = c
        return c

    def _headers(self, user: User | None, extra: dict[str, str] | None = None) -> list[tuple[str, str]]:
        h: list[tuple[str, str]] = [("Accept", "application/json")]
        token = self.conn.bearer()
        if token:
            h.append(("Authorization", f"Bearer {token}"))
        if user is not None:
            h += user.headers()
        h += list((extra or {}).items())
        return h

    def request(self, method: str, path: str, user: User | None, *, what: str, body: Any = None,
                params: dict[str, Any] | None = None, content_type: str = "application/json") -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        r = self._client().request(method, path, params=params, content=data,
                                   headers=self._headers(user, {"Content-Type": content_type} if data else None))
        if r.status_code >= 300:
            raise ApiError(r.status_code, r.text[:4000], what)
        doc: dict[str, Any] = r.json()
        return doc

    # --- as the person ----------------------------------------------------------------------

    def list_runs(self, user: User, namespace: str | None) -> dict[str, Any]:
        path = f"{RUNS}/namespaces/{namespace}/{PLURAL}" if namespace else f"{RUNS}/{PLURAL}"
        return self.request("GET", path, user, what=f"list agentruns{' in ' + namespace if namespace else ''}")

    def get_run(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", f"{RUNS}/namespaces/{namespace}/{PLURAL}/{name}", user,
                            what=f"get agentrun {namespace}/{name}")

    def patch_run(self, user: User, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", f"{RUNS}/namespaces/{namespace}/{PLURAL}/{name}", user, body=patch,
                            content_type="application/merge-patch+json", what=f"patch agentrun {namespace}/{name}")

    def list_namespaces(self, user: User) -> list[str]:
        doc = self.request("GET", "/api/v1/namespaces", user, what="list namespaces")
        return sorted(i["metadata"]["name"] for i in doc.get("items") or [])

    def can(self, user: User, verb: str, namespace: str, resource: str = PLURAL, group: str = GROUP) -> bool:
        """SelfSubjectAccessReview as the person: may they ``verb`` ``resource`` in ``namespace``?"""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"group": group, "resource": resource, "verb": verb,
                                                  "namespace": namespace}}}
        doc = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", user, body=review,
                           what="create selfsubjectaccessreview")
        return bool((doc.get("status") or {}).get("allowed"))

    def watch_runs(self, user: User, namespace: str | None, resource_version: str,
                   timeout_seconds: int = 50) -> Iterator[dict[str, Any]]:
        """The watch events (``{"type", "object"}``) of agentruns from ``resource_version``; ends
        after ``timeout_seconds`` (the server closes it) or on an error (ApiError)."""
        path = f"{RUNS}/namespaces/{namespace}/{PLURAL}" if namespace else f"{RUNS}/{PLURAL}"
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds)}
        timeout = httpx.Timeout(self.timeout, read=timeout_seconds + 15)
        with httpx.Client(base_url=self.conn.host, verify=self.conn.verify, cert=self.conn.cert,
                          timeout=timeout) as c, c.stream("GET", path, params=params,
                                                          headers=self._headers(user)) as r:
            if r.status_code >= 300:
                raise ApiError(r.status_code, r.read().decode(errors="replace")[:4000], "watch agentruns")
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    # --- as the inbox itself ----------------------------------------------------------------

    def token_review(self, token: str, audiences: list[str] | None = None) -> User | None:
        """The person a bearer token belongs to (TokenReview as the inbox), or None if the API
        server does not authenticate it. With ``audiences``, the answer's ``status.audiences`` must
        name one of them (an authenticator that ignores the requested audiences answers none:
        refused, AudienceRefused). The token is never logged nor kept here."""
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        doc = self.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", None,
                           body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
                           what="create tokenreview")
        st = doc.get("status") or {}
        if not st.get("authenticated"):
            return None
        info = st.get("user") or {}
        name = info.get("username") or ""
        if not name:
            return None
        if audiences:
            answered = [a for a in (st.get("audiences") or []) if isinstance(a, str)]
            if not set(answered) & set(audiences):
                raise AudienceRefused(audiences, answered)
        return User(name=name, groups=tuple(info.get("groups") or ()))


class AudienceRefused(Exception):
    """A TokenReview authenticated the token but its answer names none of the audiences the inbox
    requires (``--token-audience``)."""

    def __init__(self, wanted: list[str], answered: list[str]) -> None:
        self.wanted, self.answered = wanted, answered
        super().__init__(f"the API server's TokenReview answer names the audiences {answered[:8]!r}, none of "
                         f"{wanted[:8]!r} (--token-audience)")
