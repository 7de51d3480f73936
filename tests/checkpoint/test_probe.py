"""The conditional-write probe (checkpoint/probe.py) against real HTTP servers: the S3 shim in
each of its modes (one that ignores If-None-Match, one that refuses it, one that honours it, one
that answers 409 for a while) and the real S3 servers of the suite (moto, versitygw)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.s3_shim import S3Shim

from agentrun.checkpoint.errors import StoreConfigError, StoreUnavailable
from agentrun.checkpoint.probe import PROBE_DIR, ProbeCache, probe_conditional_writes
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = pytest.mark.s3


def shim_store(shim: S3Shim, bucket: str = "probe-bucket", create: bool = True) -> CheckpointStore:
    store = CheckpointStore(StoreConfig(uri=f"s3://{bucket}/ckpt", endpoint_url=shim.endpoint_url,
                                        region="us-east-1", path_style=True))
    if create:
        store.client.create_bucket(Bucket=bucket)
    return store


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_a_store_that_ignores_if_none_match_is_unsafe_and_named() -> None:
    with S3Shim("ignore") as shim:
        store = shim_store(shim)
        result = probe_conditional_writes(store.client, store.config)
        assert not result.safe
        assert result.endpoint == shim.endpoint_url and result.bucket == "probe-bucket"
        assert "ignores the condition" in result.detail
        assert shim.state.conditional_puts == 2
        assert shim.state.objects == {}, "the probe object was not cleaned up"


def test_a_store_that_honours_if_none_match_is_safe_and_cleaned_up() -> None:
    with S3Shim("honour") as shim:
        store = shim_store(shim)
        result = probe_conditional_writes(store.client, store.config)
        assert result.safe and "412" in result.detail
        assert shim.state.conditional_puts == 2 and shim.state.objects == {}


def test_a_store_that_refuses_the_header_is_unsafe() -> None:
    with S3Shim("not-implemented") as shim:
        store = shim_store(shim)
        result = probe_conditional_writes(store.client, store.config)
        assert not result.safe and "NotImplemented (HTTP 501)" in result.detail


def test_a_conflict_in_flight_is_retried_not_taken_for_a_verdict() -> None:
    with S3Shim("honour", conflicts=0) as shim:
        store = shim_store(shim)
        sleeps: list[float] = []
        real_put = store.client.put_object
        calls = {"n": 0}

        def put_then_conflict(**kw: Any) -> Any:
            calls["n"] += 1
            out = real_put(**kw)
            if calls["n"] == 1:
                shim.state.conflicts = 2  # the next two conditional PUTs meet a write in flight
            return out

        store.client.put_object = put_then_conflict  # type: ignore[method-assign]
        result = probe_conditional_writes(store.client, store.config, sleep=sleeps.append)
        assert result.safe and len(sleeps) == 2 and shim.state.conditional_puts == 4


def test_a_conflict_that_never_settles_is_retryable() -> None:
    with S3Shim("honour", conflicts=100) as shim:
        store = shim_store(shim)
        with pytest.raises(StoreUnavailable, match="ConditionalRequestConflict"):
            probe_conditional_writes(store.client, store.config, sleep=lambda s: None)


def test_the_cache_probes_once_per_endpoint_and_bucket() -> None:
    with S3Shim("ignore") as shim:
        cache = ProbeCache()
        a, b = shim_store(shim, "bucket-a"), shim_store(shim, "bucket-b")
        assert not cache.check(a).safe
        assert not cache.check(shim_store(shim, "bucket-a", create=False)).safe
        assert shim.state.conditional_puts == 2, "a second store object for the same endpoint+bucket probed again"
        assert cache.check(b).bucket == "bucket-b"
        assert shim.state.conditional_puts == 4


def test_an_unreachable_store_is_retryable_and_not_cached() -> None:
    with S3Shim("honour") as shim:
        url = shim.endpoint_url
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1",
                                            config=Config(retries={"max_attempts": 1}, connect_timeout=2))
    store = CheckpointStore(StoreConfig(uri="s3://gone/x", endpoint_url=url, path_style=True), client=client)
    cache = ProbeCache()
    with pytest.raises(StoreUnavailable, match="cannot reach"):
        cache.check(store)
    assert cache._results == {}


def test_a_missing_bucket_is_a_config_error() -> None:
    with S3Shim("honour") as shim:
        store = shim_store(shim, "never-made", create=False)
        with pytest.raises(StoreConfigError, match="NoSuchBucket"):
            probe_conditional_writes(store.client, store.config)


def test_the_real_s3_servers_honour_if_none_match(s3_bucket: Any, s3_client: Any) -> None:
    """moto and versitygw (tests/checkpoint/conftest.py): both must pass the probe."""
    store = CheckpointStore(StoreConfig.from_env(s3_bucket.env))
    result = ProbeCache().check(store)
    assert result.safe, result.detail
    left = s3_client.list_objects_v2(Bucket=s3_bucket.name).get("Contents", [])
    assert [o["Key"] for o in left if PROBE_DIR in o["Key"]] == []


def test_the_operator_turns_the_verdict_into_an_observation() -> None:
    """controller/execute.probe_store: the probe through the process-wide cache, as decide() sees it."""
    from agentrun.checkpoint.probe import PROBES
    from agentrun.controller.execute import probe_store as _probe_store

    PROBES.clear()
    try:
        with S3Shim("ignore") as shim:
            store = shim_store(shim, "op-bucket")
            seen = _probe_store(store)
            assert (seen.kind, seen.endpoint, seen.bucket) == ("unsafe", shim.endpoint_url, "op-bucket")
            assert "ignores the condition" in (seen.detail or "")
            assert _probe_store(store).kind == "unsafe" and shim.state.conditional_puts == 2  # cached
        with S3Shim("honour") as shim:
            missing = shim_store(shim, "no-such-bucket", create=False)
            down = _probe_store(missing)
            assert down.kind == "unavailable" and "NoSuchBucket" in (down.detail or "")
            assert _probe_store(shim_store(shim, "ok-bucket")).kind == "ok"
    finally:
        PROBES.clear()

