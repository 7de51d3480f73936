"""Client CPU and wall time of one lap-record read, as the lap makes it (``CheckpointStore.get_lap``,
blocking) and as the operator makes it (``Executor._get_lap`` on its event loop), against the same
record (~500 B gzip) on moto or versitygw over loopback.

With ``--python`` (repeatable) each interpreter (a venv with another checkout of agentrun installed,
e.g. main's) measures in a child process, the children interleaved in rounds against the same server
and object, so that old and new see the same load::

    nice -n 10 python bench/bench_lap_read.py --s3 versitygw --python /work/old/.venv/bin/python \\
        --python .venv/bin/python

Prints per read, p50 over the rounds: the client's CPU (``time.process_time``: the process, its
threads included) and the wall time, per interpreter and path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # e2e/ (versitygw)
sys.path.insert(2, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "checkpoint"))

BUCKET, K = "bench-lap-read", 10


def measure(fn: Callable[[], Any], reads: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(reads):
        fn()
    return (time.process_time() - c0) / reads, (time.perf_counter() - t0) / reads


def store_at(endpoint: str) -> Any:
    from agentrun.checkpoint.store import CheckpointStore, StoreConfig

    return CheckpointStore(StoreConfig(uri=f"s3://{BUCKET}/runs", endpoint_url=endpoint, region="us-east-1",
                                       path_style=True, snapshot_every=K))


def child(endpoint: str, reads: int) -> None:
    """One round in this interpreter: ``reads`` reads per path after a warm-up; prints JSON."""
    from ckpt_builders import RUN

    import agentrun
    from agentrun.controller.cache import Cache
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import Executor

    store = store_at(endpoint)
    ex = Executor(OperatorConfig(), None, Cache(on_change=lambda _: None))  # type: ignore[arg-type]
    want = store.get_lap(RUN, 1)[0]

    def lap_read() -> None:
        assert store.get_lap(RUN, 1)[0] == want

    async def operator_reads(n: int) -> None:
        for _ in range(n):
            record, _ = await ex._get_lap(store, RUN, 1)
            assert record == want

    loop = asyncio.new_event_loop()
    try:
        def operator_read_batch() -> None:
            loop.run_until_complete(operator_reads(1))

        for fn in (lap_read, operator_read_batch):  # warm: connections, credentials, caches
            measure(fn, 10)
        figures = {"lap": measure(lap_read, reads), "operator": measure(operator_read_batch, reads)}
        loop.run_until_complete(ex.aclose())
    finally:
        loop.close()
    print(json.dumps({"agentrun": os.path.dirname(agentrun.__file__), **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3", choices=("moto", "versitygw"), default="versitygw")
    parser.add_argument("--reads", type=int, default=500, help="reads per path and interpreter (rounds of 50)")
    parser.add_argument("--python", action="append", help="interpreters to compare (default: this one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.child:
        child(args.child, args.reads)
        return
    from bench_lap_run import start_moto
    from ckpt_builders import make_record

    pythons = args.python or [sys.executable]
    tmp = tempfile.TemporaryDirectory(prefix="bench-lap-read-")
    if args.s3 == "versitygw":
        from e2e.versitygw_server import start_versitygw, stop

        proc, endpoint = start_versitygw(Path(tmp.name), os.environ["AWS_ACCESS_KEY_ID"],
                                         os.environ["AWS_SECRET_ACCESS_KEY"])
    else:
        proc, endpoint = start_moto()
    rounds = max(1, args.reads // 50)
    rows: dict[str, list[dict[str, Any]]] = {p: [] for p in pythons}
    try:
        store = store_at(endpoint)
        store.client.create_bucket(Bucket=BUCKET)
        stored = store.put_lap(make_record(1, payload=200))
        for _ in range(rounds):
            for py in pythons:
                out = subprocess.run([py, __file__, "--child", endpoint, "--reads", "50"], check=True,
                                     capture_output=True, text=True)
                rows[py].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        if args.s3 == "versitygw":
            stop(proc)
        else:
            proc.terminate()
            proc.wait(timeout=10)
        tmp.cleanup()
    print(f"one lap-record read ({stored.size} B gzip) on {args.s3}, {rounds} rounds of 50 per path and "
          f"interpreter, interleaved, load {os.getloadavg()[0]:.1f}:")
    for py, got in rows.items():
        print(f"  {got[0]['agentrun']} ({py}):")
        for path in ("lap", "operator"):
            cpu = statistics.median(r[path][0] for r in got)
            wall = statistics.median(r[path][1] for r in got)
            print(f"    {path:8s} client CPU p50 {cpu * 1e3:.3f} ms per read, wall p50 {wall * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
