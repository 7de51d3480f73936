"""The ``agentrun`` command. Each subcommand lives with the package it drives and is imported
lazily, so ``agentrun lap`` (the lap Job's entrypoint) does not import Kopf and vice versa.

``-h`` and ``--help`` everywhere; the cluster flags (``cli.kube.kube_options``) go before or after
the subcommand; errors exit with ``cli.exitcodes.ExitCode``; ``agentrun completion SHELL`` prints
click's completion script. ``kubectl-agentrun`` (:func:`plugin_main`) is the same command as a
kubectl plugin."""

from __future__ import annotations

import importlib
from typing import Any

import click

# subcommand name -> "module:attribute" of a click.Command
SUBCOMMANDS = {
    "lap": "agentrun.lap.command:lap_command",
    "operator": "agentrun.controller.command:operator_command",
    "crd": "agentrun.api.crdgen:crd_command",
    "trace": "agentrun.cli.trace:trace_command",
    "approvals": "agentrun.cli.approvals:approvals_command",
    "approve": "agentrun.cli.approvals:approve_run_command",
    "reject": "agentrun.cli.approvals:reject_run_command",
    "runs": "agentrun.cli.runs:runs_command",
    "run": "agentrun.cli.run:run_command",
    "fork": "agentrun.cli.fork:fork_command",
    "gc": "agentrun.cli.gc:gc_command",
    "inbox": "agentrun.inbox.command:inbox_command",
    "wait": "agentrun.cli.lifecycle:wait_command",
    "suspend": "agentrun.cli.lifecycle:suspend_command",
    "resume": "agentrun.cli.lifecycle:resume_command",
    "cancel": "agentrun.cli.lifecycle:cancel_command",
    "retry": "agentrun.cli.lifecycle:retry_command",
    "describe": "agentrun.cli.describe:describe_command",
    "logs": "agentrun.cli.logs:logs_command",
    "completion": "agentrun.cli.main:completion_command",
}
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
PROG = "agentrun"


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
            from agentrun.cli.kube import CLIError, status_code, unreachable

            if _is_network_error(e):
                raise unreachable(e) from None
            status = getattr(e, "status", None)
            if isinstance(status, int) and status >= 400:  # an ApiException no command caught
                raise CLIError(f"the API server answered {status} {getattr(e, 'reason', '') or ''}".rstrip(),
                               status_code(status)) from None
            raise CLIError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _is_network_error(e: BaseException) -> bool:
    import socket

    import urllib3.exceptions as u3  # the kubernetes client's

    return isinstance(e, (u3.HTTPError, socket.error, ConnectionError))


def _kube_options(f: Any) -> Any:
    from agentrun.cli.kube import kube_options

    return kube_options(all_namespaces=True)(f)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="agentrun")
@_kube_options
def main() -> None:
    """agentrun: durable long-running AI agents on Kubernetes.

    The cluster flags (--kubeconfig, --context, -n, -A, --as, --as-group, --request-timeout) go
    before or after the subcommand. Exit codes: docs/cli.md."""


@click.command("completion", short_help="Print the shell completion script (bash, zsh or fish).")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion_command(ctx: click.Context, shell: str) -> None:
    """Print the completion script of SHELL; it completes commands, flags and RUN names from the
    cluster (the namespace of -n, else the context's). Load it with, e.g.:

    \b
      source <(agentrun completion bash)                       # bash, in ~/.bashrc
      agentrun completion zsh > "${fpath[1]}/_agentrun"        # zsh
      agentrun completion fish > ~/.config/fish/completions/agentrun.fish
    """
    from click.shell_completion import get_completion_class

    root = ctx.find_root()
    prog = root.info_name or PROG
    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above
    var = "_" + prog.replace("-", "_").replace(" ", "_").upper() + "_COMPLETE"
    click.echo(cls(root.command, {}, prog, var).source())


def plugin_main() -> None:
    """``kubectl agentrun ...``: kubectl runs ``kubectl-agentrun`` with the arguments after the
    plugin's name (kubectl's own flags must not come before it)."""
    main(prog_name="kubectl agentrun", complete_var="_KUBECTL_AGENTRUN_COMPLETE")


if __name__ == "__main__":
    main(prog_name=PROG)
