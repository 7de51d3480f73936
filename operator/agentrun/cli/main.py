"""The ``agentrun`` command. Each subcommand lives with the package it drives and is imported
lazily, so ``agentrun lap`` (the lap Job's entrypoint) does not import Kopf and vice versa."""

from __future__ import annotations

import importlib

import click

# subcommand name -> "module:attribute" of a click.Command
SUBCOMMANDS = {
    "lap": "agentrun.lap.command:lap_command",
    "operator": "agentrun.controller.cli:operator_command",
    "crd": "agentrun.api.crdgen:crd_command",
    "trace": "agentrun.cli.trace:trace_command",
    "approvals": "agentrun.cli.approvals:approvals_command",
    "approve": "agentrun.cli.approvals:approve_run_command",
    "reject": "agentrun.cli.approvals:reject_run_command",
    "runs": "agentrun.cli.runs:runs_command",
    "fork": "agentrun.cli.fork:fork_command",
    "gc": "agentrun.cli.gc:gc_command",
    "inbox": "agentrun.inbox.cli:inbox_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Errors are one line (``agentrun: ...``), never a traceback: an API server that cannot be
        reached surfaces as a urllib3/socket error from deep in the client."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:
            if ctx.invoked_subcommand in ("lap", "operator"):  # their own exit-code contracts
                raise
            from agentrun.cli.kube import CLIError, unreachable

            if _is_network_error(e):
                raise unreachable(e) from None
            raise CLIError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _is_network_error(e: BaseException) -> bool:
    import socket

    try:
        import urllib3.exceptions as u3
        network: tuple[type[BaseException], ...] = (u3.HTTPError, socket.error, ConnectionError)
    except ImportError:  # pragma: no cover
        network = (socket.error, ConnectionError)
    return isinstance(e, network)


@click.group(cls=LazyGroup)
@click.version_option(package_name="agentrun")
def main() -> None:
    """agentrun: durable long-running AI agents on Kubernetes."""


if __name__ == "__main__":
    main()
