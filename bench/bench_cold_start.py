"""Lap runner cold start: from process start to the first model request.

A local OpenAI-compatible chat-completions server (a thread of this process) records the arrival
time of each request; ``agentrun lap`` is started as a subprocess (the console script next to the
interpreter, as in the image) for lap 1 of a fresh run whose model is ``provider: openai`` at that
server, against a local S3 API server (moto). Cold start = arrival of the model request minus the
instant just before ``Popen``; it includes interpreter start, imports, reading the config, creating
the S3 client and reading the run's state from S3 (nothing checkpointed yet: one LIST). Each run has
its own base URL path, so requests are matched to runs. Also prints the whole process time (the
lap is a final answer, so it then writes the lap checkpoint and exits 0) and the CPU time (user +
system) the lap process used in all, which other jobs on a busy machine disturb much less than the
wall-clock figures.

The image installs the project from a wheel, whose modules pip compiles to bytecode; a checkout
with ``PYTHONDONTWRITEBYTECODE=1`` (as in the dev container) would compile ``agentrun``'s sources in
every lap process instead. So the package is compiled first (``compileall``, into its gitignored
``__pycache__`` directories); ``--no-compile`` measures the checkout as it is.

``--mcp`` measures two cases instead, interleaved run by run so the box's load hits both alike: a
spec with one HTTP tool (``http``: the tool is declared, not called) and a spec with one MCP server
(``mcp``: examples/mcp_tool_server.py, started here; the lap imports the ``mcp`` SDK and lists the
server's tools before it asks the model), and prints their figures side by side.

``--tracing`` measures tracing off and on the same way (``off``: no OTEL variable; ``on``:
``OTEL_EXPORTER_OTLP_ENDPOINT`` at this process's server, which answers the OTLP/HTTP export of the
lap's spans with 200): the lap then imports the OpenTelemetry SDK and its exporter, and sends its
spans at exit.

``--before DIR`` measures two cases the same way: ``before`` (the ``agentrun`` package of DIR, an
export of an older commit's ``operator/`` directory, first on ``PYTHONPATH``, compiled first too) and
``after`` (this checkout): a change's effect within one run, at one load.

``--floor`` measures instead what any lap built on the design's packages pays before its own code
runs, each a fresh interpreter, interleaved: the bare interpreter (``pass``, with this machine's
``site``), ``import pydantic`` and one validated model, botocore's S3 client made as the store makes it
(``checkpoint/s3store.py`` ``make_client``: ``checkpoint/s3model.py``'s session and trimmed data, the
same Config), ``import httpx`` (the lap's model and tool
client), and the three together. Their sum with the interpreter counted once is a floor of the
lap's cold start on this box (no config, no S3 request, no model request yet).

``--image REF`` (repeatable) measures the lap in that image of the local image store under runc
(e2e/runc_node.py ``run_image``: the image's user, a read-only root, the host's network, so the model
server and S3 here are reachable), and, interleaved, the container alone (``/bin/true`` in the
same image): its start (the supervisor, the overlay mount, runc) is reported separately, and the
lap's own part is the difference of the two p50s.

    python bench/bench_cold_start.py [--runs 20] [--no-compile] [--json out.json] [--mcp | --tracing]
    python bench/bench_cold_start.py --before /tmp/old/operator [--image REF ...]
    python bench/bench_cold_start.py --floor [--runs 20]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # e2e (--image)


from bench_lap_run import bench_credentials, start_moto  # noqa: E402
from benchlib import percentile, summary  # noqa: E402

import agentrun as agentrun_package  # noqa: E402
from agentrun.checkpoint.store import CheckpointStore, StoreConfig  # noqa: E402

ARRIVALS: dict[str, float] = {}
LOCK = threading.Lock()


class ChatHandler(BaseHTTPRequestHandler):
    """POST /<run>/v1/chat/completions: records the first arrival per run, answers "done"."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        now = time.time()
        if self.path == "/v1/traces":  # --tracing: the lap's spans (OTLP/HTTP), accepted unread
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        run = self.path.strip("/").split("/")[0]
        with LOCK:
            ARRIVALS.setdefault(run, now)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": int(now), "model": "bench",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    bench_credentials()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not compile the agentrun package to bytecode first (see above)")
    ap.add_argument("--mcp", action="store_true", help="measure an HTTP-only spec and an MCP spec side by side")
    ap.add_argument("--tracing", action="store_true", help="measure tracing off and on side by side")
    ap.add_argument("--before", help="an older operator/ directory: measure it (before) and this checkout (after)")
    ap.add_argument("--image", action="append", default=[], help="also measure the lap in this image under runc")
    ap.add_argument("--floor", action="store_true",
                    help="measure the design's packages alone (interpreter, pydantic, botocore's S3 client, httpx)")
    args = ap.parse_args()
    if args.floor:
        floor(args.runs, args.json)
        return
    exe = os.path.join(os.path.dirname(sys.executable), "agentrun")
    agentrun = [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "agentrun.cli.main"]
    if not args.no_compile:
        compileall.compile_dir(os.path.dirname(agentrun_package.__file__), quiet=1)
        if args.before:
            compileall.compile_dir(args.before, quiet=1)
    subprocess.run([sys.executable, "-c", "import agentrun.lap.process"], check=True)  # warm the page cache

    moto, endpoint = start_moto()
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    cases = ["http", "mcp"] if args.mcp else ["off", "on"] if args.tracing else ["before", "after"] if args.before \
        else ["none"]
    images = {}
    if args.image:
        from e2e import image_store

        for ref in args.image:
            img = image_store.ImageStore().lookup(ref)
            if img is None:
                raise SystemExit(f"{ref} is not in the local image store (make image)")
            images[ref] = img
            cases += [f"image {ref}", f"container {ref}"]
    first_by: dict[str, list[float]] = {c: [] for c in cases}
    whole_by: dict[str, list[float]] = {c: [] for c in cases}
    cpu_by: dict[str, list[float]] = {c: [] for c in cases}
    ledger = ledger_url = None
    if args.mcp:
        import socket
        import tempfile
        import urllib.request

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            mport = sock.getsockname()[1]
        db = os.path.join(tempfile.mkdtemp(prefix="bench-mcp-"), "ledger.sqlite3")
        examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
        ledger = subprocess.Popen([sys.executable, os.path.join(examples, "mcp_tool_server.py"), "--port", str(mport),
                                   "--db", db], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ledger_url = f"http://127.0.0.1:{mport}/mcp"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{mport}/_record", timeout=2).read()
                break
            except OSError:
                time.sleep(0.1)
    try:
        base = {"AGENTRUN_CHECKPOINT_URI": "s3://cold-start/runs", "AGENTRUN_S3_ENDPOINT": endpoint,
                "AGENTRUN_S3_REGION": "us-east-1", "AGENTRUN_S3_PATH_STYLE": "true", "AGENTRUN_LOG_FORMAT": "json"}
        CheckpointStore(StoreConfig.from_env(base, snapshot_every=10)).client.create_bucket(Bucket="cold-start")
        for i, case in ((i, case) for i in range(args.runs) for case in cases):
            run = f"cold-c{cases.index(case)}-{i}"
            spec: dict[str, Any] = {"task": "Say done.", "agent": {"version": "v1", "model": {
                "provider": "openai", "name": "bench", "baseURL": f"http://127.0.0.1:{port}/{run}/v1"}}}
            if case == "http":
                spec["agent"]["tools"] = [{"name": "lookup_invoice", "parameters": {"type": "object"},
                                           "http": {"url": f"http://127.0.0.1:{port}/lookup"}}]
            elif case == "mcp":
                spec["agent"]["mcpServers"] = [{"name": "ledger", "url": ledger_url}]
            uid = f"00000000-0000-0000-{cases.index(case):04d}-{i:012d}"
            lap_env = {**base, **({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"} if case == "on" else {}),
                       "AGENTRUN_NAMESPACE": "bench", "AGENTRUN_NAME": run,
                       "AGENTRUN_UID": uid, "AGENTRUN_LAP": "1", "AGENTRUN_ATTEMPT": "1",
                       "AGENTRUN_SPEC": json.dumps(spec), "AGENTRUN_AGENT_VERSION": "v1"}
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **lap_env}
            if case == "before":
                env["PYTHONPATH"] = args.before
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            if case.startswith(("image ", "container ")):
                kind, ref = case.split(" ", 1)
                creds = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
                argv = ["/bin/true"] if kind == "container" else \
                    ["env", *(f"{k}={v}" for k, v in {**creds, **lap_env}.items()), "agentrun", "lap"]
                p = run_in_image(images[ref], argv)
            else:
                p = subprocess.run([*agentrun, "lap"], env=env, capture_output=True, text=True, check=False)
            t1 = time.time()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if case.startswith("container "):
                if p.returncode != 0:
                    raise SystemExit(f"/bin/true in {case} exited {p.returncode}: {p.stdout[-800:]}")
                first_by[case].append(t1 - t0)
                whole_by[case].append(t1 - t0)
                cpu_by[case].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                continue
            if p.returncode != 0 or run not in ARRIVALS:
                raise SystemExit(f"lap of {run} exited {p.returncode} (model request seen: {run in ARRIVALS}): "
                                 f"{p.stderr[-800:]}")
            first_by[case].append(ARRIVALS[run] - t0)
            whole_by[case].append(t1 - t0)
            cpu_by[case].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    finally:
        if ledger is not None:
            ledger.terminate()
            ledger.wait(timeout=10)
        server.shutdown()
        moto.terminate()
        moto.wait(timeout=10)
    compiled = "not compiled first" if args.no_compile else "agentrun compiled to bytecode first"
    for case in cases:
        label = {"none": "", "http": " (spec with one HTTP tool)", "mcp": " (spec with one MCP server)",
                 "off": " (tracing off)", "on": " (tracing on: OTLP/HTTP export of the lap's spans)",
                 "before": f" (before: {args.before})", "after": " (after: this checkout)"}.get(
            case, f" ({case.replace('image ', 'the lap in the image ').replace('container ', '/bin/true alone in ')}, "
                  "under runc; the supervisor's CPU is the figure's)")
        print(f"lap runner cold start{label}, {args.runs} runs ({os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.1f}, {compiled}):")
        report(first_by[case], whole_by[case], cpu_by[case])
    if args.json:
        doc: dict[str, Any] = {"compiled": not args.no_compile, "images": args.image}
        for case in cases:
            prefix = "" if case == "none" else case.replace(" ", ":") + "_"
            doc.update({prefix + "first_request_seconds": first_by[case], prefix + "process_seconds": whole_by[case],
                        prefix + "process_cpu_seconds": cpu_by[case]})
        with open(args.json, "w") as f:
            json.dump(doc, f)


FLOOR_PROGRAMS = {
    "interpreter": "pass",
    "pydantic": ("from pydantic import BaseModel\n"
                 "class M(BaseModel):\n    task: str\n    laps: int = 1\n"
                 "M.model_validate({'task': 'x'})"),
    "botocore S3 client": ("from botocore.config import Config\n"
                           "from agentrun.checkpoint.s3model import session\n"
                           "session('http://127.0.0.1:9', 'us-east-1').create_client('s3', "
                           "endpoint_url='http://127.0.0.1:9', region_name='us-east-1', config=Config("
                           "s3={'addressing_style': 'path'}, retries={'mode': 'standard', 'max_attempts': 4}, "
                           "connect_timeout=5, read_timeout=30))"),
    "httpx": "from agentrun.lap.httpx_lite import httpx",
}


def floor(runs: int, json_path: str | None) -> None:
    """``--floor``: each program of :data:`FLOOR_PROGRAMS` in a fresh interpreter, interleaved, and
    all of them in one; prints p50s and the floor (interpreter + each package's increment)."""
    programs = {**FLOOR_PROGRAMS, "all three": "\n".join(v for k, v in FLOOR_PROGRAMS.items() if k != "interpreter")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENTRUN_"))}
    times: dict[str, list[float]] = {k: [] for k in programs}
    for _ in range(runs):
        for name, code in programs.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            times[name].append(time.perf_counter() - t0)
    p50 = {k: percentile(v, 0.5) for k, v in times.items()}
    print(f"the design's packages alone, {runs} fresh interpreters each, interleaved "
          f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}):")
    for name in programs:
        extra = "" if name == "interpreter" else f"  (+{(p50[name] - p50['interpreter']) * 1000:.0f} ms)"
        print(f"  {name:20s} p50 {p50[name] * 1000:5.0f} ms{extra}")
    print(f"  a lap on these packages starts no sooner than {p50['all three'] * 1000:.0f} ms (p50), before any "
          "of its own code, S3 request or model request")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"floor_seconds": times}, f)


def run_in_image(img: Any, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv in the image under runc (e2e/runc_node.py ``run_image``), in a fresh work directory."""
    import tempfile
    from pathlib import Path

    from e2e import runc_node

    with tempfile.TemporaryDirectory(prefix="bench-cold-runc-") as work:
        return runc_node.run_image(img, argv, Path(work))


def report(first_request: list[float], whole: list[float], cpu: list[float]) -> None:
    s, w, c = summary(first_request), summary(whole), summary(cpu)
    s90, w90, c90 = (percentile(v, 0.9) for v in (first_request, whole, cpu))
    print(f"  process start -> first model request: p50 {s['p50'] * 1000:.0f} ms, p90 {s90 * 1000:.0f} ms, "
          f"p99 {s['p99'] * 1000:.0f} ms (min {s['min'] * 1000:.0f}, max {s['max'] * 1000:.0f})")
    print(f"  whole lap process (checkpoint written, exit 0): p50 {w['p50'] * 1000:.0f} ms, p90 {w90 * 1000:.0f} ms, "
          f"p99 {w['p99'] * 1000:.0f} ms")
    print(f"  CPU time of the whole lap process (user + system): p50 {c['p50'] * 1000:.0f} ms, "
          f"p90 {c90 * 1000:.0f} ms (min {c['min'] * 1000:.0f})")


if __name__ == "__main__":
    main()
