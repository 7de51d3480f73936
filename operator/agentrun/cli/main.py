"""The ``agentrun`` command. Each subcommand lives with the package it drives and is imported
lazily, so ``agentrun lap`` (the lap Job's entrypoint) does not import Kopf and vice versa."""

from __future__ import annotations

import importlib

import click

# subcommand name -> "module:attribute" of a click.Command
SUBCOMMANDS = {
    "lap": "agentrun.lap.cli:lap_command",
    "operator": "agentrun.controller.cli:operator_command",
    "crd": "agentrun.api.crdgen:crd_command",
    "trace": "agentrun.checkpoint.cli:trace_command",
    "approvals": "agentrun.cli.approvals:approvals_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="agentrun")
def main() -> None:
    """agentrun: durable long-running AI agents on Kubernetes."""


if __name__ == "__main__":
    main()
