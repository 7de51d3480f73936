"""The trimmed S3 service model of the store's client (``agentrun.checkpoint.s3model``): made from
the installed botocore, a subset of its model with each kept shape as botocore has it, covering
every S3 operation the code calls, and loaded by ``make_client`` only with the botocore version it
was made from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import botocore
import pytest

from agentrun.checkpoint import s3model
from agentrun.checkpoint.store import StoreConfig, make_client

OPERATOR = Path(s3model.__file__).resolve().parents[1]
REGENERATE = "regenerate it: python -m agentrun.checkpoint.s3model"


def _committed() -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = json.loads(s3model.MANIFEST.read_text())
    return manifest, json.loads(s3model.model_file(manifest["apiVersion"]).read_text())


def _docless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _docless(v) for k, v in value.items() if k != "documentation"}
    if isinstance(value, list):
        return [_docless(v) for v in value]
    return value


def test_the_committed_copy_is_made_from_the_installed_botocore() -> None:
    manifest, model = _committed()
    assert manifest["botocore"] == botocore.__version__, f"the trimmed S3 model is from another botocore; {REGENERATE}"
    api_version, installed = s3model.installed_model()
    assert manifest["apiVersion"] == api_version, REGENERATE
    assert manifest["operations"] == sorted(s3model.OPERATIONS), REGENERATE
    assert model == s3model.trim(installed, s3model.OPERATIONS), REGENERATE


def test_each_kept_operation_and_shape_is_botocores_own_and_every_reference_is_kept() -> None:
    _, model = _committed()
    _, installed = s3model.installed_model()
    assert set(model["operations"]) == set(s3model.OPERATIONS)
    assert {k: v for k, v in model.items() if k not in ("operations", "shapes")} == {
        k: v for k, v in installed.items() if k not in ("operations", "shapes")}
    for name, op in model["operations"].items():
        assert op == _docless(installed["operations"][name]), name
    for name, shape in model["shapes"].items():
        assert shape == _docless(installed["shapes"][name]), name
        assert list(shape.get("members", {})) == list(installed["shapes"][name].get("members", {})), name  # order
        for ref in (shape.get("member"), shape.get("key"), shape.get("value"), *shape.get("members", {}).values()):
            assert ref is None or ref["shape"] in model["shapes"], (name, ref)
    assert len(model["shapes"]) < len(installed["shapes"]) / 2


def test_trim_refuses_an_operation_the_model_does_not_have() -> None:
    _, installed = s3model.installed_model()
    with pytest.raises(KeyError):
        s3model.trim(installed, ["GetObject", "NoSuchOperation"])


def test_the_copy_is_used_only_with_the_botocore_version_it_was_made_from() -> None:
    assert s3model.data_path(botocore.__version__) == str(s3model.DATA_DIR)
    assert s3model.data_path("0.0.1") is None
    assert s3model.data_path() == str(s3model.DATA_DIR)


def test_the_store_client_has_the_trimmed_model_and_every_operation_the_code_calls() -> None:
    """Scans the sources that use an S3 client (the store, the probe, gc: every module naming
    ``store.client`` or calling an object operation on a client) for its calls
    (``client.put_object(``, ``get_paginator("...")``): an operation added there must be added to
    ``OPERATIONS`` too."""
    client = make_client(StoreConfig(uri="s3://b-1/p", endpoint_url="http://127.0.0.1:9", region="us-east-1"))
    assert sorted(client.meta.service_model.operation_names) == sorted(s3model.OPERATIONS)
    calls: set[str] = set()
    for path in OPERATOR.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if not re.search(r"store\.client|client\.(put|get|head|list|delete)_object", text):
            continue
        calls |= set(re.findall(r"client\.([a-z][a-z0-9_]*)\(", text))
        calls |= set(re.findall(r"get_paginator\(\"([a-z0-9_]+)\"\)", text))
    calls -= {"get_paginator", "create_client"}
    assert {"put_object", "get_object", "head_object", "list_objects_v2", "delete_objects", "delete_object"} <= calls
    for method in sorted(calls):
        assert hasattr(client, method), f"the store's client calls {method} (not in s3model.OPERATIONS)"
    assert client.can_paginate("list_objects_v2")
