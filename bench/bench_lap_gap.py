"""The lap gap as the user feels it: from lap N's checkpoint written to lap N+1's first model request.

The overhead benchmark of ``bench_operator_cluster.py`` (same cluster, S3 server, operator
subprocess, warm-up run, operator CPU / reconciles / API requests per lap, ``--lap-nice``), with
the laps' model an OpenAI-compatible server in this process (:class:`StampingModel`) instead of the
scripted one, so that the model request of every lap arrives here and is stamped. Each run is R
laps: the model answers a lap whose conversation holds k tool results with one call of the
``note`` tool (the benchmark's local HTTP tool) while k < R - 1, and with a final answer after;
it decides from the conversation alone, so a lap asked again gets the same answer.

One gap, lap N -> N + 1 of a run, ends to end and its parts (each boundary one timestamp, so the
parts add up to the whole):

* **checkpoint written**: the S3 server's own LastModified of ``laps/<N>.json`` when it has
  sub-second precision (versitygw's and moto's have none), else the lap's own record of its
  successful PUT: the ``ts`` of its ``lap checkpointed`` log line (in the pod's log file that the
  process kubelet writes; logged after the PUT and the journal's deletion), else the lap record's
  ``timings.finishedAt`` (taken just before the PUT). The JSON says which (``checkpoint_clock``),
  and keeps the PUT's own time (``finishedAt`` -> ``lap checkpointed``) per gap as ``checkpoint_write``;
* **pod exit** -> the watch here sees lap N's container terminated (the kubelet's status update);
* **Job create** -> the watch sees lap N + 1's Job ``ADDED`` (the operator's decision and request);
* **pod create** -> the watch sees its pod ``ADDED`` (kube-controller-manager's Job controller);
* **container start** -> the watch sees its container running (the kubelet: a fork/exec on the
  process node, a runc container on the runc node);
* **lap start-up** -> lap N + 1's first model request arrives here (interpreter, imports, config,
  S3 client, the lap's first reads).

Kubernetes' own timestamps (creationTimestamp, startedAt, finishedAt) have 1-second resolution,
so the boundaries between the two ends are arrival times at this process's watch (its delivery
latency shifts a boundary, never the whole). All clocks are this box's.

Variants: ``--variant LABEL[:NAME=VALUE,...]`` (repeatable) runs every level once per variant, each
with its own operator started with those settings added to its environment, one after the other on
the same cluster, so two controller paths are measured side by side in one run. Without it: one
variant, ``main`` (the operator as it is).

``--node runc``: the process kubelet in runc mode (e2e/runc_node.py), the laps in the image
``--image`` (default ``ghcr.io/agentrun/agentrun:<version>``, from the local image store:
``make image``); its container start is the runtime's.

    python bench/bench_lap_gap.py --runs 1,50,200 --laps 4 --lap-nice 19 [--variant main] [--json out.json]
    python bench/bench_lap_gap.py --node runc --runs 1,10 --laps 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_operator_cluster import WARMUP, Bench, lap_priority  # noqa: E402
from benchlib import autogroup_enabled, checkpointed_at, parse_time, summary, wakeup_price_us  # noqa: E402

#: The parts of a gap, in order; their sum is the gap.
PARTS = ("pod_exit", "job_create", "pod_create", "container_start", "startup")
PART_TITLES = {"pod_exit": "pod exit", "job_create": "Job create", "pod_create": "pod create",
               "container_start": "container start", "startup": "lap start-up"}


class StampingModel:
    """An OpenAI-compatible chat-completions server, in a thread: ``POST /<tag>/<run>/<laps>/v1/chat/
    completions``. Stamps the first arrival of each (tag, run, lap), lap = 1 + the tool results in
    the conversation; answers one ``note`` tool call while lap < laps, a final answer after."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[str, str, int], float] = {}
        self.lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                now = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                parts = self.path.strip("/").split("/")
                tag, run, laps = parts[0], parts[1], int(parts[2])
                lap = 1 + sum(1 for m in body.get("messages") or [] if m.get("role") == "tool")
                with model.lock:
                    model.arrivals.setdefault((tag, run, lap), now)
                answer = model_answer(lap, laps)
                data = json.dumps({
                    "id": f"chatcmpl-{run}-{lap}", "object": "chat.completion", "created": int(now), "model": "bench",
                    "choices": [{"index": 0, "message": answer,
                                 "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop"}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def model_answer(lap: int, laps: int) -> dict[str, Any]:
    """The assistant message of lap ``lap`` of a run of ``laps`` laps: a ``note`` call (a lap that
    continues) before the last lap, the final answer in it."""
    if lap < laps:
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_lap{lap}", "type": "function",
            "function": {"name": "note", "arguments": json.dumps({"i": lap})}}]}
    return {"role": "assistant", "content": "done"}


def lap_gaps(jobs: dict[str, dict[int, str]], events: dict[tuple[str, str], float],
             written: dict[tuple[str, int], float], arrivals: dict[tuple[str, int], float]) -> list[dict[str, Any]]:
    """Every gap lap N -> N + 1 of every run with all its boundaries seen: ``{"run", "lap" (N),
    "total", and each of PARTS}`` in seconds. ``jobs``: run -> lap -> the name of its first attempt's
    Job; ``events``: the watch's first arrivals, ``("pod:<job>", "Terminated" | "ADDED" | "Running")``
    and ``("job:<job>", "ADDED")``; ``written``: (run, lap) -> checkpoint written; ``arrivals``:
    (run, lap) -> the lap's first model request. A gap with a boundary missing (a retried lap, a
    watch that missed an update) is left out."""
    out = []
    for run, laps in sorted(jobs.items()):
        for lap, job in sorted(laps.items()):
            nxt = laps.get(lap + 1)
            if nxt is None:
                continue
            t = [written.get((run, lap)), events.get((f"pod:{job}", "Terminated")), events.get((f"job:{nxt}", "ADDED")),
                 events.get((f"pod:{nxt}", "ADDED")), events.get((f"pod:{nxt}", "Running")), arrivals.get((run, lap + 1))]
            if any(x is None for x in t):
                continue
            ts: list[float] = [x for x in t if x is not None]
            gap: dict[str, Any] = {"run": run, "lap": lap, "total": ts[-1] - ts[0]}
            gap.update({part: ts[i + 1] - ts[i] for i, part in enumerate(PARTS)})
            out.append(gap)
    return out


class LapGapBench(Bench):
    def __init__(self, workdir: Path, s3: str, node: str) -> None:
        super().__init__(workdir, None, s3, node=node)
        self.model = StampingModel()
        self.tag = "x"

    def close(self) -> None:
        self.model.close()
        super().close()

    def run_doc(self, name: str, script: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        doc = super().run_doc(name, script, **spec)
        doc["spec"]["agent"]["model"] = {"provider": "openai", "name": "bench",
                                         "baseURL": f"{self.model.url}/{self.tag}/{name}/{len(script)}/v1"}
        return doc

    def checkpoint_logs(self, ns: str) -> dict[tuple[str, int], float]:
        """(run, lap) -> the ``ts`` of the lap's ``lap checkpointed`` log line (its first attempt
        that wrote one), from the pods' log files of the process kubelet (``DIR/pods/<ns>_<pod>_<uid>/``)."""
        out: dict[tuple[str, int], float] = {}
        for log in sorted((self.cluster.dir / "pods").glob(f"{ns}_*/*.log")):
            for line in log.read_text(errors="replace").splitlines():
                seen = checkpointed_at(line) if "lap checkpointed" in line else None
                if seen is not None:
                    out.setdefault(seen[:2], seen[2])
        return out

    def checkpoints_written(self, prefix: str) -> tuple[dict[tuple[str, int], float], str]:
        """(run, lap) -> the time its lap record was written, and which clock that is: the S3
        server's LastModified if it has sub-second precision, else the record's finishedAt."""
        from agentrun.checkpoint.codec import inflate

        client = self.s3_client()
        found: list[tuple[str, int, str, float]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=prefix + "/"):
            for obj in page.get("Contents") or []:
                parts = obj["Key"].split("/")  # prefix/<namespace>/<name>/<uid>/laps/<lap>.json
                if len(parts) >= 6 and parts[-2] == "laps" and parts[-1].endswith(".json"):
                    found.append((parts[-4], int(parts[-1][:-5]), obj["Key"], parse_time(obj["LastModified"])))
        if any(t % 1 for *_, t in found):
            return {(run, lap): t for run, lap, _, t in found}, "s3-last-modified"
        out = {}
        for run, lap, key, _ in found:
            raw = client.get_object(Bucket=self.s3.bucket, Key=key)["Body"].read()
            doc = json.loads(inflate(raw, key))
            out[(run, lap)] = parse_time(doc["timings"]["finishedAt"])
        return out, "lap-record-finishedAt"

    def s3_client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.s3.endpoint_url, aws_access_key_id=self.s3.access_key,
                            aws_secret_access_key=self.s3.secret_key, region_name=self.s3.region,
                            config=Config(s3={"addressing_style": "path"}))

    def level(self, runs: int, laps: int, timeout: float, variant: str) -> dict[str, Any]:
        self.tag = f"{variant}-{runs}"
        res = self.overhead(runs, laps, timeout)
        d = self.level_detail
        written, clock = self.checkpoints_written(d["prefix"])
        logged = self.checkpoint_logs(d["ns"])
        finished = written if clock == "lap-record-finishedAt" else {}
        if clock == "lap-record-finishedAt" and logged:  # one clock for every gap: a lap not logged has none
            written, clock = logged, "lap-log-checkpointed"
        arrivals = {(run, lap): t for (tag, run, lap), t in self.model.arrivals.items() if tag == self.tag}
        jobs = {run: v for run, v in d["jobs"].items() if run != WARMUP}
        gaps = lap_gaps(jobs, d["events"], written, arrivals)
        for g in gaps:  # the PUT (and the journal's deletion) as the lap saw it, beside the gap
            key = (g["run"], g["lap"])
            if key in finished and key in logged:
                g["checkpoint_write"] = logged[key] - finished[key]
        res.update({"variant": variant, "checkpoint_clock": clock, "lap_gaps": gaps,
                    "lap_gaps_expected": sum(max(0, len(v) - 1) for v in jobs.values())})
        return res


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``LABEL`` or ``LABEL:NAME=VALUE,NAME=VALUE``."""
    label, _, settings = text.partition(":")
    env = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
    return label, env


def report_line(res: dict[str, Any]) -> str:
    gaps = res["lap_gaps"]
    if not gaps:
        return f"lap gap, {res['variant']}, {res['runs']} runs x {res['laps_per_run']} laps: no complete gap seen"
    tot = summary([g["total"] for g in gaps])
    parts = ", ".join(f"{PART_TITLES[p]} {summary([g[p] for g in gaps])['p50'] * 1000:.0f}" for p in PARTS)
    return (f"lap gap, {res['variant']}, {res['runs']} runs x {res['laps_per_run']} laps: checkpoint written -> "
            f"next lap's first model request p50 {tot['p50'] * 1000:.0f} ms, p99 {tot['p99'] * 1000:.0f} ms "
            f"(n={tot['n']} of {res['lap_gaps_expected']}); parts p50 (ms): {parts}; "
            + "".join(f"{what} p50 {summary(res[k])['p50'] * 1000:.0f} ms; " for k, what in (
                ("gap_pod_succeeded_to_next_job", "pod Succeeded -> next Job"),
                ("gap_job_complete_to_next_job", "Job Complete -> next Job")) if res.get(k))
            + f"operator CPU {res['operator_cpu_per_lap'] * 1000:.1f} ms/lap, reconciles/lap "
            f"{res['reconciles_per_lap']:.2f}, API requests/lap {res['kube_requests_per_lap']:.2f}; "
            f"checkpoint clock {res['checkpoint_clock']}; load {os.getloadavg()[0]:.1f}; "
            f"failed runs {len(res['failed_runs'])}, retried Jobs {res['retried_jobs']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="1,50,200", help="comma-separated concurrency levels")
    ap.add_argument("--laps", type=int, default=4, help="laps per run (at least 10 below 10 runs)")
    ap.add_argument("--variant", action="append", default=None,
                    help="LABEL[:NAME=VALUE,...]: an operator with these settings (repeatable; default: main)")
    ap.add_argument("--lap-nice", type=int, default=None,
                    help="the lap processes at nice N, their sessions' autogroups too (benchlib.lowered), as the "
                         "overhead benchmark's 'laps deprioritised'")
    ap.add_argument("--node", choices=("", "runc"), default=os.environ.get("AGENTRUN_NODE", ""),
                    help="the process kubelet's mode (default $AGENTRUN_NODE)")
    ap.add_argument("--image", default=None, help="--node runc: the laps' image (default ghcr.io/agentrun/agentrun:<version>)")
    ap.add_argument("--s3", choices=("moto", "versitygw"), default="versitygw")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--dir", help="working directory (default: a temp dir, removed at the end)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    # the laps' `agentrun` (e2e.cluster.operator_env: the first on PATH) is this interpreter's
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    variants = [parse_variant(v) for v in (args.variant or ["main"])]
    tmp = None if args.dir else tempfile.mkdtemp(prefix="agentrun-lapgap-")
    workdir = Path(args.dir or tmp).resolve()
    out: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "wakeup_price_us": wakeup_price_us(),
                           "node": args.node or "process", "s3_server": args.s3, "variants": dict(variants),
                           "lap_nice": args.lap_nice, "autogroup": autogroup_enabled(),
                           "levels": []}
    extra: dict[str, str] = {}
    if args.node == "runc":
        import tomllib

        version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        out["image"] = image = args.image or f"ghcr.io/agentrun/agentrun:{version}"
        extra = {"AGENTRUN_LAP_IMAGE": image, "AGENTRUN_LAP_COMMAND": json.dumps(["agentrun", "lap"])}
    bench = LapGapBench(workdir, args.s3, args.node)
    bench.lap_nice = args.lap_nice
    if args.lap_nice is not None:
        out["lap_priority"] = lap_priority(args.lap_nice)

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f)

    try:
        for runs in (int(x) for x in args.runs.split(",")):
            laps = args.laps if runs >= 10 else max(args.laps, 10)
            for label, env in variants:
                bench.operator_extra_env = {**extra, **env}
                res = bench.level(runs, laps, args.timeout, label)
                out["levels"].append(res)
                save()
                print(report_line(res), flush=True)
    finally:
        bench.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    save()


if __name__ == "__main__":
    main()
