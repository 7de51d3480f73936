"""The approval contract: annotation names, the call binding and the bounds of what a human writes.

Imported by every side that touches a decision: the admission policies' generator (crds/ and
the chart), the operator's ``decide()``, the CLI and the tests. Nothing here does I/O.

A decision reaches a run in one of two ways:

* annotations on the AgentRun (``kubectl annotate agentrun NAME approved=true``, or
  ``agentrun approve``), optionally bound to the call the person saw with
  :data:`ANN_CALL_ID` and :data:`ANN_ARGUMENTS_SHA256`;
* a status patch of ``status.approval.decision``.

Either way the API server, not the client, records who decided (admission stamps
``request.userInfo.username`` into :data:`ANN_DECIDED_BY` / ``status.approval.decidedBy``), and the
API server checks the :data:`APPROVE_VERB` permission on ``agentruns`` before it accepts one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from .mcp import McpToolRef
from .text import escape_controls, one_line, truncate
from .types import parse_time

if TYPE_CHECKING:
    from .spec import ToolSpec

# --- annotations a person (or `agentrun approve`) writes -------------------------------------
ANN_APPROVED: Final = "approved"
"""``true`` or ``false``: the decision itself (kept short so it can be typed by hand)."""
ANN_REASON: Final = "agentrun.dev/reason"
ANN_REASON_SHORT: Final = "reason"
"""The reason given with a decision (either key; the long one wins)."""
ANN_CALL_ID: Final = "agentrun.dev/call-id"
"""Optional binding: the id of the pending call the decision is for."""
ANN_ARGUMENTS_SHA256: Final = "agentrun.dev/arguments-sha256"
"""Optional binding: :func:`arguments_sha256` of the full arguments the person saw."""
ANN_TARGET_SHA256: Final = "agentrun.dev/target-sha256"
"""Optional binding: the :func:`target_sha256` (``status.approval.targetSha256``) of the target the
person saw; a decision whose digest differs from the pending call's is refused."""

# --- annotations only admission writes --------------------------------------------------------
ANN_DECIDED_BY: Final = "agentrun.dev/decided-by"
"""The authenticated user who set :data:`ANN_APPROVED`, stamped by the MutatingAdmissionPolicy
(a value sent by a client is overwritten; on clusters without it, a ValidatingAdmissionPolicy
requires it to equal the requesting user)."""

ANN_CREATED_BY: Final = "agentrun.dev/created-by"
"""The authenticated user who created the run, stamped at CREATE by the MutatingAdmissionPolicy
(a value sent by a client is overwritten; on clusters without it, a ValidatingAdmissionPolicy
requires it to equal the requesting user). Nobody may add, change or remove it afterwards. With
``spec.approval.distinctFromCreator: true`` that user may not decide the run's approvals. Not a
decision annotation: the operator never removes it."""

DECISION_ANNOTATIONS: Final = (
    ANN_APPROVED, ANN_REASON, ANN_REASON_SHORT, ANN_CALL_ID, ANN_ARGUMENTS_SHA256, ANN_DECIDED_BY,
    ANN_TARGET_SHA256,
)
"""Every annotation of a decision: consumed (removed) together by the operator."""

# --- authorization ----------------------------------------------------------------------------
APPROVE_VERB: Final = "approve"
"""The custom RBAC verb on ``agentruns`` (group agentrun.dev) that deciding needs, checked by
the admission policy's ``authorizer`` (like ``approve`` on ``signers`` for CSRs). ``patch`` on
``agentruns`` alone does not let anyone decide."""

# --- bounds of values a person writes (checked before anything reaches status, logs or Events) --
MAX_REASON_CHARS: Final = 1024
MAX_DECIDED_BY_CHARS: Final = 256
MAX_CALL_ID_CHARS: Final = 64
SHA256_HEX_CHARS: Final = 64
MAX_APPROVERS: Final = 5
"""Most distinct approvers ``spec.approval.approvers`` may require (and ``status.approval.approvedBy`` holds)."""
MAX_TARGET_URL_CHARS: Final = 512
"""The URL of a call's target as status, the CLI and notifications show it (the digest binds the whole URL)."""
MAX_IMAGE_CHARS: Final = 1024
TARGET_DIGEST_VERSION: Final = 1
"""Bumped when :func:`target_sha256` covers something else: a decision recorded under another version
is stale (asked again), never silently accepted."""


def canonical_arguments(arguments: dict[str, Any]) -> bytes:
    """The bytes a call's arguments are digested over: JSON with sorted keys, no spaces, UTF-8."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def arguments_sha256(arguments: dict[str, Any]) -> str:
    """sha256 (hex) of :func:`canonical_arguments`: what binds a decision to the call it approves."""
    return hashlib.sha256(canonical_arguments(arguments)).hexdigest()


# --- the target: what a call does besides its arguments --------------------------------------------

def tool_definition(tool: ToolSpec | McpToolRef | None) -> dict[str, Any] | None:
    """The part of a tool's declaration that decides what its call does, as the pydantic model dumps
    it by alias with every default spelled out (so an explicit default and an omitted field digest
    the same): ``name``, ``http`` (url, method, timeout, maxResultBytes, headersSecretRef),
    ``parameters``, ``sideEffects``, ``requiresApproval``. ``description`` is left out: it is what
    the model is told, not what the call does (editing it does not make a pending approval stale).
    None: the tool is not declared (any more). An MCP tool (``api.mcp.McpToolRef``): its
    ``definition()``, which binds the server's URL and the tool's name, so an approved MCP call
    cannot be redirected by editing the spec."""
    if tool is None:
        return None
    if isinstance(tool, McpToolRef):
        return tool.definition()
    doc = tool.model_dump(by_alias=True, mode="json")
    doc.pop("description", None)
    return doc


def target_sha256(tool: ToolSpec | McpToolRef | None, image: str, arguments_digest: str) -> str:
    """sha256 (hex) over everything that decides what an approved call does: the tool's
    :func:`tool_definition`, the lap image that runs it (``spec.agent.image``, else the operator's
    default: the effective one), and :func:`arguments_sha256` of its arguments. Computed by the lap
    (from the spec and image it ran with, into the checkpoint's pending approval), by the operator
    (``status.approval.targetSha256``, which a decision is bound to) and by the lap that executes the
    call (it refuses to send a call whose digest differs from the decision's)."""
    doc = {"v": TARGET_DIGEST_VERSION, "tool": tool_definition(tool), "image": image,
           "argumentsSha256": arguments_digest}
    return hashlib.sha256(canonical_arguments(doc)).hexdigest()


def shown_url(url: str, limit: int = MAX_TARGET_URL_CHARS) -> str:
    """A tool URL as status, the CLI and notifications show it: no user info (credentials), the
    query's values hidden (they may hold tokens; its keys stay), no fragment; control characters
    escaped; at most ``limit`` characters. The digest binds the full URL: a change anywhere in it
    makes a pending decision stale, even where this form hides it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = parts.port
    except ValueError:
        return truncate(escape_controls(url.split("://", 1)[0])[0], 16) + "://(unparsable URL)"
    shown = f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}"
    if parts.query:
        keys = [kv.split("=", 1)[0] for kv in parts.query.split("&") if kv]
        shown += "?" + "&".join(f"{k}=…" for k in keys)
    return truncate(escape_controls(shown)[0], limit)


def call_target(tool: ToolSpec | McpToolRef | None, image: str) -> dict[str, str | None]:
    """What a person is shown of where an approved call goes: ``method``, ``url`` (:func:`shown_url`),
    ``headersSecret`` (the NAME of the Secret the extra headers come from, never a value) and the
    lap ``image``; the camelCase keys of ``status.approval.target``."""
    if tool is None:
        return {"method": None, "url": None, "headersSecret": None,
                "image": truncate(escape_controls(image)[0], MAX_IMAGE_CHARS)}
    if isinstance(tool, McpToolRef):  # an MCP tool: the server's URL, the method names the protocol
        mref = tool.server.headers_secret_ref
        return {"method": "MCP", "url": shown_url(tool.server.url),
                "headersSecret": mref.name if mref is not None else None,
                "image": truncate(escape_controls(image)[0], MAX_IMAGE_CHARS)}
    ref = tool.http.headers_secret_ref
    return {"method": tool.http.method, "url": shown_url(tool.http.url),
            "headersSecret": ref.name if ref is not None else None,
            "image": truncate(escape_controls(image)[0], MAX_IMAGE_CHARS)}


def target_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """What differs between two :func:`call_target` forms, named as a person reads them
    (``url http://a/x -> http://b/x``); empty when the shown forms are equal (then the change is in
    what the target does not show: the parameters, timeout, result bound, sideEffects,
    requiresApproval or the hidden part of the URL)."""
    old, new = old or {}, new or {}
    labels = {"method": "method", "url": "url", "headersSecret": "headers Secret", "image": "image"}
    return [f"{label} {old.get(k) or '(none)'} -> {new.get(k) or '(none)'}"
            for k, label in labels.items() if (old.get(k) or None) != (new.get(k) or None)]


# --- a pending approval and a decision, as the CLI, the inbox and the operator read them ------
# (pure: AgentRun dicts in, rows, digests and patches out; the I/O is each caller's)

AWAITING: Final = "AwaitingApproval"
"""The phase of a run waiting for a decision on one call (``status.approval``)."""


def approvals_text(ap: dict[str, Any]) -> str:
    """"1 of 2": the distinct approvals so far of the required ones (status.approval.approvedBy,
    approvalsRequired); a decided approval counts what decided it."""
    required = ap.get("approvalsRequired")
    required = required if isinstance(required, int) and not isinstance(required, bool) and required > 0 else 1
    done = len([v for v in ap.get("approvedBy") or [] if isinstance(v, dict)])
    if ap.get("state") == "Approved":
        done = max(done, 1)
    return f"{min(done, required)} of {required}"


def target_text(ap: dict[str, Any], limit: int = 512) -> str:
    """Where the call goes: "METHOD URL" (status.approval.target: no credentials), one line."""
    target = ap.get("target") or {}
    if not isinstance(target, dict) or not target.get("url"):
        return "<unknown>"
    return one_line(f"{target.get('method') or '?'} {target['url']}", limit)



def queue_rows(runs: list[dict[str, Any]], now: datetime, owner: str | None = None) -> list[dict[str, Any]]:
    """The approval queue: one row per run in phase AwaitingApproval (optionally of one owner),
    oldest request first (then namespace, name). ``now`` must be timezone-aware."""
    rows = []
    for run in runs:
        st = run.get("status") or {}
        if st.get("phase") != AWAITING:
            continue
        meta = run.get("metadata") or {}
        spec_ap = (run.get("spec") or {}).get("approval") or {}
        ap = st.get("approval") or {}
        who = ap.get("owner") or st.get("waitingOn") or spec_ap.get("owner") or "unassigned"
        if owner is not None and who != owner:
            continue
        requested = parse_time(ap.get("requestedAt")) or parse_time(meta.get("creationTimestamp"))
        deadline = parse_time(ap.get("deadline"))
        rows.append({
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "owner": who,
            "tool": ap.get("tool") or "",
            "target": ap.get("target") or None,
            "targetSha256": ap.get("targetSha256"),
            "approvals": approvals_text(ap),
            "approvedBy": [v.get("user") for v in ap.get("approvedBy") or [] if isinstance(v, dict)],
            "lap": ap.get("lap", st.get("lap")),
            "callId": ap.get("callId"),
            "requestedAt": ap.get("requestedAt"),
            "deadline": ap.get("deadline"),
            "ageSeconds": int((now - requested).total_seconds()) if requested else None,
            "secondsLeft": int((deadline - now).total_seconds()) if deadline else None,
            "onTimeout": spec_ap.get("onTimeout", "reject"),
            "_sort": requested or datetime.max.replace(tzinfo=UTC),
        })
    rows.sort(key=lambda r: (r["_sort"], r["namespace"], r["name"]))
    for r in rows:
        del r["_sort"]
    return rows


@dataclass(frozen=True)
class StoredCall:
    """The pending call as the checkpoint store holds it (``arguments`` None: not readable)."""

    arguments: dict[str, Any] | None = None
    call_id: str | None = None
    lap: int | None = None
    error: str | None = None

    @property
    def sha256(self) -> str | None:
        return arguments_sha256(self.arguments) if self.arguments is not None else None

    @classmethod
    def of(cls, record: Any) -> StoredCall:
        """The pending call a lap record (``checkpoint.schema.LapRecord``) holds, or why it holds none."""
        pending = record.pending_approval
        if pending is None:
            return cls(error=f"lap {record.lap} in the checkpoint store has no pending approval")
        return cls(arguments=dict(pending.arguments), call_id=pending.call_id, lap=record.lap)


def approval_lap(run: Mapping[str, Any]) -> int | None:
    """The lap whose record holds the run's pending call: status.approval.lap, else status.lap
    (None: no lap yet)."""
    st = run.get("status") or {}
    lap = (st.get("approval") or {}).get("lap") or st.get("lap")
    return int(lap) if lap else None


def binding(run: dict[str, Any], stored: StoredCall) -> tuple[str | None, str | None, list[str]]:
    """(call id, arguments sha256, warnings) of the pending call, for showing and for a decision.
    The call id is status.approval.callId; the digest is the store's (of the full arguments) when
    the store holds that call, else status.approval.argumentsSha256 (written by the operator)."""
    ap = ((run.get("status") or {}).get("approval")) or {}
    call_id = ap.get("callId")
    status_sha = ap.get("argumentsSha256")
    warnings = []
    sha = None
    if stored.arguments is not None and stored.call_id not in (None, call_id):
        warnings.append(f"the checkpoint store's pending call is {stored.call_id}, status says {call_id}: "
                        "the run moved on; show it again")
    elif stored.arguments is not None:
        sha = stored.sha256
        if status_sha and status_sha != sha:
            warnings.append(f"the sha256 of the arguments in the checkpoint store ({sha}) differs from "
                            f"status.approval.argumentsSha256 ({status_sha}): do not decide before finding out why")
    if sha is None and status_sha:
        sha = status_sha
    if stored.error:
        warnings.append(f"full arguments not read from the checkpoint store: {stored.error}")
    return call_id, sha, warnings


def decision_patch(approve: bool, reason: str | None, resource_version: str | None, *,
                   call_id: str | None = None, sha256: str | None = None, decided_by: str | None = None,
                   target_sha256: str | None = None) -> dict[str, Any]:
    """The metadata merge patch of a decision: the annotations a user would type with kubectl, plus
    the binding of the call that was shown (call id, arguments sha256, target sha256) and the decider. With the
    resourceVersion the run was read at, the API server refuses the patch (409) if the run changed
    in between (e.g. timed out), so the check and the decision are one step."""
    annotations = {ANN_APPROVED: "true" if approve else "false"}
    if reason:
        annotations[ANN_REASON] = reason
    if call_id:
        annotations[ANN_CALL_ID] = call_id
    if sha256:
        annotations[ANN_ARGUMENTS_SHA256] = sha256
    if target_sha256:
        annotations[ANN_TARGET_SHA256] = target_sha256
    if decided_by:
        annotations[ANN_DECIDED_BY] = decided_by
    meta: dict[str, Any] = {"annotations": annotations}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def refusal(e: Any) -> str | None:
    """The API server's message of a refused decision (an admission policy's, naming the missing
    permission), or None when the error carries none."""
    try:
        body = json.loads(getattr(e, "body", None) or "{}")
    except (TypeError, ValueError):
        return None
    msg = body.get("message") if isinstance(body, dict) else None
    if not msg:
        return None
    # "agentruns.agentrun.dev "x" is forbidden: ValidatingAdmissionPolicy '...' with binding '...'
    # denied request: <the policy's message>": keep the policy's message
    marker = "denied request: "
    return str(msg.split(marker, 1)[1] if marker in msg else msg)
