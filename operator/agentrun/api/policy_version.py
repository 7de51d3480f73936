"""The version marker of a generated admission document (policy or binding).

The generators (``api/admission.py``, ``api/tenancy_admission.py``) stamp every document they emit
with :data:`ANNOTATION` = the sha256 of its ``spec`` (:func:`marker`), after every rule is in place.
The operator (``controller/policycheck.py``) reads the policies and bindings the API server holds
and compares their marker with the one its own code computes: a policy installed by an older chart,
or none at all, keeps the operator unready and starts no lap (docs/operations.md, "Admission
policies"). The API server adds defaults to a stored ``spec``, so the marker is computed from the
generated document, never from the stored one: the operator compares the annotation, and checks
that the stored spec still holds every generated field (:func:`holds`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

ANNOTATION: Final = "agentrun.dev/policy-sha256"
"""Annotation of a generated policy or binding: :func:`marker` of its spec."""


def marker(doc: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``doc["spec"]`` (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(doc.get("spec") or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stamp(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with :data:`ANNOTATION` set to :func:`marker` of its spec (in place; returned)."""
    meta = doc.setdefault("metadata", {})
    meta.setdefault("annotations", {})[ANNOTATION] = marker(doc)
    return doc


def stamped(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every document of ``docs`` stamped (:func:`stamp`)."""
    return [stamp(d) for d in docs]


def holds(stored: Any, generated: Any, path: str = "spec") -> str | None:
    """None when ``stored`` (what the API server returned) holds every field of ``generated`` with
    the same value (the server may add defaulted fields, never change ours); else the path of the
    first field that differs, e.g. ``spec.validations[2].expression``."""
    if isinstance(generated, dict):
        if not isinstance(stored, dict):
            return path
        for key, value in generated.items():
            if key not in stored:
                return f"{path}.{key}"
            diff = holds(stored[key], value, f"{path}.{key}")
            if diff is not None:
                return diff
        return None
    if isinstance(generated, list):
        if not isinstance(stored, list) or len(stored) != len(generated):
            return path
        for i, (s, g) in enumerate(zip(stored, generated, strict=True)):
            diff = holds(s, g, f"{path}[{i}]")
            if diff is not None:
                return diff
        return None
    return None if stored == generated else path
