"""Where a run's checkpoint store is: the location read from flags, the run's status and spec, and
the environment, as ``agentrun trace``, ``agentrun approvals`` and the inbox find it (pure, but for
:func:`open_located`, which makes the store's client)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_OBJECT_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/(?P<key>.+)$")
_TRUE = ("true", "1", "yes")


def store_prefix_from_status(object_uri: str, namespace: str, name: str, uid: str) -> str | None:
    """``s3://bucket/PREFIX`` from the URI of a checkpoint object of the run
    (``s3://bucket/PREFIX/<ns>/<name>/<uid>/laps/00000003.json``), or None if it is not one."""
    m = _OBJECT_URI.match(object_uri or "")
    if not m:
        return None
    marker = f"{namespace}/{name}/{uid}/"
    key = m["key"]
    at = key.find(marker)
    if at < 0 or (at > 0 and key[at - 1] != "/"):
        return None
    prefix = key[:at].rstrip("/")
    return f"s3://{m['bucket']}" + (f"/{prefix}" if prefix else "")


def resolve_store(flags: Mapping[str, Any], env: Mapping[str, str], run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The store location: ``{"uri", "endpoint", "region", "pathStyle", "from": {field: source}}``.
    Sources in order: flags, status.store (the location pinned before the run's first Job, which
    the operator uses for the run's whole life), environment, spec.checkpoint, status.checkpoint.
    ``uri`` may be None (nothing names the store); the caller says so."""
    meta = (run or {}).get("metadata") or {}
    pinned = ((run or {}).get("status") or {}).get("store") or {}
    spec_ck = ((run or {}).get("spec") or {}).get("checkpoint") or {}
    st_ck = ((run or {}).get("status") or {}).get("checkpoint") or {}
    st_uri = None
    if st_ck.get("uri") and meta:
        st_uri = store_prefix_from_status(st_ck["uri"], meta.get("namespace", ""), meta.get("name", ""),
                                          meta.get("uid", ""))
    env_ps = env.get("AGENTRUN_S3_PATH_STYLE", "").strip().lower()
    candidates: dict[str, list[tuple[str, Any]]] = {
        "uri": [("flag --uri", flags.get("uri")), ("status.store.uri", pinned.get("uri")),
                ("AGENTRUN_CHECKPOINT_URI", env.get("AGENTRUN_CHECKPOINT_URI")),
                ("spec.checkpoint.uri", spec_ck.get("uri")), ("status.checkpoint.uri", st_uri)],
        "endpoint": [("flag --endpoint", flags.get("endpoint")), ("status.store.endpoint", pinned.get("endpoint")),
                     ("AGENTRUN_S3_ENDPOINT", env.get("AGENTRUN_S3_ENDPOINT")),
                     ("spec.checkpoint.endpoint", spec_ck.get("endpoint")),
                     ("status.checkpoint.endpoint", st_ck.get("endpoint"))],
        "region": [("flag --region", flags.get("region")), ("status.store.region", pinned.get("region")),
                   ("AGENTRUN_S3_REGION", env.get("AGENTRUN_S3_REGION")),
                   ("spec.checkpoint.region", spec_ck.get("region")), ("status.checkpoint.region", st_ck.get("region"))],
        "pathStyle": [("flag --path-style", flags.get("path_style")),
                      ("status.store.pathStyle", pinned.get("pathStyle") if pinned else None),
                      ("AGENTRUN_S3_PATH_STYLE", (env_ps in _TRUE) if env_ps else None),
                      ("spec.checkpoint.pathStyle", spec_ck.get("pathStyle")),
                      ("status.checkpoint.pathStyle", st_ck.get("pathStyle"))],
    }
    out: dict[str, Any] = {"uri": None, "endpoint": None, "region": None, "pathStyle": False, "from": {}}
    for field, options in candidates.items():
        for source, value in options:
            if value not in (None, ""):
                out[field] = value
                out["from"][field] = source
                break
    return out


def rewinds_of(run: Mapping[str, Any] | None) -> tuple[int, ...]:
    """The run's rewinds in place (``status.lifecycle.rewinds``) from its object; () when none (or
    not laps): which history of the store holds each lap (``CheckpointStore.along``)."""
    raw = (((run or {}).get("status") or {}).get("lifecycle") or {}).get("rewinds") or []
    if not isinstance(raw, list) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in raw):
        return ()
    return tuple(raw)


def open_located(where: Mapping[str, Any], run: Mapping[str, Any] | None = None) -> Any:
    """The :class:`~agentrun.checkpoint.store.CheckpointStore` at ``where`` (from :func:`resolve_store`),
    bound to the rewinds of ``run`` (its object) when given; a bad URI or endpoint raises ValueError,
    a refused configuration CheckpointError."""
    from agentrun.checkpoint.store import CheckpointStore, StoreConfig

    store = CheckpointStore(StoreConfig(uri=where["uri"], endpoint_url=where["endpoint"] or None,
                                        region=where["region"] or None, path_style=bool(where["pathStyle"])))
    return store.along(rewinds_of(run)) if run is not None else store
