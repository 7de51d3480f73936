"""``agentrun operator``: run the controller (Kopf), the metrics server and the health endpoints."""

from __future__ import annotations

import logging
import os
from typing import Any

import click


@click.command("operator", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Namespace to watch (repeatable). Default: AGENTRUN_NAMESPACES, else cluster-wide.")
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics, /healthz, /readyz (0: off).")
@click.option("--log-format", type=click.Choice(["json", "text"]), default=None, help="Log format.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logs.")
def operator_command(namespaces: tuple[str, ...], metrics_port: int | None, log_format: str | None, verbose: bool) -> None:
    """Run the AgentRun operator until SIGTERM. Configuration: AGENTRUN_* environment variables
    (see agentrun.controller.config). Only the holder of the Lease acts; other replicas wait."""
    import dataclasses
    import time

    from agentrun import metrics
    from agentrun.notify.sender import check_env as check_notify_env

    from . import gcpolicy, handlers
    from .config import OperatorConfig
    from .logs import setup_logging

    try:
        cfg = OperatorConfig.from_env()
        check_notify_env()  # a bad notifier setting stops here (exit 2), not in Kopf's startup retries
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    overrides: dict[str, Any] = {}
    if namespaces:
        overrides["namespaces"] = tuple(namespaces)
    if metrics_port is not None:
        overrides["metrics_port"] = metrics_port
    if log_format:
        overrides["log_format"] = log_format
    cfg = dataclasses.replace(cfg, **overrides)
    setup_logging(cfg.log_format, logging.DEBUG if verbose else logging.INFO)
    gcpolicy.at_start()
    controller = handlers.Controller(cfg, on_synced=gcpolicy.after_sync)
    if cfg.metrics_port:
        def live() -> bool:  # the Lease loop ticks (it starts once the watch cache has synced)
            return controller.elector is None or not controller.synced \
                or (time.monotonic() - controller.elector.last_tick) < 3 * cfg.lease_duration_seconds + 30

        metrics.set_health_check("healthz", live)
        # ready: started, the watch cache listed everything (else it never campaigns), the Lease loop
        # ticks, the API server has not taken its list access away since (else it stepped down), and
        # the admission policies are in place (else it starts no lap: policycheck.py)
        metrics.set_health_check("readyz", lambda: controller.ready and controller.synced and live()
                                 and controller.cannot_lead() is None and controller.admission_ready)
        metrics.start_server(cfg.metrics_port)
    logging.getLogger("agentrun.controller").info(
        "starting agentrun operator %s (pid %d), namespaces=%s", cfg.identity, os.getpid(),
        ",".join(cfg.namespaces) or "<cluster-wide>")
    handlers.run(controller)
