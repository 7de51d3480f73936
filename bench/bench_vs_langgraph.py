"""Checkpoint cost of a 500-lap run, agentrun beside LangGraph's SQLite checkpointer.

agentrun: the 500-lap scripted run of ``bench_lap_run.py`` through the real lap code
(``execute_lap``: model journal, one HTTP tool call per lap with its journal entry, the lap record,
a snapshot every 10 laps) against a local S3 API server (moto). Bytes are every object the run left
in the bucket, attributed to the lap in its key; resume = ``load_state`` at the last lap.

LangGraph: a ``StateGraph`` with a ``messages`` channel and one node that loops, one superstep per
lap, each appending exactly the messages our lap N record carries (read back from the store: same
contents, same sizes, as LangChain ``AIMessage``/``ToolMessage``), checkpointed by
``langgraph-checkpoint-sqlite``'s ``SqliteSaver`` in a file, in each of its configurations: the
default ``add_messages`` channel and its best mode, ``DeltaChannel`` (``_messages_delta_reducer``) at
``snapshot_frequency`` k = 10, 50 and 100 (``run_langgraph_matrix``, the matrix mode's code). Bytes
are the sum of the ``checkpoints`` and ``writes`` blobs of every superstep (and the SQLite file
size); resume = ``get_state`` of the latest checkpoint (what a resume loads: for ``DeltaChannel`` it
replays the writes since the last full copy). The comparison is with LangGraph's best configuration
for each figure (``best_modes``): the fewest bytes, and the fastest resume, each over every
configuration measured; ``add_messages`` is reported beside it.

    python bench/bench_vs_langgraph.py [--laps 500] [--json out.json]

Matrix mode (issue 16): agentrun (schema 3, K=10) beside LangGraph ``add_messages`` and
``DeltaChannel`` (``_messages_delta_reducer``) at ``snapshot_frequency`` 10, 50 and 100, all on
``SqliteSaver``, at 50, 500 and 2,000 laps, for one message size per process (~530 B per lap, or
~2 kB with ``--tool-result-padding 1500``). One run of the largest lap count gives every point: the
objects (rows) written for laps <= N do not depend on later laps. ``add_messages`` is run to 500
laps only (quadratic: ~1.7 GB at 2,000). Then ``render`` merges the per-size JSON files into
``bench/results-checkpoints.json``, two plots and the Markdown section of bench/results.md:

    nice -n 10 python bench/bench_vs_langgraph.py matrix --laps 2000 --tool-result-padding 0 --json /tmp/m0.json
    nice -n 10 python bench/bench_vs_langgraph.py matrix --laps 2000 --tool-result-padding 1500 --json /tmp/m1.json
    python bench/bench_vs_langgraph.py render /tmp/m0.json /tmp/m1.json

Resume mode: the worst resume (lap N-1, a snapshot and K-1 = 9 lap records, read in parallel) and
the resume at lap N (the snapshot only) of an N-lap run, interleaved, with the client's CPU time,
the S3 server's CPU time (from /proc) per resume, one GET alone, and the client CPU split into the
store's GETs (``BlobStore.get``: botocore's ``get_object``) and the decoding (sha256, gunzip, JSON, unpacking, validation, fold); beside
LangGraph ``add_messages``' ``get_state`` at N laps. ``--s3 versitygw`` uses the Go S3 server of the
store's tests (e2e/versitygw_server.py) instead of moto. ``render --resume`` adds these runs:

    nice -n 10 python bench/bench_vs_langgraph.py resume --laps 500 --json bench/results-checkpoints-raw-resume-moto.json
    nice -n 10 python bench/bench_vs_langgraph.py resume --laps 500 --s3 versitygw \\
        --json bench/results-checkpoints-raw-resume-versitygw.json
    python bench/bench_vs_langgraph.py render bench/results-checkpoints-raw-530B.json \\
        bench/results-checkpoints-raw-2kB.json --resume bench/results-checkpoints-raw-resume-*.json

(the matrix runs of results-checkpoints.json are the two ``results-checkpoints-raw-{530B,2kB}.json``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # e2e/ (versitygw)

from bench_lap_run import RUN, BenchWorld, ToolHandler, lap_env, spec_doc  # noqa: E402
from benchlib import fmt_bytes, fmt_ms, markdown_table, ratio, summary, verdict  # noqa: E402

from agentrun.checkpoint import store as checkpoint_store  # noqa: E402
from agentrun.checkpoint.codec import unpack_lap  # noqa: E402
from agentrun.checkpoint.fold import fold  # noqa: E402
from agentrun.checkpoint.migrations import migrate, schema_version_of  # noqa: E402
from agentrun.checkpoint.schema import LapRecord, RunState  # noqa: E402
from agentrun.lap.config import parse_env  # noqa: E402
from agentrun.lap.logs import LapLogger  # noqa: E402
from agentrun.lap.runner import execute_lap  # noqa: E402

KEY_LAP = re.compile(r"/(laps|snapshots|journal|attempts)/(\d{8})")


def padded_handler(extra: int) -> type[ToolHandler]:
    """bench_lap_run's tool (a ~300-byte JSON result), its result padded with ``extra`` bytes."""

    class Padded(ToolHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            out = json.dumps({"invoice": json.loads(body), "total": "120.00", "currency": "EUR",
                              "lines": ["item"] * 20, "text": "x" * extra}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    return Padded


def run_agentrun(laps: int, max_tokens: int, extra: int = 0) -> tuple[dict[str, Any], list[list[Any]], list[Any]]:
    """The scripted run through execute_lap; returns figures, each lap's own messages and lap 0's."""
    world = BenchWorld("bench-vs", padded_handler(extra) if extra else ToolHandler)
    try:
        base, store = world.base, world.store
        spec_json = json.dumps(spec_doc(world.tool_url, laps, max_tokens))
        sink = io.StringIO()
        t_run = time.perf_counter()
        for lap in range(1, laps + 1):
            env = lap_env(base, spec_json, lap)
            result = execute_lap(parse_env(env), store, env, LapLogger({"lap": lap}, stream=sink))
            if result.code != 0:
                raise SystemExit(f"lap {lap} exited {result.code}: {result.message}")
            sink.seek(0)
            sink.truncate()
        run_seconds = time.perf_counter() - t_run
        per_lap = [0] * (laps + 1)
        objects = 0
        kinds: dict[str, int] = {}
        for page in store.client.get_paginator("list_objects_v2").paginate(Bucket="bench-vs"):
            for o in page.get("Contents", []):
                m = KEY_LAP.search(o["Key"])
                if not m:
                    raise SystemExit(f"unexpected key {o['Key']}")
                per_lap[int(m.group(2))] += o["Size"]
                kinds[m.group(1)] = kinds.get(m.group(1), 0) + o["Size"]
                objects += 1
        resume, resume_before = [], []
        for _ in range(RESUME_REPEAT):  # interleaved: lap N (the snapshot alone), lap N-1 (a snapshot and K-1 records)
            t0 = time.perf_counter()
            loaded = store.load_state(RUN, through_lap=laps)
            resume.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            before = store.load_state(RUN, through_lap=laps - 1)
            resume_before.append(time.perf_counter() - t0)
        messages = [store.get_lap(RUN, lap)[0].messages for lap in range(1, laps + 1)]
        figures = {
            "laps": laps, "objects": objects, "total_bytes": sum(per_lap), "per_lap_bytes": per_lap[1:],
            "bytes_by_kind": kinds, "resume_seconds": resume, "resume_objects_read": loaded.objects_read,
            "resume_before_last_seconds": resume_before, "resume_before_last_objects_read": before.objects_read,
            "run_seconds": run_seconds,
            "message_bytes_per_lap": statistics.median(
                [sum(len(m.model_dump_json(by_alias=True, exclude_none=True)) for m in ms) for ms in messages]),
        }
        lap0 = [m for m in messages[0] if m.lap == 0]
        own = [[m for m in ms if m.lap == lap] for lap, ms in enumerate(messages, 1)]
        return figures, own, lap0
    finally:
        world.close()


def to_langchain(m: Any, mid: str | None = None) -> Any:
    """One agentrun message as the LangChain message LangGraph stores (``mid``: a stable id)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    ids = {"id": mid} if mid else {}
    if m.role == "assistant":
        return AIMessage(content=m.content or "", tool_calls=[
            {"id": c.id, "name": c.name, "args": c.arguments} for c in m.tool_calls], **ids)
    if m.role == "tool":
        return ToolMessage(content=m.content or "", tool_call_id=m.tool_call_id, **ids)
    if m.role == "system":
        return SystemMessage(content=m.content or "", **ids)
    return HumanMessage(content=m.content or "", **ids)


def run_graph(steps: list[list[Any]], first: list[Any], reducer: Any, path: str, thread_id: str) -> dict[str, Any]:
    """A one-node LangGraph graph that appends ``steps[lap - 1]`` per lap through ``reducer``,
    checkpointed by SqliteSaver in ``path``: the compiled app, its saver and connection, the final
    state and the wall time of the run."""
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, StateGraph

    n = len(steps)
    # functional form: this module's postponed annotations would hide the local names from LangGraph
    State = TypedDict("State", {"messages": Annotated[list, reducer], "lap": int})  # noqa: UP013

    def lap_node(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": steps[state["lap"] - 1], "lap": state["lap"] + 1}

    graph = StateGraph(State)
    graph.add_node("lap", lap_node)
    graph.set_entry_point("lap")
    graph.add_conditional_edges("lap", lambda s: END if s["lap"] > n else "lap")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": n + 10}
    t0 = time.perf_counter()
    final = app.invoke({"messages": first, "lap": 1}, config)
    run_seconds = time.perf_counter() - t0
    assert final["lap"] == n + 1 and len(final["messages"]) == len(first) + sum(len(x) for x in steps)
    return {"app": app, "saver": saver, "conn": conn, "final": final, "run_seconds": run_seconds}


def mode_name(channel: str, frequency: int | None) -> str:
    """A LangGraph configuration as results.json and results.md name it."""
    return "add_messages" if channel == "add_messages" else f"DeltaChannel k={frequency}"


def best_modes(modes: list[dict[str, Any]]) -> dict[str, str]:
    """LangGraph's best configuration for each figure, over every configuration measured (``add_messages``
    included: the best is whichever measured best, not the one expected to): ``fewest_bytes`` (the
    least blob bytes over the run), ``fastest_resume`` (the lowest resume p50 at the last lap) and
    ``fastest_resume_before_last`` (the same at the lap before). Ties go to the first in ``modes``' order."""
    if not modes:
        raise ValueError("no LangGraph configuration measured")
    return {"fewest_bytes": min(modes, key=lambda m: m["blob_bytes"])["name"],
            "fastest_resume": min(modes, key=lambda m: summary(m["resume_seconds"])["p50"])["name"],
            "fastest_resume_before_last": min(
                modes, key=lambda m: summary(m["resume_before_last_seconds"])["p50"])["name"]}


def run_langgraph(lap_messages: list[list[Any]], lap0: list[Any], laps: int) -> dict[str, Any]:
    """Every LangGraph configuration of the comparison (``add_messages``, ``DeltaChannel`` at each k of
    ``DELTA_FREQUENCIES``) on the same messages, each through ``run_langgraph_matrix`` in a file of
    its own; and which is best for each figure (``best_modes``)."""
    modes = []
    for channel, freq in [("add_messages", None), *(("DeltaChannel", k) for k in DELTA_FREQUENCIES)]:
        with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
            r = run_langgraph_matrix(lap_messages, lap0, os.path.join(tmp, "c.sqlite"), channel, freq, laps)
        r["name"] = mode_name(channel, freq)
        r["blob_bytes"] = sum(r["per_lap_bytes"])
        print(f"  {r['name']}: {r['blob_bytes']:,} B, resume get_state p50 "
              f"{fmt_ms(summary(r['resume_seconds'])['p50'])}, at lap {laps - 1} "
              f"{fmt_ms(summary(r['resume_before_last_seconds'])['p50'])}", flush=True)
        modes.append(r)
    return {"version": version("langgraph"), "sqlite_version": version("langgraph-checkpoint-sqlite"),
            "modes": modes, **best_modes(modes)}


def mode(lg: dict[str, Any], name: str) -> dict[str, Any]:
    """The configuration ``name`` of a ``run_langgraph`` result."""
    return next(m for m in lg["modes"] if m["name"] == name)


# ------------------------------------------------------------------------------------------------
# matrix mode (issue 16)
# ------------------------------------------------------------------------------------------------

POINTS = (50, 500, 2000)
DELTA_FREQUENCIES = (10, 50, 100)
ADD_MESSAGES_MAX_LAPS = 500
#: resumes timed per point in the default mode (agentrun; LangGraph's run_langgraph_matrix times 10)
RESUME_REPEAT = 20


def message_bytes(m: Any) -> int:
    """Raw bytes of one message: its JSON (role, content, tool calls, tool call id), as stored."""
    return len(m.model_dump_json(by_alias=True, exclude_none=True))


def run_laps(world: Any, laps: int, max_tokens: int) -> tuple[list[float], list[float]]:
    """The scripted run of ``laps`` laps through ``execute_lap``: each lap's wall and CPU time."""
    spec_json = json.dumps(spec_doc(world.tool_url, laps, max_tokens))
    sink = io.StringIO()
    lap_seconds, lap_cpu_seconds = [], []
    for lap in range(1, laps + 1):
        env = lap_env(world.base, spec_json, lap)
        t0, c0 = time.perf_counter(), time.process_time()
        result = execute_lap(parse_env(env), world.store, env, LapLogger({"lap": lap}, stream=sink))
        lap_seconds.append(time.perf_counter() - t0)
        lap_cpu_seconds.append(time.process_time() - c0)
        if result.code != 0:
            raise SystemExit(f"lap {lap} exited {result.code}: {result.message}")
        sink.seek(0)
        sink.truncate()
    return lap_seconds, lap_cpu_seconds


def run_agentrun_matrix(laps: int, max_tokens: int, extra: int) -> tuple[dict[str, Any], list[list[Any]], list[Any]]:
    """The scripted run through ``execute_lap`` (schema 3, K=10), with each lap's wall time."""
    world = BenchWorld("bench-vs", padded_handler(extra) if extra else ToolHandler)
    try:
        store = world.store
        lap_seconds, lap_cpu_seconds = run_laps(world, laps, max_tokens)
        per_lap = [0] * (laps + 1)
        objects_per_lap = [0] * (laps + 1)
        kinds: dict[str, int] = {}
        for page in store.client.get_paginator("list_objects_v2").paginate(Bucket="bench-vs"):
            for o in page.get("Contents", []):
                m = KEY_LAP.search(o["Key"])
                if not m:
                    raise SystemExit(f"unexpected key {o['Key']}")
                per_lap[int(m.group(2))] += o["Size"]
                objects_per_lap[int(m.group(2))] += 1
                kinds[m.group(1)] = kinds.get(m.group(1), 0) + o["Size"]
        state = store.load_state(RUN).state
        assert state.storage.bytes == sum(per_lap), (state.storage, sum(per_lap))  # status.storage is exact
        resume: dict[str, Any] = {}
        get_seconds = []
        for point in sorted({*(p for p in POINTS if p <= laps), laps, laps - 1}):  # laps - 1: K-1 records after a snapshot
            times, loaded = [], None
            for _ in range(20):
                t0 = time.perf_counter()
                loaded = store.load_state(RUN, through_lap=point)
                times.append(time.perf_counter() - t0)
            assert loaded is not None
            resume[str(point)] = {"seconds": times, "objects_read": loaded.objects_read}
        key = store.lap_key(RUN, laps)
        for _ in range(50):
            t0 = time.perf_counter()
            store.client.get_object(Bucket="bench-vs", Key=key)["Body"].read()
            get_seconds.append(time.perf_counter() - t0)
        records = [store.get_lap(RUN, lap)[0] for lap in range(1, laps + 1)]
        lap0 = [m for m in records[0].messages if m.lap == 0]
        messages = [[m for m in r.messages if m.lap == r.lap] for r in records]
        figures = {
            "laps": laps, "per_lap_bytes": per_lap[1:], "objects_per_lap": objects_per_lap[1:],
            "bytes_by_kind": kinds, "lap_seconds": lap_seconds, "lap_cpu_seconds": lap_cpu_seconds,
            "resume": resume, "s3_get_seconds": get_seconds,
            "storage_status": state.storage.to_api(), "snapshot_every": 10,
            "message_bytes_lap0": sum(message_bytes(m) for m in lap0),
            "message_bytes_per_lap": [sum(message_bytes(m) for m in ms) for ms in messages],
        }
        return figures, messages, lap0
    finally:
        world.close()


def run_langgraph_matrix(lap_messages: list[list[Any]], lap0: list[Any], path: str, channel: str,
                         frequency: int | None, laps: int) -> dict[str, Any]:
    """One LangGraph run of ``laps`` supersteps (one per lap) appending our laps' messages, on
    SqliteSaver; bytes per step (checkpoint + metadata + writes blobs), resume = ``get_state``."""
    steps = [[to_langchain(m, f"m{lap}-{i}") for i, m in enumerate(ms)]
             for lap, ms in enumerate(lap_messages[:laps], 1)]
    first = [to_langchain(m, f"m0-{i}") for i, m in enumerate(lap0)]
    if channel == "add_messages":
        from langgraph.graph.message import add_messages

        reducer: Any = add_messages
    else:
        from langgraph.channels.delta import DeltaChannel
        from langgraph.graph.message import _messages_delta_reducer

        reducer = DeltaChannel(_messages_delta_reducer, snapshot_frequency=frequency or 100)
    g = run_graph(steps, first, reducer, path, "run")
    app, conn, run_seconds = g["app"], g["conn"], g["run_seconds"]
    total_messages = len(first) + sum(len(x) for x in steps)
    rows = conn.execute(
        "SELECT checkpoint_id, json_extract(CAST(metadata AS TEXT), '$.step'), length(checkpoint) + length(metadata) "
        "FROM checkpoints ORDER BY checkpoint_id").fetchall()
    writes = dict(conn.execute(
        "SELECT checkpoint_id, sum(length(value)) FROM writes GROUP BY checkpoint_id").fetchall())
    # bytes through lap N = every row of the steps up to N's (step -1 is the input, lap N runs in step N-1)
    per_lap = [0] * (laps + 1)
    for cid, step, size in rows:
        per_lap[min(laps, max(0, int(step) + 1))] += size + (writes.get(cid) or 0)
    # resume at lap N (the latest checkpoint) and at lap N-1 (the checkpoint of step N-1: after lap N-1),
    # interleaved
    before_id = next(cid for cid, step, _ in rows if int(step) == laps - 1)
    latest = {"configurable": {"thread_id": "run"}}
    before = {"configurable": {"thread_id": "run", "checkpoint_id": before_id}}
    resume, resume_before = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        st = app.get_state(latest)
        resume.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        st_before = app.get_state(before)
        resume_before.append(time.perf_counter() - t0)
    assert len(st.values["messages"]) == total_messages
    assert len(st_before.values["messages"]) == total_messages - len(steps[-1]) and st_before.values["lap"] == laps
    conn.close()
    return {"channel": channel, "snapshot_frequency": frequency, "laps": laps, "checkpoints": len(rows),
            "per_lap_bytes": per_lap, "file_bytes": os.path.getsize(path), "resume_seconds": resume,
            "resume_before_last_seconds": resume_before, "run_seconds": run_seconds}


def matrix(args: argparse.Namespace) -> None:
    load_at_start = os.getloadavg()
    ours, lap_messages, lap0 = run_agentrun_matrix(args.laps, args.max_tokens, args.tool_result_padding)
    print(f"agentrun: {sum(ours['per_lap_bytes']):,} B through lap {args.laps}", flush=True)
    theirs = []
    configs = [("add_messages", None, min(args.laps, ADD_MESSAGES_MAX_LAPS))]
    configs += [("DeltaChannel", k, args.laps) for k in DELTA_FREQUENCIES]
    for channel, freq, laps in configs:
        with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
            r = run_langgraph_matrix(lap_messages, lap0, os.path.join(tmp, "c.sqlite"), channel, freq, laps)
        print(f"{channel} k={freq}: {sum(r['per_lap_bytes']):,} B through lap {laps} ({r['run_seconds']:.0f} s)", flush=True)
        theirs.append(r)
    out = {"agentrun": ours, "langgraph": theirs, "tool_result_padding": args.tool_result_padding,
           "langgraph_version": version("langgraph"), "sqlite_version": version("langgraph-checkpoint-sqlite"),
           "load_at_start": load_at_start, "load_at_end": os.getloadavg(), "cpus": os.cpu_count()}
    with open(args.json, "w") as f:
        json.dump(out, f)


# ------------------------------------------------------------------------------------------------
# resume mode: the worst resume (K-1 laps after a snapshot), where its time goes
# ------------------------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; clock ticks, 10 ms on most kernels)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class VersityWorld:
    """``BenchWorld`` with versitygw (Go, e2e/versitygw_server.py, posix backend in a temp dir) as
    the S3 server instead of moto."""

    def __init__(self, bucket: str, handler: type[Any]) -> None:
        from e2e.versitygw_server import start_versitygw

        self.tmp = tempfile.TemporaryDirectory(prefix="bench-versitygw-")
        self.server, endpoint = start_versitygw(Path(self.tmp.name), os.environ["AWS_ACCESS_KEY_ID"],
                                                os.environ["AWS_SECRET_ACCESS_KEY"])
        self.tools = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.tools.serve_forever, daemon=True).start()
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        self.base = {"AGENTRUN_CHECKPOINT_URI": f"s3://{bucket}/runs", "AGENTRUN_S3_ENDPOINT": endpoint,
                     "AGENTRUN_S3_REGION": "us-east-1", "AGENTRUN_S3_PATH_STYLE": "true",
                     "AGENTRUN_LOG_FORMAT": "json"}
        self.store = checkpoint_store.CheckpointStore(checkpoint_store.StoreConfig.from_env(self.base, snapshot_every=10))
        self.store.client.create_bucket(Bucket=bucket)

    def close(self) -> None:
        from e2e.versitygw_server import stop

        self.tools.shutdown()
        stop(self.server)
        self.tmp.cleanup()


def decode_objects(store: Any, objects: list[tuple[str, bytes, str]]) -> RunState:
    """What ``load_state`` does with the bytes of a snapshot and the lap records after it, without
    the GETs: sha256, gunzip and JSON, migration, unpacking, validation, the hash chain and fold
    (the store's own functions, in its order)."""
    state: RunState | None = None
    for key, data, sha in objects:
        checkpoint_store.verify_sha256(data, sha, key)
        raw = checkpoint_store.decode_document(data, key)
        version = schema_version_of(raw, key)
        doc = migrate(raw, key)
        if state is None:
            state = checkpoint_store.parse_model(RunState, doc, key)
            continue
        record = checkpoint_store.parse_model(LapRecord, unpack_lap(doc, key, in_place=True), key)
        store._check_link(RUN, state, record, version)
        state = fold(state, record, sha, len(data))
    assert state is not None
    return state


def run_resume(laps: int, max_tokens: int, extra: int, s3: str, repeat: int) -> dict[str, Any]:
    """The scripted run to ``laps``, then the resume figures (see the module docstring)."""
    handler = padded_handler(extra) if extra else ToolHandler
    world: Any = VersityWorld("bench-vs", handler) if s3 == "versitygw" else BenchWorld("bench-vs", handler)
    server_pid = world.server.pid if s3 == "versitygw" else world.moto.pid
    try:
        store = world.store
        run_laps(world, laps, max_tokens)
        points = [laps - 1, laps]
        for p in points:  # warm: the validators are built and the reader pool started once
            store.load_state(RUN, through_lap=p)
        walls: dict[int, list[float]] = {p: [] for p in points}
        cpus: dict[int, list[float]] = {p: [] for p in points}
        server: dict[int, float] = dict.fromkeys(points, 0.0)
        objects: dict[int, int] = {}
        for _ in range(repeat):  # interleaved, so both points see the same load
            for p in points:
                s0, c0, t0 = process_cpu_seconds(server_pid), time.process_time(), time.perf_counter()
                loaded = store.load_state(RUN, through_lap=p)
                walls[p].append(time.perf_counter() - t0)
                cpus[p].append(time.process_time() - c0)
                server[p] += process_cpu_seconds(server_pid) - s0
                objects[p] = loaded.objects_read

        def fetch(key: str) -> tuple[bytes, str]:  # the store's GET (checkpoint/s3store.py)
            blob = store.blobs.get(key)
            return blob.data, blob.metadata["sha256"]

        get_seconds, get_cpu, get_server = [], 0.0, 0.0
        key = store.lap_key(RUN, laps - 1)
        for _ in range(repeat):
            s0, c0, t0 = process_cpu_seconds(server_pid), time.process_time(), time.perf_counter()
            fetch(key)
            get_seconds.append(time.perf_counter() - t0)
            get_cpu += time.process_time() - c0
            get_server += process_cpu_seconds(server_pid) - s0
        # the worst resume's client CPU, split: its GETs one after the other, then the decoding
        snap = laps - 1 - (laps - 1) % 10
        keys = [store.snapshot_key(RUN, snap)] + [store.lap_key(RUN, n) for n in range(snap + 1, laps)]
        gets_cpu, decode_cpu = [], []
        want = store.load_state(RUN, through_lap=laps - 1).state
        for _ in range(repeat):
            c0 = time.process_time()
            fetched = []
            for k in keys:
                fetched.append((k, *fetch(k)))
            c1 = time.process_time()
            state = decode_objects(store, fetched)
            decode_cpu.append(time.process_time() - c1)
            gets_cpu.append(c1 - c0)
            assert state.messages == want.messages and state.lap == want.lap
        records = [store.get_lap(RUN, lap)[0] for lap in range(1, laps + 1)]
    finally:
        world.close()
    lap0 = [m for m in records[0].messages if m.lap == 0]
    messages = [[m for m in r.messages if m.lap == r.lap] for r in records]
    lg_laps = min(laps, ADD_MESSAGES_MAX_LAPS)
    with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
        lg = run_langgraph_matrix(messages, lap0, os.path.join(tmp, "c.sqlite"), "add_messages", None, lg_laps)
    return {
        "laps": laps, "s3": s3, "snapshot_every": 10, "repeat": repeat,
        "message_bytes_per_lap": [sum(message_bytes(m) for m in ms) for ms in messages],
        "points": {str(p): {"seconds": walls[p], "cpu_seconds": cpus[p], "server_cpu_seconds_mean": server[p] / repeat,
                            "objects_read": objects[p]} for p in points},
        "s3_get_seconds": get_seconds, "s3_get_cpu_seconds_mean": get_cpu / repeat,
        "s3_get_server_cpu_seconds_mean": get_server / repeat,
        "worst_split": {"lap": laps - 1, "objects": len(keys), "gets_cpu_seconds": gets_cpu,
                        "decode_cpu_seconds": decode_cpu},
        "s3_get_path": "botocore",
        "langgraph": {"channel": "add_messages", "laps": lg_laps, "get_state_seconds": lg["resume_seconds"]},
    }


def resume(args: argparse.Namespace) -> None:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_at_start = os.getloadavg()
    out = run_resume(args.laps, args.max_tokens, args.tool_result_padding, args.s3, args.repeat)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    out.update({"tool_result_padding": args.tool_result_padding, "started": started, "commit": commit,
                "load_at_start": load_at_start, "load_at_end": os.getloadavg(), "cpus": os.cpu_count(),
                "langgraph_version": version("langgraph"), "sqlite_version": version("langgraph-checkpoint-sqlite")})
    with open(args.json, "w") as f:
        json.dump(out, f)
    print("\n".join(resume_lines(out)[1]))


def resume_lines(r: dict[str, Any]) -> tuple[list[tuple[str, str, str, bool]], list[str]]:
    """The check and the text of one resume run (for ``render --resume``)."""
    n = r["laps"]
    size = statistics.median(r["message_bytes_per_lap"])
    worst, last = r["points"][str(n - 1)], r["points"][str(n)]
    p50 = summary(worst["seconds"])["p50"]
    get_p50 = summary(r["s3_get_seconds"])["p50"]
    lg_p50 = summary(r["langgraph"]["get_state_seconds"])["p50"]
    split = r["worst_split"]
    where = f"{r['s3']}, {size:.0f} B/lap"
    check = (f"resume p50 at lap {n - 1} (a snapshot and {worst['objects_read'] - 1} lap records), {where}",
             f"≤ LangGraph add_messages (lap {r['langgraph']['laps']}) + one S3 GET",
             f"{fmt_ms(p50)} vs {fmt_ms(lg_p50)} + {fmt_ms(get_p50)}", p50 <= lg_p50 + get_p50)
    text = (
        f"Resume ({where}; `bench_vs_langgraph.py resume --laps {n}` at {r['started']}, commit {r['commit'][:12]}, "
        f"load {r['load_at_start'][0]:.1f} before, {r['load_at_end'][0]:.1f} after, {r['cpus']} CPUs, "
        f"{r['repeat']} interleaved resumes per lap): "
        f"at lap {n - 1} ({worst['objects_read']} objects, read in parallel) p50 {fmt_ms(p50)}, the client's CPU "
        f"p50 {fmt_ms(summary(worst['cpu_seconds'])['p50'])} and the S3 server's CPU "
        f"{fmt_ms(worst['server_cpu_seconds_mean'])} per resume (mean); at lap {n} ({last['objects_read']} object) "
        f"p50 {fmt_ms(summary(last['seconds'])['p50'])}, client CPU {fmt_ms(summary(last['cpu_seconds'])['p50'])}; "
        f"one GET alone p50 {fmt_ms(get_p50)} (client CPU {fmt_ms(r['s3_get_cpu_seconds_mean'])}, server CPU "
        f"{fmt_ms(r['s3_get_server_cpu_seconds_mean'])}, means). The client CPU of the {split['objects']} objects, "
        f"split (p50): their GETs ({r.get('s3_get_path', 'botocore')}) {fmt_ms(summary(split['gets_cpu_seconds'])['p50'])}, decoding them "
        f"(sha256, gunzip, JSON, unpacking, validation, hash chain, fold) "
        f"{fmt_ms(summary(split['decode_cpu_seconds'])['p50'])}. LangGraph {r['langgraph']['channel']} get_state at "
        f"lap {r['langgraph']['laps']} p50 {fmt_ms(lg_p50)}."
    )
    return [check], [text]


def cumulative(per_lap: list[int], n: int, base: int = 0) -> int:
    return base + sum(per_lap[:n])


def render(paths: list[str], out_json: str, plot_bytes: str, plot_time: str, out_md: str,
           resume_paths: list[str] | None = None) -> None:
    """Merge the matrix runs (and the resume runs); write the JSON figures, the two plots and the
    Markdown section."""
    runs = [json.load(open(p)) for p in paths]
    resumes = [json.load(open(p)) for p in resume_paths or []]
    rows, checks, figures = [], [], {"runs": []}
    for run in runs:
        a = run["agentrun"]
        n_max = a["laps"]
        raw_per_lap = a["message_bytes_per_lap"]
        size = statistics.median(raw_per_lap)
        fig: dict[str, Any] = {"message_bytes_per_lap_median": size, "tool_result_padding": run["tool_result_padding"],
                               "points": []}
        for n in (p for p in POINTS if p <= n_max):
            raw = cumulative(raw_per_lap, n, a["message_bytes_lap0"])
            ours = cumulative(a["per_lap_bytes"], n)
            objects = cumulative(a["objects_per_lap"], n)
            point: dict[str, Any] = {"laps": n, "raw_message_bytes": raw, "agentrun_bytes": ours,
                                     "agentrun_objects": objects, "agentrun_over_raw": ours / raw,
                                     "resume_objects_read": a["resume"][str(n)]["objects_read"],
                                     "resume_p50_seconds": summary(a["resume"][str(n)]["seconds"])["p50"]}
            for lg in run["langgraph"]:
                if n > lg["laps"]:
                    continue
                name = "add_messages" if lg["channel"] == "add_messages" else f"delta_k{lg['snapshot_frequency']}"
                point[name + "_bytes"] = sum(lg["per_lap_bytes"][: n + 1])
            fig["points"].append(point)
            limit = 3 if n < 500 else 2
            checks.append((f"agentrun bytes / raw message bytes, {size:.0f} B/lap, {n} laps", f"≤ {limit}x",
                           f"{ours / raw:.2f}x", ours / raw <= limit))
            for k in DELTA_FREQUENCIES:
                theirs = point.get(f"delta_k{k}_bytes")
                if theirs is not None:
                    checks.append((f"agentrun < DeltaChannel k={k}, {size:.0f} B/lap, {n} laps", "fewer bytes",
                                   f"{fmt_bytes(ours)} vs {fmt_bytes(theirs)} ({theirs / ours:.1f}x)", ours < theirs))
            if n == 500 and "add_messages_bytes" in point:
                r = point["add_messages_bytes"] / ours
                checks.append((f"add_messages / agentrun, {size:.0f} B/lap, 500 laps", "≥ 100x", f"{r:.0f}x", r >= 100))
            checks.append((f"resume reads, {size:.0f} B/lap, lap {n}", "≤ K+1 = 11 objects",
                           str(point["resume_objects_read"]), point["resume_objects_read"] <= 11))
            rows.append([f"{size:.0f} B", n, fmt_bytes(raw), fmt_bytes(ours), f"{ours / raw:.2f}x",
                         f"{objects / n:.2f}", fmt_bytes(point.get("add_messages_bytes") or math.nan)
                         if "add_messages_bytes" in point else "-",
                         *[fmt_bytes(point[f"delta_k{k}_bytes"]) if f"delta_k{k}_bytes" in point else "-"
                           for k in DELTA_FREQUENCIES]])
        lg_resume = {("add_messages" if lg["channel"] == "add_messages" else f"delta_k{lg['snapshot_frequency']}"):
                     {"laps": lg["laps"], "p50_seconds": summary(lg["resume_seconds"])["p50"]} for lg in run["langgraph"]}
        laps_t = a["lap_seconds"]
        fig.update({
            "lap_seconds_mean": {"laps 1-100": statistics.mean(laps_t[:100]),
                                 "laps 901-1000": statistics.mean(laps_t[900:1000]) if n_max >= 1000 else None,
                                 f"laps {n_max - 99}-{n_max}": statistics.mean(laps_t[-100:])},
            "s3_get_p50_seconds": summary(a["s3_get_seconds"])["p50"], "langgraph_resume": lg_resume,
            "bytes_by_kind": a["bytes_by_kind"], "storage_status": a["storage_status"],
            "resume_worst": {"lap": n_max - 1, "objects_read": a["resume"][str(n_max - 1)]["objects_read"],
                             "p50_seconds": summary(a["resume"][str(n_max - 1)]["seconds"])["p50"]},
        })
        worst_reads = a["resume"][str(n_max - 1)]["objects_read"]
        checks.append((f"resume reads, {size:.0f} B/lap, lap {n_max - 1}", "≤ K+1 = 11 objects", str(worst_reads),
                       worst_reads <= 11))
        lg_last = lg_resume.get("delta_k100") or next(iter(lg_resume.values()))
        ours_p50 = summary(a["resume"][str(n_max)]["seconds"])["p50"]
        get_p50 = summary(a["s3_get_seconds"])["p50"]
        checks.append((f"resume p50 at lap {n_max}, {size:.0f} B/lap", "≤ LangGraph (DeltaChannel k=100) + one S3 GET",
                       f"{fmt_ms(ours_p50)} vs {fmt_ms(lg_last['p50_seconds'])} + {fmt_ms(get_p50)}",
                       ours_p50 <= lg_last["p50_seconds"] + get_p50))
        cpu = a.get("lap_cpu_seconds")
        if cpu:  # CPU time of the lap runner: what the lap costs, not how busy the shared box was
            fig["lap_cpu_seconds_mean"] = {"laps 1-100": statistics.mean(cpu[:100]),
                                           "laps 901-1000": statistics.mean(cpu[900:1000]) if n_max >= 1000 else None,
                                           f"laps {n_max - 99}-{n_max}": statistics.mean(cpu[-100:])}
            first, last = statistics.mean(cpu[:100]), statistics.mean(cpu[-100:])
            checks.append((f"lap runner CPU per lap, laps {n_max - 99}-{n_max} vs 1-100, {size:.0f} B/lap",
                           "flat (≤ 1.25x)", f"{fmt_ms(last)} vs {fmt_ms(first)}", last <= 1.25 * first))
        first, last = statistics.mean(laps_t[:100]), statistics.mean(laps_t[-100:])
        checks.append((f"lap wall time, laps {n_max - 99}-{n_max} vs 1-100, {size:.0f} B/lap (shared, loaded box)",
                       "flat (≤ 1.25x)", f"{fmt_ms(last)} vs {fmt_ms(first)}", last <= 1.25 * first))
        figures["runs"].append(fig)
    resume_text = []
    for r in resumes:
        more, text = resume_lines(r)
        checks += more
        resume_text += text
        worst = r["points"][str(r["laps"] - 1)]
        figures.setdefault("resume_runs", []).append({
            "s3": r["s3"], "laps": r["laps"], "started": r["started"], "commit": r["commit"],
            "load_at_start": r["load_at_start"], "load_at_end": r["load_at_end"],
            "message_bytes_per_lap_median": statistics.median(r["message_bytes_per_lap"]),
            "worst": {"lap": r["laps"] - 1, "objects_read": worst["objects_read"],
                      "p50_seconds": summary(worst["seconds"])["p50"],
                      "cpu_p50_seconds": summary(worst["cpu_seconds"])["p50"],
                      "server_cpu_seconds_mean": worst["server_cpu_seconds_mean"],
                      "gets_cpu_p50_seconds": summary(r["worst_split"]["gets_cpu_seconds"])["p50"],
                      "decode_cpu_p50_seconds": summary(r["worst_split"]["decode_cpu_seconds"])["p50"]},
            "snapshot_only_p50_seconds": summary(r["points"][str(r["laps"])]["seconds"])["p50"],
            "s3_get_p50_seconds": summary(r["s3_get_seconds"])["p50"],
            "langgraph_get_state_p50_seconds": summary(r["langgraph"]["get_state_seconds"])["p50"],
        })
    figures["checks"] = [{"figure": c[0], "target": c[1], "measured": c[2], "met": c[3]} for c in checks]
    figures["langgraph_version"] = runs[0]["langgraph_version"]
    figures["sqlite_version"] = runs[0]["sqlite_version"]
    figures["load_at_start"] = [r.get("load_at_start") for r in runs]
    figures["load_at_end"] = [r.get("load_at_end") for r in runs]
    figures["load_after_render"] = os.getloadavg()
    with open(out_json, "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    _plots(runs, plot_bytes, plot_time)
    md = [markdown_table(["messages/lap", "laps", "raw messages", "agentrun", "agentrun/raw", "objects/lap",
                          "add_messages", *[f"DeltaChannel k={k}" for k in DELTA_FREQUENCIES]], rows), "",
          markdown_table(["figure", "target", "measured", "verdict"], [[c[0], c[1], c[2], verdict(c[3])] for c in checks])]
    for fig in figures["runs"]:
        if not fig["points"]:
            continue
        res = fig["points"][-1]
        lr = fig["langgraph_resume"]
        worst = fig["resume_worst"]
        md.append("")
        md.append(
            f"~{fig['message_bytes_per_lap_median']:.0f} B/lap: resume at lap {res['laps']}: agentrun p50 "
            f"{fmt_ms(res['resume_p50_seconds'])} ({res['resume_objects_read']} objects; one S3 GET on loopback p50 "
            f"{fmt_ms(fig['s3_get_p50_seconds'])}); LangGraph get_state p50: "
            + ", ".join(f"{k} at lap {v['laps']} {fmt_ms(v['p50_seconds'])}" for k, v in lr.items())
            + f". Resume at lap {worst['lap']} (a snapshot and {worst['objects_read'] - 1} lap records): p50 "
            f"{fmt_ms(worst['p50_seconds'])}, {worst['objects_read']} objects"
            + ". Lap runner wall time per lap, mean: "
            + ", ".join(f"{k} {fmt_ms(v)}" for k, v in fig["lap_seconds_mean"].items() if v is not None)
            + ("; CPU time per lap, mean: " + ", ".join(
                f"{k} {fmt_ms(v)}" for k, v in fig["lap_cpu_seconds_mean"].items() if v is not None)
               if "lap_cpu_seconds_mean" in fig else "") + "."
        )
    for text in resume_text:
        md += ["", text]
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


def _plots(runs: list[dict[str, Any]], plot_bytes: str, plot_time: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = ["-", "--"]
    for run, ls in zip(runs, styles, strict=False):
        a = run["agentrun"]
        size = statistics.median(a["message_bytes_per_lap"])
        xs = range(1, a["laps"] + 1)
        cum, t = [], 0
        for b in a["per_lap_bytes"]:
            t += b
            cum.append(t)
        ax.plot(xs, cum, ls, color="black", lw=2, label=f"agentrun K=10, {size:.0f} B/lap")
        raw, t = [], a["message_bytes_lap0"]
        for b in a["message_bytes_per_lap"]:
            t += b
            raw.append(t)
        ax.plot(xs, raw, ls, color="grey", lw=1, label=f"raw message bytes, {size:.0f} B/lap")
        for lg, color in zip(run["langgraph"], ["tab:red", "tab:orange", "tab:blue", "tab:green"], strict=False):
            name = "add_messages" if lg["channel"] == "add_messages" else f"DeltaChannel k={lg['snapshot_frequency']}"
            cum, t = [], 0
            for b in lg["per_lap_bytes"][1:]:
                t += b
                cum.append(t)
            cum[0] += lg["per_lap_bytes"][0]
            ax.plot(range(1, lg["laps"] + 1), cum, ls, color=color, lw=1.2, label=f"LangGraph {name}, {size:.0f} B/lap")
    ax.set_yscale("log")
    ax.set_xlabel("laps")
    ax.set_ylabel("bytes stored (cumulative)")
    ax.set_title("Checkpoint bytes vs laps (log y): agentrun schema 3 vs LangGraph SqliteSaver")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(plot_bytes, dpi=110)
    fig, ax = plt.subplots(figsize=(9, 4))
    for run, ls in zip(runs, styles, strict=False):
        a = run["agentrun"]
        secs = a["lap_seconds"]
        w = 20
        xs = [i + w for i in range(0, len(secs) - w + 1, w)]
        ys = [statistics.mean(secs[i:i + w]) * 1000 for i in range(0, len(secs) - w + 1, w)]
        size = statistics.median(a["message_bytes_per_lap"])
        ax.plot(xs, ys, ls, label=f"wall, {size:.0f} B/lap (mean of {w} laps)")
        if a.get("lap_cpu_seconds"):
            cpu = a["lap_cpu_seconds"]
            ax.plot(xs, [statistics.mean(cpu[i:i + w]) * 1000 for i in range(0, len(cpu) - w + 1, w)], ls,
                    lw=2, label=f"CPU of the lap runner, {size:.0f} B/lap (mean of {w} laps)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("lap")
    ax.set_ylabel("lap runner time per lap (ms)")
    ax.set_title("agentrun lap runner (in-process execute_lap, moto S3 on loopback): time per lap")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot_time, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("matrix", "render", "resume"):
        cmd = sys.argv.pop(1)
        ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        if cmd == "matrix":
            ap.add_argument("--laps", type=int, default=2000)
            ap.add_argument("--max-tokens", type=int, default=4000)
            ap.add_argument("--tool-result-padding", type=int, default=0)
            ap.add_argument("--json", required=True)
            matrix(ap.parse_args())
        elif cmd == "resume":
            ap.add_argument("--laps", type=int, default=500)
            ap.add_argument("--max-tokens", type=int, default=4000)
            ap.add_argument("--tool-result-padding", type=int, default=0)
            ap.add_argument("--s3", choices=("moto", "versitygw"), default="moto")
            ap.add_argument("--repeat", type=int, default=50)
            ap.add_argument("--json", required=True)
            resume(ap.parse_args())
        else:
            here = os.path.dirname(os.path.abspath(__file__))
            ap.add_argument("runs", nargs="+")
            ap.add_argument("--json", default=os.path.join(here, "results-checkpoints.json"))
            ap.add_argument("--plot", default=os.path.join(here, "results-checkpoints-v3.png"))
            ap.add_argument("--plot-time", default=os.path.join(here, "results-lap-time.png"))
            ap.add_argument("--md", default=os.path.join(here, "results-checkpoints.md"))
            ap.add_argument("--resume", nargs="*", default=[], help="runs of the resume mode to add")
            a = ap.parse_args()
            render(a.runs, a.json, a.plot, a.plot_time, a.md, a.resume)
        return
    legacy_main()


def legacy_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laps", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--tool-result-padding", type=int, default=0,
                    help="bytes added to each tool result (default 0: bench_lap_run's ~300-byte result)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    ours, lap_messages, lap0 = run_agentrun(args.laps, args.max_tokens, args.tool_result_padding)
    print(f"checkpoint cost of a {args.laps}-lap run (one tool call per lap, "
          f"~{ours['message_bytes_per_lap']:.0f} B of messages per lap)")
    r_ours = summary(ours["resume_seconds"])
    print(f"  agentrun:  {ours['total_bytes']:,} B in {ours['objects']} S3 objects "
          f"({ours['total_bytes'] / args.laps:,.0f} B/lap; lap {args.laps}: {ours['per_lap_bytes'][-1]:,} B); "
          f"resume {fmt_ms(r_ours['p50'])} ({ours['resume_objects_read']} objects), at lap {args.laps - 1} "
          f"{fmt_ms(summary(ours['resume_before_last_seconds'])['p50'])} "
          f"({ours['resume_before_last_objects_read']} objects)", flush=True)
    theirs = run_langgraph(lap_messages, lap0, args.laps)
    fewest, fastest = mode(theirs, theirs["fewest_bytes"]), mode(theirs, theirs["fastest_resume"])
    default = mode(theirs, "add_messages")
    out = {"agentrun": ours, "langgraph": theirs, "tool_result_padding": args.tool_result_padding,
           "ratio_total_bytes": ratio(default["blob_bytes"], ours["total_bytes"]),
           "ratio_file_bytes": ratio(default["file_bytes"], ours["total_bytes"]),
           "ratio_best_bytes": ratio(fewest["blob_bytes"], ours["total_bytes"]),
           "ratio_best_resume": ratio(summary(fastest["resume_seconds"])["p50"], r_ours["p50"])}
    print(f"  LangGraph {theirs['version']} SqliteSaver: fewest bytes {theirs['fewest_bytes']} "
          f"({out['ratio_best_bytes']:.1f}x agentrun's), fastest resume {theirs['fastest_resume']} "
          f"({out['ratio_best_resume']:.2f}x agentrun's); add_messages {out['ratio_total_bytes']:.1f}x agentrun's bytes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
