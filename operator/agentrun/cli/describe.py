"""``agentrun describe RUN``: one run as ``kubectl describe`` shows an object: a summary of the spec,
the status (with the Agent definition a run of an Agent runs, ``status.agent``), the conditions,
the approval and the recent Events. ``describe_text`` is pure; every value that comes from a user
or a model is one line and bounded (``api.text.one_line``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from agentrun.api.text import one_line
from agentrun.api.types import human_duration, parse_time
from agentrun.cli.kube import complete_runs, connect, core_api, current_options, get_run, kube_options
from agentrun.cli.output import colour_phase, columns, output_option, render, run_name

MAX_EVENTS = 15
MAX_PARAMETERS_SHOWN = 10
SHORT_DIGEST = 12  # hex digits of status.agent.digest shown (the full one: -o yaml)


def _age(ts: Any, now: datetime) -> str:
    t = parse_time(ts) if isinstance(ts, str) else ts
    return human_duration((now - t).total_seconds()) if isinstance(t, datetime) else "<unknown>"


def _v(value: Any, limit: int = 200) -> str:
    if value is None or value == "":
        return "<none>"
    return one_line(str(value), limit)


def _parameters(params: Any) -> str:
    if not isinstance(params, dict) or not params:
        return "<none>"
    shown = [f"{one_line(str(k), 63)}={one_line(str(v), 64)}" for k, v in sorted(params.items())[:MAX_PARAMETERS_SHOWN]]
    more = len(params) - MAX_PARAMETERS_SHOWN
    return ", ".join(shown) + (f", ... ({more} more)" if more > 0 else "")


def pinned_agent_text(pinned: Any, now: datetime) -> str:
    """``status.agent`` in one bounded line: "NAME version V, digest sha256:SHORT, pinned T (AGE ago)"."""
    if not isinstance(pinned, dict) or not pinned.get("name"):
        return "<none>"
    digest = str(pinned.get("digest") or "")
    text = (f"{_v(pinned.get('name'), 253)} version {_v(pinned.get('version'), 63)}, digest "
            + (f"sha256:{one_line(digest[:SHORT_DIGEST], SHORT_DIGEST)}" if digest else "<none>"))
    if pinned.get("pinnedAt"):
        text += f", pinned {_v(pinned.get('pinnedAt'), 40)} ({_age(pinned.get('pinnedAt'), now)} ago)"
    return text


def describe_text(run: dict[str, Any], events: list[dict[str, Any]], now: datetime) -> str:
    meta = run.get("metadata") or {}
    spec = run.get("spec") or {}
    st = run.get("status") or {}
    agent = spec.get("agent") or {}
    model = agent.get("model") or {}
    budget = spec.get("budget") or {}
    approval = spec.get("approval") or {}
    life = st.get("lifecycle") or {}
    cost = st.get("cost") or {}
    lines = [
        f"Name:             {_v(meta.get('name'))}",
        f"Namespace:        {_v(meta.get('namespace'))}",
        f"UID:              {_v(meta.get('uid'))}",
        f"Created:          {_v(meta.get('creationTimestamp'))} ({_age(meta.get('creationTimestamp'), now)} ago)",
        "Spec:",
        f"  Task:           {_v(spec.get('task'), 160)}",
    ]
    ref = spec.get("agentRef") if isinstance(spec.get("agentRef"), dict) else None
    unset = "<the Agent's>"
    if ref is not None:  # a run of an Agent: its agent, model and tools are the Agent's (Status, Agent)
        lines += [f"  Agent ref:      {_v(ref.get('name'), 253)}",
                  f"  Parameters:     {_parameters(spec.get('parameters'))}"]
    else:
        lines += [
            f"  Agent:          {_v(agent.get('version'))}" + (f", image {_v(agent.get('image'))}" if agent.get("image")
                                                                 else ""),
            f"  Model:          {_v(model.get('provider'))} {_v(model.get('name'))}",
            f"  Tools:          {_v(', '.join(str(t.get('name')) for t in agent.get('tools') or [] if isinstance(t, dict)))}",
        ]
    lines += [
        # a run of an Agent: what the run leaves unset is the Agent's (its resolved copy in the store)
        f"  Budget:         maxLaps {_v(budget.get('maxLaps', unset if ref else 100))}, maxCostUSD "
        f"{_v(budget.get('maxCostUSD', unset if ref else None))}",
        f"  Approval owner: {_v(approval.get('owner', unset if ref else None))}",
        f"  Suspend:        {'true' if spec.get('suspend') else 'false'}",
        "  Cancel:         " + (("reason " + _v((spec.get('cancel') or {}).get('reason'))) if spec.get("cancel") is not None
                                  else "<none>"),
        f"  Active deadline: {_v(spec.get('activeDeadline'))}",
    ]
    if spec.get("forkFrom"):
        f = spec["forkFrom"]
        lines.append(f"  Fork from:      {_v(f.get('name'))} (uid {_v(f.get('uid'))}) lap {_v(f.get('lap'))}")
    phase = st.get("phase") or "Pending"
    lines += [
        "Status:",
        f"  Phase:          {colour_phase(phase, phase)}",
        f"  Message:        {_v(st.get('message'), 300)}",
        f"  Agent:          {pinned_agent_text(st.get('agent'), now)}",
        f"  Lap:            {int(st.get('lap') or 0)} (last checkpointed)",
        f"  Last checkpoint: {_v(st.get('lastCheckpointTime'))}",
        f"  Cost:           ${_v(cost.get('usd', '0.00'))}, tokens {int(cost.get('inputTokens') or 0)} in / "
        f"{int(cost.get('outputTokens') or 0)} out",
        f"  Started:        {_v(st.get('startedAt'))}",
        f"  Waiting on:     {_v(st.get('waitingOn'))}",
        f"  Retries in place: {int(life.get('retries') or 0)}"
        + (f" (last by {_v(life.get('lastRetryBy'))} at {_v(life.get('lastRetryAt'))} from "
           f"{_v(life.get('lastRetryFromPhase'))})" if life.get("retries") else ""),
    ]
    if st.get("traceId"):
        lines.append(f"  Trace:          {_v(st.get('traceId'), 32)} (OpenTelemetry trace id)")
    rewinds = [r for r in life.get("rewinds") or [] if isinstance(r, int) and not isinstance(r, bool)]
    if rewinds:
        lines.append(f"  Rewinds:        {len(rewinds)} (to lap{'s' if len(rewinds) > 1 else ''} "
                     f"{', '.join(str(r) for r in rewinds[-8:])}{', ...' if len(rewinds) > 8 else ''}; "
                     f"history {len(rewinds)} is current)")
    queue = st.get("queue")
    if isinstance(queue, dict):
        scope = str(queue.get("scope") or "namespace")
        rule = {"Agent": "maxActiveRunsPerAgent", "model": "maxActiveRunsPerModel"}.get(scope.split(" ", 1)[0],
                                                                                     "maxActiveRuns")
        of = "" if scope == "namespace" else f" of {_v(scope, 300)}"
        lines.append(f"  Queue:          position {_v(queue.get('position'), 12)} ({_v(queue.get('active'), 12)} of "
                     f"{_v(queue.get('limit'), 12)} runs{of} active; AgentRunPolicy {_v(queue.get('policy'), 253)} "
                     f"{rule})")
    kueue = st.get("kueue")
    if isinstance(kueue, dict):
        lines.append(f"  Kueue:          Job {_v(kueue.get('job'), 63)} held in LocalQueue {_v(kueue.get('localQueue'), 63)}"
                     f" since {_v(kueue.get('since'))}; Workload {_v(kueue.get('workload'), 253)}")
    if life.get("cancelledBy") or life.get("cancelReason"):
        lines.append(f"  Cancelled:      by {_v(life.get('cancelledBy'))} at {_v(life.get('cancelledAt'))}: "
                     f"{_v(life.get('cancelReason'))}")
    conds = [c for c in st.get("conditions") or [] if isinstance(c, dict)]
    lines.append("Conditions:")
    if conds:
        table = columns(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                        [[_v(c.get("type"), 40), _v(c.get("status"), 10), _v(c.get("reason"), 60),
                          _age(c.get("lastTransitionTime"), now), _v(c.get("message"), 160)] for c in conds])
        lines += ["  " + ln for ln in table.splitlines()]
    else:
        lines.append("  <none>")
    ap = st.get("approval") or {}
    lines.append("Approval:")
    if ap:
        target = ap.get("target") or {}
        lines += [
            f"  State:          {_v(ap.get('state'))}",
            f"  Tool:           {_v(ap.get('tool'))} (call {_v(ap.get('callId'))}, lap {_v(ap.get('lap'))})",
            f"  Target:         {_v(target.get('method'))} {_v(target.get('url'), 300)}" if target else
            "  Target:         <unknown>",
            f"  Requested:      {_v(ap.get('requestedAt'))}",
            f"  Deadline:       {_v(ap.get('deadline'))}",
        ]
        if ap.get("decision"):
            lines.append(f"  Decision:       {_v(ap.get('decision'))} by {_v(ap.get('decidedBy'))}: {_v(ap.get('reason'))}")
    else:
        lines.append("  <none>")
    lines.append("Events:")
    if events:
        rows = []
        for ev in events[-MAX_EVENTS:]:
            when = ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp")
            src = ev.get("reportingComponent") or (ev.get("source") or {}).get("component")
            rows.append([_v(ev.get("type"), 20), _v(ev.get("reason"), 60), _age(when, now), _v(src, 60),
                         _v(ev.get("message"), 200)])
        lines += ["  " + ln for ln in columns(["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], rows).splitlines()]
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def run_events(namespace: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events of the run (by uid), oldest first; [] when they cannot be read (said on stderr)."""
    meta = run.get("metadata") or {}
    try:
        api = core_api()
        res = api.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={meta.get('uid')}")
        items = [api.api_client.sanitize_for_serialization(e) for e in res.items]
    except Exception as e:
        click.echo(f"warning: events not read: {one_line(str(e).splitlines()[0] if str(e) else type(e).__name__, 200)}",
                   err=True)
        return []

    def when(ev: dict[str, Any]) -> str:
        return str(ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp") or "")

    return sorted(items, key=when)


@click.command("describe", short_help="RUN in detail: spec, status, conditions, approval, recent Events.")
@click.argument("run", shell_complete=complete_runs)
@kube_options()
@output_option(("text", "json", "yaml", "name"), default="text",
               help="text (kubectl describe's layout), the AgentRun as JSON/YAML, name, or jsonpath=TEMPLATE.")
def describe_command(run: str, output: str) -> None:
    """Show RUN as kubectl describe shows an object: a summary of its spec, its status (phase,
    message, lap, cost, retries in place, the cancel), its conditions, the approval and the recent
    Events."""
    from datetime import UTC

    api, ns = connect(current_options())
    obj = get_run(api, ns, run)
    if output != "text":
        click.echo(render(output, obj, names=lambda: [run_name(run)]), nl=not output.startswith("jsonpath="))
        return
    click.echo(describe_text(obj, run_events(ns, obj), datetime.now(UTC)))
