"""Benchmark of the lap runner: a 500-lap scripted run through the real runner code path.

Starts a local S3 API server (moto, server mode) and a local HTTP tool server, then runs laps
in-process with ``agentrun.lap.runner.execute_lap`` (the same function ``agentrun lap`` calls), and
a few laps as ``agentrun lap`` subprocesses to show the process overhead. Prints a table:
bytes written per lap (lap record + journal objects + snapshot) at laps 5, 50, 500; total bytes;
objects read and time to resume at lap 500; window size (estimated tokens) at laps 5, 50, 500.

    python bench/bench_lap_run.py [--laps 500] [--max-tokens 4000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentrun.checkpoint.schema import RunRef  # noqa: E402
from agentrun.checkpoint.store import CheckpointStore, StoreConfig  # noqa: E402
from agentrun.lap.config import parse_env  # noqa: E402
from agentrun.lap.interfaces import ModelRequest, ModelResponse  # noqa: E402
from agentrun.lap.logs import LapLogger  # noqa: E402
from agentrun.lap.models import make_model  # noqa: E402
from agentrun.lap.runner import execute_lap  # noqa: E402
from agentrun.lap.window import apply_compaction, build_window, messages_tokens, plan_compaction  # noqa: E402

RUN = RunRef(namespace="bench", name="invoices", uid="b3c4d5e6-0000-1111-2222-333344445555")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_credentials() -> None:
    """Dummy S3 credentials for the benchmark's own S3 server, unless set: in main() and
    start_moto(), not at import (a test importing a benchmark must not change the session's keys)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    bench_credentials()
    port = free_port()
    exe = shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


class BenchWorld:
    """What a scripted lap bench runs against: a local S3 API server (moto) with ``bucket``, a
    tool server on 127.0.0.1 answering with ``handler``, the lap environment ``base`` pointing at
    ``s3://BUCKET/runs`` and a ``CheckpointStore`` on it. ``close()`` stops both servers."""

    def __init__(self, bucket: str, handler: type[BaseHTTPRequestHandler]) -> None:
        self.moto, endpoint = start_moto()
        self.tools = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.tools.serve_forever, daemon=True).start()
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        self.base = {"AGENTRUN_CHECKPOINT_URI": f"s3://{bucket}/runs", "AGENTRUN_S3_ENDPOINT": endpoint,
                     "AGENTRUN_S3_REGION": "us-east-1", "AGENTRUN_S3_PATH_STYLE": "true",
                     "AGENTRUN_LOG_FORMAT": "json"}
        self.store = CheckpointStore(StoreConfig.from_env(self.base, snapshot_every=10))
        self.store.client.create_bucket(Bucket=bucket)

    def close(self) -> None:
        self.tools.shutdown()
        self.moto.terminate()
        self.moto.wait(timeout=10)



class ToolHandler(BaseHTTPRequestHandler):
    """Echoes a ~300-byte JSON result; dedupes nothing (the bench measures the runner)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = json.dumps({"invoice": json.loads(body), "total": "120.00", "currency": "EUR", "lines": ["item"] * 20}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class Capturing:
    def __init__(self, inner: Any) -> None:
        self.inner, self.tokens = inner, {}

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.tokens[request.lap] = messages_tokens(request.messages)
        return self.inner.complete(request)


def spec_doc(tool_url: str, laps: int, max_tokens: int) -> dict[str, Any]:
    script = [{"content": f"Invoice doc_{i} extracted; next." + ("\nPIN: vendor ACME bills in EUR" if i == 3 else ""),
               "toolCalls": [{"name": "extract_invoice", "arguments": {"doc": f"doc_{i}"}}]} for i in range(1, laps + 10)]
    return {
        "task": "Extract all 500 invoices of the quarter and record them.",
        "agent": {"version": "v1", "model": {"provider": "scripted", "script": script,
                  "pricing": {"inputPerMillionTokensUSD": "2.50", "outputPerMillionTokensUSD": "10"}},
                  "tools": [{"name": "extract_invoice", "description": "Extract one invoice",
                             "parameters": {"type": "object", "properties": {"doc": {"type": "string"}}, "required": ["doc"]},
                             "http": {"url": f"{tool_url}/extract", "timeout": "5s"}}],
                  "window": {"maxTokens": max_tokens, "systemPrompt": "You extract invoices."}},
        "budget": {"maxLaps": 100000},
        "checkpoint": {"snapshotEvery": 10},
    }


def lap_env(base: dict[str, str], spec_json: str, lap: int) -> dict[str, str]:
    return {**base, "AGENTRUN_NAMESPACE": RUN.namespace, "AGENTRUN_NAME": RUN.name, "AGENTRUN_UID": RUN.uid,
            "AGENTRUN_LAP": str(lap), "AGENTRUN_ATTEMPT": "1", "AGENTRUN_SPEC": spec_json, "AGENTRUN_AGENT_VERSION": "v1"}


def bytes_of_lap(client: Any, bucket: str, store: CheckpointStore, lap: int) -> tuple[int, int, int]:
    """(lap record bytes, journal bytes, snapshot bytes) written by lap ``lap``."""
    prefix = store.run_prefix(RUN)
    lap_bytes = client.head_object(Bucket=bucket, Key=store.lap_key(RUN, lap))["ContentLength"]
    journal = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}journal/{lap:08d}/").get("Contents", [])
    snaps = client.list_objects_v2(Bucket=bucket, Prefix=store.snapshot_key(RUN, lap)).get("Contents", [])
    return lap_bytes, sum(o["Size"] for o in journal), sum(o["Size"] for o in snaps)


def total_bytes(client: Any, bucket: str) -> tuple[int, int]:
    size = count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            size, count = size + o["Size"], count + 1
    return size, count


def main() -> None:
    bench_credentials()
    ap = argparse.ArgumentParser()
    ap.add_argument("--laps", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--subprocess-laps", type=int, default=3)
    args = ap.parse_args()

    world = BenchWorld("bench-ckpt", ToolHandler)
    try:
        base, store = world.base, world.store
        spec = spec_doc(world.tool_url, args.laps + args.subprocess_laps, args.max_tokens)
        spec_json = json.dumps(spec)
        model = Capturing(make_model(parse_env(lap_env(base, spec_json, 1)).spec, {}))
        sink = io.StringIO()
        lap_seconds: list[float] = []
        t_run = time.perf_counter()
        for lap in range(1, args.laps + 1):
            env = lap_env(base, spec_json, lap)
            t0 = time.perf_counter()
            cfg = parse_env(env)
            result = execute_lap(cfg, store, env, LapLogger({"lap": lap}, stream=sink), model=model)
            lap_seconds.append(time.perf_counter() - t0)
            if result.code != 0:
                raise SystemExit(f"lap {lap} exited {result.code}: {result.message}")
            sink.seek(0)
            sink.truncate()
        run_seconds = time.perf_counter() - t_run

        t0 = time.perf_counter()
        loaded = store.load_state(RUN, through_lap=args.laps)
        resume_seconds = time.perf_counter() - t0
        run_spec = parse_env(lap_env(base, spec_json, 1)).spec
        next_compaction = plan_compaction(loaded.state, run_spec, args.laps + 1)
        resume_window = messages_tokens(build_window(apply_compaction(loaded.state, next_compaction), run_spec))

        sub_seconds = []
        for lap in range(args.laps + 1, args.laps + args.subprocess_laps + 1):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "agentrun.cli.main", "lap"], env={**os.environ, **lap_env(base, spec_json, lap)},
                               capture_output=True, text=True)
            sub_seconds.append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise SystemExit(f"subprocess lap {lap} exited {p.returncode}: {p.stderr[-500:]}")

        client = store.client
        print(f"\nagentrun lap benchmark: {args.laps} scripted laps, 1 HTTP tool call per lap, window maxTokens={args.max_tokens}, snapshotEvery=10")
        print(f"{'lap':>6} | {'lap record B':>12} | {'journal B':>9} | {'snapshot B':>10} | {'window tokens':>13}")
        print("-" * 64)
        for lap in (5, 50, args.laps):
            if lap > args.laps:
                continue
            rec, jrn, snap = bytes_of_lap(client, "bench-ckpt", store, lap)
            print(f"{lap:>6} | {rec:>12,} | {jrn:>9,} | {snap:>10,} | {model.tokens[lap]:>13,}")
        size, count = total_bytes(client, "bench-ckpt")
        mean = sum(lap_seconds) / len(lap_seconds)
        srt = sorted(lap_seconds)
        print("-" * 64)
        print(f"total stored after {args.laps + args.subprocess_laps} laps: {size:,} bytes in {count} objects ({size / (args.laps + args.subprocess_laps):,.0f} B/lap)")
        print(f"max window over the run: {max(model.tokens.values()):,} tokens (budget {args.max_tokens:,})")
        print(f"resume at lap {args.laps}: {loaded.objects_read} objects read in {resume_seconds * 1000:.1f} ms; window of lap {args.laps + 1} rebuilt from it {resume_window:,} tokens")
        print(f"in-process lap: mean {mean * 1000:.1f} ms, p50 {srt[len(srt) // 2] * 1000:.1f} ms, p95 {srt[int(len(srt) * 0.95)] * 1000:.1f} ms; whole run {run_seconds:.1f} s")
        if sub_seconds:
            sm = sum(sub_seconds) / len(sub_seconds)
            print(f"`agentrun lap` subprocess: mean {sm * 1000:.0f} ms per lap over {len(sub_seconds)} laps "
                  f"(process overhead ~{(sm - mean) * 1000:.0f} ms: interpreter start, imports, boto3 client)")
    finally:
        world.close()


if __name__ == "__main__":
    main()
