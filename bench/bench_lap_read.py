"""Client CPU and wall time of one checkpoint GET: botocore's ``get_object`` beside the store's lean
GET (``operator/agentrun/checkpoint/s3get.py``), the same gzip object (~500 B, a lap record's size), on moto
or versitygw over loopback, interleaved in rounds so both see the same load::

    nice -n 10 python bench/bench_s3get.py --s3 versitygw --gets 500

Prints per GET: the client's CPU (``time.process_time``, this process only) and the wall time,
p50 over the rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # e2e/ (versitygw)

from bench_lap_run import start_moto  # noqa: E402

from agentrun.checkpoint import s3get  # noqa: E402
from agentrun.checkpoint.codec import encode_object  # noqa: E402
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, sha256_hex  # noqa: E402


def measure(fn: Callable[[], Any], gets: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(gets):
        fn()
    return (time.process_time() - c0) / gets, (time.perf_counter() - t0) / gets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3", choices=("moto", "versitygw"), default="versitygw")
    parser.add_argument("--gets", type=int, default=500, help="GETs per path (in rounds of 50)")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    tmp = tempfile.TemporaryDirectory(prefix="bench-s3get-")
    if args.s3 == "versitygw":
        from e2e.versitygw_server import start_versitygw, stop

        proc, endpoint = start_versitygw(Path(tmp.name), os.environ["AWS_ACCESS_KEY_ID"],
                                         os.environ["AWS_SECRET_ACCESS_KEY"])
    else:
        proc, endpoint = start_moto()
    try:
        config = StoreConfig(uri="s3://bench-s3get/runs", endpoint_url=endpoint, region="us-east-1", path_style=True)
        store = CheckpointStore(config)
        if store.lean_get is None:
            raise SystemExit(f"the lean GET is off ({s3get.ENV_SWITCH}={os.environ.get(s3get.ENV_SWITCH)!r})")
        store.client.create_bucket(Bucket="bench-s3get")
        key = "runs/bench/object.json"
        body = encode_object({"kind": "LapRecord", "text": " ".join(f"word{i}" for i in range(150))})
        store.client.put_object(Bucket="bench-s3get", Key=key, Body=body, Metadata={"sha256": sha256_hex(body)})
        lean = store.lean_get

        def botocore_get() -> None:
            store.client.get_object(Bucket="bench-s3get", Key=key)["Body"].read()

        def lean_get() -> None:
            if not isinstance(lean.get(key), s3get.Got):
                raise SystemExit("the lean GET fell back to botocore")

        for fn in (botocore_get, lean_get):  # warm: connections, credentials, botocore's caches
            measure(fn, 20)
        rounds = max(1, args.gets // 50)
        figures: dict[str, list[tuple[float, float]]] = {"botocore": [], "lean": []}
        for _ in range(rounds):
            figures["botocore"].append(measure(botocore_get, 50))
            figures["lean"].append(measure(lean_get, 50))
    finally:
        if args.s3 == "versitygw":
            stop(proc)
        else:
            proc.terminate()
            proc.wait(timeout=10)
        tmp.cleanup()
    p50 = {name: (statistics.median(c for c, _ in rows), statistics.median(w for _, w in rows))
           for name, rows in figures.items()}
    print(f"one GET of a {len(body)}-byte gzip object on {args.s3}, "
          f"{rounds} rounds of 50 per path, load {os.getloadavg()[0]:.1f}:")
    for name, (cpu, wall) in p50.items():
        print(f"  {name:9s} client CPU p50 {cpu * 1e3:.3f} ms per GET, wall p50 {wall * 1e3:.3f} ms")
    print(f"  lean / botocore: client CPU x{p50['lean'][0] / p50['botocore'][0]:.2f}, "
          f"wall x{p50['lean'][1] / p50['botocore'][1]:.2f}")


if __name__ == "__main__":
    main()
