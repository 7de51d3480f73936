"""The inbox's pages, as pure functions of AgentRun dicts and ``now``.

Every value that came from a user or an agent (names, task, arguments, reasons, lap texts) goes
through ``esc`` (HTML-escaped) after being bounded; nothing secret is ever an input here (the
session's CSRF token is the only per-person value, and it is meant to be in the page).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentrun.api.approval import AWAITING, MAX_REASON_CHARS, StoredCall, binding, queue_rows
from agentrun.api.lifecycle import APPROVAL_WITHDRAWN
from agentrun.api.text import one_line
from agentrun.api.types import human_duration, parse_time
from agentrun.inbox.laps import LapSummary

MAX_TASK = 2000
MAX_ARGUMENTS = 256 * 1024  # characters of pretty JSON shown; beyond: cut, with the sha256 of all of it
MAX_FIELD = 256
MAX_HISTORY = 50
MAX_URL = 512  # characters of a call's target URL shown
MAX_APPROVERS_SHOWN = 5


def esc(value: object, limit: int = MAX_FIELD) -> str:
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=True)


@dataclass(frozen=True)
class Card:
    """One pending approval as shown."""

    namespace: str
    name: str
    resource_version: str
    owner: str
    tool: str
    lap: int | None
    call_id: str | None
    task: str
    cost_usd: str
    requested_at: str | None
    deadline: str | None
    age_seconds: int | None
    seconds_left: int | None
    on_timeout: str
    arguments: str
    arguments_source: str
    sha256: str | None
    can_decide: bool
    warnings: tuple[str, ...] = ()
    laps: tuple[LapSummary, ...] = ()
    laps_error: str | None = None
    target: str | None = None  # what the call will run: "POST https://... · headers from Secret x"
    target_sha256: str | None = None
    approvals: str | None = None  # "1 of 2 approvals (alice)"
    agent: str | None = None  # of a run of an Agent: "Agent NAME version V" (status.agent)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def dom_id(self) -> str:
        return f"run-{self.namespace}.{self.name}"


def target_text(ap: dict[str, Any]) -> str | None:
    """What the pending call will run, from ``status.approval.target`` (written by the operator when
    the call starts waiting: method, URL without credentials, the headers Secret's name, the
    image), one line, control characters escaped, bounded; None when the run has no target (runs
    from before it was recorded)."""
    t = ap.get("target")
    if not isinstance(t, dict):
        return None
    call = " ".join(p for p in (one_line(str(t.get("method") or ""), 16).upper(),
                                one_line(str(t.get("url") or ""), MAX_URL)) if p)
    parts = [call] if call else []
    if t.get("headersSecret"):
        parts.append(f"headers from Secret {one_line(str(t['headersSecret']), 253)}")
    if t.get("image"):
        parts.append(f"image {one_line(str(t['image']), 300)}")
    return " · ".join(parts) or None


def approvals_text(ap: dict[str, Any]) -> str | None:
    """"N of M approvals (who)" from ``status.approval.approvalsRequired`` and ``approvedBy``; None
    when the run has neither (runs from before four eyes)."""
    required, by = ap.get("approvalsRequired"), ap.get("approvedBy")
    if required is None and not by:
        return None
    users: list[str] = []
    for entry in by if isinstance(by, list) else []:
        u = entry.get("user") if isinstance(entry, dict) else None
        if isinstance(u, str) and u and u not in users:
            users.append(u)
    m = required if isinstance(required, int) and not isinstance(required, bool) and required > 0 else 1
    shown = ", ".join(one_line(u, 64) for u in users[:MAX_APPROVERS_SHOWN])
    if len(users) > MAX_APPROVERS_SHOWN:
        shown += f", … ({len(users) - MAX_APPROVERS_SHOWN} more)"
    return f"{len(users)} of {m} approvals" + (f" ({shown})" if shown else "")


def agent_text(pinned: object) -> str | None:
    """"Agent NAME version V" from ``status.agent`` (the definition a run of an Agent runs, pinned by
    the operator), one line, bounded; None for a run with its own spec.agent."""
    if not isinstance(pinned, dict) or not pinned.get("name"):
        return None
    return f"Agent {one_line(str(pinned['name']), 253)} version {one_line(str(pinned.get('version') or '?'), 63)}"


def waiting(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if (r.get("status") or {}).get("phase") == AWAITING]


def card(run: dict[str, Any], now: datetime, stored: StoredCall, laps: list[LapSummary], laps_error: str | None,
         can_decide: bool) -> Card:
    """The card of a run in phase AwaitingApproval (``queue_rows`` gives owner, age, deadline)."""
    row = queue_rows([run], now)[0]
    meta = run.get("metadata") or {}
    st = run.get("status") or {}
    ap = st.get("approval") or {}
    _, sha, warnings = binding(run, stored)
    if stored.arguments is not None:
        args = json.dumps(stored.arguments, indent=2, sort_keys=True, ensure_ascii=False)
        source = f"from the checkpoint store (lap {stored.lap})"
    else:
        raw = ap.get("arguments") or ""
        try:
            args = json.dumps(json.loads(raw), indent=2, sort_keys=True, ensure_ascii=False) if raw else "{}"
        except ValueError:
            args = raw
        source = "from status, cut at 4 KiB" if ap.get("argumentsTruncated") else "from status"
    if len(args) > MAX_ARGUMENTS:
        args = args[:MAX_ARGUMENTS] + "\n… (cut for display; the sha256 is of the full arguments)"
    return Card(
        namespace=row["namespace"], name=row["name"], resource_version=str(meta.get("resourceVersion", "")),
        owner=row["owner"], tool=row["tool"], lap=row["lap"], call_id=row["callId"],
        task=str((run.get("spec") or {}).get("task") or ""), cost_usd=str((st.get("cost") or {}).get("usd", "0.00")),
        requested_at=row["requestedAt"], deadline=row["deadline"], age_seconds=row["ageSeconds"],
        seconds_left=row["secondsLeft"], on_timeout=row["onTimeout"], arguments=args, arguments_source=source,
        sha256=sha, can_decide=can_decide, warnings=tuple(warnings), laps=tuple(laps), laps_error=laps_error,
        target=target_text(ap), target_sha256=_hex(ap.get("targetSha256")), approvals=approvals_text(ap),
        agent=agent_text(st.get("agent")),
    )


def _hex(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= 128 and all(c in "0123456789abcdef" for c in value) \
        else None


def history_rows(runs: list[dict[str, Any]], limit: int = MAX_HISTORY) -> list[dict[str, Any]]:
    """The latest decision of each run (status.approval once decided or timed out), newest first."""
    rows = []
    for run in runs:
        meta = run.get("metadata") or {}
        ap = (run.get("status") or {}).get("approval") or {}
        if ap.get("state") not in ("Approved", "Rejected", "TimedOut", APPROVAL_WITHDRAWN):
            continue
        at, by, reason = ap.get("decidedAt"), ap.get("decidedBy"), ap.get("reason")
        if ap.get("state") == APPROVAL_WITHDRAWN:  # the run was cancelled (or ran out of time) while it waited
            lc = (run.get("status") or {}).get("lifecycle") or {}
            at, by, reason = lc.get("cancelledAt"), lc.get("cancelledBy"), lc.get("cancelReason")
            if not lc.get("cancelledAt"):
                reason = (run.get("status") or {}).get("message")
        rows.append({
            "namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "tool": ap.get("tool", ""),
            "callId": ap.get("callId", ""), "state": ap["state"], "decidedBy": by or "",
            "reason": reason or "", "decidedAt": at or "",
            "_sort": parse_time(at) or parse_time(ap.get("deadline")) or datetime.min.replace(tzinfo=UTC),
        })
    rows.sort(key=lambda r: (r["_sort"], r["namespace"], r["name"]), reverse=True)
    for r in rows:
        del r["_sort"]
    return rows[:limit]


# ------------------------------------------------------------------------------------------ HTML

def deadline_text(seconds_left: int | None) -> str:
    if seconds_left is None:
        return "no deadline"
    return "overdue" if seconds_left <= 0 else f"{human_duration(seconds_left)} left"


def _laps_html(c: Card) -> str:
    if c.laps_error:
        return f'<p class="note">{esc(c.laps_error, 400)}</p>'
    if not c.laps:
        return '<p class="note">No laps read.</p>'
    items = []
    for lap in c.laps:
        said = "".join(f'<p class="said">{esc(s, 700)}</p>' for s in lap.said)
        tools = "".join(
            f'<li><code>{esc(t)}</code> <span class="status">{esc(s)}</span> <code class="args">{esc(a, 300)}</code>'
            + (f'<br><span class="result">→ {esc(r, 700)}</span>' if r else "") + "</li>"
            for t, s, a, r in lap.tools)
        items.append(f'<li><b>Lap {esc(lap.lap)}</b> <span class="note">{esc(lap.outcome)}, '
                     f'{esc(lap.cost_usd)} USD</span>{said}' + (f"<ul>{tools}</ul>" if tools else "") + "</li>")
    return f'<ol class="laps">{"".join(items)}</ol>'


def card_html(c: Card, csrf: str) -> str:
    rid = esc(c.dom_id)
    facts = [
        ("Owner", esc(c.owner)), ("Tool", f"<code>{esc(c.tool)}</code>"),
        ("Lap", esc(c.lap if c.lap is not None else "?")), ("Call", f"<code>{esc(c.call_id or '?')}</code>"),
        ("Cost so far", f"{esc(c.cost_usd, 32)} USD"),
        ("Requested", f'<time datetime="{esc(c.requested_at or "")}" data-since="{esc(c.requested_at or "")}">'
                      + (f"{esc(human_duration(c.age_seconds))} ago" if c.age_seconds is not None else "?") + "</time>"),
        ("Deadline", f'<time class="countdown" datetime="{esc(c.deadline or "")}" '
                     f'data-deadline="{esc(c.deadline or "")}">{esc(deadline_text(c.seconds_left))}</time>'),
        ("On timeout", esc(c.on_timeout)),
    ]
    if c.approvals:
        facts.append(("Approvals", f'<span class="approvals">{esc(c.approvals, 600)}</span>'))
    if c.agent:
        facts.append(("Runs", f'<span class="agent">{esc(c.agent, 400)}</span>'))
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
    if c.target:  # first and full width: where the call goes is what an approver must see
        dl = ('<div class="wide"><dt>Will run</dt><dd><code class="target">'
              f"{esc(c.target, MAX_URL + 700)}</code></dd></div>") + dl
    warn = "".join(f"<li>{esc(w, 600)}</li>" for w in c.warnings)
    if c.can_decide and not (c.call_id and c.sha256):
        action = ('<p class="readonly">This call cannot be bound to what is shown (its call id or arguments digest '
                  'is unknown); decide with <code>agentrun approvals show</code> and <code>agentrun approve</code>.</p>')
    elif c.can_decide:
        action = (
            f'<form class="decide" method="post" action="/decide" data-key="{esc(c.key)}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="namespace" value="{esc(c.namespace)}">'
            f'<input type="hidden" name="name" value="{esc(c.name)}">'
            f'<input type="hidden" name="callId" value="{esc(c.call_id or "")}">'
            f'<input type="hidden" name="sha256" value="{esc(c.sha256 or "")}">'
            + (f'<input type="hidden" name="targetSha256" value="{esc(c.target_sha256)}">' if c.target_sha256 else "")
            + f'<label for="{rid}-reason">Reason <span class="note">(required to reject)</span></label>'
            f'<textarea id="{rid}-reason" name="reason" rows="2" maxlength="{MAX_REASON_CHARS}"></textarea>'
            '<div class="buttons">'
            '<button type="submit" name="decision" value="approve" class="approve">Approve</button>'
            '<button type="submit" name="decision" value="reject" class="reject">Reject</button>'
            "</div>"
            '<p class="result" role="status" aria-live="polite"></p>'
            "</form>"
        )
    else:
        action = (f'<p class="readonly">Read-only: you do not have the <code>approve</code> permission on '
                  f'agentruns in namespace {esc(c.namespace)}.</p>')
    return (
        f'<article class="card" id="{rid}" data-key="{esc(c.key)}" data-rv="{esc(c.resource_version)}" '
        f'aria-labelledby="{rid}-h">'
        f'<h3 id="{rid}-h"><span class="ns">{esc(c.namespace)}/</span>{esc(c.name)}</h3>'
        f'<dl class="facts">{dl}</dl>'
        f'<p class="task"><b>Task:</b> {esc(c.task, MAX_TASK)}</p>'
        f'<details open><summary>Arguments <span class="note">{esc(c.arguments_source)}</span></summary>'
        f'<p class="sha">sha256 <code>{esc(c.sha256 or "unknown")}</code></p>'
        f'<pre class="args">{esc(c.arguments, MAX_ARGUMENTS + 100)}</pre></details>'
        f'<details><summary>Recent laps</summary>{_laps_html(c)}</details>'
        + (f'<ul class="warn">{warn}</ul>' if warn else "")
        + action + "</article>"
    )


def _when(value: str) -> str:
    """An API time as ``2026-12-01 10:52:43Z`` (seconds, UTC), or ``-``."""
    t = parse_time(value)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"


def history_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return '<p class="empty">No decisions yet.</p>'
    body = "".join(
        f'<tr data-key="{esc(r["namespace"] + "/" + r["name"])}"><td><time datetime="{esc(r["decidedAt"])}">'
        f'{esc(_when(r["decidedAt"]))}</time></td><td>{esc(r["decidedBy"] or "-")}</td>'
        f'<td>{esc(r["namespace"])}/{esc(r["name"])}</td><td><code>{esc(r["tool"])}</code> '
        f'<code>{esc(r["callId"])}</code></td><td class="state-{esc(r["state"].lower())}">{esc(r["state"])}</td>'
        f"<td>{esc(r['reason'], MAX_REASON_CHARS)}</td></tr>"
        for r in rows)
    return ('<div class="scroll"><table><thead><tr><th scope="col">When</th><th scope="col">Who</th>'
            '<th scope="col">Run</th><th scope="col">Call</th><th scope="col">Decision</th>'
            f'<th scope="col">Reason</th></tr></thead><tbody>{body}</tbody></table></div>')


def main_html(cards: list[Card], history: list[dict[str, Any]], csrf: str, notices: list[str]) -> str:
    """The live part of the page (replaced by the script on every watch event)."""
    notes = "".join(f'<p class="notice">{esc(n, 600)}</p>' for n in notices)
    pending = "".join(card_html(c, csrf) for c in cards) or '<p class="empty">Nothing is waiting for a decision.</p>'
    return (
        f'<section id="pending" aria-labelledby="pending-h"><h2 id="pending-h">Waiting for a decision '
        f'<span class="count">({len(cards)})</span></h2>{notes}<div id="cards">{pending}</div></section>'
        f'<section id="history" aria-labelledby="history-h"><h2 id="history-h">Recent decisions</h2>'
        f"{history_html(history)}</section>"
    )


def _shell(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        '<link rel="stylesheet" href="/static/app.css"></head>'
        f'<body>{body}<script src="/static/app.js" defer></script></body></html>'
    )


def nav(current: str) -> str:
    """The links between the inbox's pages: the approvals (/) and the run explorer (/runs)."""
    links = (("/", "Approvals"), ("/runs", "Runs"))
    return '<nav class="tabs">' + "".join(
        f'<a href="{h}"' + (' aria-current="page"' if h == current else "") + f">{t}</a>" for h, t in links) + "</nav>"


def page_html(user: str, main: str, csrf: str) -> str:
    return _shell("Approvals · agentrun inbox", (
        f'<header><h1>Approval inbox</h1>{nav("/")}<div class="who">Signed in as <b id="user">'
        f'{esc(user)}</b> <form method="post" action="/logout" class="inline">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}"><button type="submit" class="link">Sign out</button>'
        '</form></div><p id="live" class="note" role="status">Connecting…</p></header>'
        f'<main id="main" data-csrf="{esc(csrf)}">{main}</main>'
    ))


def login_html(error: str | None, proxy_note: str | None = None, csrf: str | None = None) -> str:
    """The sign-in page. ``csrf``: the form's token (bound to the sign-in cookie); without it (proxy
    mode) there is no form. A token in the link (``/login#token=``, ``make dev``) is filled in by
    the script, never sent by it: signing in takes a click (no login CSRF by link)."""
    err = f'<p class="error" role="alert">{esc(error, 300)}</p>' if error else ""
    form = (
        '<p>Paste a Kubernetes bearer token (for example <code>kubectl create token NAME</code>, or your '
        'OIDC ID token). The API server checks it (TokenReview), now and every few minutes; the inbox keeps '
        'your name and groups, and the token only encrypted in a signed cookie.</p>'
        '<form method="post" action="/login" id="login-form">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="off" required maxlength="16384">'
        '<p id="from-link" class="notice" hidden>A token from the link you opened is filled in. Sign in only '
        'if you asked for this link yourself: whoever made it chooses who you are signed in as.</p>'
        '<button type="submit">Sign in</button></form>'
    ) if csrf else ""
    body = (
        '<header><h1>Approval inbox</h1></header><main id="login"><h2>Sign in</h2>' + err + form
        + (f'<p class="note">{esc(proxy_note, 300)}</p>' if proxy_note else "") + "</main>"
    )
    return _shell("Sign in · agentrun inbox", body)


def message_html(title: str, text: str) -> str:
    return _shell(f"{title} · agentrun inbox", f'<header><h1>{esc(title)}</h1></header><main><p>{esc(text, 2000)}'
                                               '</p><p><a href="/">Back to the inbox</a></p></main>')
