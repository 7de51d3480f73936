"""Run chaos scenarios: create the runs, inject the faults at their progress points, answer the
approvals, wait for every run to end, check the invariants, delete the runs, check nothing is left.
On a violation, print a diagnosis (operator log tail, per-run status, store keys, tool calls)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from e2e.chaos import invariants
from e2e.chaos.schedule import (
    APISERVER_RESTART,
    AT_BURST,
    ETCD_RESTART,
    KUBELET_RESTART,
    LEADER_KILL,
    OPERATOR_KILL,
    POD_DELETE,
    POD_SIGKILL,
    S3_OUTAGE,
    Fault,
    RunPlan,
    Scenario,
    build,
    build_soak,
)
from e2e.chaos.world import GROUP, PLURAL, REQ_TIMEOUT, VERSION, Watcher, World, say

# kube-apiserver's denial while a policy's CRD paramKind is not (yet again) in its discovery cache
TRANSIENT_ADMISSION = "failed to find resource referenced by paramKind"

TERMINAL = ("Succeeded", "Failed", "BudgetExceeded")
#: How long the garbage collector may take per kept Job (and its pod) once the runs are deleted.
CLEANUP_SECONDS_PER_JOB = 0.5
#: The stall check (the only bound on a scenario without ``timeout``, the ci schedule's): the
#: scenario fails, with a diagnosis, when no step of progress (a lap checkpointed, a run terminal)
#: came for STALL_SECONDS or STALL_FACTOR times the longest gap between two steps measured so far in
#: the scenario, whichever is longer: a box slowed down by load widens its own bound.
STALL_SECONDS = 240.0
STALL_FACTOR = 10.0


def stall_bound(gaps: list[float]) -> float:
    """Seconds without progress after which a scenario is stalled, from the gaps measured so far."""
    return max(STALL_SECONDS, STALL_FACTOR * max(gaps, default=0.0))


def probe_refused(request: Any) -> bool:
    """True when ``request()`` (one API request) fails: the apiserver was really away. Any error
    counts (refused, reset, timed out, a 5xx while it starts); a request that succeeds means the
    restart did not take the API away."""
    try:
        request()
    except Exception:  # noqa: BLE001
        return True
    return False


def apiserver_restart_landed(old_pid: int | None, new_pid: int | None, refused_while_down: bool) -> tuple[bool, str]:
    """Whether an apiserver restart landed, and what was seen: the process was replaced (a new pid)
    and a request made while it was down failed. (The time it took is no evidence: it is > 0 always.)"""
    seen = []
    if not old_pid or old_pid == new_pid:
        seen.append(f"the apiserver pid did not change ({old_pid} -> {new_pid})")
    if not refused_while_down:
        seen.append("a request made while it was stopped was answered")
    return not seen, "; ".join(seen)


class ScenarioFailed(AssertionError):
    pass


def run_doc(world: World, plan: RunPlan) -> dict:
    tools = [
        {"name": "note", "http": {"url": f"{world.tool_url}/note", "timeout": "60s"}},
        {"name": "refund", "requiresApproval": True, "http": {"url": f"{world.tool_url}/refund", "timeout": "20s"}},
    ]
    return {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": plan.name},
        "spec": {
            "task": f"chaos {plan.name}",
            "agent": {"version": "v1", "model": {"provider": "scripted", "script": plan.steps,
                                                 "pricing": {"inputPerMillionTokensUSD": "3.00",
                                                             "outputPerMillionTokensUSD": "15.00"}},
                      "tools": tools},
            "approval": {"owner": "chaos", "timeout": "1h", "onTimeout": "reject"},
            "budget": {"maxLaps": plan.laps + 2},
            "lapTimeout": "120s",
            "retry": {"attemptsPerLap": 10, "backoff": {"initial": "1s", "max": "3s", "factor": 2}},
        },
    }


class ScenarioRun:
    def __init__(self, world: World, scn: Scenario, seed: int, schedule: str) -> None:
        self.world, self.scn, self.seed, self.schedule = world, scn, seed, schedule
        self.ns = f"chaos-{scn.name}"
        self.plans = {p.name: p for p in scn.runs}
        self.runs: dict[str, dict] = {}
        self.decided: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.timers: list[tuple[float, str, Any]] = []  # (at, what, fn)
        self.errors: list[str] = []
        self.api_errors = 0
        self.t0 = time.time()
        self.watcher: Watcher | None = None
        self.burst_done = False
        self.key_runs: dict[str, str] = {}  # expected idempotency key -> run uid (for in-flight victims)
        self.mapped_uids: set[str] = set()  # runs whose keys are in key_runs
        self.cli_failures: dict[str, str] = {}  # run -> the last error of `agentrun approvals approve`
        self.hit_pods: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def progress(self) -> float:
        done = sum(min((r.get("status") or {}).get("lap") or 0, self.plans[n].laps) for n, r in self.runs.items()
                   if n in self.plans)
        return done / max(1, self.scn.expected_laps)

    def steps(self) -> int:
        """Steps of progress so far: laps checkpointed, and runs in a terminal phase."""
        laps = sum(min((r.get("status") or {}).get("lap") or 0, self.plans[n].laps) for n, r in self.runs.items()
                   if n in self.plans)
        return laps + sum(1 for r in self.runs.values() if (r.get("status") or {}).get("phase") in TERMINAL)

    def poll(self) -> bool:
        try:
            items = self.world.list_runs(self.ns)
        except Exception:  # noqa: BLE001  (the apiserver may be down: that is the point)
            self.api_errors += 1
            return False
        self.runs = {r["metadata"]["name"]: r for r in items}
        return True

    def background(self, name: str, fn) -> None:
        def wrap() -> None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"fault {name} raised {type(e).__name__}: {e}")
        t = threading.Thread(target=wrap, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    # ------------------------------------------------------------------ faults
    def _inflight_run_uids(self) -> set[str]:
        """uids of runs with a tool call in flight at the tool server right now."""
        rec = self.world.tools.recorder
        with rec.lock:
            keys = [e.get("idempotencyKey") for e in rec.inflight]
        for name, r in self.runs.items():  # every run seen so far (runs are created over a few seconds)
            plan, md = self.plans.get(name), r["metadata"]
            if plan and md["uid"] not in self.mapped_uids:
                self.mapped_uids.add(md["uid"])
                for k in invariants.expected_calls(plan, md["namespace"], md["uid"]):
                    self.key_runs[k] = md["uid"]
        return {self.key_runs[k] for k in keys if k in self.key_runs}

    def fire(self, f: Fault) -> bool:
        w = self.world
        el = time.time() - self.t0
        if f.kind == OPERATOR_KILL:
            if any(t[1] == "operator restart" for t in self.timers):
                return False  # still down from the previous kill: kill it again once it is back
            f.landed = w.kill_operator()
            f.note = f"operator SIGKILLed at {el:.0f}s, restarted {f.down_seconds}s later"
            self.timers.append((time.time() + f.down_seconds, "operator restart", lambda: w.start_operator(self.ns)))
        elif f.kind == LEADER_KILL:
            try:
                holder = w.lease_holder(self.ns)
            except Exception:  # noqa: BLE001
                return False
            if holder not in w.operators:
                return False  # no live holder yet: try again at the next poll
            f.note = f"leader {holder} SIGKILLed {f.delay}s after the approval burst at {el:.0f}s"

            def kill_leader() -> None:
                time.sleep(f.delay)
                f.landed = w.kill_operator(holder)
                self.timers.append((time.time() + f.down_seconds, "replica restart",
                                    lambda: w.start_operator(self.ns, replace=False)))
            self.background(f.kind, kill_leader)
        elif f.kind in (POD_DELETE, POD_SIGKILL):
            try:
                pods = sorted((p for p in w.list_pods(self.ns) if p.status.phase == "Running"
                               and not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)
            except Exception:  # noqa: BLE001
                return False
            pods = [p for p in pods if p.metadata.uid not in self.hit_pods]  # one fault per pod
            if f.kind == POD_SIGKILL:
                pods = [p for p in pods if w.pod_pid(self.ns, p)]
            # prefer a lap with a tool call in flight: the kill then lands mid-call, and the retried
            # attempt sends the same key again (answered from the record)
            busy = self._inflight_run_uids()
            mid_call = [p for p in pods if (p.metadata.labels or {}).get("agentrun.dev/run-uid") in busy]
            if mid_call:
                pods = mid_call
            elif pods and self.progress() < 0.7 and not getattr(f, "_waited", False):
                f._waited = time.time()  # type: ignore[attr-defined]
                return False  # wait a little for a call in flight
            elif pods and self.progress() < 0.7 and time.time() - getattr(f, "_waited", 0) < 8:
                return False
            if not pods:
                return False  # try again at the next poll
            pod = pods[min(len(pods) - 1, int(f.pick * len(pods)))]
            self.hit_pods.add(pod.metadata.uid)
            # a re-armed fault (its first lap ended before the kill) strikes at once: landing is
            # what counts now, the random delay already had its turn
            delay = 0.0 if mid_call or getattr(f, "_rearmed", 0) else f.delay
            f.note = f"{f.kind} {pod.metadata.name} {delay}s after {el:.0f}s{' (mid-call)' if mid_call else ''}"

            def hit() -> None:
                time.sleep(delay)
                if f.kind == POD_DELETE:
                    f.landed, err = self._delete_pod(pod.metadata.name, int(f.pick * 3))
                    if not f.landed:
                        f.note += f" (delete failed: {err.strip()[:100]})"
                        if "NotFound" in err:  # the lap ended and its pod was removed: again
                            self._rearm(f)
                else:
                    pid = w.pod_pid(self.ns, pod)
                    if pid:
                        os.killpg(pid, signal.SIGKILL)
                        f.landed = True
                        f.mid_call = bool(mid_call)
                    else:
                        f.note += " (the lap had already ended)"
                        self._rearm(f)
            self.background(f.kind, hit)
        elif f.kind == S3_OUTAGE:
            before = w.proxy.refused
            w.proxy.cut()
            f.note = f"S3 cut at {el:.0f}s for {f.down_seconds}s"

            cut_at = time.time()

            def back() -> None:
                # keep S3 away (up to 30 s in all) until the operator itself met the outage: its
                # StoreUnavailable Event is part of what an outage must show
                try:
                    reasons = w.event_reasons(self.ns)
                    met = reasons.get("StoreUnavailable", 0) > 0 or reasons.get("LapRetry:store", 0) > 0
                except Exception:  # noqa: BLE001
                    met = False
                if not met and time.time() - cut_at < max(30.0, f.down_seconds):
                    self.timers.append((time.time() + 1.0, "S3 still cut", back))
                    return
                w.proxy.resume()
                f.landed = w.proxy.refused > before
                f.note += f", {w.proxy.refused - before} connection(s) refused, back after {time.time() - cut_at:.0f}s"
            self.timers.append((time.time() + f.down_seconds, "S3 back", back))
        elif f.kind == APISERVER_RESTART:
            f.note = f"apiserver restart at {el:.0f}s"

            def restart() -> None:
                old_pid = w.cluster.pids.get("apiserver")
                refused: list[bool] = []

                def while_down() -> None:  # the API is really away: a request now must fail
                    refused.append(probe_refused(lambda: w.core.get_api_resources(_request_timeout=5)))
                took = w.cluster.restart_apiserver(down_seconds=f.down_seconds, while_down=while_down)
                f.landed, why = apiserver_restart_landed(old_pid, w.cluster.pids.get("apiserver"), any(refused))
                f.note += f", unavailable {took:.1f}s" + (f" ({why})" if why else ", a request while down was refused")
            self.background(f.kind, restart)
        elif f.kind == ETCD_RESTART:
            f.note = f"etcd restart at {el:.0f}s ({f.down_seconds}s down, data dir kept)"

            def restart_etcd() -> None:
                took, seen_down = w.restart_etcd(f.down_seconds)
                f.landed = seen_down
                f.note += f", apiserver ready again after {took:.1f}s" + ("" if seen_down else " (never saw it not ready)")
            self.background(f.kind, restart_etcd)
        elif f.kind == KUBELET_RESTART:
            if not w.live_lap_processes(self.ns):
                return False  # wait for a running lap: the point is a restart while pods run
            f.note = f"kubelet SIGKILLed at {el:.0f}s, restarted {f.down_seconds}s later"

            def restart_kubelet() -> None:
                alive = w.restart_kubelet(self.ns, f.down_seconds)
                f.landed = alive > 0
                f.note += f" ({alive} lap process(es) were running)"
            self.background(f.kind, restart_kubelet)
        else:
            raise ValueError(f.kind)
        f.fired_at = el
        say(f"{self.scn.name}: {f.note} (progress {self.progress():.0%})")
        return True

    def _delete_pod(self, name: str, grace: int) -> tuple[bool, str]:
        """``kubectl delete pod``, tried again for up to 90 s (the apiserver may be restarting: another
        fault) until it is accepted or the pod is gone; (accepted, the last stderr)."""
        end = time.time() + 90
        while True:
            r = self.world.kubectl("delete", "pod", name, "-n", self.ns, "--wait=false", f"--grace-period={grace}",
                                   check=False)
            if r.returncode == 0 or "NotFound" in r.stderr or time.time() > end:
                return r.returncode == 0, r.stderr
            time.sleep(1)

    def fire_held(self, f: Fault) -> bool:
        """Fire a fault that has a victim call (schedule.assign_targets) once the tool server holds
        that call: on the pod of the call's run, whose lap process is alive and waiting for the
        answer. The call is released when the fault has landed (a graceful delete: once the lap's
        process is gone), and is then executed, as a tool finishes a call it had begun; the retried
        attempt sends the same key and is answered from the record."""
        w = self.world
        rec = w.tools.recorder
        assert f.target is not None
        if f.target not in rec.held():
            if rec.let_go.get(f.target) == "timed out":
                f.note = (f"its call {f.target} was held {rec.max_seconds:.0f}s at the tool server but no live lap "
                          "process of its run was found")
            return False
        run = self.runs.get(f.target.split("/")[0])
        if run is None:
            return False
        uid = run["metadata"]["uid"]
        try:
            pods = [p for p in w.list_pods(self.ns) if (p.metadata.labels or {}).get("agentrun.dev/run-uid") == uid
                    and not p.metadata.deletion_timestamp and p.metadata.uid not in self.hit_pods]
        except Exception:  # noqa: BLE001  (the apiserver may be restarting: the call stays held)
            return False
        live = [(p, pid) for p in pods if (pid := w.pod_pid(self.ns, p))]
        if not live:
            return False  # its process is not registered yet: the next poll
        pod, pid = live[0]
        self.hit_pods.add(pod.metadata.uid)
        el = time.time() - self.t0
        f.fired_at, f.mid_call = el, True
        f.note = f"{f.kind} {pod.metadata.name} at {el:.0f}s, its call {f.target} held at the tool server"

        def hit() -> None:
            try:
                if f.kind == POD_SIGKILL:
                    os.killpg(pid, signal.SIGKILL)
                    f.landed = True
                elif f.kind == POD_DELETE:
                    f.landed, err = self._delete_pod(pod.metadata.name, int(f.pick * 3))
                    if not f.landed:
                        f.note += f" (delete failed: {err.strip()[:100]})"
                    gone = time.time() + 60  # hold the call through the grace period, as a slow tool would
                    while w.pod_pid(self.ns, pod) and time.time() < gone:
                        time.sleep(0.2)
                else:  # KUBELET_RESTART: the held lap is running while the kubelet is away
                    alive = w.restart_kubelet(self.ns, f.down_seconds)
                    f.landed = alive > 0
                    f.note += f"; kubelet SIGKILLed, restarted {f.down_seconds}s later ({alive} lap process(es) ran)"
            finally:
                rec.release(f.target)
        self.background(f.kind, hit)
        say(f"{self.scn.name}: {f.note} (progress {self.progress():.0%})")
        return True

    def _rearm(self, f: Fault, tries: int = 10) -> None:
        """A pod fault whose lap ended between the pick and the kill did not land: fire it again,
        without the delay, on another running lap (at most ``tries`` times, while laps remain), so
        "every fault lands" tests the operator, not the race between the delay and a fast lap (CI
        beside a CPU hog, seed 203587: a 1.02 s delay missed three short laps in a row)."""
        done = getattr(f, "_rearmed", 0)
        if done >= tries:
            return
        f._rearmed = done + 1  # type: ignore[attr-defined]

        def refire() -> None:
            if f.landed or self.progress() >= 1.0:
                return
            if not self.fire(f):
                self.timers.append((time.time() + 1, f"{f.kind} re-armed, waiting for a lap", refire))

        self.timers.append((time.time(), f"{f.kind} re-armed: its lap ended before the kill", refire))

    # ------------------------------------------------------------------ approvals
    def approve(self, name: str, plan: RunPlan) -> None:
        """Decide a waiting run's approval: by annotation (approved=true|false + agentrun.dev/reason,
        what a user types with kubectl), or with `agentrun approvals approve` (in the background)."""
        w = self.world
        self.decided.add(name)
        if plan.approval == "approve-cli":
            def cli() -> None:
                # one try per poll: a failure (the apiserver restarting, for as long as it takes) hands
                # the run back to the poll loop, which asks again while the run still waits; a CLI
                # that keeps failing leaves the run waiting, and the stall check reports it with
                # the CLI's last error (seed 363823: five tries 2 s apart all fell inside a restart)
                try:
                    r = subprocess.run([sys.executable, "-m", "agentrun.cli.main", "approvals", "approve", name,
                                        "-n", self.ns, "--reason", "chaos"], env=w.cluster.env(),
                                       capture_output=True, text=True, timeout=120)
                    ok, why = r.returncode == 0, r.stderr.strip()[-300:]
                except subprocess.TimeoutExpired:
                    ok, why = False, "timed out after 120 s"
                if not ok:
                    self.cli_failures[name] = why
                    time.sleep(2)
                    self.decided.discard(name)
            self.background(f"approve-cli {name}", cli)
            return
        value = "false" if plan.approval == "reject" else "true"
        try:
            w.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name,
                {"metadata": {"annotations": {"approved": value, "agentrun.dev/reason": "chaos"}}},
                _request_timeout=REQ_TIMEOUT)
        except Exception:  # noqa: BLE001  (apiserver down: try again at the next poll)
            self.decided.discard(name)

    # ------------------------------------------------------------------ the scenario
    def create_run(self, doc: dict) -> None:
        """Create one run as a careful client would: retried while the apiserver is away, and while it
        refuses with the transient denial of a ValidatingAdmissionPolicy whose CRD paramKind it has
        not yet rediscovered after a restart (kubernetes#124237, up to ~30 s; docs/operations.md). An
        AlreadyExists after a retry is the earlier try's create having landed. Any other refusal fails."""
        end, tried = time.time() + 180, False
        while True:
            try:
                self.world.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, doc,
                                                                  _request_timeout=REQ_TIMEOUT)
                return
            except ApiException as e:
                if e.status == 409 and tried:
                    return
                transient = (e.status == 422 and TRANSIENT_ADMISSION in (e.body or "")) or e.status in (429, 500, 503)
                if not transient or time.time() > end:
                    raise
            except (OSError, urllib3.exceptions.HTTPError):
                if time.time() > end:
                    raise
            tried = True
            time.sleep(1)

    def create_runs(self) -> None:
        n = len(self.scn.runs)
        for i, plan in enumerate(self.scn.runs):
            self.create_run(run_doc(self.world, plan))
            if self.scn.create_over and i < n - 1:
                time.sleep(self.scn.create_over / n)

    def execute(self) -> dict:
        w, scn = self.world, self.scn
        say(f"=== scenario {scn.name}: {len(scn.runs)} runs, {scn.expected_laps} laps, "
            f"{sum(1 for p in scn.runs if p.approval)} approvals, faults: "
            f"{', '.join(f'{f.kind}@{f.at:.0%}' for f in sorted(scn.faults, key=lambda f: f.at))}")
        w.new_namespace(self.ns)
        held = [f for f in scn.faults if f.target]  # fired when their call is held (fire_held)
        w.new_tool_record(holds={f.target for f in held if f.target}, count_before_dedup=scn.count_before_dedup)
        self.refused0 = w.proxy.refused
        self.watcher = Watcher(w, self.ns)
        self.watcher.start()
        skews = list(scn.skews) + [0.0] * scn.replicas
        for i in range(scn.replicas):
            ident = w.start_operator(self.ns, skew=skews[i], replace=(i == 0))
            if i == 0 and scn.replicas > 1 and scn.skews:
                self.wait_holder(ident)  # the skewed standby must meet a Lease that is renewed
        self.t0 = time.time()
        self.create_runs()
        pending = sorted((f for f in scn.faults if f.at != AT_BURST and not f.target), key=lambda f: f.at) \
            + [f for f in scn.faults if f.at == AT_BURST]
        deadline = self.t0 + scn.timeout if scn.timeout is not None else None
        last_print = 0.0
        last_step = [0, time.time()]  # [steps of progress (laps done + runs terminal), when the last came]
        gaps: list[float] = []  # seconds between two steps of progress, measured in this scenario
        while True:
            now = time.time()
            if deadline is not None and now > deadline:
                self.errors.append(f"timed out after {scn.timeout:.0f}s")
                break
            for t in [t for t in self.timers if t[0] <= now]:
                self.timers.remove(t)
                t[2]()
                if t[1] != "S3 still cut":
                    say(f"{scn.name}: {t[1]} at {now - self.t0:.0f}s")
            code = w.operator_exited_by_itself()
            if code is not None:
                self.errors.append(f"the operator exited by itself with code {code} at {now - self.t0:.0f}s")
                w.start_operator(self.ns, replace=False)
            if not self.poll():
                time.sleep(1)
                continue
            prog = self.progress()
            steps = self.steps()
            if steps > last_step[0]:
                gaps.append(now - last_step[1])
                last_step[:] = [steps, now]
            elif now - last_step[1] > stall_bound(gaps):
                self.errors.append(f"stalled: no lap checkpointed and no run ended for {now - last_step[1]:.0f}s, "
                                   f"over {stall_bound(gaps):.0f}s (the longest gap so far: "
                                   f"{max(gaps, default=0):.0f}s; progress {prog:.0%})")
                break
            for f in [f for f in held if self.fire_held(f)]:
                held.remove(f)
            while pending and 0 <= pending[0].at <= prog:
                if not self.fire(pending[0]):
                    break
                pending.pop(0)
            waiting = [(name, self.plans[name]) for name, r in self.runs.items()
                       if name in self.plans and self.plans[name].approval and name not in self.decided
                       and (r.get("status") or {}).get("phase") == "AwaitingApproval"]
            if scn.approval_burst and not self.burst_done:
                # hold the approvals until enough runs wait, then decide them all at once: a burst
                undecided = sum(1 for p in scn.runs if p.approval and p.name not in self.decided)
                if len(waiting) >= min(scn.approval_burst, undecided) and waiting:
                    say(f"{scn.name}: approval burst: deciding {len(waiting)} approvals at once")
                    for name, plan in waiting:
                        self.approve(name, plan)
                    self.burst_done = True
                    for f in [f for f in pending if f.at == AT_BURST]:
                        if self.fire(f):
                            pending.remove(f)
                waiting = []
            for f in [f for f in pending if f.at == AT_BURST and self.burst_done]:
                if self.fire(f):  # the leader was not known yet: again
                    pending.remove(f)
            for name, plan in waiting:
                self.approve(name, plan)
            terminal = [n for n, r in self.runs.items() if (r.get("status") or {}).get("phase") in TERMINAL]
            if now - last_print > 10:
                phases = Counter((r.get("status") or {}).get("phase") or "-" for r in self.runs.values())
                say(f"{scn.name}: {now - self.t0:.0f}s progress {prog:.0%} {dict(sorted(phases.items()))}")
                last_print = now
            if len(terminal) == len(scn.runs) and len(self.runs) == len(scn.runs) and not self.timers \
                    and all(not t.is_alive() for t in self.threads):
                break
            time.sleep(1)
        elapsed = time.time() - self.t0
        w.tools.recorder.release_all()  # a fault whose call never came (or the scenario timed out)
        for t in self.threads:
            t.join(60)
        say(f"{scn.name}: all runs ended after {elapsed:.0f}s; checking invariants")
        self.poll()
        violations = list(self.errors)
        violations += self.settle("no orphan Jobs or pods", lambda: invariants.check_no_orphans(w, self.ns, self.runs), 90)
        self.evidence = ev = self.collect()
        violations += invariants.check_all(ev)
        if violations:
            self.diagnose(violations)
            raise ScenarioFailed(f"scenario {scn.name} (seed {self.seed}, replay: CHAOS_SEED={self.seed} "
                                 f"python -m e2e.chaos --schedule {self.schedule}): {len(violations)} violation(s):\n  "
                                 + "\n  ".join(violations[:40]))
        say(f"{scn.name}: invariants OK after {elapsed:.0f}s: {len(scn.runs)} runs, {scn.expected_laps} laps, "
            f"{len(ev.jobs)} Jobs, {(ev.tool.get('totals') or {}).get('executions')} side effects each executed once; "
            "deleting the runs")
        w.kubectl("delete", "agentruns", "--all", "-n", self.ns, "--wait=true", "--timeout=120s", check=False)
        # the garbage collector removes every kept Job and its pod: its time grows with their number
        # (a soak wave of 2,944 Jobs still had 2,583 pods after 180 s)
        left = self.settle("nothing left after deleting the runs", lambda: invariants.check_nothing_left(w, self.ns),
                           max(180.0, CLEANUP_SECONDS_PER_JOB * len(ev.jobs)))
        w.kill_operators()
        if left:
            self.diagnose(left)
            raise ScenarioFailed(f"scenario {scn.name} (seed {self.seed}): left behind:\n  " + "\n  ".join(left[:40]))
        retries = sum((r.get("status") or {}).get("totalRetries") or 0 for r in self.runs.values())
        tot = ev.tool.get("totals") or {}
        result = {"scenario": scn.name, "runs": len(scn.runs), "laps": scn.expected_laps, "seconds": round(elapsed),
                  "retries": retries, "jobs": len(ev.jobs), "tool_requests": tot.get("requests"),
                  "tool_executions": tot.get("executions"), "tool_replays": tot.get("replays"),
                  "store_unavailable_events": ev.events.get("StoreUnavailable", 0),
                  "status_writes": len(ev.status_writes), "lease_writes": len(ev.lease_writes),
                  "faults": [f.note for f in scn.faults], "api_poll_errors": self.api_errors,
                  "s3_refused": ev.s3_refused}
        say(f"{scn.name}: OK in {elapsed:.0f}s ({retries} lap retries, {len(ev.jobs)} Jobs, "
            f"{tot.get('replays')} repeats answered from the record): every run Succeeded, each side effect once, "
            f"lap chains intact, status == store, every fault landed, nothing left")
        return result

    def collect(self) -> invariants.Evidence:
        """Everything the invariants read, from records outside the code under test."""
        w = self.world
        assert self.watcher is not None
        self.watcher.stop()
        wt = self.watcher
        jobs = dict(wt.jobs)
        for j in w.list_jobs(self.ns):  # the final list too (a watch may have missed an ADDED)
            wt._on_job(j)
        jobs = dict(wt.jobs)
        runs = {}
        for name, r in self.runs.items():
            md = r["metadata"]
            runs[name] = invariants.RunFacts(name=name, namespace=md["namespace"], uid=md["uid"],
                                             status=r.get("status") or {}, laps=w.raw_laps(r))
        return invariants.Evidence(
            plans=self.scn.runs, runs=runs, tool=w.tool_record(), jobs=list(jobs.values()),
            status_writes=list(wt.status_writes), ticks=list(wt.ticks), lease_writes=list(wt.lease_writes),
            kills=dict(w.kills), faults=self.scn.faults, events=w.event_reasons(self.ns),
            s3_refused=w.proxy.refused - self.refused0, watched=bool(wt.ticks), replicas=self.scn.replicas)

    def wait_holder(self, identity: str, timeout: float = 120) -> None:
        end = time.time() + timeout
        while time.time() < end:
            try:
                if self.world.lease_holder(self.ns) == identity:
                    return
            except Exception:  # noqa: BLE001  (no Lease yet)
                pass
            time.sleep(0.5)
        self.errors.append(f"replica {identity} never took the Lease")

    def settle(self, what: str, check, timeout: float) -> list[str]:
        end = time.time() + timeout
        while True:
            try:
                problems = check()
            except Exception as e:  # noqa: BLE001
                problems = [f"{what}: {type(e).__name__}: {e}"]
            if not problems or time.time() > end:
                return problems
            time.sleep(2)

    def diagnose(self, violations: list[str]) -> None:
        w = self.world
        out = [f"===== chaos diagnosis: scenario {self.scn.name}, seed {self.seed} ====="]
        out += [f"violation: {v}" for v in violations]
        out.append("--- faults ---")
        out += [f"{f.kind} at {f.at:.0%}: {f.note or 'not fired'}" for f in self.scn.faults]
        out += [f"`agentrun approvals approve {n}` last failed with: {why}" for n, why in sorted(self.cli_failures.items())]
        out.append("--- runs (name phase lap retries message) ---")
        bad = {v.split(":")[0] for v in violations}
        for name, r in sorted(self.runs.items()):
            st = r.get("status") or {}
            out.append(f"{name} {st.get('phase')} lap={st.get('lap')} retries={st.get('totalRetries')} "
                       f"ck={(st.get('checkpoint') or {}).get('key', '').rsplit('/', 2)[-1]} {st.get('message', '')}")
            if name in bad:
                try:
                    prefix = w.store.run_prefix(w.run_ref(r))
                    keys = [o["Key"][len(prefix):] for page in w.s3c.get_paginator("list_objects_v2").paginate(
                        Bucket=w.s3.bucket, Prefix=prefix) for o in page.get("Contents", [])]
                    out.append(f"    store: {keys}")
                    md = r["metadata"]
                    tkeys = w.tool_record().get("keys") or {}
                    mine = invariants.expected_calls(self.plans[name], md["namespace"], md["uid"]) \
                        if name in self.plans else {}
                    out.append("    tool record of its scripted keys (requests, executions, replays): "
                               + str({k: tuple((tkeys.get(k) or {}).get(f, 0) for f in ("requests", "executions",
                                                                                        "replays"))
                                      for k in mine}))
                    out.append(f"    status: {st}")
                except Exception as e:  # noqa: BLE001
                    out.append(f"    (store/tool read failed: {e})")
        r = w.kubectl("get", "jobs,pods", "-n", self.ns, "-o", "wide", check=False)
        out += ["--- kubectl get jobs,pods ---", r.stdout + r.stderr]
        if w.operator_log and w.operator_log.exists():
            out.append(f"--- operator log tail ({w.operator_log}) ---")
            out += w.operator_log.read_text(errors="replace").splitlines()[-200:]
        kl = w.cluster.dir / "logs" / "kubelet.log"
        out.append(f"--- kubelet log tail ({kl}) ---")
        out += kl.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(out), file=sys.stderr, flush=True)


def run_schedule(schedule: str, seed: int, tmp: str, only: list[str] | None = None,
                 world: World | None = None, *, soak: tuple[int, int, float] | None = None) -> list[dict]:
    """Run every scenario of the schedule in ``world`` (default: a new one started in tmp and
    stopped at the end). Raises ScenarioFailed on the first scenario whose invariants do not hold.
    ``schedule == "soak"`` with ``soak=(runs, laps, minutes)``: waves of random faults from the seed
    (schedule.build_soak), no new wave started once ``minutes`` have passed."""
    if schedule == "soak":
        runs, laps, minutes = soak or (20, 4, 10.0)
        scenarios = build_soak(seed, runs, laps, minutes)
    else:
        scenarios = [s for s in build(schedule, seed) if not only or s.name in only]
        minutes = None
    say(f"chaos seed {seed} (replay: CHAOS_SEED={seed} python -m e2e.chaos --schedule {schedule}"
        f"{f' --runs {soak[0]} --laps {soak[1]} --minutes {soak[2]}' if soak else ''}); "
        f"scenarios: {', '.join(s.name for s in scenarios)}; work dir {tmp}")
    t0 = time.time()
    own = world is None
    if world is None:
        world = World(tmp)
    results: list[dict] = []
    problems: list[str] = []
    try:
        if own:
            world.start()
        for scn in scenarios:
            if minutes is not None and results and time.time() - t0 > minutes * 60:
                break
            results.append(ScenarioRun(world, scn, seed, schedule).execute())
    finally:
        if own:
            problems = world.stop()
    if problems:
        raise ScenarioFailed("; ".join(problems))
    say(f"schedule {schedule} seed {seed}: {len(results)} scenario(s) OK in {time.time() - t0:.0f}s")
    for r in results:
        say(f"  {r}")
    if schedule == "soak":
        tot = {k: sum(r[k] or 0 for r in results) for k in ("runs", "laps", "retries", "jobs", "tool_executions",
                                                            "tool_replays", "s3_refused")}
        say(f"soak totals: {len(results)} waves, {tot}, "
            f"{sum(len(r['faults']) for r in results)} faults, all landed, invariants held")
    return results
