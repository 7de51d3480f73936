"""``agentrun runs``: the runs of a namespace (or all) with phase, lap, time since the last
checkpoint, cost, who they wait on and why a run fails or retries. ``run_rows`` / ``format_runs``
are pure."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
import yaml

from agentrun.api.text import one_line
from agentrun.api.types import parse_time
from agentrun.cli.approvals import _now
from agentrun.cli.kube import check_namespace_flags, connect, current_options, kube_options, list_runs
from agentrun.cli.output import columns, human_duration

COLUMNS = ("NAME", "PHASE", "LAP", "SINCE-CHECKPOINT", "COST", "WAITING-ON", "CAUSE")
MAX_CAUSE_COLUMN = 100
# Progressing reasons of a run that is held up by something it names (the condition's message).
_HELD_UP = ("SecretMissing", "LapPodConfigError", "StoreUnavailable")


def run_cause(status: dict[str, Any]) -> str | None:
    """Why a run failed, retries or is held up, else None: a Failed/BudgetExceeded run's message; a
    Retrying run's last failure of the lap in progress (status.retries[].lastReason: the pod's cause);
    a run held up by a missing Secret or an unavailable store, the Progressing condition's message."""
    phase = status.get("phase")
    if phase in ("Failed", "BudgetExceeded"):
        return status.get("message") or None
    if phase == "Retrying":
        lap = int(status.get("lap") or 0) + 1
        entry = next((r for r in status.get("retries") or [] if isinstance(r, dict) and r.get("lap") == lap), None)
        return (entry or {}).get("lastReason") or status.get("message") or None
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Progressing" and cond.get("reason") in _HELD_UP:
            return cond.get("message") or cond.get("reason")
    return None


def run_rows(runs: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """One row per run, by namespace then name. ``now`` must be timezone-aware."""
    rows = []
    for run in runs:
        meta = run.get("metadata") or {}
        st = run.get("status") or {}
        last = parse_time(st.get("lastCheckpointTime"))
        fork = (run.get("spec") or {}).get("forkFrom")
        rows.append({
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "phase": st.get("phase") or "Pending",
            "lap": int(st.get("lap") or 0),
            "lastCheckpointTime": st.get("lastCheckpointTime"),
            "secondsSinceCheckpoint": int((now - last).total_seconds()) if last else None,
            "costUSD": (st.get("cost") or {}).get("usd", "0.00"),
            "waitingOn": st.get("waitingOn"),
            "agentVersion": st.get("agentVersion"),
            "forkedFrom": {"name": fork.get("name"), "lap": fork.get("lap")} if fork else None,
            "message": st.get("message"),
            "cause": run_cause(st),
        })
    rows.sort(key=lambda r: (r["namespace"], r["name"]))
    return rows


def table_cells(row: dict[str, Any], with_namespace: bool) -> list[str]:
    cells = [
        row["name"], row["phase"], str(row["lap"]),
        "<none>" if row["secondsSinceCheckpoint"] is None else human_duration(row["secondsSinceCheckpoint"]),
        "$" + str(row["costUSD"]), row["waitingOn"] or "<none>",
        one_line(row["cause"], MAX_CAUSE_COLUMN) if row.get("cause") else "<none>",
    ]
    return ([row["namespace"]] if with_namespace else []) + cells


def format_runs(rows: list[dict[str, Any]], with_namespace: bool = False) -> str:
    """kubectl-like columns, three spaces apart (NAMESPACE first with -A)."""
    header = (["NAMESPACE"] if with_namespace else []) + list(COLUMNS)
    return columns(header, [table_cells(r, with_namespace) for r in rows])


def render(rows: list[dict[str, Any]], output: str, with_namespace: bool) -> str:
    if output == "json":
        return json.dumps(rows, indent=2)
    if output == "yaml":
        return yaml.safe_dump(rows, sort_keys=False).rstrip("\n")
    return format_runs(rows, with_namespace)


@click.command("runs", short_help="The runs: phase, lap, time since the last checkpoint, cost, waiting-on, cause.")
@kube_options(all_namespaces=True)
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True,
              help="table, or a JSON/YAML list of rows.")
def runs_command(output: str) -> None:
    """List AgentRuns: NAME, PHASE, LAP (last checkpointed), SINCE-CHECKPOINT (time since the last
    checkpoint was written), COST (USD so far), WAITING-ON (owner of a pending approval) and CAUSE
    (why a run failed, retries or is held up: the failing pod's cause, a missing Secret)."""
    opts = current_options()
    check_namespace_flags(opts)
    api, ns = connect(opts)
    items = list_runs(api, None if opts.all_namespaces else ns)
    rows = run_rows(items, _now())
    if not rows and output == "table":
        where = "any namespace" if opts.all_namespaces else f"namespace {ns}"
        click.echo(f"No agentruns in {where}.", err=True)
        return
    click.echo(render(rows, output, opts.all_namespaces))
