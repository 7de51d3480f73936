"""The tool authors' kit's overhead per call: the same handler with and without agentrun.toolkit.

Three uvicorn servers (subprocesses, one worker each) serve the same Starlette handler (a JSON echo
of its arguments, the cheapest possible tool, so the kit's part is not hidden behind the tool's
work): ``plain`` without the kit, ``kit`` behind ``IdempotencyMiddleware`` with the default
SQLiteStore (WAL, ``synchronous=FULL``: every stored response fsync'd before it is answered), and
``kit_normal`` with ``synchronous=NORMAL`` (durable across a crash of the process, not of the host).
The client (this process, httpx) sends rounds of ``--concurrency`` requests at once, each with a new
key (a first execution: the kit's costly path, one INSERT and one UPDATE), to the three servers in
turn; the latency of each call is measured from send to the end of the body. Then ``--sequential``
calls one at a time to each server (no queue in front of it: the kit's own cost per call). Added latency = the
kit's percentile minus the plain one's. Then every key of the last round is sent again (a repeat,
answered from the store). Each server counts its handler's executions: a kit server that executed
a key twice fails the benchmark (exit 1).

    python bench/bench_toolkit.py [--concurrency 100] [--rounds 20] [--sequential 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("plain", "kit", "kit_normal")


def serve(variant: str, port: int, db: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from agentrun.toolkit import IdempotencyMiddleware, SQLiteStore

    executed = {"n": 0}

    async def echo(request: Request) -> JSONResponse:
        executed["n"] += 1
        return JSONResponse({"echo": await request.json(), "status": "done"})

    async def count(_: Request) -> JSONResponse:
        return JSONResponse(executed)

    app: Any = Starlette(routes=[Route("/call", echo, methods=["POST"]), Route("/_count", count)])
    if variant != "plain":
        app = IdempotencyMiddleware(app, SQLiteStore(db, synchronous="NORMAL" if variant == "kit_normal" else "FULL"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(concurrency: int, rounds: int, sequential: int) -> dict[str, Any]:
    import anyio
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="bench-toolkit-"))
    procs, urls = [], {}
    for v in VARIANTS:
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve", v, "--port", str(port),
                                       "--db", str(tmp / f"{v}.sqlite3")]))
        urls[v] = f"http://127.0.0.1:{port}"
    lat: dict[str, list[float]] = {v: [] for v in VARIANTS}
    repeat: list[float] = []
    seq: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for v, url in urls.items():
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url + "/_count", timeout=2)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"server {v} did not start") from None
                    time.sleep(0.1)

        async def one(client: httpx.AsyncClient, url: str, key: str | None, i: int, out: list[float]) -> None:
            headers = {"Idempotency-Key": key} if key else {}
            t0 = time.perf_counter()
            r = await client.post(url + "/call", json={"invoice": f"INV-{i}", "amountCents": i}, headers=headers)
            r.read()
            out.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")

        async def run() -> list[str]:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            last: list[str] = []
            async with httpx.AsyncClient(limits=limits, timeout=60) as client:
                for rnd in range(rounds + 1):  # round 0 warms the connections and the servers up, uncounted
                    for v in VARIANTS:
                        keys = [None if v == "plain" else f"bench:{uuid.uuid4().hex}:{i}" for i in range(concurrency)]
                        sink: list[float] = []
                        async with anyio.create_task_group() as tg:
                            for i, k in enumerate(keys):
                                tg.start_soon(one, client, urls[v], k, i, sink)
                        if rnd:
                            lat[v].extend(sink)
                        if v == "kit":
                            last = [k for k in keys if k]
                async with anyio.create_task_group() as tg:
                    for i, k in enumerate(last):
                        tg.start_soon(one, client, urls["kit"], k, i, repeat)
                # one call at a time (no queue in front of the server): the kit's own cost per call
                for i in range(sequential):
                    for v in VARIANTS:
                        await one(client, urls[v], None if v == "plain" else f"seq:{uuid.uuid4().hex}", i, seq[v])
            return last

        anyio.run(run)
        counts = {v: httpx.get(urls[v] + "/_count").json()["n"] for v in VARIANTS}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    expected = (rounds + 1) * concurrency + sequential
    from benchlib import summary

    # summaries (n, p50, p99, min, max, mean in seconds), not every sample: results.json stays readable
    return {"concurrency": concurrency, "rounds": rounds, "latency_seconds": {v: summary(lat[v]) for v in VARIANTS},
            "repeat_latency_seconds": summary(repeat), "executions": counts,
            "sequential_latency_seconds": {v: summary(seq[v]) for v in VARIANTS},
            "expected_executions": expected, "cpus": os.cpu_count(), "load": list(os.getloadavg())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sequential", type=int, default=300, help="then this many calls one at a time per server")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.db)
        return 0
    from benchlib import fmt_ms, markdown_table

    data = measure(args.concurrency, args.rounds, args.sequential)
    s = data["latency_seconds"]
    rep = data["repeat_latency_seconds"]
    data["added_seconds"] = {v: {"p50": s[v]["p50"] - s["plain"]["p50"], "p99": s[v]["p99"] - s["plain"]["p99"]}
                             for v in VARIANTS if v != "plain"}
    rows = [[v, s[v]["n"], fmt_ms(s[v]["p50"]), fmt_ms(s[v]["p99"]),
             "-" if v == "plain" else fmt_ms(data["added_seconds"][v]["p50"]),
             "-"] for v in VARIANTS]  # no difference of tails under a queue: noise, not the kit's cost
    rows.append(["kit, repeated key (answered from the store)", rep["n"], fmt_ms(rep["p50"]), fmt_ms(rep["p99"]),
                 "-", "-"])
    q = data["sequential_latency_seconds"]
    data["sequential_added_seconds"] = {v: {"p50": q[v]["p50"] - q["plain"]["p50"],
                                            "p99": q[v]["p99"] - q["plain"]["p99"]} for v in VARIANTS if v != "plain"}
    for v in VARIANTS:
        rows.append([f"{v}, one call at a time", q[v]["n"], fmt_ms(q[v]["p50"]), fmt_ms(q[v]["p99"]),
                     "-" if v == "plain" else fmt_ms(data["sequential_added_seconds"][v]["p50"]),
                     "-" if v == "plain" else fmt_ms(data["sequential_added_seconds"][v]["p99"])])
    print(f"{args.concurrency} concurrent calls per round, each with a new key, {args.rounds} rounds per server, "
          f"one uvicorn worker each, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(markdown_table(["server", "calls", "latency p50", "p99", "added p50", "added p99"], rows))
    print(f"executions: {data['executions']} (each server: {data['expected_executions']} distinct calls)")
    if args.json:
        Path(args.json).write_text(json.dumps(data) + "\n")
    bad = {v: n for v, n in data["executions"].items() if n != data["expected_executions"]}
    if bad:
        print(f"FAIL: executions differ from the calls sent: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
