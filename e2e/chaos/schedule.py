"""Seeded chaos schedules: which runs a scenario creates (scripted, side-effecting, some waiting
for approval) and which faults it injects at which point of its progress.

Everything random comes from ``random.Random(f"{seed}:{scenario}")``: the same seed gives the same
runs, scripts, approval decisions, fault kinds, fault points and victim choices. The *timing* of a
fault relative to a lap is not replayable (it depends on the machine's load); the plan is.
Progress is measured as laps checkpointed / laps expected, so a fault lands mid-run however fast
or slow the box is.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

# fault kinds
OPERATOR_KILL = "operator-kill"  # SIGKILL the operator's process group; restart after `downSeconds`
POD_DELETE = "pod-delete"  # delete a running lap pod (grace 0..2 s)
POD_SIGKILL = "pod-sigkill"  # SIGKILL a running lap pod's process (group)
S3_OUTAGE = "s3-outage"  # S3 refuses every connection for `downSeconds`
APISERVER_RESTART = "apiserver-restart"  # stop kube-apiserver, start it again with the same flags
ETCD_RESTART = "etcd-restart"  # stop etcd (SIGTERM), start it again with the same flags and data dir
KUBELET_RESTART = "kubelet-restart"  # SIGKILL the process kubelet while pods run, start it again
LEADER_KILL = "leader-kill"  # SIGKILL the replica holding the Lease (2 replicas), right after an approval burst
AT_BURST = -1.0  # Fault.at for a fault that fires right after the scenario's approval burst
#: Faults that need a running lap: each is given one scripted call as its victim (assign_targets).
LAP_FAULTS = (POD_DELETE, POD_SIGKILL, KUBELET_RESTART)


@dataclass
class Fault:
    kind: str
    at: float  # progress fraction (0..1) at which it fires
    down_seconds: float = 0.0
    delay: float = 0.0  # extra seconds before hitting the chosen victim (a random point of its lap)
    pick: float = 0.0  # which victim (fraction into the sorted candidates)
    fired_at: float | None = None
    note: str = ""
    landed: bool = False  # set by the runner when the fault hit something (see invariants.check_faults_landed)
    mid_call: bool = False  # a pod fault that hit a lap with a tool call in flight
    target: str | None = None  # LAP_FAULTS: the `order` of the scripted call held in flight for it


@dataclass
class RunPlan:
    name: str
    steps: list[dict]  # the scripted model responses
    approval: str | None = None  # None | "approve" | "approve-cli" | "reject"

    @property
    def laps(self) -> int:
        return len(self.steps)


@dataclass
class Scenario:
    name: str
    runs: list[RunPlan]
    faults: list[Fault] = field(default_factory=list)
    create_over: float = 0.0  # seconds over which the runs are created
    # a bound on the whole scenario; None (the ci schedule): none, the runner's stall check (no
    # progress for a bound derived from the pace measured so far) ends a scenario that hangs
    timeout: float | None = 600.0
    # the tool server counts executions at arrival, before it deduplicates (holds.HoldingRecorder):
    # a key sent twice concurrently shows as executed twice
    count_before_dedup: bool = False
    replicas: int = 1  # operator replicas (2: a standby holds off until the Lease expires)
    skews: tuple[float, ...] = ()  # per replica: wall-clock offset (s) of its Lease elector's time source;
    # the first replica holds the Lease before the others start, so a standby ahead of the holder
    # would take it at once under an expiry that compares renewTime with the local clock
    approval_burst: int = 0  # hold approvals until this many runs wait, then decide them all at once

    @property
    def expected_laps(self) -> int:
        return sum(r.laps for r in self.runs)


def _note(order: str, sleep: float = 0.0) -> dict[str, Any]:
    args: dict[str, Any] = {"order": order}
    if sleep:
        args["sleepSeconds"] = sleep
    return {"name": "note", "arguments": args}


def make_runs(rng: random.Random, prefix: str, n: int, laps: tuple[int, int], n_approval: int,
              slow: float = 0.3) -> list[RunPlan]:
    """n runs of laps[0]..laps[1] laps; every lap but the last makes 1-2 side-effecting `note` calls
    (a share of them slow, so kills land mid-call); n_approval of them ask for a `refund` that needs
    approval in one of their laps (approved by annotation, by the CLI, or rejected)."""
    plans = []
    approvals = set(rng.sample(range(n), n_approval))
    for i in range(n):
        name = f"{prefix}-{i:03d}"
        k = rng.randint(*laps)
        steps: list[dict] = []
        for s in range(k - 1):
            calls = [_note(f"{name}/{s + 1}/{j + 1}", round(rng.uniform(0.5, 2.0), 1) if rng.random() < slow else 0.0)
                     for j in range(rng.randint(1, 2))]
            steps.append({"content": f"lap {s + 1}", "toolCalls": calls,
                          "usage": {"inputTokens": 100 + s, "outputTokens": 10 + s}})
        steps.append({"content": "done", "usage": {"inputTokens": 50, "outputTokens": 5}})
        decision = None
        if i in approvals:
            s = rng.randrange(k - 1) if k > 1 else 0
            if k == 1:  # the approval needs a lap after it
                steps.insert(0, {"content": "lap 1", "toolCalls": []})
            steps[s]["toolCalls"].append({"name": "refund", "arguments": {"order": f"{name}/refund"}})
            decision = rng.choices(["approve", "approve-cli", "reject"], weights=[6, 2, 2])[0]
        plans.append(RunPlan(name=name, steps=steps, approval=decision))
    return plans


def assign_targets(scn: Scenario) -> Scenario:
    """Give each fault that needs a running lap (LAP_FAULTS) its victim from the plan: one scripted
    side-effecting ``note`` call, named by its ``order`` argument: the last of its lap, in a lap with
    two calls where one is free (so ``invariants.check_journaled`` has an earlier answer to check). The tool server holds that call's
    first request in flight until the fault has landed (holds.HoldingRecorder), so the fault finds
    its lap running, mid-call, on any box. The run is ``pick`` of the way through the runs and the
    lap ``at`` of the way through that run's call laps; a lap is the victim of one fault at most
    (the next run is tried when a run's call laps are taken). A pure function of the plan: the
    seed's other draws are unchanged. A fault left without a victim (no call lap left) keeps
    ``target=None`` and fires the old way, at its progress point on any running lap."""
    taken: set[tuple[str, int]] = set()
    runs = scn.runs
    for f in scn.faults:
        if f.kind not in LAP_FAULTS or not runs:
            continue
        first = int(f.pick * len(runs)) % len(runs)
        for i in range(len(runs)):
            p = runs[(first + i) % len(runs)]
            call_laps = [s for s, st in enumerate(p.steps)
                         if any(c["name"] == "note" for c in st.get("toolCalls") or [])]
            free = [s for s in call_laps if (p.name, s) not in taken]
            if not free:
                continue
            want = call_laps[min(len(call_laps) - 1, int(f.at * len(call_laps)))]
            notes = {s: [c["arguments"]["order"] for c in p.steps[s]["toolCalls"] if c["name"] == "note"]
                     for s in free}
            # a lap with two calls first: its victim is the LAST one, so the call answered before it
            # gives invariants.check_journaled something to check (with one call it is vacuous)
            lap = min(free, key=lambda s: (len(notes[s]) < 2, abs(s - want), s))
            taken.add((p.name, lap))
            f.target = notes[lap][-1]
            break
    return scn


def _pod_faults(rng: random.Random, n: int, lo: float, hi: float) -> list[Fault]:
    return [Fault(kind=POD_DELETE if i % 2 == 0 else POD_SIGKILL, at=rng.uniform(lo, hi),
                  delay=round(rng.uniform(0.0, 1.5), 2), pick=rng.random()) for i in range(n)]


def _op_kills(rng: random.Random, n: int, lo: float, hi: float) -> list[Fault]:
    return [Fault(kind=OPERATOR_KILL, at=rng.uniform(lo, hi), down_seconds=round(rng.uniform(1.0, 6.0), 1))
            for _ in range(n)]


def default_seed(cwd: str | os.PathLike[str] | None = None) -> tuple[int, str]:
    """The seed when none is given, and where it came from: ``$CHAOS_SEED`` if set, else one derived
    from the git commit of the source tree (the first 8 hex digits of ``HEAD`` modulo 10**6), so
    every run of one commit, in CI or on a laptop, injects the same plan and a failure replays.
    Without git (a tarball, no ``.git``) a random seed, never a fixed one (a fixed default would
    test one plan forever): the source names it, and every run prints it first, so it replays with
    ``CHAOS_SEED=N``. ``cwd``: where to ask git (default: this file's directory)."""
    import subprocess
    from pathlib import Path

    if os.environ.get("CHAOS_SEED"):
        return int(os.environ["CHAOS_SEED"]), "CHAOS_SEED"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        if len(sha) >= 8:
            return int(sha[:8], 16) % 10**6, f"commit {sha[:12]}"
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    seed = random.SystemRandom().randrange(1, 10**6)
    return seed, f"no git commit found: a random seed, replay with CHAOS_SEED={seed}"


def _infra(rng: random.Random, lo: float, hi: float) -> list[Fault]:
    """One of each new infrastructure fault: an etcd restart (data dir kept) and a kubelet restart
    while pods run."""
    return [Fault(kind=ETCD_RESTART, at=rng.uniform(lo, hi), down_seconds=round(rng.uniform(2.0, 6.0), 1)),
            Fault(kind=KUBELET_RESTART, at=rng.uniform(lo, hi), down_seconds=round(rng.uniform(1.0, 5.0), 1))]


def leader_scenario(rng: random.Random, name: str, prefix: str, n: int, skews: tuple[float, ...] = ()) -> Scenario:
    """Two operator replicas; every run asks for an approval; the approvals are held until half the
    runs wait, then decided all at once, and the Lease holder is SIGKILLed 0-1 s later."""
    runs = make_runs(rng, prefix, n, (3, 4), n)
    for p in runs:
        p.approval = rng.choice(["approve", "approve", "approve-cli", "reject"])
    return Scenario(name=name, runs=runs, replicas=2, skews=skews, approval_burst=max(1, n // 2),
                    faults=[Fault(kind=LEADER_KILL, at=AT_BURST, delay=round(rng.uniform(0.0, 1.0), 2),
                                  down_seconds=round(rng.uniform(2.0, 6.0), 1))],
                    create_over=3, timeout=600)


SOAK_KINDS = (OPERATOR_KILL, POD_DELETE, POD_SIGKILL, S3_OUTAGE, APISERVER_RESTART, ETCD_RESTART, KUBELET_RESTART)


#: A soak wave's time bound per planned lap (2.4x what 100 runs x 20 laps took on 2 cores).
SOAK_SECONDS_PER_LAP = 1.5


def build_soak(seed: int, runs: int, laps: int, minutes: float) -> list[Scenario]:
    """``make soak``: waves of ``runs`` runs of ``laps`` laps each, until ``minutes`` have passed
    (the runner stops starting waves then). Each wave draws 4-8 random faults from every kind
    (times, victims and durations from the seed); every 3rd wave runs two replicas (Lease
    elector time sources 10-30 s apart) with an approval burst and a leader kill. Only recoverable
    faults: at most one S3 outage (12-20 s) per wave."""
    out: list[Scenario] = []
    waves = max(1, int(minutes * 60 // 20) + 1)  # an upper bound; the runner stops on time
    for w in range(waves):
        r = random.Random(f"{seed}:soak:{w}")
        if w % 3 == 2:
            a = round(r.uniform(5, 15), 1)
            skews = (-a, a)
            scn = leader_scenario(r, f"soak{w:03d}", f"w{w:03d}", max(4, runs // 2), skews)
        else:
            plans = make_runs(r, f"w{w:03d}", runs, (max(2, laps - 1), laps), max(1, runs // 10), slow=0.4)
            faults = []
            outage = False
            for _ in range(r.randint(4, 8)):
                kind = r.choice(SOAK_KINDS)
                if kind == S3_OUTAGE and outage:
                    # recoverable faults only: each failed attempt during an outage costs one of the
                    # run's 10 attempts per lap (1-3 s backoff), so about 30 s of store outage per
                    # lap is what a run rides out (found by soak seed 17: four outages, 77 s in all)
                    kind = r.choice([k for k in SOAK_KINDS if k != S3_OUTAGE])
                outage = outage or kind == S3_OUTAGE
                f = Fault(kind=kind, at=r.uniform(0.05, 0.85), delay=round(r.uniform(0.0, 1.5), 2), pick=r.random())
                if kind == OPERATOR_KILL:
                    f.down_seconds = round(r.uniform(1.0, 6.0), 1)
                elif kind == S3_OUTAGE:
                    f.down_seconds = round(r.uniform(12.0, 20.0), 1)  # meets a store write, leaves attempts
                elif kind in (APISERVER_RESTART, ETCD_RESTART):
                    f.down_seconds = round(r.uniform(2.0, 10.0), 1)
                elif kind == KUBELET_RESTART:
                    f.down_seconds = round(r.uniform(1.0, 5.0), 1)
                faults.append(f)
            # the wave's bound grows with its laps (100 runs x 20 laps took ~21 min on 2 cores: a
            # fixed 900 s cut it short); a hang is caught sooner by the runner's stall check
            scn = Scenario(name=f"soak{w:03d}", runs=plans, faults=faults, create_over=5,
                           timeout=max(900.0, 300.0 + SOAK_SECONDS_PER_LAP * sum(p.laps for p in plans)))
        out.append(assign_targets(scn))
    return out


def build(schedule: str, seed: int) -> list[Scenario]:
    return [assign_targets(s) for s in _build(schedule, seed)]


def _build(schedule: str, seed: int) -> list[Scenario]:
    if schedule not in ("ci", "full", "smoke", "new"):
        raise ValueError(f"unknown schedule {schedule!r} (ci, full, smoke or new)")

    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:{schedule}:{name}")

    out: list[Scenario] = []
    if schedule == "smoke":  # a quick sanity check of the suite itself (about a minute)
        r = rng("smoke")
        out.append(Scenario(name="smoke", runs=make_runs(r, "k", 4, (2, 3), 1),
                            faults=_op_kills(r, 1, 0.2, 0.5) + _pod_faults(r, 2, 0.1, 0.7)
                            + [Fault(kind=S3_OUTAGE, at=0.3, down_seconds=8.0),
                               Fault(kind=APISERVER_RESTART, at=0.5, down_seconds=2.0)],
                            timeout=240))
        return out
    if schedule == "new":  # the faults of issue 17, one scenario each (also part of full)
        out += _new_scenarios(rng)
        return out
    if schedule == "ci":
        r = rng("faults")
        out.append(Scenario(
            name="faults", runs=make_runs(r, "f", 20, (3, 4), 4),
            faults=_op_kills(r, 2, 0.1, 0.6) + _pod_faults(r, 4, 0.1, 0.8)
            + [Fault(kind=S3_OUTAGE, at=r.uniform(0.25, 0.45), down_seconds=30.0),
               Fault(kind=APISERVER_RESTART, at=r.uniform(0.5, 0.75), down_seconds=5.0)],
            create_over=5, timeout=None, count_before_dedup=True))
        r = rng("scale")
        out.append(Scenario(
            name="scale", runs=make_runs(r, "s", 100, (2, 2), 20, slow=0.1),
            faults=_op_kills(r, 1, 0.3, 0.6), create_over=15, timeout=None, count_before_dedup=True))
        return out
    r = rng("operator-kill")
    out.append(Scenario(name="operator-kill", runs=make_runs(r, "ok", 25, (4, 5), 4),
                        faults=_op_kills(r, 4, 0.05, 0.85), create_over=5, timeout=600))
    r = rng("pod-kill")
    out.append(Scenario(name="pod-kill", runs=make_runs(r, "pk", 20, (4, 5), 2, slow=0.5),
                        faults=_pod_faults(r, 12, 0.05, 0.9), create_over=5, timeout=600))
    r = rng("s3-outage")
    out.append(Scenario(name="s3-outage", runs=make_runs(r, "so", 20, (4, 5), 2),
                        faults=[Fault(kind=S3_OUTAGE, at=r.uniform(0.2, 0.4), down_seconds=30.0),
                                Fault(kind=S3_OUTAGE, at=r.uniform(0.6, 0.8), down_seconds=30.0)],
                        create_over=5, timeout=600))
    r = rng("apiserver-restart")
    out.append(Scenario(name="apiserver-restart", runs=make_runs(r, "ar", 20, (4, 5), 2),
                        faults=[Fault(kind=APISERVER_RESTART, at=r.uniform(0.15, 0.35), down_seconds=5.0),
                                Fault(kind=APISERVER_RESTART, at=r.uniform(0.55, 0.75), down_seconds=15.0)],
                        create_over=5, timeout=600))
    r = rng("mixed")
    out.append(Scenario(name="mixed", runs=make_runs(r, "mx", 25, (3, 5), 5),
                        faults=_op_kills(r, 2, 0.1, 0.7) + _pod_faults(r, 6, 0.1, 0.85)
                        + [Fault(kind=S3_OUTAGE, at=r.uniform(0.25, 0.45), down_seconds=30.0),
                           Fault(kind=APISERVER_RESTART, at=r.uniform(0.5, 0.75), down_seconds=5.0)],
                        create_over=5, timeout=600))
    r = rng("scale")
    out.append(Scenario(name="scale", runs=make_runs(r, "s", 100, (3, 3), 30, slow=0.1),
                        faults=_op_kills(r, 2, 0.2, 0.7) + _pod_faults(r, 4, 0.2, 0.8),
                        create_over=15, timeout=900))
    out += _new_scenarios(rng)
    return out


def _new_scenarios(rng) -> list[Scenario]:
    r = rng("etcd-kubelet")
    out = [Scenario(name="etcd-kubelet", runs=make_runs(r, "ek", 12, (3, 4), 2, slow=0.5),
                    faults=_infra(r, 0.15, 0.45) + _infra(r, 0.5, 0.8), create_over=5, timeout=600)]
    out.append(leader_scenario(rng("leader-kill"), "leader-kill", "lk", 12))
    r = rng("clock-skew")
    a = round(r.uniform(10, 30), 1)  # the first replica (the holder) behind, the standby ahead: 2a apart
    out.append(leader_scenario(r, "clock-skew", "cs", 10, skews=(-a, a)))
    return out
