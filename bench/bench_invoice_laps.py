"""The invoice example under ``make dev``, laps 1-8, timed wall-clock: the operator before the pod-exit
change beside this one (issue 34).

What runs is what ``make dev`` runs: ``tools/dev.sh up`` itself, with its state directory in the
benchmark's work directory and every port chosen free (``DEV_*_PORT=0``): the local control plane
(etcd, kube-apiserver, kube-controller-manager, the process kubelet), moto's S3 server, the CRDs and
admission policies, the recording tool server, the MCP ledger server, the operator with dev.sh's
settings, the approval inbox, and ``examples/invoice-run.yaml`` (its scripted model, its tools on
that tool server) applied. The first ``up`` brings all of it up (the MCP example's run beside the
invoice run): a warm-up, not counted. Then each round deletes the invoice run (the operator still up:
the run's finalizer), waits until its Jobs are gone, and runs ``tools/dev.sh up`` again, which, as a
second ``make dev`` does, keeps the cluster, S3 and the tool servers, restarts the operator and the
inbox and applies the example again: a new run ``invoices-2024-06`` (new uid), laps 1..8, then
``AwaitingApproval`` (lap 8 asks for approval of ``schedule_payment``), where dev.sh returns.

The two operators: ``new`` is this checkout's (``agentrun`` on PATH, this interpreter's); ``old``
is the same command with an export of an older commit's ``operator/`` directory first on
``PYTHONPATH`` (``--before-commit``, default 26a5622: a lap ended at its Job's ``Complete``
condition; now it ends at its lap pod's exit 0), byte-compiled before the first round. Only the
operator (and the inbox dev.sh starts beside it) differ: the lap pods are the process kubelet's
children, started with the kubelet's environment from the first ``up``, so both variants' laps run
this checkout's ``agentrun lap``. Rounds alternate, old first: old, new, old, new, ... on one cluster.

**No approval wait in laps 1-8**: lap 8 is the lap that requests the approval; its checkpoint is
the end of what is timed, and the run is deleted while it awaits the decision. Nobody approves.

How each boundary of a run is taken (all clocks are this box's):

* **Job N** -- lap N's Job (first attempt) ``ADDED``, at arrival at this process's watch (Kubernetes
  timestamps have 1-second resolution);
* **checkpoint N** -- the ``ts`` of lap N's ``lap checkpointed`` log line (ms; written after the
  lap record's PUT and its journal's deletion), from the pod's log file the process kubelet writes
  (moto's LastModified has whole seconds);
* **model call N** -- the lap record's ``timings.startedAt`` (the lap's state read and its model and
  tools set up; its scripted model answers next, in the process: no request leaves it, so this
  stands for "the first model request" of a lap with a real model);
* **AwaitingApproval** -- the run's ``status.phase`` becoming ``AwaitingApproval``, at arrival at the
  watch; **applied** -- the run ``ADDED`` (dev.sh's ``kubectl apply``, right after it restarted the
  operator: so applied -> Job 1 holds the operator's start and Lease, in both variants).

Figures per run: lap N = Job N -> checkpoint N (N = 1..8); gap N = checkpoint N -> Job N + 1 and
checkpoint N -> model call N + 1 (N = 1..7); laps 1-8 = Job 1 -> checkpoint 8, which is exactly the
sum of the laps and the gaps to the next Job. The table gives each variant's median over its rounds.

    python bench/bench_invoice_laps.py [--rounds 3] [--before-commit 26a5622 | --before DIR] [--json out.json]

``--before DIR``: an ``operator/`` directory exported already (``git archive C operator | tar -x``)
instead of the export of ``--before-commit`` made here (which needs this checkout's git history).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import checkpointed_at, parse_time, stamp_events  # noqa: E402

#: The run of examples/invoice-run.yaml (tools/dev.sh's RUN) and the laps timed: 1..8 end at its
#: approval request (lap 8's schedule_payment).
RUN = "invoices-2024-06"
LAPS = 8
NAMESPACE = "default"
#: tools/dev.sh's checkpoint prefix: AGENTRUN_CHECKPOINT_URI=s3://<bucket>/dev
PREFIX = "dev"
VARIANTS = ("old", "new")

def run_figures(jobs: dict[int, float], checkpoints: dict[int, float], model_calls: dict[int, float],
                applied: float | None = None, waiting: float | None = None, laps: int = LAPS) -> dict[str, Any]:
    """The figures of one run (seconds) from its boundaries, each lap -> epoch seconds: ``jobs``
    (lap's first Job ADDED), ``checkpoints`` (its ``lap checkpointed``), ``model_calls`` (its
    record's startedAt); ``applied`` (the run ADDED), ``waiting`` (AwaitingApproval seen). A figure
    whose boundaries were not both seen is None; ``complete`` says whether every lap and gap was."""
    def d(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    lap = {n: d(jobs.get(n), checkpoints.get(n)) for n in range(1, laps + 1)}
    to_job = {n: d(checkpoints.get(n), jobs.get(n + 1)) for n in range(1, laps)}
    to_model = {n: d(checkpoints.get(n), model_calls.get(n + 1)) for n in range(1, laps)}
    return {
        "lap": lap, "gap_to_job": to_job, "gap_to_model_call": to_model,
        "laps_total": d(jobs.get(1), checkpoints.get(laps)),
        "applied_to_job1": d(applied, jobs.get(1)),
        "checkpoint_to_awaiting_approval": d(checkpoints.get(laps), waiting),
        "complete": all(v is not None for v in (*lap.values(), *to_job.values(), *to_model.values())),
    }


def median_of(rounds: list[dict[str, Any]], key: str, n: int | None = None) -> float | None:
    """The median over ``rounds`` (run_figures results) of ``key`` (of lap/gap ``n``), its Nones left out."""
    xs = [(r[key] if n is None else r[key].get(n)) for r in rounds]
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def pod_exit_median(rounds: list[dict[str, Any]]) -> float | None:
    """The median, over every lap of ``rounds``, of checkpoint -> the lap pod's exit seen (the lap's part)."""
    xs = [x for r in rounds for x in (r.get("pod_exit_after_checkpoint") or {}).values()]
    return statistics.median(xs) if xs else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def table(by_variant: dict[str, list[dict[str, Any]]], laps: int = LAPS) -> str:
    """The report: per lap and gap, each variant's median (ms) over its rounds, and the totals."""
    names = [v for v in VARIANTS if by_variant.get(v)]
    head = ["lap N"] + [f"{what} {v}" for what in ("Job->ckpt", "ckpt->next Job", "ckpt->next model call")
                        for v in names]
    rows = []
    for n in range(1, laps + 1):
        row = [str(n)]
        for key in ("lap", "gap_to_job", "gap_to_model_call"):
            for v in names:
                row.append(_ms(median_of(by_variant[v], key, n)) if key == "lap" or n < laps else "")
        rows.append(row)
    sums = ["sum"]
    for key in ("lap", "gap_to_job", "gap_to_model_call"):
        for v in names:
            per_round = [sum(x for x in r[key].values() if x is not None) for r in by_variant[v]]
            sums.append(_ms(statistics.median(per_round)) if per_round else "-")
    rows.append(sums)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    out.append("")
    for v in names:
        rs = by_variant[v]
        out.append(f"{v}: laps 1-{laps} (Job 1 -> checkpoint {laps}) median {_ms(median_of(rs, 'laps_total'))} ms, "
                   f"per round " + ", ".join(_ms(r["laps_total"]) for r in rs) + " ms; "
                   f"checkpoint {laps} -> AwaitingApproval {_ms(median_of(rs, 'checkpoint_to_awaiting_approval'))} ms; "
                   f"checkpoint -> lap pod's exit seen {_ms(pod_exit_median(rs))} ms; "
                   f"applied -> Job 1 (operator start and Lease) {_ms(median_of(rs, 'applied_to_job1'))} ms")
    return "\n".join(out)


# ------------------------------------------------------------------ the stack (tools/dev.sh)


class DevStack:
    """``tools/dev.sh`` in ``dir``: ``up`` with one of the two operators, ``down`` at the end."""

    def __init__(self, dir: Path, before: Path) -> None:
        self.dir, self.before = dir, before
        self.log = dir / "dev-sh.log"

    def env(self, variant: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(LOCALKUBE_DIR=str(self.dir), DEV_APPROVE="manual", AGENTRUN_NODE="", PYTHON=sys.executable,
                   DEV_TOOL_PORT="0", DEV_MCP_PORT="0", DEV_METRICS_PORT="0", DEV_INBOX_PORT="0")
        # dev.sh's `agentrun` (the operator's, the inbox's, the laps' command) is this interpreter's
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        if variant == "old":  # the older package shadows this checkout's (an editable install: a .pth path)
            env["PYTHONPATH"] = str(self.before)
        return env

    def up(self, variant: str, timeout: float) -> float:
        """``tools/dev.sh up`` with the variant's operator; its wall seconds. Raises if it fails."""
        t0 = time.time()
        with open(self.log, "a") as fh:
            fh.write(f"\n===== tools/dev.sh up ({variant}) at {time.strftime('%H:%M:%S')}\n")
            fh.flush()
            p = subprocess.run(["bash", str(ROOT / "tools" / "dev.sh"), "up"], env=self.env(variant), cwd=ROOT,
                               stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"tools/dev.sh up ({variant}) exited {p.returncode}:\n"
                             + "\n".join(self.log.read_text().splitlines()[-40:]))
        return time.time() - t0

    def down(self) -> None:
        subprocess.run(["bash", str(ROOT / "tools" / "dev.sh"), "down"], env=self.env("new"), cwd=ROOT,
                       stdout=open(self.log, "a"), stderr=subprocess.STDOUT, timeout=180, check=False)

    def kube(self) -> Any:
        """The kubernetes client configured for the stack's cluster (dev.sh's cluster.json)."""
        from kubernetes import client, config

        config.load_kube_config(json.loads((self.dir / "cluster.json").read_text())["kubeconfig"])
        return client

    def s3(self) -> tuple[Any, str]:
        import boto3
        from botocore.config import Config

        s = json.loads((self.dir / "s3" / "s3.json").read_text())
        return boto3.client("s3", endpoint_url=s["endpoint_url"], aws_access_key_id=s["access_key"],
                            aws_secret_access_key=s["secret_key"], region_name=s["region"],
                            config=Config(s3={"addressing_style": "path"})), s["bucket"]


def export_before(commit: str, dest: Path) -> Path:
    """``git archive COMMIT operator`` of this repository extracted under ``dest``, byte-compiled (so
    its first imports do not compile); the ``operator`` directory."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "operator"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest / "operator")], check=True)
    return dest / "operator"


class Watch:
    """Arrival stamps of this namespace's lap Jobs (``job:<name>`` ADDED), lap pods (``pod:<job>``
    Terminated) and AgentRuns (``run:<uid>`` ADDED, and each phase), first arrival of each
    (``benchlib.stamp_events``)."""

    def __init__(self, client: Any) -> None:
        self.events: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=stamp_events, args=(client, NAMESPACE, kind, self.events, self.stop),
                                         daemon=True) for kind in ("job", "pod", "run")]
        for t in self.threads:
            t.start()


class InvoiceBench:
    def __init__(self, stack: DevStack) -> None:
        self.stack = stack
        self.client = stack.kube()
        self.watch = Watch(self.client)
        self.s3, self.bucket = stack.s3()

    def run_uid(self) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.client.CustomObjectsApi().get_namespaced_custom_object("agentrun.dev", "v1alpha1", NAMESPACE,
                                                                              "agentruns", RUN)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return str(obj["metadata"]["uid"])

    def delete_run(self, timeout: float = 120) -> None:
        """The invoice run deleted (its finalizer done by the operator still up) and its Jobs gone."""
        from agentrun.api.contract import LABEL_RUN

        if self.run_uid() is not None:
            self.client.CustomObjectsApi().delete_namespaced_custom_object("agentrun.dev", "v1alpha1", NAMESPACE,
                                                                           "agentruns", RUN)
        end = time.time() + timeout
        batch = self.client.BatchV1Api()
        while self.run_uid() is not None or batch.list_namespaced_job(NAMESPACE, label_selector=f"{LABEL_RUN}={RUN}").items:
            if time.time() > end:
                raise SystemExit(f"{RUN} or its Jobs still there {timeout:.0f} s after its deletion")
            time.sleep(0.5)

    def collect(self, uid: str) -> dict[str, Any]:
        """The boundaries of the run ``uid`` and its figures (run_figures)."""
        from agentrun.api.contract import LABEL_ATTEMPT, LABEL_LAP, LABEL_RUN_UID
        from agentrun.checkpoint.codec import inflate

        jobs_by_lap: dict[int, str] = {}
        retried = 0
        for j in self.client.BatchV1Api().list_namespaced_job(NAMESPACE, label_selector=f"{LABEL_RUN_UID}={uid}").items:
            lab = j.metadata.labels or {}
            if lab.get(LABEL_ATTEMPT) != "1":
                retried += 1
                continue
            jobs_by_lap[int(lab[LABEL_LAP])] = j.metadata.name
        ev = self.watch.events
        jobs = {n: ev[(f"job:{name}", "ADDED")] for n, name in jobs_by_lap.items() if (f"job:{name}", "ADDED") in ev}
        pod_exit = {n: ev[(f"pod:{name}", "Terminated")] for n, name in jobs_by_lap.items()
                    if (f"pod:{name}", "Terminated") in ev}
        checkpoints: dict[int, float] = {}
        # the process kubelet's pod log files (DIR/pods/<ns>_<pod>_<uid>/<container>.log) of every attempt of
        # the run's laps: a pod's name starts with its Job's, <run>-<uid[:5]>-l<lap>-a<attempt> (the uid tells
        # this run's pods from an earlier round's)
        for log in sorted((self.stack.dir / "pods").glob(f"{NAMESPACE}_{RUN}-{uid.replace('-', '')[:5]}-l*/*.log")):
            for line in log.read_text(errors="replace").splitlines():
                hit = checkpointed_at(line)
                if hit and hit[0] == RUN:
                    checkpoints.setdefault(hit[1], hit[2])
        model_calls: dict[int, float] = {}
        prefix = f"{PREFIX}/{NAMESPACE}/{RUN}/{uid}/laps/"
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents") or []:
                key = obj["Key"]
                doc = json.loads(inflate(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(), key))
                model_calls[int(key.rsplit("/", 1)[1].split(".")[0])] = parse_time(str(doc["timings"]["startedAt"]))
        fig = run_figures(jobs, checkpoints, model_calls, ev.get((f"run:{uid}", "ADDED")),
                          ev.get((f"run:{uid}", "AwaitingApproval")))
        fig["pod_exit_after_checkpoint"] = {n: pod_exit[n] - checkpoints[n] for n in pod_exit if n in checkpoints}
        fig.update(uid=uid, retried_jobs=retried, laps_seen=len(jobs_by_lap))
        return fig

    def round(self, variant: str, timeout: float) -> dict[str, Any]:
        self.delete_run()
        load = os.getloadavg()
        seconds = self.stack.up(variant, timeout)
        time.sleep(1.0)  # the watch's last arrivals
        uid = self.run_uid()
        if uid is None:
            raise SystemExit(f"{RUN} is gone after tools/dev.sh up")
        fig = self.collect(uid)
        fig.update(variant=variant, dev_sh_seconds=seconds, load_before=load, load_after=os.getloadavg())
        return fig

    def close(self) -> None:
        self.watch.stop.set()


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per operator, interleaved old, new, old, new, ...")
    ap.add_argument("--before-commit", default="26a5622", help="the old operator: this commit's operator/ (git archive)")
    ap.add_argument("--before", default=None,
                    help="the old operator: an operator/ directory exported already (instead of --before-commit)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one tools/dev.sh up")
    ap.add_argument("--dir", help="working directory (default: a temp dir, removed at the end)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # dev.sh down on SIGTERM too
    tmp = None if args.dir else tempfile.mkdtemp(prefix="agentrun-invoice-")
    workdir = Path(args.dir or tmp).resolve()
    before = Path(args.before).resolve() if args.before else export_before(args.before_commit, workdir / "before")
    out: dict[str, Any] = {
        "uptime_before": _uptime(), "load_before": os.getloadavg(), "cpus": os.cpu_count(),
        "before": {"commit": None if args.before else args.before_commit, "path": str(before)},
        "run": RUN, "laps": LAPS, "rounds_per_variant": args.rounds, "order": [], "rounds": [],
    }

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(out))

    stack = DevStack(workdir / "dev", before)
    stack.dir.mkdir(parents=True, exist_ok=True)
    bench = None
    try:
        t0 = time.time()
        out["bring_up_seconds"] = stack.up("new", args.timeout * 2)  # the warm-up: everything make dev starts
        print(f"make dev's stack up (tools/dev.sh up, the invoice and MCP runs beside, new operator; not counted) "
              f"in {out['bring_up_seconds']:.0f} s", flush=True)
        bench = InvoiceBench(stack)
        for i in range(args.rounds):
            for variant in VARIANTS:
                fig = bench.round(variant, args.timeout)
                fig["round"] = i + 1
                out["rounds"].append(fig)
                out["order"].append(variant)
                save()
                print(f"round {i + 1} {variant}: laps 1-{LAPS} {_ms(fig['laps_total'])} ms "
                      f"(gaps to next Job {', '.join(_ms(x) for x in fig['gap_to_job'].values())} ms; "
                      f"{fig['laps_seen']} laps, retried Jobs {fig['retried_jobs']}; dev.sh up {fig['dev_sh_seconds']:.0f} s; "
                      f"load {fig['load_after'][0]:.1f})", flush=True)
        out["wall_seconds"] = time.time() - t0
    finally:
        if bench is not None:
            bench.close()
        stack.down()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    out["uptime_after"], out["load_after"] = _uptime(), os.getloadavg()
    by_variant = {v: [r for r in out["rounds"] if r["variant"] == v] for v in VARIANTS}
    incomplete = [f"round {r['round']} {r['variant']}" for r in out["rounds"] if not r["complete"]]
    out["incomplete"] = incomplete
    save()
    print(f"\nThe invoice example under make dev, laps 1-{LAPS}, median over {args.rounds} round(s) per operator "
          f"(ms; old = {args.before or args.before_commit}'s operator, new = this checkout's; lap N+1's 'model call' = "
          "its record's startedAt, the scripted model answering in the lap):\n" + table(by_variant))
    print(f"uptime before: {out['uptime_before']}\nuptime after:  {out['uptime_after']}")
    if incomplete:
        raise SystemExit(f"a boundary not seen in {', '.join(incomplete)}: see the JSON")


if __name__ == "__main__":
    main()
