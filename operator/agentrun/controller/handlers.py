"""Kopf wiring: the operator process's lifecycle around :class:`reconciler.Controller`.

Kopf runs the process (signals, startup and cleanup handlers); the controller's state lives in
Kopf's ``memo`` (``memo.controller``), not in a module global. Kopf watches nothing itself: the
AgentRuns, their Jobs and pods are watched by the controller's own cache (``cache.py``), which
feeds its work queue (``queue.py``); a reconcile observes the cache (``observe.py``), asks
``decide()`` (the only policy) and executes the decision (``execute.py``). Only the holder of the
Lease (``lease.py``) acts.

Kopf is configured to keep no state in the run (annotations, never the pruned status) and to post
no Events of its own.

The names below the wiring are re-exported for the callers and tests of the earlier single module.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from .config import OperatorConfig
from .eventloop import operator_loop
from .execute import StatusRefused, pruned_field, status_refusal
from .execute import probe_store as _probe_store
from .observe import job_state as _job_state
from .observe import pod_exit as _pod_exit
from .observe import pod_failure_message as _pod_failure_message
from .observe import spec_error_text
from .reconciler import Controller, exact_namespaces

__all__ = [
    "Controller",
    "StatusRefused",
    "_job_state",
    "_pod_exit",
    "_pod_failure_message",
    "_probe_store",
    "exact_namespaces",
    "memo_for",
    "pruned_field",
    "run",
    "spec_error_text",
    "status_refusal",
]


def memo_for(controller: Controller) -> kopf.Memo:
    """The Kopf memo that carries ``controller`` to the startup and cleanup handlers."""
    memo = kopf.Memo()
    memo.controller = controller
    return memo


def run(controller: Controller) -> None:
    """Run the operator until SIGTERM (blocking)."""
    cfg = controller.config
    with operator_loop(cfg.event_loop) as (loop, what):
        logging.getLogger("agentrun.controller").info("event loop: %s", what)
        kopf.run(
            loop=loop,
            standalone=True,  # leader election is our Lease (agentrun.controller.lease), not Kopf peering
            clusterwide=not cfg.namespaces,
            namespaces=list(cfg.namespaces),
            memo=memo_for(controller),
        )


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.agentrun.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "kopf.agentrun.dev/finalizer"
    settings.posting.enabled = False  # Events are posted by the controller, with our reasons
    # Kopf watches no resource: nothing to discover. Without this Kopf lists and watches
    # namespaces (and CRDs) cluster-wide, which a namespaced RBAC does not grant.
    settings.scanning.disabled = True
    controller = getattr(memo, "controller", None)
    if controller is None:
        controller = memo.controller = Controller(OperatorConfig.from_env())
    try:
        await controller.start()
    except ValueError as exc:  # a bad setting (the notifier's): retrying the startup cannot fix it
        raise kopf.PermanentError(str(exc)) from None


@kopf.on.cleanup()
async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = getattr(memo, "controller", None)
    if controller is not None:
        await controller.stop()
