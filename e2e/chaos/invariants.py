"""What must hold after every chaos scenario. Each check returns a list of violations (strings
naming the run and what is wrong); an empty list means the invariant holds.

* every run reached its terminal phase (Succeeded: the scripts are finite and every fault is
  recoverable);
* every side effect happened exactly once: at the recording tool server, every idempotency key was
  executed once, and the set of keys equals the set the scripts imply
  (``r_<uid8>:<lap>:<tool>:call_<n>``; a rejected approval's call absent);
* no lap missing or duplicated in the store: lap keys 1..N contiguous, each record's lap equals its
  key, the hash chain intact (``CheckpointStore.load_state`` folds with the chain checked), N equals
  the number of scripted laps and the run's status.lap;
* the status agrees with the store: status.checkpoint key and sha256 are lap N's, status.cost
  (usd, input and output tokens) equals the folded totals;
* no orphan Jobs or pods: every Job is finished and owned by an existing run, every pod is owned by
  an existing Job and not running; after the runs are deleted nothing is left, not even a lap
  process.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from agentrun.checkpoint.store import lap_of_key
from e2e.chaos.schedule import RunPlan, Scenario
from e2e.chaos.world import World


def expected_keys(plan: RunPlan, short_id: str) -> set[str]:
    keys = set()
    for s, step in enumerate(plan.steps):
        for j, call in enumerate(step.get("toolCalls") or [], start=1):
            if call["name"] == "refund" and plan.approval == "reject":
                continue
            keys.add(f"{short_id}:{s + 1}:{call['name']}:call_{j}")
    return keys


def check_phases(scn: Scenario, runs: dict[str, dict]) -> list[str]:
    out = []
    for plan in scn.runs:
        st = (runs.get(plan.name) or {}).get("status") or {}
        if plan.name not in runs:
            out.append(f"{plan.name}: the AgentRun is gone")
        elif st.get("phase") != "Succeeded":
            out.append(f"{plan.name}: phase {st.get('phase')!r}, expected Succeeded ({st.get('message', '')})")
    return out


def check_side_effects(world: World, scn: Scenario, runs: dict[str, dict]) -> list[str]:
    out = []
    calls = world.executed_calls()
    per_key = Counter(c["idempotencyKey"] for c in calls)
    for plan in scn.runs:
        run = runs.get(plan.name)
        if run is None:
            continue
        short = world.run_ref(run).short_id
        want = expected_keys(plan, short)
        got = {k for k in per_key if k and k.startswith(short + ":")}
        twice = {k: n for k, n in per_key.items() if k in got and n != 1}
        if twice:
            out.append(f"{plan.name}: side effects executed more than once: {twice}")
        if got != want:
            out.append(f"{plan.name}: executed keys differ from the script: missing {sorted(want - got)}, "
                       f"unexpected {sorted(got - want)}")
    if None in per_key:
        out.append(f"{per_key[None]} tool call(s) without an Idempotency-Key")
    return out


def check_store(world: World, scn: Scenario, runs: dict[str, dict]) -> list[str]:
    out = []
    for plan in scn.runs:
        run = runs.get(plan.name)
        if run is None:
            continue
        ref = world.run_ref(run)
        st = run.get("status") or {}
        prefix = world.store.run_prefix(ref) + "laps/"
        keys = [o["Key"] for page in world.s3c.get_paginator("list_objects_v2").paginate(
            Bucket=world.s3.bucket, Prefix=prefix) for o in page.get("Contents", [])]
        laps = [lap_of_key(k) for k in keys]
        n = len(keys)
        if laps != list(range(1, n + 1)):
            out.append(f"{plan.name}: lap keys not 1..N contiguous: {laps}")
            continue
        try:
            loaded = world.store.load_state(ref)
        except Exception as e:  # noqa: BLE001
            out.append(f"{plan.name}: load_state failed (hash chain / record): {type(e).__name__}: {e}")
            continue
        state = loaded.state
        if state.lap != n or n != plan.laps or st.get("lap") != n:
            out.append(f"{plan.name}: laps: store {n} (folded {state.lap}), script {plan.laps}, status {st.get('lap')}")
        for lap in range(1, n + 1):
            record, _ = world.store.get_lap(ref, lap)
            if record.lap != lap:
                out.append(f"{plan.name}: {world.store.lap_key(ref, lap)} holds lap {record.lap}")
        ck = st.get("checkpoint") or {}
        last = world.store.head_lap(ref, n) if n else None
        if n and (ck.get("key") != world.store.lap_key(ref, n) or last is None or ck.get("sha256") != last.sha256):
            out.append(f"{plan.name}: status.checkpoint {ck} is not lap {n} ({last})")
        cost = st.get("cost") or {}
        totals = state.totals
        if (cost.get("inputTokens", 0) != totals.input_tokens or cost.get("outputTokens", 0) != totals.output_tokens
                or Decimal(str(cost.get("usd", "0"))) != Decimal(totals.cost_usd)):
            out.append(f"{plan.name}: status.cost {cost} != store totals {totals.model_dump(by_alias=True)}")
        if totals.laps != n:
            out.append(f"{plan.name}: store totals.laps {totals.laps} != {n}")
    return out


def check_no_orphans(world: World, ns: str, runs: dict[str, dict]) -> list[str]:
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


def check_nothing_left(world: World, ns: str) -> list[str]:
    out = [f"Job {j.metadata.name} left after the runs were deleted" for j in world.list_jobs(ns)]
    out += [f"pod {p.metadata.name} ({p.status.phase}) left after the runs were deleted" for p in world.list_pods(ns)]
    out += [f"lap process {pid} still alive" for pid in world.live_lap_processes(ns)]
    return out
