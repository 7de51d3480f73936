"""What must hold after every chaos scenario, checked against records kept OUTSIDE the code under
test. Each check is a pure function of an ``Evidence`` (built by the runner from the recording tool
server, the raw S3 objects, watches of AgentRuns, Jobs and the Lease, and the fault log) and returns
a list of violations (strings naming the run and what is wrong); empty means the invariant holds.
``tests/chaos/test_invariants.py`` feeds deliberately broken evidence into every check (the
negative control) and a correct one (which must pass).

1. phases: every run reached ``Succeeded`` (the scripts are finite, every fault is recoverable).
2. side effects (from the tool server's own record, ``GET /_record``), over EVERY key it saw, not
   only keys that look like a run's:
   * executions per key == 1 (the ci schedule counts executions at arrival, before the tool server
     deduplicates: holds.HoldingRecorder's ``count_before_dedup``, so a key sent twice
     concurrently counts twice);
   * executed keys == the keys the scripts imply (derived from each run's uid with the project's
     key function ``agentrun.lap.keys.idempotency_key``; a rejected approval's call absent), nothing
     outside that set;
   * requests per key <= attempts of the lap that sends it (a ``note`` call: its own lap; an
     approved call: the lap after the approval), attempts counted from the recorded Jobs;
   * totals: executions == the expected number of keys; requests == executions + replays +
     refusals (nothing lost, nothing refused silently); requests <= the sum of the bounds above;
     no request without an Idempotency-Key, no key reused with other arguments, no bad request.
3. store (``e2e.chaos.rawstore``: raw bytes via boto3, an independent decoder, NOT CheckpointStore
   or fold): lap keys 1..N contiguous with N == the script's laps == status.lap; every object's
   sha256 matches its metadata; each record's lap == its key and run uid == the run's;
   prevSha256 of lap n == the sha256 of lap n-1 (none for lap 1); usage, costUSD and the running
   totals (laps, tokens, cost) of every record == what the script and the pricing give;
   status.checkpoint (key, sha256) == lap N's; status.cost == the recomputed totals.
4. Jobs (recorded from a watch, plus the final list; finished Jobs are kept in chaos): every Job
   belongs to a scenario run; its name == ``jobs.job_name(run, uid, lap, attempt)`` of its labels;
   each name was created once (one uid); per run, laps 1..N each with attempts 1..a contiguous, no
   Job for a lap beyond N; Jobs == N + status.totalRetries.
5. faults landed (``check_faults_landed``): every fault fired and hit something (a running lap, a
   live operator, the Lease holder, a running pod for the kubelet restart, a real outage for the
   control-plane restarts: for the apiserver, a new process and a request refused while it was
   down, ``runner.apiserver_restart_landed``); with pod kills, retried attempts > 0, and with a pod SIGKILLed while a
   tool call was in flight, repeats answered from the record > 0; with an S3 outage, refused
   connections > 0 and StoreUnavailable Events > 0 (or, when the operator did not read the store
   during the outage, LapRetry Events naming the store > 0).
6. approvals (issue 11): ``status`` never shows a call Pending after it executed. Sound, from the
   global resourceVersion order (the etcd revision, which orders every write of this cluster):
   a ticker patches a ConfigMap every ~0.5 s and keeps (time sent, time answered, rv). A status
   write whose rv is above the rv of a tick SENT after the call's execution time (tool server
   clock, same host) was certainly committed after the execution; if it still shows that call
   Pending, that is a violation. A second, clock-free bound: no write showing the call Pending
   after (in rv order) a write showing the executing lap (approval lap + 1) checkpointed. Writes
   the watch missed (during apiserver restarts) make the check weaker, never wrong. The check
   must not be vacuous: some Pending write must have been observed.
7. leadership (two replicas, clock skew): a replica takes the Lease from another only once the
   other's last renewal is at least a lease duration old (an upper bound of the gap from the
   ticks, so a violation is certain). A standby taking a Lease that is still renewed (what a
   clock-skewed expiry did) fails; a starved holder losing its Lease on a loaded box does not.
   Not vacuous: a scenario of two replicas must show at least one takeover bounded by ticks.
8. no orphans / nothing left: see ``check_no_orphans`` and ``check_nothing_left`` (these read the
   live cluster).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from agentrun.checkpoint.schema import RunRef
from agentrun.controller.decide.jobs import job_name
from agentrun.lap.keys import idempotency_key, normalize_call_ids
from e2e.chaos.rawstore import RawLap
from e2e.chaos.schedule import (
    APISERVER_RESTART,
    ETCD_RESTART,
    KUBELET_RESTART,
    LEADER_KILL,
    OPERATOR_KILL,
    POD_DELETE,
    POD_SIGKILL,
    S3_OUTAGE,
    Fault,
    RunPlan,
)

APPROVAL_TOOLS = {"refund"}  # tools the chaos runs declare with requiresApproval
PRICE_IN = Decimal("3.00")  # per million tokens, as in runner.run_doc
PRICE_OUT = Decimal("15.00")
MICRO = Decimal("0.000001")


@dataclass
class RunFacts:
    name: str
    namespace: str
    uid: str
    status: dict
    laps: list[RawLap] = field(default_factory=list)  # the raw store objects (rawstore.list_laps)


@dataclass
class JobFacts:
    name: str
    uid: str
    owner_uids: tuple[str, ...]
    lap: int | None
    attempt: int | None


@dataclass
class StatusWrite:
    rv: int
    run: str
    lap: int | None
    approval: dict | None


@dataclass
class LeaseWrite:
    rv: int
    holder: str | None
    duration: float = 3.0  # spec.leaseDurationSeconds


@dataclass
class Tick:
    sent: float
    answered: float
    rv: int


@dataclass
class Evidence:
    plans: list[RunPlan]
    runs: dict[str, RunFacts]  # by run name; a run that is gone is absent
    tool: dict  # the tool server's GET /_record
    jobs: list[JobFacts] = field(default_factory=list)  # one per Job uid ever seen
    status_writes: list[StatusWrite] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    lease_writes: list[LeaseWrite] = field(default_factory=list)
    kills: dict[str, float] = field(default_factory=dict)  # operator identity -> when SIGKILLed
    faults: list[Fault] = field(default_factory=list)
    events: Counter = field(default_factory=Counter)  # Event reason -> count
    s3_refused: int = 0
    watched: bool = True  # status/Lease watches and the ticker ran (checks 6, 7)
    replicas: int = 1  # operator replicas of the scenario (2: check 7 must have a takeover to check)


# ---------------------------------------------------------------------------------- expectations
def expected_calls(plan: RunPlan, ns: str, uid: str) -> dict[str, tuple[str, int]]:
    """key -> (tool, the lap whose attempts send it). Keys come from the project's key function, with the
    run's full identity: whatever format it has, it is derived from the uid, never matched by prefix."""
    ref = RunRef(namespace=ns, name=plan.name, uid=uid)
    out: dict[str, tuple[str, int]] = {}
    for s, step in enumerate(plan.steps):
        calls = step.get("toolCalls") or []
        ids = normalize_call_ids([c.get("id") for c in calls])
        for cid, call in zip(ids, calls):
            if call["name"] in APPROVAL_TOOLS and plan.approval == "reject":
                continue
            lap = s + 1
            sender = lap + 1 if call["name"] in APPROVAL_TOOLS else lap
            out[idempotency_key(ref, lap, call["name"], cid)] = (call["name"], sender)
    return out


def lap_cost(step: dict) -> tuple[int, int, Decimal]:
    u = step.get("usage") or {}
    i, o = int(u.get("inputTokens") or 0), int(u.get("outputTokens") or 0)
    cost = ((Decimal(i) * PRICE_IN + Decimal(o) * PRICE_OUT) / Decimal(1_000_000)).quantize(MICRO, ROUND_HALF_EVEN)
    return i, o, cost


def _dec(v: Any) -> Decimal | None:
    try:
        return Decimal(str(v))
    except Exception:  # noqa: BLE001
        return None


def attempts_by_lap(ev: Evidence) -> dict[str, dict[int, set[int]]]:
    """run uid -> lap -> attempts that had a Job."""
    out: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for j in ev.jobs:
        if j.lap is not None and j.attempt is not None:
            for u in j.owner_uids:
                out[u][j.lap].add(j.attempt)
    return out


# ---------------------------------------------------------------------------------- the checks
def check_phases(ev: Evidence) -> list[str]:
    out = []
    for plan in ev.plans:
        run = ev.runs.get(plan.name)
        if run is None:
            out.append(f"{plan.name}: the AgentRun is gone")
        elif run.status.get("phase") != "Succeeded":
            out.append(f"{plan.name}: phase {run.status.get('phase')!r}, expected Succeeded "
                       f"({run.status.get('message', '')})")
    return out


def check_side_effects(ev: Evidence) -> list[str]:
    out = []
    keys: dict[str, dict] = ev.tool.get("keys") or {}
    expected: dict[str, tuple[str, int]] = {}  # key -> (run, sending lap)
    for plan in ev.plans:
        run = ev.runs.get(plan.name)
        if run is None:
            continue
        for k, (_, lap) in expected_calls(plan, run.namespace, run.uid).items():
            expected[k] = (plan.name, lap)
    attempts = attempts_by_lap(ev)
    uid_of = {r.name: r.uid for r in ev.runs.values()}
    executed = {k for k, v in keys.items() if v.get("executions", 0) > 0}
    for k, v in sorted(keys.items()):
        n = v.get("executions", 0)
        if n > 1:
            out.append(f"key {k}: executed {n} times")
        if v.get("conflicts"):
            out.append(f"key {k}: sent {v['conflicts']} time(s) with other arguments than its execution (refused)")
        if k in expected:
            name, lap = expected[k]
            bound = max(1, len(attempts[uid_of[name]].get(lap, ())))
            if v.get("requests", 0) > bound:
                out.append(f"{name}: key {k} requested {v['requests']} times, more than the {bound} attempt(s) of lap {lap}")
    missing, extra = set(expected) - executed, executed - set(expected)
    by_run: dict[str, list[str]] = defaultdict(list)
    for k in missing:
        by_run[expected[k][0]].append(k)
    for name, ks in sorted(by_run.items()):
        out.append(f"{name}: scripted side effects never executed: {sorted(ks)}")
    if extra:
        out.append(f"side effects executed outside the scripted set: {sorted(extra)[:20]}"
                   + (f" (+{len(extra) - 20} more)" if len(extra) > 20 else ""))
    tot = ev.tool.get("totals") or {}
    nokey = ev.tool.get("withoutKey") or {}
    if nokey.get("requests") or nokey.get("executions"):
        out.append(f"{nokey.get('requests', 0)} request(s) without an Idempotency-Key "
                   f"({nokey.get('executions', 0)} executed)")
    if tot.get("executions", 0) != len(expected):
        out.append(f"total executions {tot.get('executions', 0)} != {len(expected)} scripted side effects")
    accounted = tot.get("executions", 0) + tot.get("replays", 0) + tot.get("conflicts", 0) + tot.get("badRequests", 0)
    if tot.get("requests", 0) != accounted:
        out.append(f"total requests {tot.get('requests', 0)} != executions + replays + refusals ({accounted}): "
                   "a request was lost or refused silently")
    if tot.get("badRequests"):
        out.append(f"{tot['badRequests']} bad request(s) at the tool server")
    bound_sum = sum(max(1, len(attempts[uid_of[n]].get(lap, ())))
                    for n, lap in expected.values())
    if tot.get("requests", 0) > bound_sum + (nokey.get("requests") or 0):
        out.append(f"total requests {tot.get('requests', 0)} > {bound_sum}, the attempts that could send them")
    return out


def check_journaled(ev: Evidence) -> list[str]:
    """A lap journals each tool result before it sends its next call (lap/step.py), so a call
    answered before a later call of its lap was sent is never sent again: a retried attempt reuses
    the journaled result. Checked where it is certain, on the laps of the held victim calls
    (schedule.assign_targets): the victim's attempt sent the calls before it, had their results
    journaled, sent the victim and died with it held. So no call before the victim in its lap may
    be requested after the victim's first request (the tool server's clock, one host). A lap that
    does not journal its results (the ``skip-journal`` test fault) sends them again there."""
    out = []
    keys: dict[str, dict] = ev.tool.get("keys") or {}
    for f in ev.faults:
        if not f.target or not f.landed:
            continue
        for plan, s, step in ((p, s, st) for p in ev.plans for s, st in enumerate(p.steps)):
            calls = step.get("toolCalls") or []
            orders = [(c.get("arguments") or {}).get("order") for c in calls]
            run = ev.runs.get(plan.name)
            if f.target not in orders or run is None:
                continue
            name, ref = plan.name, RunRef(namespace=run.namespace, name=plan.name, uid=run.uid)
            ids = normalize_call_ids([c.get("id") for c in calls])
            ks = [idempotency_key(ref, s + 1, c["name"], cid) for c, cid in zip(calls, ids)]
            i = orders.index(f.target)
            victim = (keys.get(ks[i]) or {}).get("firstRequestAt")
            for c, k in zip(calls[:i], ks[:i]):
                last = (keys.get(k) or {}).get("lastRequestAt")
                if c["name"] not in APPROVAL_TOOLS and victim is not None and last is not None and last > victim:
                    out.append(f"{name}: key {k} sent again {last - victim:.1f}s after the next call of its lap "
                               f"({f.target}) was sent: its answer was not reused from the lap's journal")
    return out


def check_store(ev: Evidence) -> list[str]:
    out = []
    for plan in ev.plans:
        run = ev.runs.get(plan.name)
        if run is None:
            continue
        st, name = run.status, plan.name
        laps = run.laps
        n = len(laps)
        if [x.lap_in_key for x in laps] != list(range(1, n + 1)):
            out.append(f"{name}: lap keys not 1..N contiguous: {[x.lap_in_key for x in laps]}")
            continue
        if n != plan.laps or st.get("lap") != n:
            out.append(f"{name}: laps: store {n}, script {plan.laps}, status {st.get('lap')}")
        prev_digest = None
        t_in = t_out = 0
        t_cost = Decimal(0)
        broken = False
        for x in laps:
            if x.problems:
                out += [f"{name}: {p}" for p in x.problems]
                broken = True
                break
            try:
                lap, uid, prev = x.f("lap"), x.f("uid"), x.f("prev")
                if lap != x.lap_in_key:
                    out.append(f"{name}: {x.key} holds lap {lap}")
                if uid != run.uid:
                    out.append(f"{name}: {x.key} belongs to run uid {uid}, not {run.uid}")
                if prev != prev_digest:
                    out.append(f"{name}: hash chain broken at lap {x.lap_in_key}: prevSha256 {prev} but lap "
                               f"{x.lap_in_key - 1} has sha256 {prev_digest}")
                    broken = True
                prev_digest = x.digest
                if x.lap_in_key > len(plan.steps):
                    continue
                i, o, c = lap_cost(plan.steps[x.lap_in_key - 1])
                t_in, t_out, t_cost = t_in + i, t_out + o, t_cost + c
                if (x.f("in"), x.f("out")) != (i, o) or _dec(x.f("cost")) != c:
                    out.append(f"{name}: lap {x.lap_in_key} usage {x.f('in')}/{x.f('out')} cost {x.f('cost')}, "
                               f"script gives {i}/{o} cost {c}")
                if (x.f("t_laps"), x.f("t_in"), x.f("t_out")) != (x.lap_in_key, t_in, t_out) \
                        or _dec(x.f("t_cost")) != t_cost:
                    out.append(f"{name}: lap {x.lap_in_key} totals {x.f('t_laps')}/{x.f('t_in')}/{x.f('t_out')}/"
                               f"{x.f('t_cost')}, recomputed {x.lap_in_key}/{t_in}/{t_out}/{t_cost}")
            except ValueError as e:  # an unknown schema version (rawstore.RawStoreError)
                out.append(f"{name}: {e}")
                broken = True
                break
        if broken or not n:
            continue
        ck = st.get("checkpoint") or {}
        if ck.get("key") != laps[-1].key or ck.get("sha256") != laps[-1].digest:
            out.append(f"{name}: status.checkpoint {ck} is not lap {n} ({laps[-1].key} {laps[-1].digest})")
        cost = st.get("cost") or {}
        if (cost.get("inputTokens", 0), cost.get("outputTokens", 0)) != (t_in, t_out) \
                or _dec(cost.get("usd", "0")) != t_cost:
            out.append(f"{name}: status.cost {cost} != recomputed usd {t_cost}, tokens {t_in}/{t_out}")
    return out


def check_jobs(ev: Evidence) -> list[str]:
    out = []
    runs_by_uid = {r.uid: r for r in ev.runs.values()}
    plans = {p.name: p for p in ev.plans}
    names: dict[str, set[str]] = defaultdict(set)
    per_run: dict[str, list[JobFacts]] = defaultdict(list)
    for j in ev.jobs:
        names[j.name].add(j.uid)
        owners = [u for u in j.owner_uids if u in runs_by_uid]
        if not owners:
            out.append(f"Job {j.name} owned by {list(j.owner_uids)}, no scenario run")
            continue
        run = runs_by_uid[owners[0]]
        per_run[run.name].append(j)
        if j.lap is None or j.attempt is None:
            out.append(f"Job {j.name}: no lap/attempt labels")
        elif j.name != job_name(run.name, run.uid, j.lap, j.attempt):
            out.append(f"Job {j.name}: name is not {job_name(run.name, run.uid, j.lap, j.attempt)} "
                       f"(lap {j.lap}, attempt {j.attempt})")
    for n, uids in sorted(names.items()):
        if len(uids) > 1:
            out.append(f"Job {n} created {len(uids)} times")
    for name, run in sorted(ev.runs.items()):
        plan = plans.get(name)
        if plan is None:
            continue
        jobs = per_run.get(name, [])
        by_lap: dict[int, set[int]] = defaultdict(set)
        for j in jobs:
            if j.lap is not None and j.attempt is not None:
                by_lap[j.lap].add(j.attempt)
        n = run.status.get("lap") or 0
        if sorted(by_lap) != list(range(1, n + 1)):
            out.append(f"{name}: Jobs for laps {sorted(by_lap)}, expected 1..{n}")
        for lap, att in sorted(by_lap.items()):
            if sorted(att) != list(range(1, max(att) + 1)):
                out.append(f"{name}: lap {lap} Job attempts {sorted(att)} not 1..{max(att)}")
        want = n + (run.status.get("totalRetries") or 0)
        if len({j.name for j in jobs}) != want:
            out.append(f"{name}: {len({j.name for j in jobs})} Job(s), expected {want} "
                       f"(laps {n} + retries {run.status.get('totalRetries') or 0})")
    return out


def check_faults_landed(ev: Evidence) -> list[str]:
    out = []
    kinds = Counter(f.kind for f in ev.faults)
    for f in ev.faults:
        if f.fired_at is None:
            out.append(f"fault {f.kind}@{f.at:.0%} never fired" + (f": {f.note}" if f.note else "")
                       + (f" (its victim call {f.target} never reached the tool server)" if f.target and not f.note
                          else ""))
        elif not f.landed:
            out.append(f"fault {f.kind}@{f.at:.0%} fired but did not land: {f.note}")
    if kinds[POD_DELETE] + kinds[POD_SIGKILL] + kinds[KUBELET_RESTART]:
        retries = sum((r.status.get("totalRetries") or 0) for r in ev.runs.values())
        replays = (ev.tool.get("totals") or {}).get("replays", 0)
        if retries == 0:
            out.append("lap pods were killed but no lap attempt was retried")
        # a SIGKILL mid-call leaves the call executed but not journaled: the retry must send the same
        # key again (a graceful delete may let the lap journal the answer first, so it is not required)
        if any(f.kind == POD_SIGKILL and f.landed and f.mid_call for f in ev.faults) and replays == 0:
            out.append("lap pods were SIGKILLed mid-call but no repeated call was answered from the tool "
                       "server's record")
    if kinds[S3_OUTAGE]:
        if ev.s3_refused == 0:
            out.append("S3 was cut but no connection was refused")
        if ev.events.get("StoreUnavailable", 0) == 0 and ev.events.get("LapRetry:store", 0) == 0:
            out.append("S3 was cut but no StoreUnavailable Event (the operator) and no LapRetry Event naming "
                       "the store (a lap) was recorded")
    return out


def _after_tick(ticks: list[Tick], t: float) -> int | None:
    """rv of the first tick sent after t (committed after t), None if none."""
    cands = [k.rv for k in ticks if k.sent > t]
    return min(cands) if cands else None


def check_approvals(ev: Evidence) -> list[str]:
    out = []
    if not ev.watched:
        return ["approval check: the status watch and the ticker did not run"]
    keys = ev.tool.get("keys") or {}
    looked = 0
    for plan in ev.plans:
        run = ev.runs.get(plan.name)
        if run is None or plan.approval in (None, "reject"):
            continue
        exp = {k: lap for k, (tool, lap) in expected_calls(plan, run.namespace, run.uid).items()
               if tool in APPROVAL_TOOLS}
        writes = sorted((w for w in ev.status_writes if w.run == plan.name), key=lambda w: w.rv)
        for k, exec_lap in exp.items():
            pend = [w for w in writes if (w.approval or {}).get("state") == "Pending"
                    and (w.approval or {}).get("idempotencyKey") == k]
            at = (keys.get(k) or {}).get("executedAt") or []
            if pend:
                looked += 1
            if at:
                rv = _after_tick(ev.ticks, min(at))
                bad = [w.rv for w in pend if rv is not None and w.rv > rv]
                if bad:
                    out.append(f"{plan.name}: status showed {k} Pending at rv {bad[:3]}, after it executed "
                               f"(a tick sent after the execution has rv {rv})")
            done = [w.rv for w in writes if (w.lap or 0) >= exec_lap]
            if done:
                bad = [w.rv for w in pend if w.rv > min(done)]
                if bad:
                    out.append(f"{plan.name}: status showed {k} Pending at rv {bad[:3]}, after status.lap "
                               f"reached {exec_lap} (rv {min(done)}), the lap that executes it")
    if looked == 0 and any(p.approval not in (None, "reject") for p in ev.plans):
        out.append("approval check vacuous: no status write showing an approval Pending was observed")
    return out


def check_leadership(ev: Evidence) -> list[str]:
    """A replica takes the Lease from another only after the other's last write is at least a
    lease duration old: B's take must not be committed less than ``leaseDurationSeconds`` after A's
    last renewal. Sound from the ticks: A's renewal was committed after the last tick with a lower
    rv was SENT, B's take before the first tick with a higher rv was ANSWERED; if even that upper
    bound of the gap is below the duration, B took a Lease A was still renewing (what comparing a
    skewed renewTime with the local clock does). A release (holder emptied) may be taken at once."""
    out = []
    writes = sorted(ev.lease_writes, key=lambda w: w.rv)
    ticks = sorted(ev.ticks, key=lambda k: k.rv)
    checked = 0
    for i, w in enumerate(writes):
        if i == 0 or not w.holder:
            continue
        prev = writes[i - 1]
        if not prev.holder or prev.holder == w.holder:
            continue
        before = [k for k in ticks if k.rv < prev.rv]
        after = [k for k in ticks if k.rv > w.rv]
        if not before or not after:
            continue
        checked += 1
        gap_max = after[0].answered - before[-1].sent
        if gap_max < w.duration:
            out.append(f"Lease taken from {prev.holder} by {w.holder} at rv {w.rv} at most {gap_max:.1f}s after "
                       f"{prev.holder}'s last renewal (rv {prev.rv}), less than the {w.duration:g}s lease duration")
    if ev.replicas > 1 and checked == 0:  # a scenario of two replicas must show a takeover it could bound
        out.append(f"leadership check vacuous: {ev.replicas} replicas but no Lease taken from one by another was "
                   f"observed between two ticks ({len(writes)} Lease write(s), {len(ticks)} tick(s) seen)")
    return out


def check_all(ev: Evidence) -> list[str]:
    return (check_phases(ev) + check_side_effects(ev) + check_journaled(ev) + check_store(ev) + check_jobs(ev)
            + check_faults_landed(ev) + check_approvals(ev) + check_leadership(ev))


# ---------------------------------------------------------------------------------- live cluster
def check_no_orphans(world: Any, ns: str, runs: dict[str, dict]) -> list[str]:
    """While the runs exist: every Job finished and owned by an existing run; every pod owned by an
    existing Job and not running."""
    out = []
    uids = {r["metadata"]["uid"] for r in runs.values()}
    jobs = world.list_jobs(ns)
    job_uids = {j.metadata.uid for j in jobs}
    for j in jobs:
        owners = [o.uid for o in (j.metadata.owner_references or [])]
        if not set(owners) & uids:
            out.append(f"Job {j.metadata.name} owned by {owners}, no existing AgentRun")
        if (j.status.active or 0) > 0 or not any(c.type in ("Complete", "Failed") and c.status == "True"
                                                 for c in (j.status.conditions or [])):
            out.append(f"Job {j.metadata.name} not finished although every run is terminal "
                       f"(active {j.status.active}, conditions {[c.type for c in j.status.conditions or []]})")
    for p in world.list_pods(ns):
        owners = [o.uid for o in (p.metadata.owner_references or [])]
        if not set(owners) & job_uids:
            out.append(f"pod {p.metadata.name} ({p.status.phase}) owned by {owners}, no existing Job")
        elif p.status.phase in ("Pending", "Running"):
            out.append(f"pod {p.metadata.name} still {p.status.phase}")
    return out


def check_nothing_left(world: Any, ns: str) -> list[str]:
    out = [f"Job {j.metadata.name} left after the runs were deleted" for j in world.list_jobs(ns)]
    out += [f"pod {p.metadata.name} ({p.status.phase}) left after the runs were deleted" for p in world.list_pods(ns)]
    out += [f"lap process {pid} still alive" for pid in world.live_lap_processes(ns)]
    return out


# kinds named here so a new one is not forgotten in check_faults_landed's landing rules
KINDS = (OPERATOR_KILL, LEADER_KILL, POD_DELETE, POD_SIGKILL, S3_OUTAGE, APISERVER_RESTART, ETCD_RESTART,
         KUBELET_RESTART)
