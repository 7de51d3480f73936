"""The trimmed botocore data of the store's client (``agentrun.checkpoint.s3model``): made from the
installed botocore (a subset of its S3 model with each kept shape as botocore has it; the rest of
what an S3 client loads as botocore has it, endpoints listing S3 only), covering every S3 operation
the code calls, used only with the botocore version it was made from; and a client made with it
resolves endpoints as botocore's standard client does and keeps the standard credential chain.

The mechanism is checked on a copy made here from whatever botocore is installed (``made``), so the
tests hold with any botocore pip resolved; the committed copy is checked against the botocore the
image pins (``tools/image/requirements.txt``), and against the installed one when that is the same
version."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore
import pytest

from agentrun.checkpoint import s3model
from agentrun.checkpoint.store import StoreConfig, make_client

OPERATOR = Path(s3model.__file__).resolve().parents[1]
ROOT = OPERATOR.parents[1]
REGENERATE = "regenerate it: python -m agentrun.checkpoint.s3model"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> s3model.Copy:
    """A copy made now from the installed botocore."""
    copy = s3model.Copy(tmp_path_factory.mktemp("s3model") / "botocore_data")
    s3model.write(copy)
    return copy


@pytest.fixture
def in_use(made: s3model.Copy, monkeypatch: pytest.MonkeyPatch) -> Iterator[s3model.Copy]:
    """``made`` as the copy the store's client reads."""
    monkeypatch.setattr(s3model, "COPY", made)
    yield made


def _read(copy: s3model.Copy) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = json.loads(copy.manifest.read_text())
    return manifest, json.loads(copy.model_file(manifest["apiVersion"]).read_text())


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _docless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _docless(v) for k, v in value.items() if k != "documentation"}
    if isinstance(value, list):
        return [_docless(v) for v in value]
    return value


def _pinned(package: str) -> str:
    for line in (ROOT / "tools/image/requirements.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"{package} is not pinned in tools/image/requirements.txt")


def test_the_committed_copy_is_made_from_the_botocore_the_image_pins() -> None:
    manifest, _ = _read(s3model.COPY)
    assert manifest["botocore"] == _pinned("botocore"), f"the image pins another botocore; {REGENERATE}"
    assert manifest["operations"] == sorted(s3model.OPERATIONS), REGENERATE


def test_the_committed_copy_is_what_the_installed_botocore_makes_or_is_not_used(made: s3model.Copy) -> None:
    """With the pinned botocore installed, the committed copy is byte for byte a copy made now (and
    is used); with another botocore, it is not used: the store's client has S3's full model."""
    manifest, _ = _read(s3model.COPY)
    client = make_client(StoreConfig(uri="s3://b-1/p", endpoint_url="http://127.0.0.1:9", region="us-east-1"))
    operations = set(client.meta.service_model.operation_names)
    if manifest["botocore"] == botocore.__version__:
        assert s3model.usable()
        assert _files(s3model.COPY.root) == _files(made.root), REGENERATE
        assert operations == set(s3model.OPERATIONS)
    else:
        assert not s3model.usable()
        assert operations > set(s3model.OPERATIONS) and len(operations) > 50


def test_a_copy_holds_the_installed_model_trimmed_and_the_client_data(made: s3model.Copy) -> None:
    manifest, model = _read(made)
    assert manifest["botocore"] == botocore.__version__
    api_version, installed = s3model.installed_model()
    assert manifest["apiVersion"] == api_version
    assert manifest["operations"] == sorted(s3model.OPERATIONS)
    assert model == s3model.trim(installed, s3model.OPERATIONS)
    for name, data in s3model.client_data().items():
        assert json.loads((made.client_dir / f"{name}.json").read_text()) == data, name
    files = {p.relative_to(made.client_dir).as_posix() for p in made.client_dir.rglob("*.json")}
    assert files == {f"{name}.json" for name in s3model.client_data()}


def test_each_kept_operation_and_shape_is_botocores_own_and_every_reference_is_kept(made: s3model.Copy) -> None:
    _, model = _read(made)
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


def test_a_copy_is_used_only_with_the_botocore_version_it_was_made_from(made: s3model.Copy) -> None:
    assert s3model.usable(botocore.__version__, copy=made)
    assert s3model.usable(copy=made)
    assert not s3model.usable("0.0.1", copy=made)
    assert not s3model.usable(copy=s3model.Copy(made.root.parent / "missing"))


def test_the_endpoints_copy_keeps_every_partition_and_only_s3(made: s3model.Copy) -> None:
    endpoints = json.loads((made.client_dir / "endpoints.json").read_text())
    installed = s3model.client_data()["endpoints"]
    assert [p["partition"] for p in endpoints["partitions"]] == [p["partition"] for p in installed["partitions"]]
    for mine, theirs in zip(endpoints["partitions"], installed["partitions"]):
        assert set(mine["services"]) == {"s3"} & set(theirs["services"])
        assert {k: v for k, v in mine.items() if k != "services"} == {k: v for k, v in theirs.items() if k != "services"}


def _request(client: Any, op: str, **params: Any) -> tuple[str, ...]:
    """The URL, signing region and host of the request ``op`` would send (not sent), or the type
    and message of the error raised before sending it."""
    seen: dict[str, Any] = {}

    class Sent(Exception):
        pass

    def capture(request: Any, **_: Any) -> None:
        seen["url"] = request.url
        seen["auth"] = request.headers.get("Authorization", b"").decode()
        raise Sent

    client.meta.events.register(f"before-send.s3.{op}", capture)
    try:
        getattr(client, op_method(op))(**params)
    except Sent:
        scope = re.search(r"Credential=[^/]+/[0-9]+/([^/]+)/s3", seen["auth"])
        return seen["url"], scope[1] if scope else "", seen["url"].split("/")[2]
    except Exception as e:
        return type(e).__name__, str(e)
    raise AssertionError(f"{op} was sent")


def op_method(op: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower().replace("v_2", "v2")


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9", "https://s3.example.test:8443/"])
@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1", "cn-north-1", None])
@pytest.mark.parametrize("path_style", [False, True])
@pytest.mark.parametrize("variant", [None, "AWS_USE_DUALSTACK_ENDPOINT", "AWS_USE_FIPS_ENDPOINT"])
def test_requests_go_where_the_standard_client_sends_them(
    endpoint: str | None, region: str | None, path_style: bool, variant: str | None, monkeypatch: pytest.MonkeyPatch,
    in_use: s3model.Copy,
) -> None:
    from botocore.config import Config
    from botocore.session import Session

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    for var in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_DATA_PATH", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    if variant:
        monkeypatch.setenv(variant, "true")
    mine = make_client(StoreConfig(uri="s3://b-1/p", endpoint_url=endpoint, region=region, path_style=path_style))
    standard = Session().create_client("s3", endpoint_url=endpoint, region_name=region, config=Config(
        s3={"addressing_style": "path" if path_style else "auto"}, retries={"mode": "standard", "max_attempts": 4},
        connect_timeout=5, read_timeout=30))
    assert len(mine.meta.service_model.operation_names) < len(standard.meta.service_model.operation_names)
    assert (mine.meta.region_name, mine.meta.partition, mine.meta.endpoint_url) == (
        standard.meta.region_name, standard.meta.partition, standard.meta.endpoint_url)
    for op, params in (("GetObject", {"Bucket": "bucket-1", "Key": "a/b.json"}),
                       ("PutObject", {"Bucket": "arn:aws:s3:us-west-2:123456789012:accesspoint/ap-1", "Key": "k"}),
                       ("ListObjectsV2", {"Bucket": "bucket.with.dots", "Prefix": "p/"}),
                       ("HeadObject", {"Bucket": "bucket-1", "Key": "k"})):
        assert _request(mine, op, **params) == _request(standard, op, **params), (op, params)


def test_the_store_client_has_the_trimmed_model_and_every_operation_the_code_calls(in_use: s3model.Copy) -> None:
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


def test_web_identity_credentials_come_from_sts_through_a_standard_session(
    moto_s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_use: s3model.Copy,
) -> None:
    """The store's client with an endpoint URL (its session's data knows only S3) and no keys in the
    environment: the web identity provider of the standard chain (IRSA) calls STS (moto's, through
    AWS_ENDPOINT_URL_STS) with botocore's own STS data, and the S3 requests are signed with the
    temporary credentials STS returned."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZ2VudHJ1biJ9.")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DATA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/agentrun-lap")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto_s3_server.endpoint_url)
    client = make_client(StoreConfig(uri="s3://b-1/p", endpoint_url=moto_s3_server.endpoint_url, region="us-east-1",
                                     path_style=True))
    signed: list[str] = []
    client.meta.events.register("before-send.s3.*", lambda request, **_: signed.append(
        request.headers["Authorization"].decode()))
    bucket = "web-identity-1"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"
    keys = {re.search(r"Credential=([^/]+)/", auth)[1] for auth in signed}  # type: ignore[index]
    assert len(keys) == 1 and next(iter(keys)).startswith("ASIA"), keys  # STS's temporary keys
