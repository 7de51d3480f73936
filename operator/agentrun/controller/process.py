"""The operator process, run by Kopf: its lifecycle and its liveness probe.

Kopf does three things for agentrun: it runs the process (the event loop of ``eventloop.py``,
SIGTERM and SIGINT), it calls the startup and cleanup handlers below, which
start and stop :class:`reconciler.Controller` (kept in Kopf's ``memo``, not in a module global),
and it serves the liveness endpoint (Kopf's ``--liveness``, AGENTRUN_LIVENESS_PORT) from the probe
handlers below (``kopf.on.probe``), on the event loop itself: a loop that no longer runs fails it.

Kopf watches nothing. The AgentRuns, their Jobs and pods are watched by the controller's own cache
(``cache.py``), which feeds its work queue (``queue.py``); only the holder of the Lease
(``lease.py``) acts. So Kopf runs with its own registry (:data:`REGISTRY`: these handlers and no
resource handler), ``standalone`` (no peering: the Lease elects), without scanning namespaces or
CRDs, and with a login handler that hands it the credentials the controller loaded at start
instead of loading the kubeconfig (or running its exec plugin) a second time. Kopf then uses the
API only for its discovery of the API groups at start; it posts nothing and keeps nothing in the runs.

Readiness is answered by the metrics server's ``/readyz`` (503 until :func:`waiting_for` is empty:
Kopf's endpoint has one path, and it is the liveness probe's); the ``ready`` probe handler reports
the same verdict in Kopf's liveness response, where it never fails the probe.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from .eventloop import operator_loop
from .reconciler import Controller, exact_namespaces, namespace_matcher

__all__ = ["REGISTRY", "live", "memo_for", "run", "settings", "waiting_for"]

#: Kopf's handlers of this process (and no other: Kopf's default registry adds its own login
#: handlers, which load the kubeconfig again).
REGISTRY = kopf.OperatorRegistry()

#: The path of Kopf's liveness endpoint (the chart's livenessProbe).
LIVENESS_PATH = "/healthz"


def live(controller: Controller) -> bool:
    """The Lease loop ticks (it starts once the watch cache has synced): a replica whose elector
    stopped neither leads nor stands by, and only a restart brings it back (docs/chaos.md)."""
    cfg = controller.config
    return controller.elector is None or not controller.synced \
        or (time.monotonic() - controller.elector.last_tick) < 3 * cfg.lease_duration_seconds + 30


def waiting_for(controller: Controller) -> list[str]:
    """What this replica waits for before it is ready (empty: ready): started; the watch cache
    listed everything (else it never campaigns); the Lease loop ticks; the API server has not taken
    its list access away since (else it stepped down); and its admission policies are in place
    (else it starts no lap: policycheck.py)."""
    waits = []
    if not controller.ready:
        waits.append("start")
    if not controller.synced:
        waits.append("watch cache sync")
    if not live(controller):
        waits.append("Lease loop")
    if controller.cannot_lead() is not None:
        waits.append("list access")
    if not controller.admission_ready:
        waits.append("admission policies")
    return waits


def settings() -> kopf.OperatorSettings:
    """Kopf's settings: only what differs from its defaults."""
    s = kopf.OperatorSettings()
    # No resource handler, so nothing to discover: without this Kopf lists and watches the
    # namespaces (namespaced mode) and watches the CRDs, which the chart's RBAC does not grant.
    s.scanning.disabled = True
    return s


def memo_for(controller: Controller) -> kopf.Memo:
    """The Kopf memo that carries ``controller`` to the handlers."""
    memo = kopf.Memo()
    memo.controller = controller
    return memo


def run(controller: Controller) -> None:
    """Run the operator until SIGTERM (blocking)."""
    cfg = controller.config
    # a probe every periodSeconds: Kopf logs each probe handler's success at INFO (a failure stays: ERROR)
    logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
    with operator_loop(cfg.event_loop) as (loop, what):
        logging.getLogger("agentrun.controller").info("event loop: %s", what)
        kopf.run(
            loop=loop,
            registry=REGISTRY,
            settings=settings(),
            standalone=True,  # leader election is our Lease (agentrun.controller.lease), not Kopf peering
            clusterwide=not cfg.namespaces,
            namespaces=list(cfg.namespaces),
            liveness_endpoint=f"http://0.0.0.0:{cfg.liveness_port}{LIVENESS_PATH}" if cfg.liveness_port else None,
            memo=memo_for(controller),
        )


@kopf.on.startup(registry=REGISTRY)
async def _startup(memo: kopf.Memo, **_: Any) -> None:
    try:
        await memo.controller.start()
    except ValueError as exc:  # a bad setting (the notifier's): retrying the startup cannot fix it
        raise kopf.PermanentError(str(exc)) from None
    if memo.get("schedules") is None:  # AgentSchedules (agentrun.schedule): beside the runs, on the same Lease
        from agentrun.schedule.shell import attach

        ns = memo.controller.config.namespaces
        memo.schedules = attach(memo.controller, list(ns) if exact_namespaces(ns) else [None], namespace_matcher(ns))


@kopf.on.cleanup(registry=REGISTRY)
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("schedules") is not None:
        await memo.schedules.stop()
    await memo.controller.stop()


@kopf.on.login(registry=REGISTRY)
def _login(**_: Any) -> kopf.ConnectionInfo:
    """The credentials the controller loaded at start (the kubernetes client's default
    configuration: in-cluster token, kubeconfig, client certificate or exec plugin), for Kopf's
    discovery. Kopf runs it once the startup handlers are done, and again only if the API server
    refuses them (401)."""
    from kubernetes import client

    conf = client.Configuration.get_default_copy()
    header = conf.get_api_key_with_prefix("BearerToken") or conf.get_api_key_with_prefix("authorization")
    scheme, _space, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=conf.host,
        ca_path=conf.ssl_ca_cert,
        insecure=not conf.verify_ssl,
        username=conf.username or None,
        password=conf.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=conf.cert_file,
        private_key_path=conf.key_file,
    )


@kopf.on.probe(id="lease", registry=REGISTRY)
def _probe_lease(memo: kopf.Memo, **_: Any) -> str:
    """Liveness: fails (HTTP 500) once the Lease loop has stopped ticking (:func:`live`)."""
    controller: Controller = memo.controller
    elector = controller.elector
    if elector is None or not controller.synced:
        return "not campaigning yet"
    if not live(controller):
        raise kopf.PermanentError(f"the Lease loop has stopped: no tick for {time.monotonic() - elector.last_tick:.0f} s")
    return "ticking"


@kopf.on.probe(id="ready", registry=REGISTRY)
def _probe_ready(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Readiness, for a reader of the liveness response (never fails it: /readyz is the probe)."""
    waits = waiting_for(memo.controller)
    return {"ready": not waits, "waitingFor": waits}
