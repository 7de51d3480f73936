"""What to announce about approvals and run outcomes, and how the messages look: pure functions of
AgentRun dicts (and, for which outcomes, of the AgentRunPolicies that apply to a run's namespace).

Everything in a message that a run's author or the model chose (the arguments above all, but also
the tool, the owner and the run's name) is text, never markup: control characters (ESC, newlines,
the bidirectional overrides) are escaped as in status and logs (``agentrun.api.text``), then
Slack's ``& < >`` (so ``<!channel>`` or ``<https://evil|Open the approval inbox>`` cannot ping
anyone nor show a link) and Teams' Markdown (so ``[text](url)`` is not a link) are escaped for
the format at hand. Only the inbox link (from the chart's values) is markup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agentrun.api.approval import AWAITING
from agentrun.api.lifecycle import OUTCOMES
from agentrun.api.tenancy import AgentRunPolicySpec
from agentrun.api.text import escape_controls, one_line
from agentrun.api.types import parse_time

Kind = Literal["requested", "deadline-near"]
Format = Literal["generic", "slack", "teams"]
KINDS: tuple[Kind, ...] = ("requested", "deadline-near")
FIELD = {"requested": "requestedAt", "deadline-near": "deadlineNearAt"}
SUMMARY_CHARS = 300


@dataclass(frozen=True)
class Settings:
    deadline_near_seconds: int = 600
    inbox_url: str = ""
    outcomes: tuple[str, ...] = ()
    """The outcomes announced for a run without spec.notify (AGENTRUN_NOTIFY_OUTCOMES, the chart's
    notifications.outcomes); a run's spec.notify.outcomes replaces them."""


@dataclass(frozen=True)
class Notice:
    kind: Kind
    namespace: str
    name: str
    uid: str
    call_id: str
    owner: str
    tool: str
    lap: int | None
    summary: str
    deadline: str | None
    on_timeout: str
    link: str
    target: str = ""
    """Where the call goes: "METHOD URL" (status.approval.target: no credentials in the URL)."""
    headers_secret: str = ""
    """The NAME of the Secret the call's extra headers come from (never a value)."""
    approvals: str = ""
    """"1 of 2" when more than one distinct approver is needed, else empty."""
    target_sha256: str = ""

    @property
    def idempotency_key(self) -> str:
        """Stable per run, call, target and kind: a receiver that dedupes on it sees each message once
        even if a delivery is repeated (a crash between delivery and recording it); a request asked
        again for a changed target (ApprovalStale) is a new message."""
        tail = f":{self.target_sha256[:16]}" if self.target_sha256 else ""
        return f"{self.uid}:{self.call_id}:{self.kind}{tail}"

    @property
    def about(self) -> str:
        return f"{self.kind} (call {self.call_id})"


@dataclass(frozen=True)
class OutcomeNotice:
    """A run's outcome (a terminal phase), announced once per outcome: a retried run's next outcome
    is another message (``retries`` is part of its key and of ``status.lifecycle.notified``)."""

    namespace: str
    name: str
    uid: str
    phase: str
    message: str
    retries: int
    lap: int | None
    cost_usd: str
    link: str = ""
    kind: Literal["outcome"] = "outcome"

    @property
    def idempotency_key(self) -> str:
        return f"{self.uid}:outcome:{self.phase}:{self.retries}"

    @property
    def about(self) -> str:
        return f"outcome {self.phase}"


AnyNotice = Notice | OutcomeNotice


def policy_outcomes(policies: Mapping[str, object] | None) -> tuple[str, ...] | None:
    """The outcomes the AgentRunPolicies that apply to a namespace choose for its runs without
    spec.notify: the union of ``notifications.outcomes`` of the readable policies that set it, in
    the order of :data:`OUTCOMES`; None when none sets it (or the policies are not known: ``None``),
    the operator's default then applies. A policy that sets ``[]`` takes part with nothing: alone,
    it turns the default off in its namespaces. Missing or unreadable policies (None,
    ``PolicyUnreadable``: the re-check refuses their runs) have no say. A union, not the lowest as
    for ``maxActiveRuns``: an announcement restricts nothing, and each team's policy asks for what
    it needs to hear."""
    chosen: set[str] | None = None
    for p in (policies or {}).values():
        if isinstance(p, AgentRunPolicySpec) and p.notifications.outcomes is not None:
            chosen = (chosen or set()) | set(p.notifications.outcomes)
    return None if chosen is None else tuple(o for o in OUTCOMES if o in chosen)


def namespace_outcomes(policies: Mapping[str, object] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """The outcomes announced for a namespace's runs without spec.notify: its policies' choice
    (:func:`policy_outcomes`), else ``default`` (AGENTRUN_NOTIFY_OUTCOMES, the chart's
    notifications.outcomes)."""
    chosen = policy_outcomes(policies)
    return default if chosen is None else chosen


def chosen_outcomes(run: dict[str, Any], defaults: tuple[str, ...]) -> tuple[str, ...]:
    """The outcomes announced for ``run``: its spec.notify.outcomes when it has spec.notify, else
    ``defaults`` (its namespace's: :func:`namespace_outcomes`). The precedence: the run, then its
    namespace's AgentRunPolicies, then the operator's default."""
    spec_notify = (run.get("spec") or {}).get("notify")
    if isinstance(spec_notify, dict):
        return tuple(o for o in spec_notify.get("outcomes") or () if o in OUTCOMES)
    return tuple(o for o in defaults if o in OUTCOMES)


def outcome_due(run: dict[str, Any], defaults: tuple[str, ...]) -> OutcomeNotice | None:
    """The run's outcome message when it is due: its phase is a chosen outcome and
    status.lifecycle.notified does not record it for this retry yet."""
    st = run.get("status") or {}
    phase = st.get("phase")
    if phase not in chosen_outcomes(run, defaults):
        return None
    lc = st.get("lifecycle") or {}
    retries = int(lc.get("retries") or 0)
    done = lc.get("notified") or {}
    if done.get("phase") == phase and int(done.get("retries") or 0) == retries:
        return None
    meta = run.get("metadata") or {}
    return OutcomeNotice(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
                         phase=str(phase), message=one_line(str(st.get("message") or ""), 1000), retries=retries,
                         lap=st.get("lap"), cost_usd=str((st.get("cost") or {}).get("usd") or "0.00"))


def summary(arguments: str | None) -> str:
    """A short one-line summary of the call's arguments (status holds them as JSON, cut at 4 KiB)."""
    if not arguments:
        return ""
    try:
        doc = json.loads(arguments)
    except ValueError:
        return one_line(arguments, SUMMARY_CHARS)
    if isinstance(doc, dict):
        parts = [f"{k}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}" for k, v in sorted(doc.items())]
        return one_line(", ".join(parts), SUMMARY_CHARS)
    return one_line(json.dumps(doc, ensure_ascii=False), SUMMARY_CHARS)


_SLACK = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Markdown of Adaptive Cards (TextBlock, Fact.value): emphasis, links, code, and list markers at
# the start of the text; a backslash makes any of them text.
_MD = re.compile(r"[\\`*_~\[\]()<>#|!{}]")
_MD_LIST = re.compile(r"^(\s*)(?:([-+])|(\d+)\.)(?=\s|$)")


def slack_text(text: str) -> str:
    """``text`` as literal Slack mrkdwn: controls escaped, then ``& < >`` (Slack's only escapes)."""
    return re.sub("[&<>]", lambda m: _SLACK[m.group()], escape_controls(text)[0])


def teams_text(text: str) -> str:
    """``text`` as literal Adaptive Card Markdown: controls escaped, Markdown punctuation backslashed."""
    flat = _MD.sub(lambda m: "\\" + m.group(), escape_controls(text)[0])
    return _MD_LIST.sub(lambda m: m.group(1) + ("\\" + m.group(2) if m.group(2) else m.group(3) + "\\."), flat)


def announcements(run: dict[str, Any], now: datetime, settings: Settings,
                  outcomes: tuple[str, ...] | None = None) -> list[AnyNotice]:
    """The messages due for ``run`` now, in order, none already delivered: for its pending call, or
    its outcome (spec.notify.outcomes, else ``outcomes``, its namespace's choice, else
    ``settings.outcomes``)."""
    outcome = outcome_due(run, settings.outcomes if outcomes is None else outcomes)
    if outcome is not None:
        return [outcome]
    return list(approval_announcements(run, now, settings))


def approval_announcements(run: dict[str, Any], now: datetime, settings: Settings) -> list[Notice]:
    """The approval messages due for ``run`` now, in order, none already delivered for its pending call."""
    st = run.get("status") or {}
    ap = st.get("approval") or {}
    if st.get("phase") != AWAITING or ap.get("state") != "Pending" or not ap.get("callId"):
        return []
    notified = ap.get("notified") or {}
    same = notified.get("callId") == ap["callId"] and notified.get("targetSha256") == ap.get("targetSha256")
    done = notified if same else {}
    meta = run.get("metadata") or {}
    deadline = parse_time(ap.get("deadline"))
    due: list[Kind] = []
    if not done.get(FIELD["requested"]):
        due.append("requested")
    if (deadline is not None and not done.get(FIELD["deadline-near"])
            and (deadline - now).total_seconds() <= settings.deadline_near_seconds):
        due.append("deadline-near")
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    link = f"{settings.inbox_url.rstrip('/')}/#run-{ns}.{name}" if settings.inbox_url else ""
    spec_ap = (run.get("spec") or {}).get("approval") or {}
    return [Notice(kind=k, namespace=ns, name=name, uid=meta.get("uid", ""), call_id=ap["callId"],
                   owner=str(ap.get("owner") or spec_ap.get("owner") or "unassigned"), tool=str(ap.get("tool") or ""),
                   lap=ap.get("lap"), summary=summary(ap.get("arguments")), deadline=ap.get("deadline"),
                   on_timeout=str(spec_ap.get("onTimeout", "reject")), link=link, **_target(ap)) for k in due]


def _target(ap: dict[str, Any]) -> dict[str, str]:
    """The Notice fields of the call's target and approvals, from status.approval (operator-written)."""
    target = ap.get("target") or {}
    url = target.get("url")
    required = ap.get("approvalsRequired") or 1
    return {
        "target": one_line(f"{target.get('method') or '?'} {url}", 600) if url else "",
        "headers_secret": one_line(str(target.get("headersSecret") or ""), 253),
        "approvals": f"{len(ap.get('approvedBy') or [])} of {required}" if required > 1 else "",
        "target_sha256": str(ap.get("targetSha256") or ""),
    }


def notified_patch(run: dict[str, Any], notice: AnyNotice, at: datetime) -> dict[str, Any]:
    """The status merge patch recording ``notice`` as delivered (keeps what was recorded for the
    same call; starts over for another call)."""
    if isinstance(notice, OutcomeNotice):
        return {"status": {"lifecycle": {"notified": {
            "phase": notice.phase, "retries": notice.retries, "at": at.isoformat().replace("+00:00", "Z")}}}}
    ap = (run.get("status") or {}).get("approval") or {}
    prev = ap.get("notified") or {}
    same = prev.get("callId") == notice.call_id and (prev.get("targetSha256") or "") == notice.target_sha256
    rec = {k: v for k, v in prev.items() if k in FIELD.values()} if same else {}
    rec.update({"callId": notice.call_id, FIELD[notice.kind]: at.isoformat().replace("+00:00", "Z")})
    if notice.target_sha256:
        rec["targetSha256"] = notice.target_sha256
    return {"status": {"approval": {"notified": rec}}}


_OUTCOME_TITLES = {"Succeeded": "Run succeeded", "Failed": "Run failed", "BudgetExceeded": "Run out of budget",
                   "Cancelled": "Run cancelled", "DeadlineExceeded": "Run past its deadline"}


def outcome_body(n: OutcomeNotice, fmt: Format) -> dict[str, Any]:
    """The JSON body of an outcome message in ``fmt`` (every value escaped for it)."""
    title = f"{_OUTCOME_TITLES.get(n.phase, n.phase)}: {n.namespace}/{n.name}"
    facts = [("Run", f"{n.namespace}/{n.name}"), ("Phase", n.phase), ("Message", n.message or "-"),
             ("Laps", str(n.lap if n.lap is not None else "-")), ("Cost", f"${n.cost_usd}")]
    if n.retries:
        facts.append(("Retries", str(n.retries)))
    if fmt == "slack":
        return {"text": f"*{slack_text(title)}*\n" + "\n".join(f"*{k}:* {slack_text(v)}" for k, v in facts)}
    if fmt == "teams":
        return {"type": "message", "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4",
                "body": [{"type": "TextBlock", "text": teams_text(title), "weight": "Bolder", "wrap": True},
                         {"type": "FactSet", "facts": [{"title": k, "value": teams_text(v)} for k, v in facts]}],
                "actions": [],
            },
        }]}
    return {"kind": "outcome", "title": one_line(title, 1000), "namespace": n.namespace, "name": n.name, "uid": n.uid,
            "phase": n.phase, "message": n.message, "lap": n.lap, "costUSD": n.cost_usd, "retries": n.retries,
            "idempotencyKey": n.idempotency_key}


def _title(n: Notice) -> str:
    if n.kind == "requested":
        return f"Approval needed: {n.tool} in {n.namespace}/{n.name}"
    return f"Deadline near: {n.tool} in {n.namespace}/{n.name} (until {n.deadline}, then {n.on_timeout})"


def body(n: AnyNotice, fmt: Format) -> dict[str, Any]:
    """The JSON body of one message in ``fmt``: every value escaped for it (the module's docstring)."""
    if isinstance(n, OutcomeNotice):
        return outcome_body(n, fmt)
    facts = [("Owner", n.owner), ("Run", f"{n.namespace}/{n.name}"), ("Tool", n.tool),
             ("Target", n.target or "-"), ("Headers Secret", n.headers_secret or "-"),
             ("Arguments", n.summary or "-"), ("Deadline", n.deadline or "-"), ("On timeout", n.on_timeout)]
    if n.approvals:
        facts.append(("Approvals", n.approvals))
    if fmt == "slack":
        text = f"*{slack_text(_title(n))}*\n" + "\n".join(f"*{k}:* {slack_text(v)}" for k, v in facts)
        if n.link:
            text += f"\n<{n.link}|Open the approval inbox>"
        return {"text": text}
    if fmt == "teams":
        return {
            "type": "message",
            "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "content": {
                    "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                    "version": "1.4",
                    "body": [{"type": "TextBlock", "text": teams_text(_title(n)), "weight": "Bolder", "wrap": True},
                             {"type": "FactSet", "facts": [{"title": k, "value": teams_text(v)} for k, v in facts]}],
                    "actions": ([{"type": "Action.OpenUrl", "title": "Open the approval inbox", "url": n.link}]
                                if n.link else []),
                },
            }],
        }
    return {"kind": n.kind, "title": one_line(_title(n), 1000), "namespace": n.namespace, "name": n.name,
            "uid": n.uid, "callId": n.call_id, "owner": one_line(n.owner, 1000), "tool": one_line(n.tool, 1000),
            "lap": n.lap, "target": n.target or None, "headersSecret": n.headers_secret or None,
            "approvals": n.approvals or None,
            "arguments": n.summary, "deadline": n.deadline, "onTimeout": n.on_timeout,
            "inbox": n.link or None, "idempotencyKey": n.idempotency_key}
