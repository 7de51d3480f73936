"""``agentrun operator``: the click command that configures the operator process and runs it
(``process.py``: Kopf, the controller, the liveness endpoint), with the metrics server (``/metrics``,
``/readyz``) beside it."""

from __future__ import annotations

import logging
import os
from typing import Any

import click


@click.command("operator", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Namespace to watch (repeatable). Default: AGENTRUN_NAMESPACES, else cluster-wide.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="Port of /metrics and /readyz (0: off).")
@click.option("--liveness-port", type=click.IntRange(0, 65535), default=None, help="Port of Kopf's liveness endpoint /healthz (0: off).")
@click.option("--log-format", type=click.Choice(["json", "text"]), default=None, help="Log format.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logs.")
def operator_command(namespaces: tuple[str, ...], metrics_port: int | None, liveness_port: int | None,
                     log_format: str | None, verbose: bool) -> None:
    """Run the AgentRun operator until SIGTERM. Configuration: AGENTRUN_* environment variables
    (see agentrun.controller.config). Only the holder of the Lease acts; other replicas wait."""
    import dataclasses

    from agentrun import metrics
    from agentrun.notify.sender import check_env as check_notify_env

    from . import gcpolicy, process
    from .config import OperatorConfig
    from .logs import setup_logging
    from .reconciler import Controller

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
    if liveness_port is not None:
        overrides["liveness_port"] = liveness_port
    if log_format:
        overrides["log_format"] = log_format
    cfg = dataclasses.replace(cfg, **overrides)
    if cfg.liveness_port and cfg.liveness_port == cfg.metrics_port:
        raise click.UsageError(f"the liveness port (--liveness-port, AGENTRUN_LIVENESS_PORT) and the metrics port "
                               f"(--metrics-port, AGENTRUN_METRICS_PORT) are both {cfg.metrics_port}: each needs its own")
    setup_logging(cfg.log_format, logging.DEBUG if verbose else logging.INFO)
    gcpolicy.at_start()
    controller = Controller(cfg, on_synced=gcpolicy.after_sync)
    if cfg.metrics_port:
        metrics.set_readiness_check(lambda: not process.waiting_for(controller))
        metrics.start_server(cfg.metrics_port)
    logging.getLogger("agentrun.controller").info(
        "starting agentrun operator %s (pid %d), namespaces=%s", cfg.identity, os.getpid(),
        ",".join(cfg.namespaces) or "<cluster-wide>")
    process.run(controller)
