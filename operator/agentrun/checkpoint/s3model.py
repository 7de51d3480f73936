"""The data botocore loads for the checkpoint store's S3 client, trimmed to what that client needs.

Making an S3 client, botocore parses the whole S3 service model (``s3/2006-03-01/service-2.json.gz``:
every S3 operation with its documentation) and the endpoints of every AWS service
(``endpoints.json``), after listing its data directory (every AWS service) twice, at every lap
pod's start (what that costs, and what the trimmed data saves: bench/analysis.md). Made from the
installed botocore's data by ``python -m agentrun.checkpoint.s3model`` into ``botocore_data/``:

- ``model/``: the S3 service model with only the operations in ``OPERATIONS`` and the shapes they
  reach, each as botocore has it, without the ``documentation`` strings of operations and shapes
  (they only feed the clients' docstrings);
- ``client/``: the rest of what an S3 client loads, as botocore has it, except ``endpoints.json``
  whose partitions list only the S3 service: the S3 model's ``sdk-extras``, its endpoint rule set
  and paginators, ``partitions.json``, ``sdk-default-configuration.json``, ``_retry.json``.

``session(endpoint_url, region)`` is the botocore session the store's client is made from:

- with an endpoint URL (an S3-compatible store, or S3 through a given endpoint) and no
  ``AWS_DATA_PATH``: a session whose data loader knows only ``model/`` and ``client/``, and whose
  credential and token providers are those of a standard session (``create_credential_resolver``
  with the client's region, as the session makes them), so the credential chain's own clients
  (STS for web identity, SSO, sign-in) are made by that standard session with botocore's data.
  With an endpoint URL, botocore's endpoint resolution does not depend on whether
  ``endpoints.json`` is its own (``args.py``, ``compute_endpoint_resolver_builtin_defaults``);
- otherwise (AWS's own endpoints): a standard session whose data search path has ``model/`` before
  botocore's data (after ``AWS_DATA_PATH``): only the S3 model is the trimmed one.

The copy is used only with the botocore version it was made from (``agentrun-s3-model.json``); with
any other version the session is a standard one, as ``boto3.client("s3")`` uses, until it is made
again. The committed copy is made from the botocore the image pins (``tools/image/requirements.txt``;
``tests/checkpoint/test_s3model.py`` fails when the two differ); an environment that resolved another
botocore (a plain ``pip install``) gets the standard data, and the tests check the mechanism on a
copy made from whatever botocore is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPERATIONS = (
    # the store, the conditional-write probe and gc (paginated ListObjectsV2)
    "DeleteObject", "DeleteObjects", "GetObject", "HeadObject", "ListObjectsV2", "PutObject",
    # what botocore's S3 client calls by itself: HeadBucket (finding a bucket's region after a
    # redirect), CreateSession (S3 Express directory buckets)
    "CreateSession", "HeadBucket",
    # the tests, benchmarks and `make dev` create their buckets with the store's client
    "CreateBucket",
)  # fmt: skip


@dataclass(frozen=True)
class Copy:
    """Where a trimmed copy lives: ``root/model``, ``root/client`` and its manifest."""

    root: Path

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def client_dir(self) -> Path:
        return self.root / "client"

    @property
    def manifest(self) -> Path:
        """``{"botocore": <version the copy was made from>, "apiVersion": ..., "operations": [...]}``."""
        return self.root / "agentrun-s3-model.json"

    def model_file(self, api_version: str) -> Path:
        return self.model_dir / SERVICE / api_version / "service-2.json"


COPY = Copy(Path(__file__).with_name("botocore_data"))
"""The copy shipped in the package (and the image)."""
SERVICE = "s3"
CLIENT_DATA = ("endpoints", "partitions", "sdk-default-configuration", "_retry")
SERVICE_DATA = ("service-2.sdk-extras", "endpoint-rule-set-1", "paginators-1", "paginators-1.sdk-extras")


def usable(botocore_version: str | None = None, copy: Copy | None = None) -> bool:
    """Whether the copy (default: ``COPY``) was made from ``botocore_version`` (default: the
    installed botocore's)."""
    copy = copy or COPY
    if botocore_version is None:
        import botocore

        botocore_version = botocore.__version__
    try:
        manifest = json.loads(copy.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(manifest.get("botocore") == botocore_version)


def session(endpoint_url: str | None, region: str | None, copy: Copy | None = None) -> Any:
    """The botocore session to make the store's S3 client from (see above), with the copy
    ``copy`` (default: ``COPY``)."""
    import os

    from botocore.loaders import Loader, create_loader
    from botocore.session import Session

    copy = copy or COPY
    standard = Session()
    if not usable(copy=copy):
        return standard
    data_path = standard.get_config_variable("data_path")
    if endpoint_url and not data_path:
        from botocore.credentials import create_credential_resolver
        from botocore.tokens import create_token_resolver

        s3 = Session()
        s3.register_component("data_loader", Loader(
            extra_search_paths=[str(copy.model_dir), str(copy.client_dir)], include_default_search_paths=False))
        region_name = region or standard.get_config_variable("region")  # as Session.create_client
        s3.register_component("credential_provider", create_credential_resolver(standard, region_name=region_name))
        s3.register_component("token_provider", create_token_resolver(standard))
        return s3
    paths = [data_path, str(copy.model_dir)]
    standard.register_component("data_loader", create_loader(os.pathsep.join(p for p in paths if p)))
    return standard


def trim(model: Mapping[str, Any], operations: Iterable[str]) -> dict[str, Any]:
    """``model`` (a botocore service model) with only ``operations`` and the shapes they reach
    (input, output, errors, recursively), without the ``documentation`` strings of operations and
    shapes (the rest as it is: ``clientContextParams`` requires its own). Raises KeyError for an
    operation the model does not have."""
    shapes = model["shapes"]
    ops = {name: model["operations"][name] for name in sorted(operations)}
    kept: set[str] = set()
    todo = [ref["shape"] for op in ops.values()
            for ref in (op.get("input"), op.get("output"), *op.get("errors", ())) if ref]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        shape = shapes[name]
        refs = [shape.get("member"), shape.get("key"), shape.get("value"), *shape.get("members", {}).values()]
        todo.extend(ref["shape"] for ref in refs if ref)
    return {**model, "operations": _without_documentation(ops),
            "shapes": _without_documentation({name: shapes[name] for name in sorted(kept)})}


def _without_documentation(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_documentation(v) for k, v in value.items() if k != "documentation"}
    if isinstance(value, list):
        return [_without_documentation(v) for v in value]
    return value


def installed_model() -> tuple[str, dict[str, Any]]:
    """The API version and the raw service model (no ``sdk-extras`` merged) of S3 in the installed
    botocore's own data."""
    from botocore.loaders import Loader

    loader = Loader(include_default_search_paths=False, extra_search_paths=[Loader.BUILTIN_DATA_PATH])
    api_version = loader.determine_latest_version(SERVICE, "service-2")
    return api_version, loader.load_data(f"{SERVICE}/{api_version}/service-2")


def client_data() -> dict[str, Any]:
    """``client/``'s files (path under it without ``.json`` -> data) from the installed botocore."""
    from botocore.loaders import Loader

    loader = Loader(include_default_search_paths=False, extra_search_paths=[Loader.BUILTIN_DATA_PATH])
    api_version = loader.determine_latest_version(SERVICE, "service-2")
    files: dict[str, Any] = {name: loader.load_data(name) for name in CLIENT_DATA}
    endpoints = files["endpoints"]
    files["endpoints"] = {**endpoints, "partitions": [
        {**p, "services": {k: v for k, v in p["services"].items() if k == SERVICE}} for p in endpoints["partitions"]]}
    for name in SERVICE_DATA:
        files[f"{SERVICE}/{api_version}/{name}"] = loader.load_data(f"{SERVICE}/{api_version}/{name}")
    return files


def write(copy: Copy | None = None) -> Path:
    """Make the copy (default: ``COPY``) from the installed botocore (replacing the one there was)."""
    import shutil

    import botocore

    copy = copy or COPY
    api_version, model = installed_model()
    shutil.rmtree(copy.root, ignore_errors=True)
    path = copy.model_file(api_version)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(trim(model, OPERATIONS), separators=(",", ":")) + "\n", encoding="utf-8")
    for name, data in client_data().items():
        target = copy.client_dir / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    copy.manifest.write_text(json.dumps({"botocore": botocore.__version__, "apiVersion": api_version,
                                         "operations": sorted(OPERATIONS)}, indent=2) + "\n", encoding="utf-8")
    return copy.root


if __name__ == "__main__":
    print(write())
