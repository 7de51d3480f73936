"""Checkpoint store benchmark: a 500-lap scripted run through CheckpointStore against a local S3 API
server (moto's server, started here on a free loopback port), equal-size lap deltas.

Prints bytes written per lap (at laps 5, 50, 500; lap objects alone and with snapshot bytes
amortized), time per put_lap, objects read and wall time of load_state at the end, and checks:

* lap 500's bytes are within 1.5x of lap 5's (checkpoint cost per lap stays flat);
* resuming at lap 500 reads at most K+1 objects (counted by the store and by GET requests seen);
* the state ``load_state`` resumes from equals the state folded while writing, its storage count
  included, and that count equals the bytes and objects listed under the run's prefix.

Each record carries the run's storage before it, as the lap runner writes it (``record.storage`` =
the storage of the state the lap started from); the state a lap starts from counts the snapshot
written after the lap before, as ``load_state`` does (a snapshot lap's state is folded through its
record, and its snapshot is stored after it).

Exit code 0 when all three hold, 1 otherwise.  Usage: python bench/bench_checkpoints.py [--laps 500]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from agentrun.api.types import format_usd
from agentrun.checkpoint.fold import fold, initial_state
from agentrun.checkpoint.schema import (
    Compaction,
    LapRecord,
    Message,
    Outcome,
    RunRef,
    Storage,
    Timings,
    ToolCall,
    ToolCallRecord,
    Totals,
    Usage,
)
from agentrun.checkpoint.store import CheckpointStore, StoreConfig

RUN = RunRef(namespace="bench", name="invoices-500", uid=str(uuid.UUID(int=500)))
T0 = datetime(2025, 11, 3, tzinfo=UTC)
WINDOW = 20  # laps of messages kept in the state; older ones are compacted into the summary


def start_s3() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def scripted_record(lap: int, prev: str | None, payload: int, k: int) -> LapRecord:
    """Lap ``lap`` of the scripted run: one model turn, one tool call, same size every lap
    (numbers are zero-padded). Compaction happens on laps = 3 mod K, away from the laps measured."""
    tag = f"{lap:06d}"
    started = T0 + timedelta(seconds=30 * lap)
    result = ("R" + tag) * (payload // 7)
    compaction = None
    if lap % k == 3 and lap > WINDOW:
        compaction = Compaction(through_lap=lap - WINDOW, summary="S" * 400, pinned_facts=["fact " + tag])
    return LapRecord(
        agent_version="bench-agent:1.0.0",
        run=RUN,
        lap=lap,
        attempt=1,
        prev_sha256=prev,
        outcome=Outcome(type="continue"),
        messages=[
            Message(role="assistant", content="Thinking about doc " + tag, lap=lap,
                    tool_calls=[ToolCall(id="c" + tag, name="extract", arguments={"doc": tag})]),
            Message(role="tool", content=result, tool_call_id="c" + tag, lap=lap),
        ],
        tool_calls=[
            ToolCallRecord(call_id="c" + tag, tool="extract", arguments={"doc": tag},
                           idempotency_key=f"{RUN.short_id}:{lap}:extract:c{tag}", status="ok", result=result,
                           http_status=200, started_at=started, finished_at=started + timedelta(seconds=1))
        ],
        usage=Usage(input_tokens=1000, output_tokens=100),
        cost_usd="0.012500",
        totals=Totals(laps=lap, input_tokens=100000 + lap, output_tokens=100000 + lap,
                      cost_usd=format_usd(Decimal("100.0125") + Decimal(lap) / 1000000)),
        compaction=compaction,
        timings=Timings(started_at=started, finished_at=started + timedelta(seconds=2)),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--laps", type=int, default=500)
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--payload", type=int, default=1500, help="bytes of tool result per lap (approx.)")
    parser.add_argument("--endpoint", help="use this S3 endpoint instead of starting a moto server")
    args = parser.parse_args()
    n, k = args.laps, args.snapshot_every
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    proc, endpoint = (None, args.endpoint) if args.endpoint else start_s3()
    try:
        bucket = "bench-" + uuid.uuid4().hex[:12]
        store = CheckpointStore(StoreConfig(uri=f"s3://{bucket}/ckpt", endpoint_url=endpoint,
                                            region="us-east-1", path_style=True, snapshot_every=k))
        store.client.create_bucket(Bucket=bucket)
        return run_bench(store, n, k, args.payload)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def run_bench(store: CheckpointStore, n: int, k: int, payload: int) -> int:
    lap_bytes: dict[int, int] = {}
    put_seconds: dict[int, float] = {}
    snap_bytes: dict[int, int] = {}
    state, prev = initial_state(RUN), None
    for lap in range(1, n + 1):
        # the run's storage before this record, as the lap runner sets it (lap/runner.py)
        record = scripted_record(lap, prev, payload, k).model_copy(update={"storage": state.storage})
        t = time.perf_counter()
        stored = store.put_lap(record, state_before=state)
        put_seconds[lap] = time.perf_counter() - t
        lap_bytes[lap] = stored.size
        state = fold(state, record, stored.sha256, stored.size)
        prev = stored.sha256
        if lap % k == 0:  # put_lap stored the snapshot after this lap: the next lap's state counts it
            snap = store._head(store.snapshot_key(RUN, lap))
            assert snap is not None, f"no snapshot after lap {lap}"
            snap_bytes[lap] = snap.size
            state = state.model_copy(update={"storage": Storage(
                bytes=state.storage.bytes + snap.size, objects=state.storage.objects + 1)})
    listed = [o for page in store.client.get_paginator("list_objects_v2").paginate(
        Bucket=store.config.bucket, Prefix=store.run_prefix(RUN)) for o in page.get("Contents", [])]
    stored_total = Storage(bytes=sum(o["Size"] for o in listed), objects=len(listed))
    gets: list[str] = []
    store.client.meta.events.register("before-send.s3.GetObject", lambda request, **_: gets.append(request.url))

    def timed_load(through: int | None) -> tuple[int, int, float, Any]:
        times = []
        for _ in range(5):
            gets.clear()
            t = time.perf_counter()
            result = store.load_state(RUN, through_lap=through)
            times.append(time.perf_counter() - t)
        return result.objects_read, len(gets), statistics.median(times), result.state

    reads_n, gets_n, load_n, loaded = timed_load(None)
    worst = n - 1 if n % k == 0 else n
    reads_w, gets_w, load_w, _ = timed_load(worst)
    t = time.perf_counter()
    latest = store.latest_lap(RUN)
    latest_s = time.perf_counter() - t

    def amortized(lap: int) -> float:
        """Lap bytes plus the snapshot bytes of its K-lap window spread over the window."""
        window_end = ((lap + k - 1) // k) * k
        return lap_bytes[lap] + snap_bytes.get(window_end, snap_bytes[max(snap_bytes)]) / k

    total_laps, total_snaps = sum(lap_bytes.values()), sum(snap_bytes.values())
    print(f"checkpoint store benchmark: {n} laps, snapshot every K={k}, ~{payload} B tool result per lap, "
          f"messages window {WINDOW} laps (older ones compacted)")
    print()
    print(f"{'lap':>6} {'lap object B':>13} {'+ snapshot/K B':>15} {'put_lap ms':>11}")
    for lap in (5, 50, n):
        if lap <= n:
            print(f"{lap:>6} {lap_bytes[lap]:>13} {amortized(lap):>15.0f} {put_seconds[lap] * 1000:>11.1f}")
    print()
    print(f"total bytes written: {total_laps + total_snaps} ({total_laps} lap objects + {total_snaps} in "
          f"{len(snap_bytes)} snapshots)")
    print(f"bytes per lap: lap objects only {total_laps / n:.0f}, with snapshots amortized {(total_laps + total_snaps) / n:.0f}")
    print(f"lap object size min/max: {min(lap_bytes.values())}/{max(lap_bytes.values())} B; "
          f"snapshot size first/last: {snap_bytes[min(snap_bytes)]}/{snap_bytes[max(snap_bytes)]} B")
    plain = [s for lap, s in put_seconds.items() if lap % k]
    snap = [s for lap, s in put_seconds.items() if lap % k == 0]
    print(f"put_lap ms: mean {statistics.mean(put_seconds.values()) * 1000:.1f}, p50 {percentile(plain, .5) * 1000:.1f}, "
          f"p95 {percentile(plain, .95) * 1000:.1f} (laps without snapshot); "
          f"mean {statistics.mean(snap) * 1000:.1f} on snapshot laps")
    print(f"load_state at lap {n}: {reads_n} objects read ({gets_n} GET requests seen), {load_n * 1000:.1f} ms median of 5")
    print(f"load_state at lap {worst} (worst case in the last window): {reads_w} objects ({gets_w} GETs), {load_w * 1000:.1f} ms")
    print(f"latest_lap: {latest} in {latest_s * 1000:.1f} ms")
    print()
    flat = lap_bytes[n] <= 1.5 * lap_bytes[min(5, n)]
    bounded = max(reads_n, gets_n, reads_w, gets_w) <= k + 1
    correct = loaded == state and latest == n
    counted = loaded.storage == stored_total
    print(f"[{'PASS' if flat else 'FAIL'}] lap {n} bytes {lap_bytes[n]} within 1.5x of lap 5 bytes {lap_bytes[min(5, n)]} "
          f"(ratio {lap_bytes[n] / lap_bytes[min(5, n)]:.3f})")
    print(f"[{'PASS' if bounded else 'FAIL'}] resume reads at most K+1 = {k + 1} objects")
    print(f"[{'PASS' if correct else 'FAIL'}] loaded state equals the state folded while writing; latest_lap = {n}")
    print(f"[{'PASS' if counted else 'FAIL'}] the loaded state's storage ({loaded.storage.bytes} B in "
          f"{loaded.storage.objects} objects) is what the run's prefix lists ({stored_total.bytes} B in "
          f"{stored_total.objects} objects)")
    if not correct:
        diff = sorted(f for f in type(state).model_fields if getattr(loaded, f) != getattr(state, f))
        print(f"       fields that differ: {diff}; storage loaded {loaded.storage}, folded {state.storage}")
    return 0 if flat and bounded and correct and counted else 1


if __name__ == "__main__":
    sys.exit(main())
