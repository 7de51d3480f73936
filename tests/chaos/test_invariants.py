"""The chaos invariants' negative control (issue 17): a correct record passes, and each deliberately
broken record (a key executed twice, an extra key, a missing key, a broken hash chain, a wrong cost,
a missing Job, a fault that did not land, ...) makes exactly the invariant that guards it fail.

The correct record is made the way the real system makes it: the lap objects are LapRecords
serialised by the project's own writer format (canonical JSON + sha256 metadata), the tool record
comes from the real recording tool server answering real HTTP requests from the project's HTTP tool
runner. The invariants read them with their own decoder (e2e/chaos/rawstore.py)."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from e2e.chaos import invariants as inv
from e2e.chaos import rawstore
from e2e.chaos.schedule import POD_SIGKILL, S3_OUTAGE, Fault, RunPlan

from agentrun.checkpoint.schema import LapRecord, Outcome, RunRef, Timings, ToolCallRecord, Totals, Usage
from agentrun.checkpoint.store import canonical_json, sha256_hex
from agentrun.controller.decide.jobs import job_name
from agentrun.lap.keys import idempotency_key

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import tool_server  # noqa: E402

NS, NAME, UID = "chaos-t", "r1", "8f2a1c0d-1111-2222-3333-444455556666"
REF = RunRef(namespace=NS, name=NAME, uid=UID)
PREFIX = f"chaos/{NS}/{NAME}/{UID}/"


def note(order: str) -> dict:
    return {"name": "note", "arguments": {"order": order}}


PLAN = RunPlan(name=NAME, approval="approve", steps=[
    {"content": "lap 1", "toolCalls": [note("a"), note("b"), {"name": "refund", "arguments": {"order": "r"}}],
     "usage": {"inputTokens": 100, "outputTokens": 10}},
    {"content": "lap 2", "toolCalls": [note("c")], "usage": {"inputTokens": 101, "outputTokens": 11}},
    {"content": "done", "usage": {"inputTokens": 50, "outputTokens": 5}},
])
K_A = idempotency_key(REF, 1, "note", "call_1")
K_B = idempotency_key(REF, 1, "note", "call_2")
K_REFUND = idempotency_key(REF, 1, "refund", "call_3")  # asked in lap 1, executed in lap 2
K_C = idempotency_key(REF, 2, "note", "call_1")


def lap_objects(chain_break_at: int | None = None, cost_of: dict[int, str] | None = None) -> list[rawstore.RawLap]:
    """The run's three lap objects, serialised as the store writes them, read back raw."""
    out, prev = [], None
    t_in = t_out = 0
    t_cost = Decimal(0)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    for lap, step in enumerate(PLAN.steps, start=1):
        i, o, c = inv.lap_cost(step)
        t_in, t_out, t_cost = t_in + i, t_out + o, t_cost + c
        cost = (cost_of or {}).get(lap, str(c))
        rec = LapRecord(agent_version="v1", run=REF, lap=lap, attempt=1,
                        prev_sha256="0" * 64 if lap == chain_break_at else prev,
                        outcome=Outcome(type="done" if lap == 3 else "continue"),
                        tool_calls=[ToolCallRecord(call_id="call_1", tool="note", idempotency_key=K_A, status="ok")],
                        usage=Usage(input_tokens=i, output_tokens=o), cost_usd=cost,
                        totals=Totals(laps=lap, input_tokens=t_in, output_tokens=t_out, cost_usd=str(t_cost)),
                        timings=Timings(started_at=now, finished_at=now))
        data = canonical_json(rec.model_dump(mode="json", by_alias=True, exclude_none=True))
        sha = sha256_hex(data)
        out.append(rawstore.read_lap(f"{PREFIX}laps/{lap:08d}.json", data, {"sha256": sha}))
        prev = sha
    return out


@functools.lru_cache(maxsize=2)
def _tool_record(send_key: bool) -> str:
    return json.dumps(tool_record_from_a_real_server(send_key))


def tool_record(send_key: bool = True) -> dict:
    return json.loads(_tool_record(send_key))


def tool_record_from_a_real_server(send_key: bool = True) -> dict:
    """The recording tool server answering the project's HTTP tool runner: lap 1 twice (its first
    attempt killed after the first call: the retry sends that key again), lap 2 once (the approved
    refund and note c). ``send_key=False``: the header dropped (the negative control of the issue)."""
    from agentrun.api.spec import ToolSpec
    from agentrun.lap.tools.http import HTTPToolRunner

    rec = tool_server.Recorder()
    server = tool_server.serve(0, recorder=rec)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"

        def tool(name: str) -> ToolSpec:
            return ToolSpec.model_validate({"name": name, "sideEffects": send_key, "http": {"url": f"{url}/{name}"}})
        runner = HTTPToolRunner()
        runner.call(tool("note"), {"order": "a"}, K_A)  # attempt 1, then killed
        runner.call(tool("note"), {"order": "a"}, K_A)  # attempt 2: the same key again
        runner.call(tool("note"), {"order": "b"}, K_B)
        runner.call(tool("refund"), {"order": "r"}, K_REFUND)  # lap 2 (approved)
        runner.call(tool("note"), {"order": "c"}, K_C)
    finally:
        server.shutdown()
    return rec.record()


def good() -> inv.Evidence:
    laps = lap_objects()
    totals = laps[-1].doc["totals"]
    status = {"phase": "Succeeded", "lap": 3, "totalRetries": 1,
              "checkpoint": {"key": laps[-1].key, "sha256": laps[-1].digest},
              "cost": {"usd": totals["costUSD"], "inputTokens": totals["inputTokens"],
                       "outputTokens": totals["outputTokens"]}}
    jobs = [inv.JobFacts(name=job_name(NAME, UID, lap, a), uid=f"job-{lap}-{a}", owner_uids=(UID,), lap=lap, attempt=a)
            for lap, a in ((1, 1), (1, 2), (2, 1), (3, 1))]
    tool = tool_record()
    t_exec = min(tool["keys"][K_REFUND]["executedAt"])
    return inv.Evidence(
        plans=[PLAN], runs={NAME: inv.RunFacts(name=NAME, namespace=NS, uid=UID, status=status, laps=laps)},
        tool=tool, jobs=jobs,
        status_writes=[inv.StatusWrite(rv=10, run=NAME, lap=1, approval={"state": "Pending", "idempotencyKey": K_REFUND}),
                       inv.StatusWrite(rv=20, run=NAME, lap=1, approval={"state": "Approved", "idempotencyKey": K_REFUND}),
                       inv.StatusWrite(rv=30, run=NAME, lap=2, approval=None),
                       inv.StatusWrite(rv=40, run=NAME, lap=3, approval=None)],
        ticks=[inv.Tick(sent=t_exec - 10, answered=t_exec - 9.9, rv=15), inv.Tick(sent=t_exec + 0.5, answered=t_exec + 0.6, rv=25),
               inv.Tick(sent=t_exec + 100, answered=t_exec + 100.1, rv=35)],
        lease_writes=[inv.LeaseWrite(rv=5, holder="op-1"), inv.LeaseWrite(rv=16, holder="op-1"),
                      inv.LeaseWrite(rv=30, holder="op-2"),  # op-1's last renewal >= 10 s before (ticks 15 and 35)
                      inv.LeaseWrite(rv=31, holder=None), inv.LeaseWrite(rv=32, holder="op-1")],  # released: at once
        kills={"op-1": t_exec + 50},
        faults=[Fault(kind=POD_SIGKILL, at=0.3, fired_at=5.0, landed=True, mid_call=True),
                Fault(kind=S3_OUTAGE, at=0.5, fired_at=9.0, landed=True)],
        events=Counter({"StoreUnavailable": 2}), s3_refused=4)


def test_a_correct_record_passes():
    ev = good()
    assert ev.tool["totals"] == {"requests": 5, "executions": 4, "replays": 1, "conflicts": 0, "badRequests": 0}
    assert inv.check_all(ev) == []
    ev.replicas = 2  # its op-1 -> op-2 takeover (rv 30) is bounded by ticks: the leadership check is not vacuous
    assert inv.check_all(ev) == []


def _tool_key(ev: inv.Evidence, key: str, **changes: int) -> None:
    k = ev.tool["keys"].setdefault(key, {"requests": 0, "executions": 0, "replays": 0, "conflicts": 0,
                                         "executedAt": [1.0]})
    for f, d in changes.items():
        k[f] = k.get(f, 0) + d
        if f in ("requests", "executions", "replays", "conflicts"):
            ev.tool["totals"][f] += d


def _quick_take(ev: inv.Evidence) -> None:
    """op-2 renews at rv 41, op-1 takes at rv 42; ticks at rv 40 and 44, 1 s apart: the take came
    at most 1.1 s after the renewal."""
    t = ev.ticks[-1].answered + 100
    ev.ticks += [inv.Tick(sent=t, answered=t + 0.1, rv=40), inv.Tick(sent=t + 1, answered=t + 1.1, rv=44)]
    ev.lease_writes += [inv.LeaseWrite(rv=41, holder="op-2"), inv.LeaseWrite(rv=42, holder="op-1")]


def _rewrite_lap(ev, i: int, **fields) -> None:
    """Lap object ``i`` rewritten with ``fields`` changed and a sha256 that matches its new bytes
    (a consistent object that says something else)."""
    x = ev.runs[NAME].laps[i]
    data = canonical_json({**x.doc, **fields})
    ev.runs[NAME].laps[i] = rawstore.read_lap(x.key, data, {"sha256": sha256_hex(data)})


def _set_status(ev, **kw):
    ev.runs[NAME].status.update(kw)


BROKEN = {
    "a key executed twice": (lambda ev: _tool_key(ev, K_B, requests=1, executions=1), "executed 2 times"),
    "an extra key (another uid)": (lambda ev: _tool_key(ev, idempotency_key(RunRef(namespace=NS, name=NAME, uid="0" * 36),
                                                                         1, "note", "call_1"), requests=1, executions=1),
                                   "outside the scripted set"),
    "a missing key": (lambda ev: _tool_key(ev, K_C, requests=-1, executions=-1), "never executed"),
    "requests beyond the attempts": (lambda ev: _tool_key(ev, K_C, requests=1, replays=1), "more than the 1 attempt"),
    "a request lost or refused silently": (lambda ev: ev.tool["totals"].update(requests=ev.tool["totals"]["requests"] + 1),
                                           "refused silently"),
    "a key reused with other arguments": (lambda ev: _tool_key(ev, K_B, requests=1, conflicts=1), "other arguments"),
    "a broken hash chain": (lambda ev: ev.runs[NAME].laps.__setitem__(slice(None), lap_objects(chain_break_at=2)),
                            "hash chain broken at lap 2"),
    "an object changed after it was written": (
        lambda ev: ev.runs[NAME].laps.__setitem__(1, rawstore.read_lap(
            ev.runs[NAME].laps[1].key, canonical_json({**ev.runs[NAME].laps[1].doc, "lap": 2, "costUSD": "9.00"}),
            {"sha256": ev.runs[NAME].laps[1].digest})), "matches neither"),
    "a wrong lap cost": (lambda ev: ev.runs[NAME].laps.__setitem__(slice(None), lap_objects(cost_of={2: "0.000999"})),
                         "lap 2 usage"),
    "a wrong status cost": (lambda ev: _set_status(ev, cost={**ev.runs[NAME].status["cost"], "usd": "0.01"}),
                            "status.cost"),
    "a missing lap": (lambda ev: ev.runs[NAME].laps.pop(1), "not 1..N contiguous"),
    "a status checkpoint not the last lap's": (
        lambda ev: _set_status(ev, checkpoint={"key": ev.runs[NAME].laps[1].key, "sha256": ev.runs[NAME].laps[1].digest}),
        "status.checkpoint"),
    "a run not Succeeded": (lambda ev: _set_status(ev, phase="Failed"), "phase 'Failed'"),
    "a missing Job": (lambda ev: ev.jobs.pop(2), "Jobs for laps [1, 3]"),
    "a Job created twice": (lambda ev: ev.jobs.append(inv.JobFacts(name=ev.jobs[0].name, uid="other", owner_uids=(UID,),
                                                                  lap=1, attempt=1)), "created 2 times"),
    "a Job name not deterministic": (lambda ev: setattr(ev.jobs[3], "name", "r1-lap3"), "name is not"),
    "a Job for an unknown run": (lambda ev: ev.jobs.append(inv.JobFacts(name="x", uid="x", owner_uids=("nobody",),
                                                                       lap=1, attempt=1)), "no scenario run"),
    "a retry without its Job": (lambda ev: _set_status(ev, totalRetries=2), "4 Job(s), expected 5"),
    "a fault that did not land": (lambda ev: setattr(ev.faults[0], "landed", False), "did not land"),
    "a fault that never fired": (lambda ev: setattr(ev.faults[1], "fired_at", None), "never fired"),
    "pod kills without a repeat answered from the record": (
        lambda ev: _tool_key(ev, K_A, requests=-1, replays=-1), "no repeated call"),
    "pod kills without a retry": (lambda ev: (_set_status(ev, totalRetries=0), ev.jobs.pop(1)), "no lap attempt was retried"),
    "an S3 outage nobody met": (lambda ev: setattr(ev, "s3_refused", 0), "no connection was refused"),
    "an S3 outage nobody noticed (no StoreUnavailable, no store LapRetry)": (
        lambda ev: setattr(ev, "events", Counter({"LapRetry": 3})), "no StoreUnavailable"),
    "status Pending after the call executed": (
        lambda ev: ev.status_writes.append(inv.StatusWrite(rv=31, run=NAME, lap=1,
                                                           approval={"state": "Pending", "idempotencyKey": K_REFUND})),
        "after it executed"),
    "status Pending after the executing lap, no ticks": (
        lambda ev: (ev.ticks.clear(), ev.ticks.append(inv.Tick(sent=0, answered=0, rv=1)),
                    ev.status_writes.append(inv.StatusWrite(rv=31, run=NAME, lap=1,
                                                            approval={"state": "Pending", "idempotencyKey": K_REFUND}))),
        "after status.lap reached 2"),
    "no Pending ever observed (a vacuous approval check)": (
        lambda ev: ev.status_writes.pop(0), "approval check vacuous"),
    "a Lease taken from a holder that renewed a second before": (lambda ev: _quick_take(ev), "less than the 3s lease"),
    # the branches no entry above reached (issue 36: each violation branch shown to fire)
    "a run that is gone": (lambda ev: ev.runs.pop(NAME), "the AgentRun is gone"),
    "status.lap not the store's laps": (lambda ev: _set_status(ev, lap=2), "laps: store 3, script 3, status 2"),
    "a record holding another lap than its key": (lambda ev: _rewrite_lap(ev, 1, lap=3), "holds lap 3"),
    "a record of another run uid": (lambda ev: _rewrite_lap(ev, 1, run={**ev.runs[NAME].laps[1].doc["run"],
                                                                        "uid": "0" * 36}),
                                    "belongs to run uid " + "0" * 36),
    "running totals that do not add up": (lambda ev: _rewrite_lap(ev, 2, totals={
        **ev.runs[NAME].laps[2].doc["totals"], "inputTokens": 1}), "lap 3 totals 3/1/"),
    "a schema version the decoder does not know": (lambda ev: _rewrite_lap(ev, 0, schemaVersion=99),
                                                   "unknown to the chaos decoder"),
    "a Job without lap/attempt labels": (lambda ev: (setattr(ev.jobs[3], "lap", None)), "no lap/attempt labels"),
    "a lap's attempts not 1..a": (lambda ev: (setattr(ev.jobs[1], "attempt", 3),
                                             setattr(ev.jobs[1], "name", job_name(NAME, UID, 1, 3))),
                                  "lap 1 Job attempts [1, 3] not 1..3"),
    "a bad request at the tool server": (lambda ev: ev.tool["totals"].update(
        badRequests=1, requests=ev.tool["totals"]["requests"] + 1), "1 bad request(s) at the tool server"),
    "more requests than every attempt could send": (lambda ev: _tool_key(ev, K_C, requests=2, replays=2),
                                                    "the attempts that could send them"),
    "the status watch and the ticker did not run": (lambda ev: setattr(ev, "watched", False),
                                                    "the status watch and the ticker did not run"),
    "two replicas but no takeover observed (a vacuous leadership check)": (
        lambda ev: (setattr(ev, "replicas", 2), ev.lease_writes.__setitem__(slice(None), [
            inv.LeaseWrite(rv=5, holder="op-1"), inv.LeaseWrite(rv=16, holder="op-1")])),
        "leadership check vacuous"),
    "two replicas, a takeover but no tick after it": (
        lambda ev: (setattr(ev, "replicas", 2), ev.ticks.__setitem__(slice(None), [t for t in ev.ticks if t.rv < 30])),
        "leadership check vacuous"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_broken_record_fails(name):
    ev = good()
    assert inv.check_all(ev) == []
    breaker, expected = BROKEN[name]
    ev = copy.deepcopy(ev)
    breaker(ev)
    violations = inv.check_all(ev)
    assert any(expected in v for v in violations), violations


def test_dropping_the_idempotency_header_fails_the_side_effect_invariant():
    """The issue's negative control: the same run with the Idempotency-Key header dropped (the tool
    declared without side effects, so the runner sends no key). The retried call then executes twice
    at the real tool server, and the invariants say so."""
    ev = good()
    ev.tool = tool_record(send_key=False)
    assert ev.tool["withoutKey"] == {"requests": 5, "executions": 5}
    v = inv.check_side_effects(ev)
    assert any("without an Idempotency-Key" in x for x in v), v
    assert any("never executed" in x for x in v), v
    assert any("total executions 5 != 4" in x for x in v), v


def test_the_tool_server_counts_refusals_and_serves_its_record():
    """It never refuses silently: a body that is not JSON and a key reused with other arguments are
    answered with an error AND counted."""
    import urllib.error
    import urllib.request

    rec = tool_server.Recorder()
    server = tool_server.serve(0, recorder=rec)
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def post(body: bytes, key: str | None) -> int:
        req = urllib.request.Request(f"{url}/x", data=body, method="POST",
                                     headers={"Idempotency-Key": key} if key else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert post(b'{"a": 1}', "k1") == 200
        assert post(b'{"a": 1}', "k1") == 200  # replayed
        assert post(b'{"a": 2}', "k1") == 422  # other arguments: refused, counted
        assert post(b"not json", "k2") == 400
        assert post(b'{"a": 3}', None) == 200
        with urllib.request.urlopen(f"{url}/_record", timeout=10) as r:
            served = json.load(r)
    finally:
        server.shutdown()
    assert served["totals"] == {"requests": 5, "executions": 2, "replays": 1, "conflicts": 1, "badRequests": 1}
    assert served["keys"]["k1"]["requests"] == 3 and served["keys"]["k1"]["executions"] == 1
    assert len(served["keys"]["k1"]["executedAt"]) == 1 and served["keys"]["k1"]["firstRequestAt"]
    assert served["withoutKey"] == {"requests": 1, "executions": 1}


def test_the_raw_decoder_reads_gzip_objects_from_s3(s3_client, s3_bucket):
    """A compressed object (what a schema v3 may write) is detected by its ContentEncoding or its
    bytes, and its sha256 may cover either form; an unknown encoding or version is named."""
    laps = lap_objects()
    for x in laps:
        plain = canonical_json(x.doc)
        body = gzip.compress(plain)
        extra = {"ContentEncoding": "gzip"} if x.lap_in_key == 1 else {}
        s3_client.put_object(Bucket=s3_bucket.name, Key=x.key + ".gz", Body=body,
                             Metadata={"sha256": sha256_hex(body) if x.lap_in_key != 2 else sha256_hex(plain)}, **extra)
    read = rawstore.list_laps(s3_client, s3_bucket.name, PREFIX)
    assert [x.lap_in_key for x in read] == [1, 2, 3] and not any(x.problems for x in read)
    assert [x.f("lap") for x in read] == [1, 2, 3]
    with pytest.raises(rawstore.RawStoreError, match="unknown content encoding 'br'"):
        rawstore.decode(b"xx", "br")
    odd = rawstore.read_lap(PREFIX + "laps/00000001.json", canonical_json({**laps[0].doc, "schemaVersion": 9}), {})
    with pytest.raises(rawstore.RawStoreError, match="schemaVersion 9 unknown"):
        odd.f("lap")
