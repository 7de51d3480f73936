"""``agentrun trace``: print the per-lap trace of a run from the checkpoint store."""

from __future__ import annotations

import os

import click

from agentrun.checkpoint.errors import CheckpointError
from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.checkpoint.trace import format_trace


@click.command("trace")
@click.option("--uri", envvar="AGENTRUN_CHECKPOINT_URI", required=True, help="s3://bucket/prefix")
@click.option("--endpoint", envvar="AGENTRUN_S3_ENDPOINT", default=None, help="S3 endpoint URL (default: AWS).")
@click.option("--region", envvar="AGENTRUN_S3_REGION", default=None, help="S3 region.")
@click.option("--path-style/--no-path-style", default=None, help="Path-style addressing (MinIO, moto).")
@click.option("--namespace", required=True, help="Namespace of the AgentRun.")
@click.option("--name", required=True, help="Name of the AgentRun.")
@click.option("--uid", required=True, help="UID of the AgentRun (kubectl get agentrun NAME -o jsonpath='{.metadata.uid}').")
@click.option("--from-lap", type=click.IntRange(min=1), default=1, show_default=True, help="First lap to print.")
@click.option("--width", type=click.IntRange(min=40), default=120, show_default=True)
def trace_command(
    uri: str,
    endpoint: str | None,
    region: str | None,
    path_style: bool | None,
    namespace: str,
    name: str,
    uid: str,
    from_lap: int,
    width: int,
) -> None:
    """Print the per-lap trace of a run: outcome, tools and their status, tokens, cost, duration,
    and the assistant's text of every lap. Credentials come from the standard AWS chain."""
    if path_style is None:
        path_style = os.environ.get("AGENTRUN_S3_PATH_STYLE", "").lower() in ("true", "1", "yes")
    try:
        config = StoreConfig(uri=uri, endpoint_url=endpoint or None, region=region or None, path_style=path_style)
        store = CheckpointStore(config)
        run = RunRef(namespace=namespace, name=name, uid=uid)
        store.run_prefix(run)
        text = format_trace(store.iter_laps(run, start=from_lap), width=width)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:  # bad URI / endpoint / run identity
        raise click.ClickException(_first_line(e)) from None
    click.echo(text, nl=False)


def _first_line(error: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        err = error.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "input"
        return f"{field}: {err['msg']}"
    return str(error)
