"""``agentrun runs``: the runs of a namespace (or all) with phase, lap, time since the last
checkpoint, cost, who they wait on and why a run fails or retries. ``run_rows`` / ``format_runs``
are pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from agentrun.api.status import TERMINAL_PHASES
from agentrun.api.text import one_line
from agentrun.api.types import human_duration, parse_time
from agentrun.cli.approvals import _now
from agentrun.cli.kube import check_namespace_flags, connect, current_options, kube_options, list_runs
from agentrun.cli.output import colour_phase, columns, output_option, run_name, terminal_width

COLUMNS = ("NAME", "PHASE", "LAP", "SINCE-CHECKPOINT", "COST", "WAITING-ON", "CAUSE")
WIDE_COLUMNS = ("AGENT", "AGENT-VERSION", "FORKED-FROM", "RETRIES")
MAX_CAUSE_COLUMN = 100
# Progressing reasons of a run that is held up by something it names (the condition's message).
_HELD_UP = ("SecretMissing", "LapPodConfigError", "StoreUnavailable", "AgentNotFound", "AgentInvalid",
            "InvalidParameters", "PinnedAgentUnreadable")


def run_cause(status: dict[str, Any]) -> str | None:
    """Why a run failed, retries or is held up, else None: a run's message once it ended other than
    Succeeded (Failed, BudgetExceeded, Cancelled, DeadlineExceeded); a
    Retrying run's last failure of the lap in progress (status.retries[].lastReason: the pod's cause);
    a run held up by a missing Secret or an unavailable store, the Progressing condition's message."""
    phase = status.get("phase")
    if phase in TERMINAL_PHASES and phase != "Succeeded":
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
        ref = (run.get("spec") or {}).get("agentRef") or {}
        pinned = st.get("agent") or {}
        rows.append({
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "agent": ref.get("name") if isinstance(ref, dict) else None,
            "agentPinned": {"version": pinned.get("version"), "digest": pinned.get("digest")} if pinned else None,
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
            "retriesInPlace": int((st.get("lifecycle") or {}).get("retries") or 0),
        })
    rows.sort(key=lambda r: (r["namespace"], r["name"]))
    return rows


def table_cells(row: dict[str, Any], with_namespace: bool, cause_chars: int = MAX_CAUSE_COLUMN,
                wide: bool = False) -> list[str]:
    cells = [
        row["name"], row["phase"], str(row["lap"]),
        "<none>" if row["secondsSinceCheckpoint"] is None else human_duration(row["secondsSinceCheckpoint"]),
        "$" + str(row["costUSD"]), row["waitingOn"] or "<none>",
        one_line(row["cause"], cause_chars) if row.get("cause") else "<none>",
    ]
    if wide:
        fork = row.get("forkedFrom")
        cells += [row.get("agent") or "<inline>", row.get("agentVersion") or "<none>", f"{fork['name']}@{fork['lap']}" if fork else "<none>",
                  str(row.get("retriesInPlace") or 0)]
    return ([row["namespace"]] if with_namespace else []) + cells


def format_runs(rows: list[dict[str, Any]], with_namespace: bool = False, width: int | None = None,
                wide: bool = False) -> str:
    """kubectl-like columns, three spaces apart (NAMESPACE first with -A). The CAUSE column is cut
    to fit ``width`` (the terminal's; at least 20 characters, at most 100); ``wide`` cuts nothing and
    adds AGENT, AGENT-VERSION, FORKED-FROM and RETRIES (retries in place)."""
    header = (["NAMESPACE"] if with_namespace else []) + list(COLUMNS) + (list(WIDE_COLUMNS) if wide else [])
    cause = MAX_CAUSE_COLUMN
    if wide:
        cause = 4096
    elif width is not None and rows:
        before = [table_cells(r, with_namespace, 0)[:-1] for r in rows]
        used = sum(max(len(h), *(len(c[i]) for c in before)) + 3 for i, h in enumerate(header[:-1]))
        cause = max(20, min(MAX_CAUSE_COLUMN, width - used))
    phase_col = header.index("PHASE")

    def style(col: int, padded: str, cell: str) -> str:
        return colour_phase(padded, cell) if col == phase_col else padded

    return columns(header, [table_cells(r, with_namespace, cause, wide) for r in rows], style)


def render(rows: list[dict[str, Any]], output: str, with_namespace: bool, width: int | None = None) -> str:
    from agentrun.cli.output import render as render_doc

    return render_doc(output, rows, table=lambda: format_runs(rows, with_namespace, width),
                      wide=lambda: format_runs(rows, with_namespace, wide=True),
                      names=lambda: [run_name(r["name"]) for r in rows], items=rows)


@click.command("runs", short_help="The runs: phase, lap, time since the last checkpoint, cost, waiting-on, cause.")
@kube_options(all_namespaces=True)
@output_option(help="table, wide (more columns, no cut), a JSON/YAML list of rows, name "
               "(agentrun.agentrun.dev/NAME), or jsonpath=TEMPLATE over {items: [rows]}.")
def runs_command(output: str) -> None:
    """List AgentRuns: NAME, PHASE, LAP (last checkpointed), SINCE-CHECKPOINT (time since the last
    checkpoint was written), COST (USD so far), WAITING-ON (owner of a pending approval) and CAUSE
    (why a run failed, retries or is held up: the failing pod's cause, a missing Secret, a missing Agent), cut to the
    terminal's width. -o wide adds AGENT (the Agent it runs, spec.agentRef, or <inline>), AGENT-VERSION,
    FORKED-FROM and RETRIES (retries in place); -o json/yaml rows carry agent and agentPinned
    (status.agent: version, digest)."""
    opts = current_options()
    check_namespace_flags(opts)
    api, ns = connect(opts)
    items = list_runs(api, None if opts.all_namespaces else ns)
    rows = run_rows(items, _now())
    if not rows and output in ("table", "wide", "name"):
        where = "any namespace" if opts.all_namespaces else f"namespace {ns}"
        click.echo(f"No agentruns in {where}.", err=True)
        return
    text = render(rows, output, opts.all_namespaces, terminal_width(10_000))
    click.echo(text, nl=not output.startswith("jsonpath="))
