"""Run every benchmark and write bench/results.md with tables and plots (bench/results-*.png).

    python bench/run_all.py                 # the full set (what `make bench` runs), ~20-40 min
    python bench/run_all.py --quick         # small counts, to check the harness (~5 min)
    python bench/run_all.py --skip-cluster  # no local control plane (checkpoint and cold-start only)

Each benchmark runs as a subprocess writing JSON; a benchmark that fails is reported as failed in
results.md (with the tail of its output) and the others still run. Regenerating overwrites
results.md and the PNGs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from benchlib import (  # noqa: E402
    fmt_bytes,
    fmt_ms,
    folded_profile_top,
    markdown_table,
    ratio,
    summary,
    verdict,
)

TARGET_P50, TARGET_P99 = 0.100, 1.0
TARGET_RATIO, TARGET_RSS_MB, TARGET_RESYNC = 50.0, 300.0, 30.0
PROFILE_KEEP = ("agentrun/", "kubernetes/", "urllib3/", "ssl", "kopf/", "botocore/", "boto3/", "pydantic",
                "json/", "http/client", "socket.py", "aiohttp/", "asyncio/threads.py")


def run(name: str, args: list[str], tmp: Path, log: list[str]) -> dict[str, Any] | None:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, str(BENCH / args[0]), *args[1:], "--json", str(out)]
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.time() - t0
    print(p.stdout, end="", flush=True)
    log.append(f"### {name} ({took:.0f} s, exit {p.returncode})\n\n```\n$ python bench/{' '.join(args)}\n"
               f"{p.stdout.strip()}\n{p.stderr.strip()[-3000:] if p.returncode else ''}```\n")
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        # a benchmark that saves as it goes (the cluster one) keeps its finished parts
        return json.loads(out.read_text()) if out.exists() else None
    return json.loads(out.read_text())


def run_text(name: str, args: list[str], log: list[str]) -> None:
    """A benchmark that prints its own table (the existing store- and compute-level ones)."""
    print(f"== {name}", flush=True)
    p = subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], capture_output=True, text=True, cwd=ROOT)
    log.append(f"### {name} (exit {p.returncode})\n\n```\n$ python bench/{' '.join(args)}\n{p.stdout.strip()}\n"
               f"{p.stderr.strip()[-2000:] if p.returncode else ''}```\n")


# ------------------------------------------------------------------ plots


def plot_checkpoints(lg: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = lg["agentrun"]["per_lap_bytes"]
    theirs = lg["langgraph"]["per_step_bytes"][1:]  # step 0 is the input checkpoint
    cum = lambda xs: [sum(xs[: i + 1]) / 1e6 for i in range(len(xs))]  # noqa: E731
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(range(1, len(ours) + 1), cum(ours), label="agentrun (S3: lap records, journal, snapshots)")
    a.plot(range(1, len(theirs) + 1), cum(theirs), label=f"LangGraph {lg['langgraph']['version']} SqliteSaver")
    a.set_xlabel("lap")
    a.set_ylabel("bytes written so far (MB)")
    a.set_title("cumulative checkpoint bytes")
    a.legend()
    b.semilogy(range(1, len(ours) + 1), ours, label="agentrun", lw=0.8)
    b.semilogy(range(1, len(theirs) + 1), theirs, label="LangGraph", lw=0.8)
    b.set_xlabel("lap")
    b.set_ylabel("bytes written by this lap (log)")
    b.set_title("bytes per lap")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_overhead(levels: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for lv in levels:
        g = sorted(lv["gap_job_complete_to_next_job"])
        if g:
            ax.plot([x * 1000 for x in g], [(i + 1) / len(g) for i in range(len(g))],
                    label=f"{lv['runs']} concurrent runs (n={len(g)})")
    ax.axvline(TARGET_P50 * 1000, color="grey", ls="--", lw=0.8)
    ax.axvline(TARGET_P99 * 1000, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("lap Job Complete -> next lap Job ADDED (ms, log); dashed: 100 ms, dotted: 1 s")
    ax.set_ylabel("fraction of laps")
    ax.set_title("control-plane overhead per lap (CDF)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_scale(sc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in sc["samples"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(t, [s[1] for s in sc["samples"]], label="reconciles done")
    ax.axhline(sc["runs"], color="grey", ls="--", lw=0.8)
    ax.set_xlabel("seconds since the operator process started")
    ax.set_ylabel("agentrun_reconcile_total")
    ax2 = ax.twinx()
    ax2.plot(t, [(s[2] or 0) / 1024 for s in sc["samples"]], color="tab:red", label="RSS (MB)")
    ax2.set_ylabel("RSS (MB)", color="tab:red")
    ax.set_title(f"operator restart with {sc['runs']} AgentRuns")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------ report


def _load_note(load_before: str) -> str:
    """A warning when something else was using the CPUs as the benchmarks started."""
    one_minute = float(load_before.split("/")[0])
    if one_minute >= 2.0:
        return ("; **the box was busy before the benchmarks started** (load at or above its CPU count), "
                "so times carry other jobs' noise")
    return "; the box was otherwise idle when the benchmarks started (the load after is their own)"


def report(res: dict[str, Any], env: dict[str, Any], raw: list[str], out: Path, profile: Path | None) -> str:
    md: list[str] = []
    md.append("# Benchmark results\n")
    md.append(f"Generated by `make bench` (`python bench/run_all.py{' ' + env['argv'] if env['argv'] else ''}`) on "
              f"{env['date']}: {env['cpus']} CPUs, {env['machine']}, Python {env['python']}. "
              f"Load average (1/5/15 min) {env['load_before']} before, {env['load_after']} after"
              f"{_load_note(env['load_before'])}. "
              "The benchmark processes ran under `nice -n 10`. Percentiles are nearest-rank; with fewer than 100 "
              "samples p99 is the maximum. Each benchmark's own output is at the end.\n")
    targets: list[list[str]] = []
    ov = res.get("overhead")
    lg = res.get("langgraph")
    sc = res.get("scale")
    cs = res.get("cold_start")
    top = max(ov, key=lambda lv: lv["runs"]) if ov else None
    if top is not None and top["gap_job_complete_to_next_job"]:
        s = summary(top["gap_job_complete_to_next_job"])
        targets.append([f"overhead per lap at {top['runs']} runs, p50", "≤ 100 ms", fmt_ms(s["p50"]),
                        verdict(s["p50"] <= TARGET_P50)])
        targets.append([f"overhead per lap at {top['runs']} runs, p99", "≤ 1 s", fmt_ms(s["p99"]),
                        verdict(s["p99"] <= TARGET_P99)])
    if lg:
        targets.append(["checkpoint bytes, LangGraph / agentrun at 500 laps", "≥ 50x",
                        f"{lg['ratio_total_bytes']:.1f}x", verdict(lg["ratio_total_bytes"] >= TARGET_RATIO)])
    if res.get("langgraph_big"):
        b = res["langgraph_big"]
        targets.append([f"same, tool results +{b['tool_result_padding']} B", "≥ 50x", f"{b['ratio_total_bytes']:.1f}x",
                        verdict(b["ratio_total_bytes"] >= TARGET_RATIO)])
    if sc:
        targets.append([f"resync after restart, {sc['runs']} runs", "≤ 30 s", f"{sc['resync_seconds']:.1f} s",
                        verdict(sc["resync_seconds"] <= TARGET_RESYNC)])
        peak = sc["rss_kb_peak"] / 1024
        targets.append([f"operator RSS at {sc['runs']} runs (peak)", "≤ 300 MB", f"{peak:.0f} MB",
                        verdict(peak <= TARGET_RSS_MB)])
    md.append("## Targets\n")
    md.append(markdown_table(["figure", "target", "measured", "verdict"], targets) if targets else "(no results)\n")

    if ov:
        md.append("\n## 1. Control-plane overhead per lap\n")
        md.append(
            "R concurrent AgentRuns of L laps each on the local control plane (etcd, kube-apiserver, "
            "kube-controller-manager, the process kubelet), the S3 server and the operator as a subprocess. "
            "Each lap is a real `agentrun lap` pod (scripted model, one call to a local HTTP tool so the run "
            "continues) writing a real checkpoint, which the operator reads and verifies in S3 before it creates "
            "the next lap's Job. **How it is timed**: a watch in the benchmark process on the namespace's Jobs and "
            "pods stamps each event at arrival (Kubernetes timestamps have 1-second resolution); overhead = "
            "next lap's Job `ADDED` minus the finished Job's `Complete` condition, both seen by the same watch "
            "path. This is the operator's part: watch delivery to the operator, its reconcile (read the run, "
            "list Jobs and the finished pod, read and verify the checkpoint in S3, decide) and the Job create. "
            "The column *pod done -> next Job* adds the Job controller's own delay (pod `Succeeded` -> Job "
            "`Complete`), which is Kubernetes', not the operator's. Operator CPU is its utime+stime from /proc "
            "over the whole benchmark, divided by the laps run; the lap processes compete with it for the "
            "2 CPUs.\n")
        rows = []
        for lv in ov:
            g, p = lv["gap_job_complete_to_next_job"], lv["gap_pod_succeeded_to_next_job"]
            gs = summary(g) if g else None
            ps = summary(p) if p else None
            rows.append([lv["runs"], lv["laps_per_run"], gs["n"] if gs else 0,
                         fmt_ms(gs["p50"]) if gs else "-", fmt_ms(gs["p99"]) if gs else "-",
                         fmt_ms(ps["p50"]) if ps else "-", fmt_ms(ps["p99"]) if ps else "-",
                         f"{lv['operator_cpu_per_lap'] * 1000:.0f} ms",
                         f"{lv['reconciles'] / max(1, lv['laps_total']):.1f}",
                         f"{lv['reconcile_seconds_sum'] / max(1, lv['reconciles']) * 1000:.0f} ms",
                         f"{lv['wall_seconds']:.0f} s", len(lv["failed_runs"]), lv["retried_jobs"],
                         " / ".join(f"{x:.1f}" for x in lv["load_after"][:1])])
        md.append(markdown_table(
            ["runs", "laps/run", "gaps n", "Job done -> next Job p50", "p99", "pod done -> next Job p50", "p99",
             "operator CPU/lap", "reconciles/lap", "mean reconcile (wall)", "wall", "failed runs", "retried Jobs",
             "load after"], rows))
        md.append("\n![overhead CDF](results-overhead.png)\n")
        if profile is not None and profile.exists():
            # frames of the operator's own code and the libraries it calls (threading/asyncio/click
            # frames are on every stack and say nothing)
            top_frames = folded_profile_top(profile.read_text().splitlines(), n=25, keep=PROFILE_KEEP)
            md.append(f"\nWhere the operator's CPU goes at {top['runs']} runs (py-spy, on-CPU samples of every thread "
                      "of the operator during the run, inclusive share; the folded stacks are in "
                      f"`{profile.name}`):\n")
            md.append(markdown_table(["share", "frame"], [[f"{pct:.1f} %", f"`{k}`"] for pct, k in top_frames]))
    if lg:
        a, t = lg["agentrun"], lg["langgraph"]
        md.append("\n## 2. Checkpoint cost over a 500-lap run, beside LangGraph\n")
        md.append(
            f"The same {a['laps']}-lap run on both sides. **agentrun**: `bench_lap_run.py`'s scripted run through "
            "the real lap code (`execute_lap`): each lap journals the model response and the tool result, "
            "writes the lap record (the lap's messages, the tool call record, usage, timings, hash chain) and every "
            "10 laps a snapshot of the state (a window of recent messages, compaction summary, pinned facts) to a "
            "local S3 server; bytes = every object the run left. Resume = `load_state` at the last lap. "
            f"**LangGraph {t['version']}** with langgraph-checkpoint-sqlite {t['sqlite_version']}: a `StateGraph` "
            "with a `messages` channel (`add_messages`) and one node looping once per lap, each superstep "
            "appending exactly the messages of our lap N (read back from our store: same contents, as "
            "`AIMessage` with its tool call and `ToolMessage`), `SqliteSaver` on a file. Bytes = the "
            "`checkpoints` and `writes` blobs (and the file size); resume = `get_tuple` of the latest checkpoint. "
            "What each stores: LangGraph's SQLite checkpointer stores the full channel values in every "
            "checkpoint, so a step costs the whole history so far (quadratic in laps); agentrun stores each lap's "
            "delta once and a bounded window snapshot every K laps (linear). The run's full history stays "
            "readable in agentrun (the lap records), so nothing is dropped to get the ratio. The agentrun side "
            "also keeps the crash journal (model response and tool result written before the lap record), "
            "which LangGraph does not have.\n")
        rows = []
        for key, label in (("langgraph", "as `bench_lap_run.py` (~300 B tool result)"),
                           ("langgraph_big", "tool results padded")):
            x = res.get(key)
            if not x:
                continue
            xa, xt = x["agentrun"], x["langgraph"]
            ra, rt = summary(xa["resume_seconds"]), summary(xt["resume_seconds"])
            pad = f" (+{x['tool_result_padding']} B)" if x.get("tool_result_padding") else ""
            rows.append([label + pad, f"{xa['message_bytes_per_lap']:.0f} B",
                         fmt_bytes(xa["total_bytes"]), fmt_bytes(xa["total_bytes"] / xa["laps"]),
                         fmt_bytes(xa["per_lap_bytes"][-1]),
                         fmt_bytes(xt["blob_bytes"]), fmt_bytes(xt["file_bytes"]), fmt_bytes(xt["per_step_bytes"][-1]),
                         f"{x['ratio_total_bytes']:.1f}x",
                         f"{fmt_ms(ra['p50'])} ({xa['resume_objects_read']} obj)", fmt_ms(rt["p50"]),
                         f"{ratio(rt['p50'], ra['p50']):.2f}x"])
        md.append(markdown_table(
            ["setup", "messages/lap", "agentrun total", "per lap", f"lap {a['laps']}", "LangGraph blobs",
             "SQLite file", f"step {a['laps']}", "bytes ratio LG/ours", "resume ours p50 (n=5)",
             "resume LG p50 (n=5)", "resume ratio LG/ours"], rows))
        kinds = a["bytes_by_kind"]
        md.append("\nWhere agentrun's bytes go (default setup): " + ", ".join(
            f"{k} {fmt_bytes(v)} ({100 * v / a['total_bytes']:.0f} %)" for k, v in sorted(kinds.items())) + ".\n")
        md.append("\n![checkpoint bytes](results-checkpoints.png)\n")
    if sc:
        md.append(f"\n## 3. Operator scale: restart with {sc['runs']} AgentRuns\n")
        mix = sc["mix"]
        md.append(
            f"{sc['runs']} AgentRuns in one namespace, no Jobs: {mix['suspended']} with `spec.suspend: true` "
            f"(driven to Suspended by a first operator), {mix['terminal']} terminal (Succeeded / Failed / "
            f"BudgetExceeded written through the status subresource, as an earlier operator leaves them), "
            f"{mix['awaiting_approval']} AwaitingApproval (a pending approval due in a day). The first operator "
            "settles them and is stopped (SIGTERM, it releases the Lease); a second one starts. **Resync** = "
            "from the second operator's process start (interpreter and imports included) until every run has "
            "been reconciled once: its `agentrun_reconcile_total` (reconciles done as the Lease holder) reaches "
            "the number of runs and stays there for 3 s (sampled every 0.2 s). Every run is enqueued at start "
            "by the resync on acquiring the Lease, and the queue holds a run until its reconcile is done. "
            "RSS from /proc/<pid>/status: VmHWM (peak) and VmRSS 10 s after the resync (steady). The periodic "
            "resync was set to 1 h to keep it out of the window; the Lease duration is the default 15 s.\n")
        rows = [
            ["runs created (8 client threads)", f"{sc['create_seconds']:.1f} s"],
            ["resync: process start -> every run reconciled", f"{sc['resync_seconds']:.1f} s"],
            ["... of which process start -> Lease acquired (operator log)", _lease_seconds(sc)],
            ["... first reached N reconciles", f"{sc['first_n_reconciles_seconds']:.1f} s"
             if sc.get("first_n_reconciles_seconds") is not None else "-"],
            ["reconciles done by the restarted operator", f"{sc['reconciles']:.0f}"],
            ["mean reconcile, wall, waiting for a thread included (its own histogram)",
             fmt_ms((sc.get("reconcile_seconds_sum") or 0) / max(1, sc["reconciles"]))],
            ["RSS of the first operator, settled", f"{(sc['rss_kb_first_operator'] or 0) / 1024:.0f} MB"],
            ["RSS peak (VmHWM) / steady (VmRSS)", f"{sc['rss_kb_peak'] / 1024:.0f} MB / {sc['rss_kb_steady'] / 1024:.0f} MB"],
            ["phases after the restart", ", ".join(f"{k} {v}" for k, v in sorted(sc["phases_after"].items()))],
        ]
        md.append(markdown_table(["figure", "value"], rows))
        md.append("\n![resync](results-scale.png)\n")
    if cs:
        f, w = summary(cs["first_request_seconds"]), summary(cs["process_seconds"])
        md.append("\n## 4. Lap runner cold start\n")
        md.append(
            "`agentrun lap` started by a subprocess (the console script, as in the image) for lap 1 of a fresh "
            "run whose model is an OpenAI-compatible server in the benchmark process, which stamps each request's "
            "arrival; cold start = arrival of the first model request minus the instant before `Popen` "
            "(interpreter, imports, config, S3 client, reading the run's state from S3). A real pod adds the "
            "container start; on the process kubelet it is a fork/exec.\n")
        md.append(markdown_table(["figure", "runs", "p50", "p99", "min", "max"], [
            ["process start -> first model request", f["n"], fmt_ms(f["p50"]), fmt_ms(f["p99"]), fmt_ms(f["min"]),
             fmt_ms(f["max"])],
            ["whole lap process (checkpoint written, exit 0)", w["n"], fmt_ms(w["p50"]), fmt_ms(w["p99"]),
             fmt_ms(w["min"]), fmt_ms(w["max"])],
        ]))
    if res.get("analysis"):
        md.append("\n## Analysis\n")
        md.append(res["analysis"])
    md.append("\n## Raw output\n")
    md.extend(raw)
    text = "\n".join(md)
    out.write_text(text)
    return text


def _lease_seconds(sc: dict[str, Any]) -> str:
    ts = sc.get("lease_acquired_ts")
    if not ts or not sc.get("restart_epoch"):
        return "-"
    return f"{datetime.fromisoformat(ts).timestamp() - sc['restart_epoch']:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts (harness check)")
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--out", default=str(BENCH / "results.md"))
    ap.add_argument("--render", help="only write results.md from the JSON of an earlier run in this directory")
    ap.add_argument("--analysis", default=str(BENCH / "analysis.md"),
                    help="hand-written analysis appended to results.md (kept if present)")
    args = ap.parse_args()
    q = args.quick
    out = Path(args.out)
    env = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
           "machine": f"{platform.system()} {platform.machine()}", "python": platform.python_version(),
           "load_before": " / ".join(f"{x:.1f}" for x in os.getloadavg()), "argv": " ".join(sys.argv[1:])}
    res: dict[str, Any] = {}
    raw: list[str] = []
    profile = out.parent / "results-operator-profile.txt"
    tmp = Path(args.render or tempfile.mkdtemp(prefix="agentrun-bench-results-"))  # kept: each benchmark's JSON
    print(f"benchmark JSON in {tmp}", flush=True)

    def load(name: str) -> dict[str, Any] | None:
        path = tmp / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    if args.render:  # no run: the JSON a previous (perhaps interrupted) run left
        cl = load("operator on the local control plane") or {}
        res["overhead"], res["scale"] = cl.get("overhead"), cl.get("scale")
        res["langgraph"] = load("checkpoints beside LangGraph")
        res["langgraph_big"] = load("checkpoints beside LangGraph, bigger tool results")
        res["cold_start"] = load("lap runner cold start")
        raw.append(f"(rendered from the JSON in {tmp} by `run_all.py --render`; the outputs below are the "
                   "*.txt files found there)\n")
        for f in sorted(tmp.glob("*.txt")):
            raw.append(f"### {f.stem}\n\n```\n{f.read_text().strip()}\n```\n")
    else:
        if not args.skip_cluster:
            cl = run("operator on the local control plane",
                     ["bench_operator_cluster.py", "all", "--runs", "1,5" if q else "1,50,200", "--laps", "2",
                      "--scale-runs", "50" if q else "1000", "--profile", str(profile)], tmp, raw)
            if cl:
                res["overhead"], res["scale"] = cl.get("overhead"), cl.get("scale")
        laps = "50" if q else "500"
        res["langgraph"] = run("checkpoints beside LangGraph", ["bench_vs_langgraph.py", "--laps", laps], tmp, raw)
        res["langgraph_big"] = run("checkpoints beside LangGraph, bigger tool results",
                                   ["bench_vs_langgraph.py", "--laps", laps, "--tool-result-padding", "1500"], tmp, raw)
        res["cold_start"] = run("lap runner cold start", ["bench_cold_start.py", "--runs", "5" if q else "20"], tmp, raw)
        run_text("checkpoint store alone", ["bench_checkpoints.py", "--laps", laps], raw)
        run_text("operator decision compute", ["bench_operator_overhead.py", "--laps", laps], raw)
    if Path(args.analysis).exists():
        res["analysis"] = Path(args.analysis).read_text()
    for png in out.parent.glob("results-*.png"):
        png.unlink()
    if res.get("langgraph"):
        plot_checkpoints(res["langgraph"], out.parent / "results-checkpoints.png")
    if res.get("overhead"):
        plot_overhead(res["overhead"], out.parent / "results-overhead.png")
    if res.get("scale"):
        plot_scale(res["scale"], out.parent / "results-scale.png")
    env["load_after"] = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    (out.parent / "results.json").write_text(json.dumps({"env": env, **{k: v for k, v in res.items() if k != "analysis"}}))
    report(res, env, raw, out, profile)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
