"""S3's 409 ConditionalRequestConflict (a concurrent conditional write of the key still in flight)
is retryable, never "already exists": against the S3 shim over HTTP, which answers 409 on demand."""

from __future__ import annotations

import pytest
from ckpt_builders import RUN, make_record
from e2e.s3_shim import S3Shim

from agentrun.checkpoint import s3store
from agentrun.checkpoint.errors import LapAlreadyCheckpointed, StoreUnavailable
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

pytestmark = pytest.mark.s3


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(s3store, "CONFLICT_BACKOFF_SECONDS", 0.001)


def make(shim: S3Shim) -> CheckpointStore:
    store = CheckpointStore(StoreConfig(uri="s3://conflicts/ckpt", endpoint_url=shim.endpoint_url,
                                        region="us-east-1", path_style=True))
    store.client.create_bucket(Bucket="conflicts")
    return store


def test_a_conflict_that_settles_is_retried_and_the_lap_is_written() -> None:
    with S3Shim("honour", conflicts=2) as shim:
        store = make(shim)
        stored = store.put_lap(make_record(1))
        assert shim.state.conditional_puts == 3
        assert store.get_lap(RUN, 1)[1].sha256 == stored.sha256


def test_a_conflict_then_the_other_writer_won_is_already_checkpointed() -> None:
    with S3Shim("honour") as shim:
        store = make(shim)
        store.put_lap(make_record(1))
        shim.state.conflicts = 1
        other = make_record(1).model_copy(update={"attempt": 2})
        with pytest.raises(LapAlreadyCheckpointed):
            store.put_lap(other)
        assert shim.state.conditional_puts == 3


def test_a_conflict_that_does_not_settle_is_store_unavailable_not_already_exists() -> None:
    with S3Shim("honour", conflicts=1000) as shim:
        store = make(shim)
        with pytest.raises(StoreUnavailable, match="ConditionalRequestConflict") as err:
            store.put_lap(make_record(1))
        assert not isinstance(err.value, LapAlreadyCheckpointed) and not err.value.permanent
        assert shim.state.conditional_puts == s3store.CONFLICT_RETRIES + 1
        assert shim.state.objects == {}


def test_a_journal_write_meeting_a_conflict_is_retried() -> None:
    with S3Shim("honour", conflicts=1) as shim:
        store = make(shim)
        assert store.put_journal(RUN, 1, "call-1", {"result": "ok"}) is True
        assert store.get_journal(RUN, 1, "call-1") == {"result": "ok"}
