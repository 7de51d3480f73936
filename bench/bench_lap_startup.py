"""Benchmark of the lap process's start-up cost: what a lap pod pays before and around its lap.

Prints three figures, each the median of ``--runs`` fresh subprocesses:

1. import time of the lap path: ``python -c "import agentrun.lap.process"`` (interpreter start included);
2. ``agentrun lap --help`` (the console script next to the interpreter, else ``python -m agentrun.cli.main``);
3. one full scripted lap as an ``agentrun lap`` subprocess against a local moto S3 server and a
   local HTTP tool (started like ``bench_lap_run.py`` does), with the in-process time of the same
   kind of lap for comparison, so the difference is the process's own overhead; and lap 1 of a
   run whose spec declares no tools (the scripted final answer), which needs no jsonschema or httpx.

    python bench/bench_lap_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


from bench_lap_run import ToolHandler, bench_credentials, lap_env, spec_doc, start_moto

from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.config import parse_env
from agentrun.lap.logs import LapLogger
from agentrun.lap.runner import execute_lap


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} exited {p.returncode}: {p.stderr[-800:]}")
    return elapsed


def fmt(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:6.0f} ms (min {min(samples) * 1000:.0f}, max {max(samples) * 1000:.0f})"


def main() -> None:
    bench_credentials()
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    # the console script next to this interpreter (as in the image), not a version-manager shim
    exe = os.path.join(os.path.dirname(sys.executable), "agentrun")
    agentrun = [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "agentrun.cli.main"]

    timed([sys.executable, "-c", "pass"])  # warm the page cache
    bare = [timed([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
    imports = [timed([sys.executable, "-c", "import agentrun.lap.process"]) for _ in range(args.runs)]
    helps = [timed([*agentrun, "lap", "--help"]) for _ in range(args.runs)]

    moto, endpoint = start_moto()
    tools = ThreadingHTTPServer(("127.0.0.1", 0), ToolHandler)
    threading.Thread(target=tools.serve_forever, daemon=True).start()
    try:
        base = {
            "AGENTRUN_CHECKPOINT_URI": "s3://startup-ckpt/runs",
            "AGENTRUN_S3_ENDPOINT": endpoint,
            "AGENTRUN_S3_REGION": "us-east-1",
            "AGENTRUN_S3_PATH_STYLE": "true",
            "AGENTRUN_LOG_FORMAT": "json",
        }
        store = CheckpointStore(StoreConfig.from_env(base, snapshot_every=10))
        store.client.create_bucket(Bucket="startup-ckpt")
        laps = 2 * args.runs
        spec_json = json.dumps(spec_doc(f"http://127.0.0.1:{tools.server_address[1]}", laps, 4000))
        # alternate in-process and subprocess laps so both see the same (growing) run
        in_process: list[float] = []
        subproc: list[float] = []
        sink = io.StringIO()
        for lap in range(1, laps + 1):
            env = lap_env(base, spec_json, lap)
            if lap % 2:
                t0 = time.perf_counter()
                result = execute_lap(
                    parse_env(env), store, env, LapLogger({"lap": lap}, stream=sink)
                )
                in_process.append(time.perf_counter() - t0)
                if result.code != 0:
                    raise SystemExit(f"in-process lap {lap} exited {result.code}: {result.message}")
            else:
                subproc.append(timed([*agentrun, "lap"], env={**os.environ, **env}))
        # a lap that needs no tool: lap 1 of a fresh run whose spec declares no tools and whose
        # scripted response is the final answer
        bare_spec = json.dumps(
            {
                "task": "Say done.",
                "agent": {
                    "version": "v1",
                    "model": {"provider": "scripted", "script": [{"content": "done"}]},
                },
            }
        )
        no_tool: list[float] = []
        for i in range(args.runs):
            env = {
                **lap_env(base, bare_spec, 1),
                "AGENTRUN_NAME": f"bare-{i}",
                "AGENTRUN_UID": f"00000000-0000-0000-0000-{i:012d}",
            }
            no_tool.append(timed([*agentrun, "lap"], env={**os.environ, **env}))
    finally:
        tools.shutdown()
        moto.terminate()
        moto.wait(timeout=10)

    print(
        f"\nagentrun lap start-up ({args.runs} runs each, {os.cpu_count()} CPUs, {sys.version.split()[0]})"
    )
    print(f"  python -c pass                      {fmt(bare)}")
    print(f"  python -c 'import agentrun.lap.process' {fmt(imports)}")
    print(f"  agentrun lap --help                 {fmt(helps)}")
    print(f"  agentrun lap (one scripted lap)     {fmt(subproc)}")
    print(f"  same lap in-process                 {fmt(in_process)}")
    print(f"  agentrun lap (no tools, final lap)  {fmt(no_tool)}")
    overhead = statistics.median(subproc) - statistics.median(in_process)
    print(
        f"  process overhead of a lap           ~{overhead * 1000:.0f} ms (interpreter, imports, boto3 client)"
    )


if __name__ == "__main__":
    main()
