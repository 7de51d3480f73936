"""``agentrun lap`` as a click command (``agentrun lap --help``, ``python -m agentrun.cli.main lap``).
The lap pod's ``agentrun lap`` runs ``agentrun.lap.entry`` without click (``agentrun.cli.entry``);
both run the same ``entry.run``."""

from __future__ import annotations

import sys

import click

from agentrun.lap.entry import run


@click.command("lap", context_settings={"help_option_names": ["-h", "--help"]})
def lap_command() -> None:
    """Run one lap of an AgentRun (configured by AGENTRUN_* environment variables)."""
    sys.exit(run())
