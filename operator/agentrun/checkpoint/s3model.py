"""A trimmed copy of botocore's S3 service model, for the checkpoint store's client.

botocore parses the whole S3 service model (``s3/2006-03-01/service-2.json.gz``, 1.7 MB of JSON:
every S3 operation with its documentation) when an S3 client is made: 12-15 ms of CPU of every lap
pod's start. The store's client loads this copy instead (``botocore_data/``, put first in the
client's data search path, before botocore's own data): the same model with only the operations
in ``OPERATIONS`` and the shapes they reach, each shape exactly as botocore has it, without the
``documentation`` strings of operations and shapes (they only feed the clients' docstrings). Everything else the client
loads (the S3 endpoint rule set, paginators, the ``sdk-extras`` of the model, endpoints,
partitions, retry rules) still comes from botocore.

The copy is made from the installed botocore by ``python -m agentrun.checkpoint.s3model`` (run it
after changing botocore's version; ``tests/checkpoint/test_s3model.py`` fails until then), and is
used only with the botocore version it was made from (``agentrun-s3-model.json``); with any other
version the client loads botocore's full model, as ``boto3.client("s3")`` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
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
DATA_DIR = Path(__file__).with_name("botocore_data")
MANIFEST = DATA_DIR / "agentrun-s3-model.json"
"""``{"botocore": <version the copy was made from>, "apiVersion": ..., "operations": [...]}``."""
SERVICE = "s3"


def data_path(botocore_version: str | None = None) -> str | None:
    """The data directory of the trimmed model when it was made from ``botocore_version`` (default:
    the installed botocore's), else None."""
    if botocore_version is None:
        import botocore

        botocore_version = botocore.__version__
    try:
        manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if manifest.get("botocore") != botocore_version:
        return None
    return str(DATA_DIR)


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


def model_file(api_version: str) -> Path:
    return DATA_DIR / SERVICE / api_version / "service-2.json"


def write() -> Path:
    """Make the trimmed copy from the installed botocore (replacing the one there was)."""
    import botocore

    api_version, model = installed_model()
    for old in DATA_DIR.glob(f"{SERVICE}/*/service-2.json"):
        old.unlink()
        old.parent.rmdir()
    path = model_file(api_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trim(model, OPERATIONS), separators=(",", ":")) + "\n",
                    encoding="utf-8")
    MANIFEST.write_text(json.dumps({"botocore": botocore.__version__, "apiVersion": api_version,
                                    "operations": sorted(OPERATIONS)}, indent=2) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write())
