"""The inbox's API server calls: every request for a person carries ``Impersonate-User`` and
``Impersonate-Group`` so the API server authorizes (RBAC) and admits (the approval policies) it as
that person. The inbox's own identity (its ServiceAccount) is used for two things only: the
impersonation itself and TokenReview.

The transport is ``agentrun.kube``'s: one :class:`~agentrun.kube.client.Client` (one aiohttp
session, the ``kubernetes`` client's configuration for auth) and its informer for the live updates.
The inbox's HTTP server is threaded (the standard library's, a thread per connection); its threads
call the client on one event loop that runs in a thread of its own (:class:`Kube`), as the standalone
notifier does: every request thread shares one connection pool, a watch is a task on that loop and
not a thread, and nothing in the request handlers has to be async.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.kube.client import Client, load_api_client, path
from agentrun.kube.informer import Informer

RUNS = (f"/apis/{GROUP}/{VERSION}", PLURAL)
T = TypeVar("T")


def runs_path(namespace: str | None, name: str | None = None) -> str:
    """The REST path of the agentruns in ``namespace`` (None: all), or of one."""
    return path(RUNS, namespace, name)


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


class Kube:
    """API calls as a ``User`` (impersonated) or, for TokenReview only, as the inbox itself, sent by
    ``client`` on an event loop in a thread of its own; the calling thread waits for the answer.
    A non-2xx answer raises :class:`ApiError`; no answer (connection refused, timed out) is an
    ApiError 502 too, so every caller has one error to handle."""

    def __init__(self, client: Client, timeout: float = 15.0) -> None:
        self.client, self.timeout = client, timeout
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="inbox-api")
        self._thread.start()

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None, pool_size: int = 64) -> Kube:
        """The inbox's own credentials: in a pod (no kubeconfig given) its ServiceAccount, else the
        kubeconfig (``--kubeconfig``/``--context``, else KUBECONFIG). ``pool_size``: connections to
        the API server at most, one per open watch and one per request in flight."""
        return cls(Client(load_api_client(kubeconfig, context), pool_size))

    def _wait(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def request(self, method: str, path: str, user: User | None, *, what: str, body: Any = None,
                params: dict[str, Any] | None = None, content_type: str = "application/json") -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        call = self.client.request(method, path, query=params, body=body,
                                   content_type=content_type if body is not None else None,
                                   timeout=self.timeout, headers=user.headers() if user is not None else None)
        try:
            doc = self._wait(call, self.timeout + 5)
        except ApiException as e:
            raise ApiError(e.status or 0, str(e.body or "")[:4000], what) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiError(502, json.dumps({"message": f"no answer from the API server: {type(e).__name__}"}),
                           what) from None
        return doc if isinstance(doc, dict) else {}

    def close(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._wait(self.client.close(), timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    # --- as the person ----------------------------------------------------------------------

    def list_runs(self, user: User, namespace: str | None) -> dict[str, Any]:
        return self.request("GET", runs_path(namespace), user,
                            what=f"list agentruns{' in ' + namespace if namespace else ''}")

    def get_run(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", runs_path(namespace, name), user, what=f"get agentrun {namespace}/{name}")

    def patch_run(self, user: User, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", runs_path(namespace, name), user, body=patch,
                            content_type="application/merge-patch+json", what=f"patch agentrun {namespace}/{name}")

    def list_events(self, user: User, namespace: str, name: str, uid: str | None = None) -> list[dict[str, Any]]:
        """The Events (core v1) of agentrun ``namespace/name`` (of this ``uid`` when given: not those
        of an earlier run of the same name), as the person may list them."""
        selector = f"involvedObject.kind=AgentRun,involvedObject.name={name}"
        if uid:
            selector += f",involvedObject.uid={uid}"
        doc = self.request("GET", f"/api/v1/namespaces/{namespace}/events", user,
                           params={"fieldSelector": selector, "limit": "500"},
                           what=f"list events of agentrun {namespace}/{name}")
        return [i for i in doc.get("items") or [] if isinstance(i, dict)]

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

    def watch_runs(self, user: User, namespace: str | None, sink: Any, watch_seconds: int) -> Informer:
        """Start an informer of the agentruns ``user`` sees in ``namespace`` (None: all), handing
        every change to ``sink`` on the loop (``replace``, ``event``, ``refused``: see
        :class:`~agentrun.kube.informer.Informer`); a refusal (401, 403) ends it. Stop it with
        :meth:`unwatch`."""
        informer = Informer(self.client, "agentruns", namespace, None, sink, self.loop, resource=RUNS,
                            watch_seconds=watch_seconds, headers=user.headers(), stop_refused=True)
        self.loop.call_soon_threadsafe(informer.start)
        return informer

    def unwatch(self, informer: Informer) -> None:
        """Stop ``informer`` (from any thread): its watch is closed on the loop."""
        self.loop.call_soon_threadsafe(informer.stop)

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
