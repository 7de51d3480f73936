"""``agentrun gc``: checkpoint prefixes in the store whose AgentRun no longer exists.

A run's objects live under ``PREFIX/<namespace>/<name>/<uid>/`` (docs/contracts.md). A prefix is an
orphan when no AgentRun with that uid exists in the cluster: its run was deleted with
``spec.checkpoint.retention: Retain`` (the default), or with ``Delete`` while the operator could
not reach the store. ``agentrun gc`` (or ``--dry-run``) lists the orphans with their object counts
and bytes; ``--delete`` deletes them. Nothing else in the store is touched (objects that are not
under a ``<namespace>/<name>/<uid>/`` prefix, e.g. ``.agentrun-probe/``, are ignored).

Race-free order: the store is listed first, the cluster second. A run created after the store
listing has no objects in that listing; a run that wrote objects before it existed before it and
is in the cluster listing. Without ``-n``, every namespace is considered (the cluster-wide list of
AgentRuns is needed); with ``-n NS`` only that namespace's prefixes and runs.

The store comes from ``--uri/--endpoint/--region/--path-style`` or the environment
(``AGENTRUN_CHECKPOINT_URI``, ``AGENTRUN_S3_ENDPOINT``, ``AGENTRUN_S3_REGION``,
``AGENTRUN_S3_PATH_STYLE``); credentials from the standard AWS chain.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click

from agentrun.checkpoint.errors import CheckpointError
from agentrun.cli.kube import CLIError, connect, current_options, kube_options, list_runs
from agentrun.cli.output import LIST_FORMATS, columns, output_option
from agentrun.cli.output import render as render_doc

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True)
class PrefixUsage:
    """The objects of one run's prefix ``<namespace>/<name>/<uid>/``."""

    namespace: str
    name: str
    uid: str
    objects: int
    bytes: int
    newest: datetime | None

    def to_api(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid, "objects": self.objects,
                "bytes": self.bytes, "newest": self.newest.isoformat() if self.newest else None}


# ------------------------------------------------------------------------------------ pure parts

def run_prefixes(objects: Iterable[tuple[str, int, datetime | None]], prefix: str) -> list[PrefixUsage]:
    """Group ``(key, size, lastModified)`` of a listing of ``prefix/`` by run prefix
    ``<namespace>/<name>/<uid>/``; keys not of that shape are ignored. Sorted by namespace, name, uid."""
    head = f"{prefix}/" if prefix else ""
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for key, size, modified in objects:
        if not key.startswith(head):
            continue
        parts = key[len(head):].split("/")
        if len(parts) < 4 or not all(_SEGMENT.match(p) for p in parts[:3]) or not parts[3]:
            continue
        slot = acc.setdefault((parts[0], parts[1], parts[2]), [0, 0, None])
        slot[0] += 1
        slot[1] += int(size)
        if modified is not None and (slot[2] is None or modified > slot[2]):
            slot[2] = modified
    return [PrefixUsage(ns, name, uid, n, b, newest) for (ns, name, uid), (n, b, newest) in sorted(acc.items())]


def orphans(usages: Iterable[PrefixUsage], live_uids: set[str], namespace: str | None = None) -> list[PrefixUsage]:
    """The prefixes whose uid is not a live AgentRun's (of ``namespace``, when given)."""
    return [u for u in usages if u.uid not in live_uids and (namespace is None or u.namespace == namespace)]


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def render(found: list[PrefixUsage], store_uri: str, deleted: Mapping[tuple[str, str, str], int] | None) -> str:
    """The text output: one row per orphan prefix, then a summary line."""
    total_objects = sum(u.objects for u in found)
    total_bytes = sum(u.bytes for u in found)
    lines = []
    if found:
        rows = [[u.namespace, u.name, u.uid, str(u.objects), str(u.bytes), human_bytes(u.bytes),
                 u.newest.strftime("%Y-%m-%dT%H:%M:%SZ") if u.newest else "<none>"] for u in found]
        lines.append(columns(["NAMESPACE", "NAME", "UID", "OBJECTS", "BYTES", "SIZE", "NEWEST"], rows))
    what = (f"{len(found)} orphan prefix(es) in {store_uri}: {total_objects} objects, {total_bytes} bytes "
            f"({human_bytes(total_bytes)})")
    if deleted is None:
        lines.append(what + (": nothing deleted (dry run); `agentrun gc --delete` deletes them" if found else ""))
    else:
        lines.append(what + f": deleted {sum(deleted.values())} objects")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the command

def _store(uri: str | None, endpoint: str | None, region: str | None, path_style: bool | None) -> Any:
    from agentrun.checkpoint.locate import resolve_store
    from agentrun.checkpoint.store import CheckpointStore, StoreConfig

    loc = resolve_store({"uri": uri, "endpoint": endpoint, "region": region, "path_style": path_style},
                        os.environ, None)
    if not loc["uri"]:
        raise CLIError("no checkpoint store: pass --uri s3://bucket/prefix (or set AGENTRUN_CHECKPOINT_URI), "
                       "the store the operator writes to (its Helm value checkpoint.uri)")
    try:
        return CheckpointStore(StoreConfig(uri=loc["uri"], endpoint_url=loc["endpoint"], region=loc["region"],
                                           path_style=bool(loc["pathStyle"])))
    except ValueError as e:
        raise CLIError(f"checkpoint store: {str(e).splitlines()[-1].strip()}") from None


def _list_store(store: Any, namespace: str | None) -> list[PrefixUsage]:
    from botocore.exceptions import BotoCoreError, ClientError

    cfg = store.config
    head = f"{cfg.prefix}/" if cfg.prefix else ""
    list_prefix = head + (f"{namespace}/" if namespace else "")
    where = f"{cfg.uri} at {cfg.endpoint_url or 'AWS S3'}"

    def objects() -> Iterable[tuple[str, int, datetime | None]]:
        pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=cfg.bucket, Prefix=list_prefix)
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"], int(item.get("Size", 0)), item.get("LastModified")

    try:
        return run_prefixes(objects(), cfg.prefix)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "error")
        raise CLIError(f"checkpoint store {where}: S3 ListObjectsV2 {list_prefix or '/'}: {code}") from None
    except BotoCoreError as e:
        raise CLIError(f"checkpoint store {where}: {type(e).__name__}") from None


@click.command("gc", short_help="Checkpoint prefixes whose AgentRun no longer exists; --delete deletes them.")
@kube_options()
@click.option("--dry-run", "dry_run", is_flag=True, default=False,
              help="Only list the orphan prefixes (the default).")
@click.option("--delete", "delete", is_flag=True, default=False, help="Delete the orphan prefixes' objects.")
@click.option("--uri", default=None, help="The store: s3://bucket/prefix (default: $AGENTRUN_CHECKPOINT_URI).")
@click.option("--endpoint", default=None, help="S3 endpoint URL (default: $AGENTRUN_S3_ENDPOINT, else AWS).")
@click.option("--region", default=None, help="S3 region (default: $AGENTRUN_S3_REGION).")
@click.option("--path-style/--no-path-style", "path_style", default=None,
              help="Path-style addressing (default: $AGENTRUN_S3_PATH_STYLE).")
@output_option(("text", *LIST_FORMATS), default="text",
               help="text (table and summary; table and wide are the same), JSON/YAML {store, dryRun, orphans, "
                    "objects, bytes}, name (NAMESPACE/NAME/UID per orphan), or jsonpath=TEMPLATE over that document.")
def gc_command(dry_run: bool, delete: bool, uri: str | None, endpoint: str | None, region: str | None,
               path_style: bool | None, output: str) -> None:
    """List checkpoint prefixes whose AgentRun (by uid) no longer exists, with objects and bytes;
    delete them only with --delete.

    Without -n every namespace is considered; with -n NS only NS."""
    if dry_run and delete:
        raise click.UsageError("--dry-run and --delete are exclusive")
    opts = current_options()
    namespace = opts.namespace  # None: every namespace (the store spans them)
    store = _store(uri, endpoint, region, path_style)
    usages = _list_store(store, namespace)  # the store first, then the cluster (see the module doc)
    api, _ = connect(opts)
    live = {(r.get("metadata") or {}).get("uid") for r in list_runs(api, namespace)}
    found = orphans(usages, {u for u in live if u}, namespace)
    deleted: dict[tuple[str, str, str], int] | None = None
    if delete:
        from agentrun.checkpoint.schema import RunRef

        deleted = {}
        for u in found:
            try:
                deleted[(u.namespace, u.name, u.uid)] = store.delete_run(
                    RunRef(namespace=u.namespace, name=u.name, uid=u.uid))
            except CheckpointError as e:
                raise CLIError(f"deleting {u.namespace}/{u.name}/{u.uid}/: {e} (deleted so far: "
                               f"{sum(deleted.values())} objects)") from None
    doc = {
        "store": store.config.uri, "dryRun": not delete,
        "orphans": [u.to_api() | ({"deleted": deleted[(u.namespace, u.name, u.uid)]} if deleted else {})
                    for u in found],
        "objects": sum(u.objects for u in found), "bytes": sum(u.bytes for u in found),
    }
    text = render_doc(output, doc, table=lambda: render(found, store.config.uri, deleted),
                      names=lambda: [f"{u.namespace}/{u.name}/{u.uid}" for u in found])
    if text or output != "name":
        click.echo(text, nl=not output.startswith("jsonpath="))
