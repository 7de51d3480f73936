"""The store's lean GetObject (checkpoint/s3get.py) against real S3 servers (moto and versitygw):
the same bytes, metadata and errors as botocore's ``get_object``, and botocore's own path for
everything it leaves (403, a missing bucket, an unreachable store)."""

from __future__ import annotations

import socket
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ckpt_builders import RUN, make_record

from agentrun.checkpoint import s3get
from agentrun.checkpoint.errors import CheckpointNotFound, StoreConfigError, StoreUnavailable
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, canonical_json, sha256_hex

pytestmark = pytest.mark.s3


def make_store(s3_bucket: Any, client: Any = None) -> CheckpointStore:
    return CheckpointStore(StoreConfig.from_env(s3_bucket.env), client=client)


class BotocoreGets:
    """Counts the GetObject requests botocore's client sends, and keeps the last one's URL and
    Authorization header."""

    def __init__(self, client: Any) -> None:
        self.sent = 0
        self.url = ""
        self.authorization = ""
        self._lock = threading.Lock()
        client.meta.events.register("before-send.s3.GetObject", self._seen)

    def _seen(self, request: Any, **_: Any) -> None:
        with self._lock:
            self.sent += 1
            self.url = request.url
            self.authorization = str(request.headers.get("Authorization", ""))


def scope(authorization: str) -> str:
    """``<date>/<region>/s3/aws4_request`` of a SigV4 Authorization header."""
    credential = authorization.split("Credential=", 1)[1].split(",", 1)[0]
    return credential.split("/", 1)[1]


def test_the_lean_get_is_on_for_a_path_style_endpoint(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    assert store.lean_get is not None


def test_same_bytes_and_metadata_as_botocore(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    assert store.lean_get is not None
    stored = store.put_lap(make_record(1))  # gzip, with x-amz-meta-encoding
    plain = canonical_json({"kind": "Other", "n": 1})
    plain_key = store.run_prefix(RUN) + "attempts/plain.json"
    s3_client.put_object(Bucket=s3_bucket.name, Key=plain_key, Body=plain, Metadata={"sha256": sha256_hex(plain)})
    for key in (stored.key, plain_key):
        got = store.lean_get.get(key)
        assert isinstance(got, s3get.Got)
        resp = s3_client.get_object(Bucket=s3_bucket.name, Key=key)
        body = resp["Body"].read()
        assert got.body == body and got.content_length == resp["ContentLength"] == len(body)
        assert got.metadata == resp["Metadata"]
        assert got.last_modified == resp["LastModified"]
    assert store.lean_get.get(stored.key).body.startswith(b"\x1f\x8b")  # type: ignore[union-attr]
    assert store.lean_get.fallbacks == 0


def test_the_lean_url_and_signing_region_are_botocores(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    assert store.lean_get is not None
    seen = BotocoreGets(store.client)
    for key in (store.lap_key(RUN, 7), "odd keys/a b+c~d=é?x&y#z%41"):
        with pytest.raises(store.client.exceptions.NoSuchKey):
            store.client.get_object(Bucket=s3_bucket.name, Key=key)
        assert store.lean_get.url(key) == seen.url
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="GET", url=store.lean_get.url(key), data=b"")
        from botocore.auth import S3SigV4Auth

        S3SigV4Auth(store.client._get_credentials().get_frozen_credentials(), "s3", store.client.meta.region_name).add_auth(request)
        assert scope(str(request.headers["Authorization"])) == scope(seen.authorization)


def test_reads_go_through_the_lean_path_not_botocore(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    store.put_lap(make_record(1))
    seen = BotocoreGets(store.client)
    record, _ = store.get_lap(RUN, 1)
    assert record.lap == 1 and seen.sent == 0
    with pytest.raises(CheckpointNotFound) as info:
        store.get_lap(RUN, 2)
    assert seen.sent == 0  # a 404 NoSuchKey is answered by the lean GET alone
    assert str(info.value) == f"checkpoint {store.lap_key(RUN, 2)} not found"


def test_not_found_is_the_same_error_as_botocores(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lean = make_store(s3_bucket)
    monkeypatch.setenv(s3get.ENV_SWITCH, "false")
    plain = make_store(s3_bucket)
    assert lean.lean_get is not None and plain.lean_get is None
    errors = []
    for store in (lean, plain):
        with pytest.raises(CheckpointNotFound) as info:
            store.get_lap(RUN, 3)
        errors.append((type(info.value), str(info.value), info.value.key, info.value.permanent))
    assert errors[0] == errors[1]


def test_a_missing_bucket_falls_back_to_botocores_error(s3_server: Any) -> None:
    config = StoreConfig(uri="s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url,
                         region="us-east-1", path_style=True)
    store = CheckpointStore(config)
    seen = BotocoreGets(store.client)
    with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket-here' does not exist"):
        store.get_lap(RUN, 1)  # 404 NoSuchBucket is not NoSuchKey: botocore's path says it
    assert seen.sent >= 1 and store.lean_get is not None and store.lean_get.fallbacks == 1


def test_a_refused_secret_falls_back_to_botocores_error(versitygw_s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = versitygw_s3_server
    name = f"t-lean-{sha256_hex(str(datetime.now(UTC)).encode())[:12]}"
    server.client().create_bucket(Bucket=name)
    config = StoreConfig(uri=f"s3://{name}/p", endpoint_url=server.endpoint_url, region=server.region, path_style=True)
    CheckpointStore(config).put_lap(make_record(1))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    errors = []
    for switch in ("true", "false"):
        monkeypatch.setenv(s3get.ENV_SWITCH, switch)
        store = CheckpointStore(config)
        seen = BotocoreGets(store.client)
        with pytest.raises(StoreConfigError) as info:
            store.get_lap(RUN, 1)
        assert seen.sent >= 1  # botocore made the request (the lean GET's 403 is not its to answer)
        errors.append((type(info.value), str(info.value), info.value.permanent))
        assert "not-the-secret" not in str(info.value)
    assert errors[0] == errors[1]
    assert "HTTP 403" in errors[0][1]


def test_an_unreachable_store_falls_back_to_botocores_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = StoreConfig(uri="s3://nowhere-bucket/p", endpoint_url=f"http://127.0.0.1:{port}",
                         region="us-east-1", path_style=True)
    errors = []
    for switch in ("true", "false"):
        monkeypatch.setenv(s3get.ENV_SWITCH, switch)
        store = CheckpointStore(config)
        seen = BotocoreGets(store.client)
        with pytest.raises(StoreUnavailable) as info:
            store.get_lap(RUN, 1)
        assert seen.sent >= 1
        errors.append((type(info.value), str(info.value), info.value.permanent))
    assert errors[0] == errors[1] and "cannot reach the store" in errors[0][1]


def test_the_lean_get_only_where_the_url_is_botocores(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(s3_bucket.env)
    assert CheckpointStore(StoreConfig.from_env({**env, "AGENTRUN_S3_PATH_STYLE": "false"})).lean_get is None
    no_endpoint = {k: v for k, v in env.items() if k != "AGENTRUN_S3_ENDPOINT"}
    assert CheckpointStore(StoreConfig.from_env(no_endpoint), client=object()).lean_get is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert CheckpointStore(StoreConfig.from_env(env)).lean_get is None
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert CheckpointStore(StoreConfig.from_env(env)).lean_get is not None
    monkeypatch.delenv("HTTP_PROXY")
    for off in ("false", "0", "no", "off"):
        monkeypatch.setenv(s3get.ENV_SWITCH, off)
        assert CheckpointStore(StoreConfig.from_env(env)).lean_get is None


def test_the_request_is_signed_with_the_current_refreshed_credentials(versitygw_s3_server: Any) -> None:
    """Credentials that refresh on every use (expiring within botocore's mandatory refresh window),
    as web identity / IRSA credentials do near their expiry: each lean GET signs with the
    credentials the provider gives at that moment."""
    import os

    from botocore.config import Config
    from botocore.credentials import CredentialProvider, CredentialResolver, RefreshableCredentials
    from botocore.session import Session

    server = versitygw_s3_server
    name = f"t-lean-{sha256_hex(str(datetime.now(UTC)).encode())[:12]}"
    server.client().create_bucket(Bucket=name)
    config = StoreConfig(uri=f"s3://{name}/p", endpoint_url=server.endpoint_url, region=server.region, path_style=True)
    stored = CheckpointStore(config).put_lap(make_record(1))
    current = {"secret": os.environ["AWS_SECRET_ACCESS_KEY"]}
    refreshes = []

    def metadata() -> dict[str, str]:
        refreshes.append(current["secret"])
        expiry = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
        return {"access_key": os.environ["AWS_ACCESS_KEY_ID"], "secret_key": current["secret"],
                "token": "", "expiry_time": expiry}

    class Provider(CredentialProvider):  # type: ignore[misc]
        METHOD = "test-refreshing"

        def load(self) -> Any:
            return RefreshableCredentials.create_from_metadata(metadata(), metadata, self.METHOD)

    session = Session()
    session.register_component("credential_provider", CredentialResolver([Provider()]))
    client = session.create_client("s3", endpoint_url=server.endpoint_url, region_name=server.region,
                                   config=Config(s3={"addressing_style": "path"}))
    store = CheckpointStore(config, client=client)
    assert store.lean_get is not None
    assert isinstance(store.lean_get.get(stored.key), s3get.Got)
    current["secret"] = "rotated-away"
    assert store.lean_get.get(stored.key) is None  # 403 with the refreshed (wrong) secret: left to botocore
    assert refreshes[-1] == "rotated-away"
    current["secret"] = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert isinstance(store.lean_get.get(stored.key), s3get.Got)
    assert store.lean_get.fallbacks == 1


def test_a_body_over_the_bound_is_left_to_botocore(s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    stored = store.put_lap(make_record(1))
    assert store.lean_get is not None
    small = s3get.LeanGet.for_client(store.client, store.config.endpoint_url, store.config.bucket, True,
                                     max_bytes=stored.size - 1)
    assert small is not None and small.get(stored.key) is None and small.fallbacks == 1
    exact = s3get.LeanGet.for_client(store.client, store.config.endpoint_url, store.config.bucket, True,
                                     max_bytes=stored.size)
    got = exact.get(stored.key) if exact is not None else None
    assert isinstance(got, s3get.Got) and len(got.body) == stored.size


@pytest.mark.parametrize("value", ["Tue, 01 Dec 2026 18:13:17 GMT", "Mon, 07 Jan 2030 00:00:59 GMT",
                                   "Tue, 01 Dec 2026 18:13:17 +0100", "2026-12-01T18:13:17Z", "1764612797"])
def test_last_modified_is_parsed_as_botocore_parses_it(value: str) -> None:
    from botocore.utils import parse_timestamp

    ours, theirs = s3get._timestamp(value), parse_timestamp(value)
    assert ours == theirs and ours.utcoffset() == theirs.utcoffset()


def test_a_key_that_needs_percent_encoding_is_read(s3_bucket: Any, s3_client: Any) -> None:
    """The lean GET sends the key as botocore encodes it: the server finds the object botocore wrote."""
    store = make_store(s3_bucket)
    assert store.lean_get is not None
    body = canonical_json({"kind": "Other"})
    key = store.run_prefix(RUN) + "attempts/odd key+é~=,;@(1).json"
    s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=body, Metadata={"sha256": sha256_hex(body)})
    got = store.lean_get.get(key)
    assert isinstance(got, s3get.Got) and got.body == body and store.lean_get.fallbacks == 0
