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
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from .mcp import McpToolRef
from .text import escape_controls, truncate

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
