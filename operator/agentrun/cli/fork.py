"""``agentrun fork RUN --from-lap N --name NEW``: time travel. Creates the AgentRun NEW with RUN's
spec and ``spec.forkFrom {name, uid, lap}``; the operator copies RUN's state through lap N into
NEW's own store prefix (the fork snapshot) and runs lap N+1 onwards as NEW. RUN, its CR and its
checkpoint objects are only read.

``fork_body`` (the new object) is pure; the command checks up front that lap N was checkpointed
(one HEAD request to the store) so a typo is refused in one line instead of a failed run.
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

import click
import yaml

from agentrun.api.crdgen import GROUP, KIND, PLURAL, VERSION
from agentrun.checkpoint.errors import CheckpointError, CheckpointNotFound
from agentrun.checkpoint.locate import resolve_store
from agentrun.checkpoint.schema import RunRef
from agentrun.cli.kube import CLIError, api_error, connect, current_options, get_run, kube_options, unreachable
from agentrun.cli.trace import open_store, store_error

LABEL_FORKED_FROM = "agentrun.dev/forked-from"
ANN_FORKED_FROM = "agentrun.dev/forked-from"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def fork_body(source: dict[str, Any], new_name: str, lap: int) -> dict[str, Any]:
    """The new AgentRun: the source's spec (without ``suspend``), ``spec.forkFrom`` naming the
    source's name, uid and ``lap``, a label and an annotation pointing back at the source."""
    meta = source.get("metadata") or {}
    spec = copy.deepcopy(source.get("spec") or {})
    spec.pop("suspend", None)
    spec["forkFrom"] = {"name": meta["name"], "uid": meta["uid"], "lap": lap}
    labels = {}
    if len(meta["name"]) <= 63 and _LABEL_VALUE.match(meta["name"]):
        labels[LABEL_FORKED_FROM] = meta["name"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": new_name,
            "namespace": meta.get("namespace"),
            "labels": labels,
            "annotations": {ANN_FORKED_FROM: f"{meta.get('namespace')}/{meta['name']} uid {meta['uid']} lap {lap}"},
        },
        "spec": spec,
    }


@click.command("fork", short_help="A new run NEW that continues RUN from lap N (time travel).")
@click.argument("run")
@kube_options()
@click.option("--from-lap", "lap", type=click.IntRange(min=1), required=True,
              help="The checkpointed lap of RUN to continue from; NEW starts at lap N+1.")
@click.option("--name", "new_name", required=True, help="Name of the new AgentRun (same namespace).")
@click.option("--dry-run", is_flag=True, help="Print the new AgentRun (YAML) instead of creating it.")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True,
              help="text (one line), or the created object as JSON/YAML.")
@click.option("--uri", default=None, help="Store s3://bucket/prefix (default: env, spec, status).")
@click.option("--endpoint", default=None, help="S3 endpoint URL (default: env, spec, status; else AWS).")
@click.option("--region", default=None, help="S3 region.")
@click.option("--path-style/--no-path-style", default=None, help="Path-style addressing (MinIO, moto).")
def fork_command(run: str, lap: int, new_name: str, dry_run: bool, output: str, uri: str | None,
                 endpoint: str | None, region: str | None, path_style: bool | None) -> None:
    """Create NEW, a run that continues RUN from its lap N (time travel). RUN is left untouched.

    NEW gets RUN's spec and spec.forkFrom {name, uid, lap}. The operator copies RUN's state through
    lap N into NEW's own checkpoint prefix and runs lap N+1 onwards as NEW: totals (laps, tokens,
    cost) carry over through lap N, a pending approval of lap N is asked again, and the tool calls
    of NEW's laps get NEW's idempotency keys (their side effects happen anew)."""
    from kubernetes.client.exceptions import ApiException

    if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", new_name) or len(new_name) > 253:
        raise click.BadParameter(f"{new_name!r} is not a valid object name (lower-case DNS subdomain)",
                                 param_hint="--name")
    opts = current_options()
    api, ns = connect(opts)
    source = get_run(api, ns, run)
    st = source.get("status") or {}
    last = int(st.get("lap") or 0)
    if lap > last:
        raise CLIError(f'lap {lap} of agentrun "{run}" was never checkpointed (its last checkpointed lap is {last})')
    where = resolve_store({"uri": uri, "endpoint": endpoint, "region": region, "path_style": path_style},
                          os.environ, source)
    if not where["uri"]:
        raise CLIError(f'no checkpoint store known for agentrun "{run}": pass --uri or set AGENTRUN_CHECKPOINT_URI')
    store = open_store(where, source)
    ref = RunRef(namespace=ns, name=run, uid=source["metadata"]["uid"])
    outcome = None
    try:
        if not store.has_state(ref, lap):
            raise CLIError(f'lap {lap} of agentrun "{run}" was never checkpointed (no laps/{lap:08d}.json under '
                           f"{where['uri']}/{store.run_prefix(ref)})")
        try:
            outcome = store.get_lap(ref, lap)[0].outcome.type
        except CheckpointNotFound:  # a (fork) snapshot only
            pass
    except CheckpointError as e:
        raise store_error(e, where) from None
    body = fork_body(source, new_name, lap)
    if dry_run:
        click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
        return
    try:
        created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    except ApiException as e:
        if e.status == 409:
            raise CLIError(f'agentrun "{new_name}" already exists in namespace "{ns}"') from None
        if e.status == 422:
            raise CLIError(f'agentrun "{new_name}" refused by the API server: {_api_message(e)}') from None
        raise api_error(e, f'create agentrun "{new_name}" in namespace "{ns}"') from None
    except Exception as e:
        raise unreachable(e) from None
    if output == "json":
        click.echo(json.dumps(created, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(created, sort_keys=False), nl=False)
    else:
        click.echo(f"agentrun {ns}/{new_name} created: continues {run} (uid {ref.uid}) from lap {lap}; its next lap "
                   f"is {lap + 1}. {run} is left untouched.")
    if outcome in ("done", "failed"):
        click.echo(f"warning: lap {lap} of {run} ended the run ({outcome}); the fork ends there too", err=True)


def _api_message(e: Any) -> str:
    try:
        return str(json.loads(e.body).get("message", "")).splitlines()[0]
    except (TypeError, ValueError, AttributeError, IndexError):
        return str(getattr(e, "reason", e))
