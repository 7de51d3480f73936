"""The run explorer's pages (``/runs``, ``/runs/NS/NAME``), as pure functions of AgentRun dicts,
lap documents and ``now``.

A lap is read here as the document ``agentrun trace -o json`` prints for it (``LapRecord.to_api()``
plus its object's ``key``, ``sha256`` and ``bytes``: :func:`lap_doc`), so the page and the CLI show
the same laps. Every value that came from a user, an agent or a tool goes through ``esc`` (bounded,
HTML-escaped); the timeline and the cost plot are inline SVG drawn from numbers only (no script,
no style attribute: the inbox's Content-Security-Policy allows neither inline).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args
from urllib.parse import quote, urlencode

from agentrun.api.status import Phase
from agentrun.api.text import one_line
from agentrun.api.types import human_duration, parse_time
from agentrun.checkpoint.trace import lap_doc as trace_lap_doc
from agentrun.inbox.view import _shell, esc, nav

PHASES: tuple[str, ...] = get_args(Phase)
MAX_ROWS = 500  # runs listed at most (newest first); beyond: a note to filter
MAX_QUERY = 100  # characters of the text filter
MAX_TEXT = 2000  # characters of one message or tool result shown on the run page
MAX_ARGS_SHOWN = 2000  # characters of a tool call's arguments (JSON) shown
MAX_EVENTS = 100
PAGE_LAPS = 50  # laps shown on a run page (the last ones); earlier: agentrun trace --from-lap
_NS = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _num(value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        return 0.0


def _when(value: object) -> str:
    t = parse_time(value) if isinstance(value, str) else None
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"


def run_href(namespace: str, name: str) -> str:
    return f"/runs/{quote(namespace, safe='')}/{quote(name, safe='')}"


# ------------------------------------------------------------------------------------ runs list

@dataclass(frozen=True)
class Filters:
    """What the runs list is narrowed to (from the query string, bounded): a namespace, a phase,
    and a text found in the name, namespace, task, waiting-on or message (case-insensitive)."""

    namespace: str = ""
    phase: str = ""
    text: str = ""

    def query(self) -> str:
        q = {k: v for k, v in (("namespace", self.namespace), ("phase", self.phase), ("q", self.text)) if v}
        return ("?" + urlencode(q)) if q else ""


def parse_filters(query: dict[str, list[str]]) -> Filters:
    """Filters from a parsed query string; a namespace that is not a Kubernetes name or a phase
    that is not one is dropped, the text is cut to MAX_QUERY characters."""
    def first(k: str) -> str:
        return (query.get(k) or [""])[0].strip()

    ns, phase = first("namespace"), first("phase")
    return Filters(namespace=ns if _NS.match(ns) else "", phase=phase if phase in PHASES else "",
                   text=first("q")[:MAX_QUERY])


@dataclass(frozen=True)
class RunRow:
    namespace: str
    name: str
    phase: str
    lap: int
    cost_usd: str
    created: str | None
    age_seconds: int | None
    waiting_on: str
    message: str
    task: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def run_row(run: dict[str, Any], now: datetime) -> RunRow:
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    created = meta.get("creationTimestamp")
    t = parse_time(created) if isinstance(created, str) else None
    lap = st.get("lap")
    return RunRow(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        phase=str(st.get("phase") or "Pending"), lap=lap if isinstance(lap, int) and not isinstance(lap, bool) else 0,
        cost_usd=str((st.get("cost") or {}).get("usd") or "0.00"), created=created if t else None,
        age_seconds=int((now - t).total_seconds()) if t else None, waiting_on=str(st.get("waitingOn") or ""),
        message=str(st.get("message") or ""), task=str((run.get("spec") or {}).get("task") or ""),
    )


def _matches(row: RunRow, f: Filters) -> bool:
    if f.namespace and row.namespace != f.namespace:
        return False
    if f.phase and row.phase != f.phase:
        return False
    if f.text:
        needle = f.text.lower()
        return any(needle in s.lower() for s in (row.name, row.namespace, row.task, row.waiting_on, row.message))
    return True


def run_rows(runs: list[dict[str, Any]], now: datetime, f: Filters) -> tuple[list[RunRow], int]:
    """The rows that match ``f``, newest first (then namespace, name), at most MAX_ROWS; and how
    many matched in all."""
    rows = [r for r in (run_row(x, now) for x in runs) if _matches(r, f)]
    rows.sort(key=lambda r: (r.age_seconds if r.age_seconds is not None else 1 << 62, r.namespace, r.name))
    return rows[:MAX_ROWS], len(rows)


def _phase_badge(phase: str) -> str:
    return f'<span class="phase phase-{esc(phase.lower(), 32)}">{esc(phase, 32)}</span>'


def _age(created: str | None, age: int | None) -> str:
    return (f'<time datetime="{esc(created or "")}" data-since="{esc(created or "")}">'
            + (f"{esc(human_duration(age))} ago" if age is not None else "?") + "</time>")


def runs_html(rows: list[RunRow], matched: int, total: int, notices: list[str]) -> str:
    """The live part of the runs list (replaced by the script on every watch event)."""
    notes = "".join(f'<p class="notice">{esc(n, 600)}</p>' for n in notices)
    if not rows:
        body = f'<p class="empty">{"No runs match." if total else "No runs to show."}</p>'
    else:
        trs = "".join(
            f'<tr data-key="{esc(r.key)}"><td><a href="{esc(run_href(r.namespace, r.name), 600)}">'
            f'<span class="ns">{esc(r.namespace)}/</span>{esc(r.name)}</a></td>'
            f"<td>{_phase_badge(r.phase)}</td><td class=\"num\">{r.lap}</td>"
            f'<td class="num">{esc(r.cost_usd, 32)}</td><td>{_age(r.created, r.age_seconds)}</td>'
            f"<td>{esc(r.waiting_on or '-', 128)}</td><td>{esc(one_line(r.message, 200), 200)}</td></tr>"
            for r in rows)
        body = ('<div class="scroll"><table class="runs"><thead><tr><th scope="col">Run</th><th scope="col">Phase</th>'
                '<th scope="col">Lap</th><th scope="col">Cost USD</th><th scope="col">Age</th>'
                '<th scope="col">Waiting on</th><th scope="col">Message</th></tr></thead>'
                f"<tbody>{trs}</tbody></table></div>")
    more = (f'<p class="note">Showing the newest {len(rows)} of {matched}: narrow the filter to see the others.</p>'
            if matched > len(rows) else "")
    return (f'<section id="explore" aria-labelledby="runs-h"><h2 id="runs-h">Runs '
            f'<span class="count">({matched} of {total})</span></h2>{notes}{body}{more}</section>')


def filter_form(f: Filters, namespaces: list[str]) -> str:
    ns_opts = "".join(f'<option value="{esc(n)}"{" selected" if n == f.namespace else ""}>{esc(n)}</option>'
                      for n in sorted(set(namespaces) | ({f.namespace} if f.namespace else set())))
    ph_opts = "".join(f'<option value="{p}"{" selected" if p == f.phase else ""}>{p}</option>' for p in PHASES)
    return (
        '<form id="filters" class="filters" method="get" action="/runs" role="search">'
        '<label for="f-ns">Namespace</label><select id="f-ns" name="namespace"><option value="">all</option>'
        f"{ns_opts}</select>"
        '<label for="f-phase">Phase</label><select id="f-phase" name="phase"><option value="">all</option>'
        f"{ph_opts}</select>"
        f'<label for="f-q">Text</label><input id="f-q" name="q" type="search" maxlength="{MAX_QUERY}" '
        f'value="{esc(f.text, MAX_QUERY + 1)}" placeholder="name, task, owner, message">'
        '<button type="submit">Filter</button></form>'
    )


def _header(title: str, user: str, csrf: str, current: str) -> str:
    return (f'<header><h1>{esc(title, 300)}</h1>{nav(current)}<div class="who">Signed in as <b id="user">'
            f'{esc(user)}</b> <form method="post" action="/logout" class="inline">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}"><button type="submit" class="link">Sign out'
            '</button></form></div><p id="live" class="note" role="status">Connecting…</p></header>')


def explorer_page(title: str, heading: str, user: str, csrf: str, live_url: str, live_text: str,
                  before: str, main: str) -> str:
    """A page of the explorer: ``before`` (not live: the filter form, the run's heading), then
    ``main``, the live part the script fetches again from ``live_url`` on every change."""
    return _shell(f"{title} · agentrun", (
        _header(heading, user, csrf, "/runs")
        + f'<main id="main" data-csrf="{esc(csrf)}" data-live="{esc(live_url, 2000)}" '
          f'data-live-text="{esc(live_text)}">{before}{main}</main>'
    ))


# ------------------------------------------------------------------------------------ run page

def lap_doc(record: Any, stored: Any = None) -> dict[str, Any]:
    """A lap as ``agentrun trace -o json`` prints it (:func:`agentrun.checkpoint.trace.lap_doc`),
    from its record and stored object."""
    return trace_lap_doc(record, getattr(stored, "key", None), getattr(stored, "sha256", None),
                         getattr(stored, "size", None))


@dataclass(frozen=True)
class ToolView:
    call_id: str
    tool: str
    status: str
    idempotency_key: str
    arguments: str
    result: str | None
    http_status: int | None
    replayed: bool


@dataclass(frozen=True)
class LapView:
    """One lap as the run page shows it (from a lap document)."""

    lap: int
    attempt: int
    outcome: str
    outcome_message: str
    started: datetime | None
    finished: datetime | None
    cost_usd: str
    total_usd: str
    tokens_in: int
    tokens_out: int
    messages: tuple[tuple[str, str], ...]  # (who, text)
    tools: tuple[ToolView, ...]
    approval_requested: datetime | None  # this lap asked for approval (pendingApproval.requestedAt)
    approval_call: str | None
    decision: str | None  # the decision this lap resumed from: "approved by alice: reason"
    decided_at: datetime | None
    key: str
    sha256: str

    @property
    def seconds(self) -> float | None:
        if self.started and self.finished:
            return max(0.0, (self.finished - self.started).total_seconds())
        return None

    @property
    def retries(self) -> int:
        return max(0, self.attempt - 1)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _t(value: object) -> datetime | None:
    return parse_time(value) if isinstance(value, str) else None


def lap_view(doc: dict[str, Any]) -> LapView:
    """A lap document (:func:`lap_doc`, one of ``agentrun trace -o json``'s ``laps``) as shown."""
    timings, usage, totals = doc.get("timings") or {}, doc.get("usage") or {}, doc.get("totals") or {}
    messages = []
    for m in doc.get("messages") or []:
        text = m.get("content") or ""
        calls = m.get("toolCalls") or []
        if calls:
            text = (text + " " if text else "") + "calls " + ", ".join(
                f"{c.get('name')}#{c.get('id')}" for c in calls if isinstance(c, dict))
        who = str(m.get("role") or "?") + (f"[{m['toolCallId']}]" if m.get("toolCallId") else "")
        messages.append((who, str(text)))
    tools = tuple(
        ToolView(call_id=str(c.get("callId") or ""), tool=str(c.get("tool") or ""), status=str(c.get("status") or ""),
                 idempotency_key=str(c.get("idempotencyKey") or ""),
                 arguments=json.dumps(c.get("arguments") or {}, sort_keys=True, ensure_ascii=False),
                 result=c.get("result") if isinstance(c.get("result"), str) else None,
                 http_status=c.get("httpStatus") if isinstance(c.get("httpStatus"), int) else None,
                 replayed=bool(c.get("replayed")))
        for c in doc.get("toolCalls") or [] if isinstance(c, dict))
    pending = doc.get("pendingApproval") or {}
    dec = doc.get("approvalDecision") or {}
    decision = None
    if dec:
        decision = f"call {dec.get('callId')} {dec.get('decision')}" + (
            f" by {dec['decidedBy']}" if dec.get("decidedBy") else "") + (f": {dec['reason']}" if dec.get("reason") else "")
    outcome = doc.get("outcome") or {}
    return LapView(
        lap=_int(doc.get("lap")), attempt=_int(doc.get("attempt")) or 1, outcome=str(outcome.get("type") or "?"),
        outcome_message=str(outcome.get("message") or ""), started=_t(timings.get("startedAt")),
        finished=_t(timings.get("finishedAt")), cost_usd=str(doc.get("costUSD") or "0.00"),
        total_usd=str(totals.get("costUSD") or "0.00"), tokens_in=_int(usage.get("inputTokens")),
        tokens_out=_int(usage.get("outputTokens")), messages=tuple(messages), tools=tools,
        approval_requested=_t(pending.get("requestedAt")), approval_call=pending.get("callId") if pending else None,
        decision=decision, decided_at=_t(dec.get("decidedAt")), key=str(doc.get("key") or ""),
        sha256=str(doc.get("sha256") or ""),
    )


@dataclass(frozen=True)
class Span:
    """A bar of the timeline: a lap (``kind`` its outcome) or an approval wait (``kind`` "wait")."""

    kind: str
    label: str
    start: datetime
    end: datetime
    lap: int


def active_lap(run: dict[str, Any]) -> tuple[int, int, datetime] | None:
    """(lap, attempt, since) of the lap Job in flight (status.activeJob), or None."""
    job = (run.get("status") or {}).get("activeJob") or {}
    since = _t(job.get("startedAt"))
    if not since or not _int(job.get("lap")):
        return None
    return _int(job.get("lap")), _int(job.get("attempt")) or 1, since


def timeline(laps: list[LapView], now: datetime, waiting_since: datetime | None = None,
             active: tuple[int, int, datetime] | None = None) -> list[Span]:
    """The laps and the approval waits between them, in time order. A wait runs from the request
    (a lap's pendingApproval) to the decision (recorded by the next lap), or to ``now`` while the
    run still waits (``waiting_since``: status.approval.requestedAt of a run AwaitingApproval).
    ``active``: the lap in flight (:func:`active_lap`), a bar up to ``now``."""
    spans: list[Span] = []
    for i, lap in enumerate(laps):
        if lap.started and lap.finished:
            retry = f", attempt {lap.attempt}" if lap.attempt > 1 else ""
            spans.append(Span(lap.outcome, f"lap {lap.lap}: {lap.outcome}{retry}, "
                                           f"{human_duration(lap.seconds or 0)}", lap.started, lap.finished, lap.lap))
        if lap.approval_requested:
            nxt = laps[i + 1] if i + 1 < len(laps) else None
            end = (nxt.decided_at or nxt.started) if nxt else (now if waiting_since else None)
            if end and end >= lap.approval_requested:
                state = "decided" if nxt else "waiting"
                spans.append(Span("wait", f"approval of {lap.approval_call} after lap {lap.lap}: {state} after "
                                          f"{human_duration((end - lap.approval_requested).total_seconds())}",
                                  lap.approval_requested, end, lap.lap))
    if active is not None and (not laps or active[0] > laps[-1].lap) and active[2] <= now:
        lap_n, attempt, since = active
        spans.append(Span("running", f"lap {lap_n} in progress, attempt {attempt}, for "
                                     f"{human_duration((now - since).total_seconds())}", since, now, lap_n))
    return spans


def timeline_svg(spans: list[Span], width: int = 720, row: int = 22) -> str:
    """The timeline as inline SVG: one row of bars (laps, and approval waits in their own color)
    on a shared time axis; each bar's ``<title>`` says what it is."""
    if not spans:
        return '<p class="note">No laps yet.</p>'
    t0 = min(s.start for s in spans)
    t1 = max(s.end for s in spans)
    total = max((t1 - t0).total_seconds(), 1e-3)
    left, right = 4, 4
    scale = (width - left - right) / total
    h = row + 20
    bars = []
    for s in spans:
        x = left + (s.start - t0).total_seconds() * scale
        w = max(2.0, (s.end - s.start).total_seconds() * scale)
        y = 2 if s.kind != "wait" else 6
        bh = row - 4 if s.kind != "wait" else row - 12
        bars.append(f'<rect class="tl-{esc(s.kind, 32)}" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bh}" '
                    f'data-lap="{s.lap}"><title>{esc(s.label, 300)}</title></rect>')
    axis = (f'<text x="{left}" y="{h - 4}" class="axis">{esc(_when(t0.isoformat()))}</text>'
            f'<text x="{width - right}" y="{h - 4}" class="axis" text-anchor="end">'
            f"+{esc(human_duration(total))}</text>")
    return (f'<svg class="timeline" viewBox="0 0 {width} {h}" role="img" aria-label="Timeline of the laps and '
            f'approval waits">{"".join(bars)}{axis}</svg>')


def cost_svg(laps: list[LapView], width: int = 360, height: int = 120) -> str:
    """Cost over laps as inline SVG: the run's total after each lap (a line with a dot per lap),
    each lap's own cost as a bar under it."""
    if not laps:
        return '<p class="note">No laps yet.</p>'
    totals = [_num(lap.total_usd) for lap in laps]
    own = [_num(lap.cost_usd) for lap in laps]
    top = max([*totals, *own, 1e-9])
    pad_l, pad_b, pad_t = 44, 18, 8
    plot_w, plot_h = width - pad_l - 6, height - pad_b - pad_t
    n = len(laps)
    step = plot_w / max(n, 1)

    def y(v: float) -> float:
        return pad_t + plot_h - (v / top) * plot_h

    bars, dots, points = [], [], []
    for i, lap in enumerate(laps):
        cx = pad_l + step * (i + 0.5)
        bw = max(1.0, step * 0.5)
        bars.append(f'<rect class="cost-lap" x="{cx - bw / 2:.1f}" y="{y(own[i]):.1f}" width="{bw:.1f}" '
                    f'height="{pad_t + plot_h - y(own[i]):.1f}"><title>lap {lap.lap}: {esc(lap.cost_usd, 32)} USD'
                    "</title></rect>")
        points.append(f"{cx:.1f},{y(totals[i]):.1f}")
        dots.append(f'<circle class="cost-dot" cx="{cx:.1f}" cy="{y(totals[i]):.1f}" r="2.5" data-lap="{lap.lap}" '
                    f'data-total="{esc(lap.total_usd, 32)}"><title>after lap {lap.lap}: {esc(lap.total_usd, 32)} USD'
                    "</title></circle>")
    axis = (f'<line class="axis" x1="{pad_l}" y1="{pad_t + plot_h}" x2="{width - 6}" y2="{pad_t + plot_h}"/>'
            f'<text class="axis" x="{pad_l - 4}" y="{pad_t + 8}" text-anchor="end">{top:.2f}</text>'
            f'<text class="axis" x="{pad_l - 4}" y="{pad_t + plot_h}" text-anchor="end">0</text>'
            f'<text class="axis" x="{pad_l}" y="{height - 4}">lap {laps[0].lap}</text>'
            f'<text class="axis" x="{width - 6}" y="{height - 4}" text-anchor="end">lap {laps[-1].lap}</text>')
    return (f'<svg class="cost" viewBox="0 0 {width} {height}" role="img" aria-label="Cost in USD over laps: the '
            f'total after each lap, and each lap\'s own cost">{"".join(bars)}'
            f'<polyline class="cost-line" points="{" ".join(points)}"/>{"".join(dots)}{axis}</svg>')


def _dur(lap: LapView) -> str:
    return f"{lap.seconds:.1f}s" if lap.seconds is not None else "-"


def lap_html(lap: LapView) -> str:
    said = "".join(f'<li><b>{esc(who, 80)}</b>: {esc(text, MAX_TEXT)}</li>' for who, text in lap.messages)
    tools = "".join(
        f'<tr class="tool" data-call="{esc(t.call_id, 130)}"><td><code>{esc(t.tool, 80)}</code> '
        f'<code class="call">{esc(t.call_id, 130)}</code></td><td class="status">{esc(t.status, 32)}'
        + (f" http {t.http_status}" if t.http_status is not None else "")
        + (' <span class="replayed">from the journal</span>' if t.replayed else "")
        + f'</td><td><code class="idem">{esc(t.idempotency_key, 600)}</code></td>'
        f'<td><code class="args">{esc(t.arguments, MAX_ARGS_SHOWN)}</code>'
        + (f'<br><span class="result">→ {esc(t.result, MAX_TEXT)}</span>' if t.result is not None else "")
        + "</td></tr>"
        for t in lap.tools)
    tools_table = ('<div class="scroll"><table class="tools"><thead><tr><th scope="col">Tool call</th><th scope="col">Status</th>'
                   '<th scope="col">Idempotency key</th><th scope="col">Arguments → result</th></tr></thead>'
                   f"<tbody>{tools}</tbody></table></div>") if tools else ""
    extra = []
    if lap.outcome_message:
        extra.append(f'<p class="outcome-msg">{esc(lap.outcome_message, MAX_TEXT)}</p>')
    if lap.approval_call:
        extra.append(f'<p class="approval">Asked for approval of call <code>{esc(lap.approval_call, 130)}</code> at '
                     f"{esc(_when(lap.approval_requested.isoformat() if lap.approval_requested else None))}</p>")
    if lap.decision:
        extra.append(f'<p class="decision">Resumed after {esc(lap.decision, 700)}</p>')
    retry = f", attempt {lap.attempt}" if lap.attempt > 1 else ""
    return (
        f'<details class="lap" id="lap-{lap.lap}" data-lap="{lap.lap}" data-attempt="{lap.attempt}" '
        f'data-outcome="{esc(lap.outcome, 32)}" data-cost="{esc(lap.cost_usd, 32)}">'
        f'<summary><b>Lap {lap.lap}</b> <span class="outcome outcome-{esc(lap.outcome, 32)}">{esc(lap.outcome, 32)}'
        f'</span>{esc(retry)} · {_dur(lap)} · {esc(lap.cost_usd, 32)} USD · {lap.tokens_in}/{lap.tokens_out} tokens'
        + (f" · {len(lap.tools)} tool call{'s' if len(lap.tools) != 1 else ''}" if lap.tools else "")
        + "</summary>"
        + "".join(extra)
        + (f'<ol class="messages">{said}</ol>' if said else "")
        + tools_table
        + f'<p class="note stored">{esc(lap.key, 600)} · sha256 <code>{esc(lap.sha256, 64)}</code></p></details>'
    )


def _approval_cell(lap: LapView) -> str:
    parts = []
    if lap.approval_call:
        parts.append(f"asked for <code>{esc(lap.approval_call, 130)}</code>")
    if lap.decision:
        parts.append(f"resumed: {esc(lap.decision, 300)}")
    return " · ".join(parts)


def lap_retries(run: dict[str, Any]) -> dict[int, str]:
    """Failed attempts per lap from status.retries (the recent laps that needed any): lap -> "N
    failed: last reason" (bounded)."""
    out = {}
    for r in ((run.get("status") or {}).get("retries") or [])[:20]:
        if isinstance(r, dict) and _int(r.get("lap")) and _int(r.get("retries")):
            n = _int(r["retries"])
            why = one_line(str(r.get("lastReason") or ""), 200)
            out[_int(r["lap"])] = f"{n} failed" + (f": {why}" if why else "")
    return out


def laps_table(laps: list[LapView], failed: dict[int, str] | None = None) -> str:
    failed = failed or {}
    rows = "".join(
        f'<tr data-lap="{lap.lap}"><td class="num"><a href="#lap-{lap.lap}">{lap.lap}</a></td>'
        f'<td class="num">{lap.attempt}'
        + (f'<br><span class="note failed-attempts">{esc(failed[lap.lap], 240)}</span>' if lap.lap in failed else "")
        + "</td>"
        + f'<td class="outcome-{esc(lap.outcome, 32)}">{esc(lap.outcome, 32)}</td>'
        f'<td>{esc(_when(lap.started.isoformat() if lap.started else None))}</td><td class="num">{_dur(lap)}</td>'
        f'<td class="num">{esc(lap.cost_usd, 32)}</td><td class="num">{len(lap.tools)}</td>'
        f"<td>{_approval_cell(lap)}</td></tr>"
        for lap in laps)
    return ('<div class="scroll"><table class="laps-table"><thead><tr><th scope="col">Lap</th>'
            '<th scope="col">Attempt</th><th scope="col">Outcome</th><th scope="col">Started</th>'
            '<th scope="col">Duration</th><th scope="col">Cost USD</th><th scope="col">Tool calls</th>'
            f'<th scope="col">Approval</th></tr></thead><tbody>{rows}</tbody></table></div>')


def events_html(events: list[dict[str, Any]] | None, refused: str | None) -> str:
    """The run's Events, newest first (at most MAX_EVENTS), or why they could not be listed."""
    if refused:
        return f'<p class="note">{esc(refused, 600)}</p>'
    if not events:
        return '<p class="empty">No Events (the API server keeps them for an hour by default).</p>'

    def last(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp")
                   or "")

    rows = "".join(
        f'<tr class="ev-{esc(str(e.get("type") or "").lower(), 16)}"><td><time datetime="{esc(last(e), 64)}">'
        f"{esc(_when(last(e)))}</time></td><td>{esc(e.get('type'), 16)}</td><td>{esc(e.get('reason'), 128)}</td>"
        f'<td class="num">{_int(e.get("count")) or 1}</td><td>{esc(e.get("message"), 1000)}</td></tr>'
        for e in sorted(events, key=last, reverse=True)[:MAX_EVENTS])
    return ('<div class="scroll"><table class="events"><thead><tr><th scope="col">Last seen</th>'
            '<th scope="col">Type</th><th scope="col">Reason</th><th scope="col">Count</th>'
            f'<th scope="col">Message</th></tr></thead><tbody>{rows}</tbody></table></div>')


def retries_text(run: dict[str, Any]) -> str | None:
    """The run's retries in place (status.lifecycle), as ``agentrun trace`` says them, or None."""
    life = ((run.get("status") or {}).get("lifecycle")) or {}
    n = _int(life.get("retries"))
    if not n:
        return None
    out = f"retried in place {n} time{'s' if n != 1 else ''}; the last by {one_line(str(life.get('lastRetryBy') or '?'), 120)}"
    if life.get("lastRetryAt"):
        out += f" at {one_line(str(life['lastRetryAt']), 40)}"
    if life.get("retriedLap") is not None:
        out += f", lap {_int(life['retriedLap'])} started again"
    return out


def run_html(run: dict[str, Any], laps: list[dict[str, Any]], laps_error: str | None, events: list[dict[str, Any]] | None,
             events_refused: str | None, now: datetime, trace_link: str | None, trace_id: str | None) -> str:
    """The live part of a run's page: its facts, timeline, cost plot, laps (from the checkpoint
    store), and Events. ``laps``: lap documents (:func:`lap_doc`), oldest first."""
    row = run_row(run, now)
    st = run.get("status") or {}
    views = [lap_view(d) for d in laps]
    ap = st.get("approval") or {}
    waiting_since = _t(ap.get("requestedAt")) if row.phase == "AwaitingApproval" else None
    facts = [("Phase", _phase_badge(row.phase)), ("Lap", str(row.lap)), ("Cost", f"{esc(row.cost_usd, 32)} USD"),
             ("Age", _age(row.created, row.age_seconds)), ("Waiting on", esc(row.waiting_on or "-", 128)),
             ("Version", esc(st.get("agentVersion") or "-", 64)),
             ("Failed attempts", str(_int(st.get("totalRetries"))))]
    if trace_id:
        facts.append(("Trace", (f'<a class="trace" href="{esc(trace_link, 700)}" rel="noopener noreferrer">'
                                f'<code>{esc(trace_id, 32)}</code></a>') if trace_link else f"<code>{esc(trace_id, 32)}</code>"))
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
    notes = []
    if row.message:
        notes.append(f'<p class="message">{esc(row.message, MAX_TEXT)}</p>')
    retries = retries_text(run)
    if retries:
        notes.append(f'<p class="note retries">{esc(retries, 600)}</p>')
    if row.phase == "AwaitingApproval":
        notes.append('<p class="notice">Waiting for a decision on call '
                     f"<code>{esc(ap.get('callId') or '?', 130)}</code> ({esc(ap.get('tool') or '?', 80)}): "
                     '<a href="/">decide in the approval inbox</a>.</p>')
    if laps_error:
        notes.append(f'<p class="notice">{esc(laps_error, 600)}</p>')
    shown = ""
    if views and views[0].lap > 1 and row.lap > PAGE_LAPS:
        shown = (f'<p class="note">The last {len(views)} laps; the earlier ones: <code>agentrun trace '
                 f"{esc(row.name)} -n {esc(row.namespace)} --from-lap 1</code>.</p>")
    return (
        f'<div id="explore" data-key="{esc(row.key)}" data-rv="{esc((run.get("metadata") or {}).get("resourceVersion"), 32)}">'
        f'<dl class="facts">{dl}</dl>{"".join(notes)}'
        f'<p class="task"><b>Task:</b> {esc(row.task, MAX_TEXT)}</p>'
        f'<section aria-labelledby="timeline-h"><h2 id="timeline-h">Timeline</h2>'
        f"{timeline_svg(timeline(views, now, waiting_since, active_lap(run)))}"
        '<p class="legend note"><span class="key tl-continue"></span> lap <span class="key tl-done"></span> last lap '
        '<span class="key tl-failed"></span> failed <span class="key tl-wait"></span> approval wait '
        '<span class="key tl-running"></span> in progress</p></section>'
        f'<section aria-labelledby="cost-h"><h2 id="cost-h">Cost over laps</h2>{cost_svg(views)}</section>'
        f'<section aria-labelledby="laps-h"><h2 id="laps-h">Laps <span class="count">({len(views)})</span></h2>'
        f'{shown}{laps_table(views, lap_retries(run)) if views else ""}{"".join(lap_html(v) for v in reversed(views))}</section>'
        f'<section aria-labelledby="events-h"><h2 id="events-h">Events</h2>{events_html(events, events_refused)}'
        "</section></div>"
    )


def run_heading(namespace: str, name: str) -> str:
    return (f'<p class="crumbs"><a href="/runs">Runs</a> / <a href="/runs?namespace={esc(quote(namespace))}">'
            f'{esc(namespace)}</a></p><h2 class="run-name"><span class="ns">{esc(namespace)}/</span>{esc(name)}</h2>')


def now_utc() -> datetime:
    return datetime.now(UTC)
