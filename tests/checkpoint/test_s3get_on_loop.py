"""The lean GET on the operator's event loop (controller/as3.py) against real S3 servers (moto and
versitygw): what the blocking lean GET answers (the same bytes, metadata and Last-Modified as
botocore's ``get_object``; ``NOT_FOUND`` for NoSuchKey), None for whatever it leaves to botocore
(a missing bucket, a body over the bound, an unreachable store), and the operator's lap read
(``Executor._get_lap``) making one GET on the loop and botocore's only after a None."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from ckpt_builders import RUN, make_record
from test_s3get import BotocoreGets, make_store

from agentrun.checkpoint import s3get
from agentrun.checkpoint.errors import CheckpointNotFound, StoreConfigError
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, canonical_json, sha256_hex
from agentrun.controller.as3 import AsyncS3Get

pytestmark = pytest.mark.s3
S3_REGION = "us-east-1"


def on_loop(lean: s3get.LeanGet, *keys: str) -> list[Any]:
    async def go() -> list[Any]:
        s3 = AsyncS3Get()
        try:
            return [await s3.get(lean, k) for k in keys]
        finally:
            await s3.close()

    return asyncio.run(go())


def test_the_same_answers_as_the_blocking_lean_get(s3_bucket: Any, s3_client: Any) -> None:
    store = make_store(s3_bucket)
    lean = store.lean_get
    assert lean is not None
    stored = store.put_lap(make_record(1))  # gzip, with x-amz-meta-encoding
    plain = canonical_json({"kind": "Other", "n": 1})
    odd = store.run_prefix(RUN) + "attempts/odd keys a b+c~d=é?x&y#z%41.json"
    s3_client.put_object(Bucket=s3_bucket.name, Key=odd, Body=plain, Metadata={"sha256": sha256_hex(plain)})
    urls: list[str] = []
    lean.observe(urls.append)
    keys = (stored.key, odd, store.lap_key(RUN, 9))
    got = on_loop(lean, *keys)
    assert got == [lean.get(k) for k in keys]  # Got is a frozen dataclass: bytes, metadata, time, length
    assert isinstance(got[0], s3get.Got) and got[0].body.startswith(b"\x1f\x8b")  # stored bytes, not decoded
    assert got[1].body == plain and got[2] == s3get.NOT_FOUND  # type: ignore[union-attr]
    assert len(urls) == 6 and lean.fallbacks == 0


def test_what_it_leaves_to_botocore_is_none(s3_server: Any, s3_bucket: Any) -> None:
    store = make_store(s3_bucket)
    stored = store.put_lap(make_record(1))
    small = s3get.LeanGet.for_client(store.client, store.config.endpoint_url, store.config.bucket, True,
                                     max_bytes=stored.size - 1)
    assert small is not None
    assert on_loop(small, stored.key) == [None] and small.fallbacks == 1  # a body over the bound
    gone = CheckpointStore(StoreConfig(uri="s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url,
                                       region="us-east-1", path_style=True))
    assert gone.lean_get is not None
    assert on_loop(gone.lean_get, gone.lap_key(RUN, 1)) == [None] and gone.lean_get.fallbacks == 1  # NoSuchBucket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nowhere = CheckpointStore(StoreConfig(uri="s3://nowhere-bucket/p", endpoint_url=f"http://127.0.0.1:{port}",
                                          region="us-east-1", path_style=True))
    assert nowhere.lean_get is not None
    assert on_loop(nowhere.lean_get, nowhere.lap_key(RUN, 1)) == [None]  # connection refused


def test_the_operators_lap_read_makes_one_get_and_botocores_only_after_a_none(s3_server: Any, s3_bucket: Any) -> None:
    from agentrun.controller.cache import Cache
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor

    store = make_store(s3_bucket)
    store.put_lap(make_record(1))
    ex = Executor(OperatorConfig(), None, Cache(on_change=lambda _: None))  # type: ignore[arg-type]
    assert store.lean_get is not None
    lean_urls: list[str] = []
    threads: list[str] = []
    store.lean_get.observe(lambda url: (lean_urls.append(url), threads.append(threading.current_thread().name)))
    botocore = BotocoreGets(store.client)

    async def read(s: CheckpointStore, lap: int) -> Any:
        try:
            return await ex._get_lap(s, RUN, lap)
        finally:
            await ex.aclose()

    record, stored = asyncio.run(read(store, 1))
    assert (record, stored.sha256) == (store.get_lap(RUN, 1)[0], store.head_lap(RUN, 1).sha256)  # type: ignore[union-attr]
    assert len(lean_urls) == 2 and botocore.sent == 0  # the loop's GET, then the check's own
    assert threads == ["MainThread", "MainThread"]  # on the event loop, not in a worker thread
    with pytest.raises(CheckpointNotFound):
        asyncio.run(read(store, 2))
    assert botocore.sent == 0
    gone = CheckpointStore(StoreConfig(uri="s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url,
                                       region="us-east-1", path_style=True))
    gone_gets = BotocoreGets(gone.client)
    with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket-here' does not exist"):
        asyncio.run(read(gone, 1))  # None on the loop, then botocore's error, with no second lean GET
    assert gone.lean_get is not None and gone.lean_get.fallbacks == 1 and gone_gets.sent >= 1


def _self_signed(directory: Any, name: str) -> tuple[Any, Any]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tls_versitygw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    """versitygw over https with a self-signed certificate: (endpoint, its certificate, another
    certificate the server does not use)."""
    if os.environ.get("AGENTRUN_SKIP_VERSITYGW") == "1":
        pytest.skip("AGENTRUN_SKIP_VERSITYGW=1")
    from e2e.versitygw_server import start_versitygw, stop

    d = tmp_path_factory.mktemp("versitygw-tls")
    cert, key = _self_signed(d, "server")
    other, _ = _self_signed(d, "other")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    proc, endpoint = start_versitygw(d, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                                     region=S3_REGION, tls=(cert, key))
    try:
        yield endpoint, cert, other
    finally:
        stop(proc)


def test_over_https_both_senders_verify_the_endpoint_with_the_ca_bundle(tls_versitygw: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With an https endpoint the lean GET verifies the server with the CA bundle botocore uses
    (``AWS_CA_BUNDLE``), in the lap pod (urllib3) and on the operator's loop (http1) alike; a
    server the bundle does not vouch for is left to botocore by both."""
    endpoint, cert, other = tls_versitygw
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    config = StoreConfig(uri=f"s3://t-tls-{uuid.uuid4().hex[:12]}/p", endpoint_url=endpoint, region=S3_REGION,
                         path_style=True)
    store = CheckpointStore(config)
    store.client.create_bucket(Bucket=config.bucket)
    stored = store.put_lap(make_record(1))
    lean = store.lean_get
    assert lean is not None and lean.ca_certs == str(cert)
    got = lean.get(stored.key)
    assert isinstance(got, s3get.Got) and got.content_length == stored.size
    assert on_loop(lean, stored.key, store.lap_key(RUN, 2)) == [got, s3get.NOT_FOUND]
    assert lean.fallbacks == 0
    monkeypatch.setenv("AWS_CA_BUNDLE", str(other))  # a bundle that does not vouch for the server
    wrong = CheckpointStore(config)
    assert wrong.lean_get is not None and wrong.lean_get.ca_certs == str(other)
    assert wrong.lean_get.get(stored.key) is None and on_loop(wrong.lean_get, stored.key) == [None]
    assert wrong.lean_get.fallbacks == 2


def test_a_big_lap_record_is_decoded_off_the_loop(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record over ``INLINE_DECODE_BYTES`` is fetched on the loop and decoded in a worker thread
    (the same record and object as ``store.get_lap``); a small one is decoded on the loop."""
    from agentrun.controller import execute
    from agentrun.controller.cache import Cache
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor

    store = make_store(s3_bucket)
    stored = store.put_lap(make_record(1))
    ex = Executor(OperatorConfig(), None, Cache(on_change=lambda _: None))  # type: ignore[arg-type]
    decoded_in: list[str] = []
    real = store.get_lap

    def get_lap(*a: Any, **kw: Any) -> Any:
        decoded_in.append(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(store, "get_lap", get_lap)

    async def read() -> Any:
        try:
            return await ex._get_lap(store, RUN, 1)
        finally:
            await ex.aclose()

    small = asyncio.run(read())
    monkeypatch.setattr(execute, "INLINE_DECODE_BYTES", stored.size - 1)
    big = asyncio.run(read())
    assert small[0] == big[0] == real(RUN, 1)[0] and big[1].sha256 == stored.sha256
    assert decoded_in[0] == "MainThread" and decoded_in[1] != "MainThread"


def _established_to(port: int) -> set[int]:
    """Local ports of the IPv4 TCP connections in state ESTABLISHED whose remote port is ``port``
    (``/proc/net/tcp``: the client ends of connections to the server on ``port``)."""
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(remote.split(":")[1], 16) == port:
                ports.add(int(local.split(":")[1], 16))
    return ports


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net/tcp")
@pytest.mark.parametrize("keep_alive", [True, False])
def test_the_operators_gets_reuse_one_connection_where_the_server_keeps_it(
        tmp_path: Any, keep_alive: bool) -> None:
    """Against an S3 server that keeps connections open (versitygw ``--keep-alive``, as AWS S3, MinIO
    and Ceph do) the operator's lap reads go over one connection, kept between reads; against one that
    answers ``Connection: close`` (versitygw's default, moto's server) each read has its own and none
    is left open. The same bytes either way."""
    if os.environ.get("AGENTRUN_SKIP_VERSITYGW") == "1":
        pytest.skip("AGENTRUN_SKIP_VERSITYGW=1")
    from urllib.parse import urlsplit

    from e2e.versitygw_server import start_versitygw, stop

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    proc, endpoint = start_versitygw(tmp_path, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                                     region=S3_REGION, keep_alive=keep_alive)
    try:
        port = urlsplit(endpoint).port
        assert port is not None
        config = StoreConfig(uri=f"s3://t-ka-{uuid.uuid4().hex[:12]}/p", endpoint_url=endpoint, region=S3_REGION,
                             path_style=True)
        store = CheckpointStore(config)
        store.client.create_bucket(Bucket=config.bucket)
        keys = [store.put_lap(make_record(lap)).key for lap in (1, 2, 3)]
        lean = store.lean_get
        assert lean is not None

        before = _established_to(port)  # the writes' client (botocore keeps its connection)

        async def go() -> tuple[list[Any], list[set[int]]]:
            s3, got, seen = AsyncS3Get(), [], []
            try:
                for k in keys:
                    got.append(await s3.get(lean, k))
                    seen.append(_established_to(port) - before)
            finally:
                await s3.close()
            return got, seen

        got, seen = asyncio.run(go())
        assert [g.body if isinstance(g, s3get.Got) else g for g in got] == [lean.get(k).body for k in keys]  # type: ignore[union-attr]
        assert lean.fallbacks == 0
        if keep_alive:
            assert len(seen[0]) == 1 and seen == [seen[0]] * 3, seen  # one connection, kept
        else:
            assert seen == [set()] * 3, seen  # closed after each read
    finally:
        stop(proc)
