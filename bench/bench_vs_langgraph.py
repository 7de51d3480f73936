"""Checkpoint cost of a 500-lap run, agentrun beside LangGraph's SQLite checkpointer.

agentrun: the 500-lap scripted run of ``bench_lap_run.py`` through the real lap code
(``execute_lap``: model journal, one HTTP tool call per lap with its journal entry, the lap record,
a snapshot every 10 laps) against a local S3 API server (moto). Bytes are every object the run left
in the bucket, attributed to the lap in its key; resume = ``load_state`` at the last lap.

LangGraph: a ``StateGraph`` with a ``messages`` channel (``add_messages``) and one node that loops,
one superstep per lap, each appending exactly the messages our lap N record carries (read back from
the store: same contents, same sizes, as LangChain ``AIMessage``/``ToolMessage``), checkpointed
by ``langgraph-checkpoint-sqlite``'s ``SqliteSaver`` in a file. Bytes are the sum of the
``checkpoints`` and ``writes`` blobs per superstep, and the SQLite file size; resume =
``get_tuple`` of the latest checkpoint (what a LangGraph resume loads).

    python bench/bench_vs_langgraph.py [--laps 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_lap_run import RUN, ToolHandler, lap_env, spec_doc, start_moto  # noqa: E402
from benchlib import ratio, summary  # noqa: E402

from agentrun.checkpoint.store import CheckpointStore, StoreConfig  # noqa: E402
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


def run_agentrun(laps: int, max_tokens: int, extra: int = 0) -> tuple[dict[str, Any], list[list[Any]]]:
    """The scripted run through execute_lap; returns figures and each lap's messages."""
    moto, endpoint = start_moto()
    tools = ThreadingHTTPServer(("127.0.0.1", 0), padded_handler(extra) if extra else ToolHandler)
    threading.Thread(target=tools.serve_forever, daemon=True).start()
    try:
        base = {"AGENTRUN_CHECKPOINT_URI": "s3://bench-vs/runs", "AGENTRUN_S3_ENDPOINT": endpoint,
                "AGENTRUN_S3_REGION": "us-east-1", "AGENTRUN_S3_PATH_STYLE": "true", "AGENTRUN_LOG_FORMAT": "json"}
        store = CheckpointStore(StoreConfig.from_env(base, snapshot_every=10))
        store.client.create_bucket(Bucket="bench-vs")
        spec_json = json.dumps(spec_doc(f"http://127.0.0.1:{tools.server_address[1]}", laps, max_tokens))
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
        resume = []
        for _ in range(5):
            t0 = time.perf_counter()
            loaded = store.load_state(RUN, through_lap=laps)
            resume.append(time.perf_counter() - t0)
        messages = [store.get_lap(RUN, lap)[0].messages for lap in range(1, laps + 1)]
        figures = {
            "laps": laps, "objects": objects, "total_bytes": sum(per_lap), "per_lap_bytes": per_lap[1:],
            "bytes_by_kind": kinds, "resume_seconds": resume, "resume_objects_read": loaded.objects_read,
            "run_seconds": run_seconds,
            "message_bytes_per_lap": statistics.median(
                [sum(len(m.model_dump_json(by_alias=True, exclude_none=True)) for m in ms) for ms in messages]),
        }
        return figures, messages
    finally:
        tools.shutdown()
        moto.terminate()
        moto.wait(timeout=10)


def run_langgraph(lap_messages: list[list[Any]], task: str, path: str) -> dict[str, Any]:
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, StateGraph
    from langgraph.graph.message import add_messages

    def to_lc(m: Any) -> Any:
        if m.role == "assistant":
            return AIMessage(content=m.content or "", tool_calls=[
                {"id": c.id, "name": c.name, "args": c.arguments} for c in m.tool_calls])
        if m.role == "tool":
            return ToolMessage(content=m.content or "", tool_call_id=m.tool_call_id)
        if m.role == "system":
            return SystemMessage(content=m.content or "")
        return HumanMessage(content=m.content or "")

    laps = [[to_lc(m) for m in ms] for ms in lap_messages]
    n = len(laps)

    # functional form: this module's postponed annotations would hide the local names from LangGraph
    State = TypedDict("State", {"messages": Annotated[list, add_messages], "lap": int})  # noqa: UP013

    def lap_node(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": laps[state["lap"] - 1], "lap": state["lap"] + 1}

    graph = StateGraph(State)
    graph.add_node("lap", lap_node)
    graph.set_entry_point("lap")
    graph.add_conditional_edges("lap", lambda s: END if s["lap"] > n else "lap")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "invoices-500"}, "recursion_limit": n + 10}
    t0 = time.perf_counter()
    final = app.invoke({"messages": [HumanMessage(content=task)], "lap": 1}, config)
    run_seconds = time.perf_counter() - t0
    assert final["lap"] == n + 1 and len(final["messages"]) == 1 + sum(len(x) for x in laps)
    rows = conn.execute(
        "SELECT checkpoint_id, length(checkpoint) + length(metadata) FROM checkpoints ORDER BY checkpoint_id").fetchall()
    writes = dict(conn.execute(
        "SELECT checkpoint_id, sum(length(value)) FROM writes GROUP BY checkpoint_id").fetchall())
    per_step = [size + (writes.get(cid) or 0) for cid, size in rows]
    resume = []
    for _ in range(5):
        t0 = time.perf_counter()
        tup = saver.get_tuple({"configurable": {"thread_id": "invoices-500"}})
        resume.append(time.perf_counter() - t0)
    assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == len(final["messages"])
    conn.close()
    return {
        "version": version("langgraph"), "sqlite_version": version("langgraph-checkpoint-sqlite"),
        "checkpoints": len(rows), "blob_bytes": sum(per_step), "per_step_bytes": per_step,
        "file_bytes": os.path.getsize(path), "resume_seconds": resume, "run_seconds": run_seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laps", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--tool-result-padding", type=int, default=0,
                    help="bytes added to each tool result (default 0: bench_lap_run's ~300-byte result)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    ours, lap_messages = run_agentrun(args.laps, args.max_tokens, args.tool_result_padding)
    with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
        theirs = run_langgraph(lap_messages, "Extract all 500 invoices of the quarter and record them.",
                               os.path.join(tmp, "checkpoints.sqlite"))
    out = {"agentrun": ours, "langgraph": theirs, "tool_result_padding": args.tool_result_padding,
           "ratio_total_bytes": ratio(theirs["blob_bytes"], ours["total_bytes"]),
           "ratio_file_bytes": ratio(theirs["file_bytes"], ours["total_bytes"])}
    r_ours, r_theirs = summary(ours["resume_seconds"]), summary(theirs["resume_seconds"])
    print(f"checkpoint cost of a {args.laps}-lap run (one tool call per lap, "
          f"~{ours['message_bytes_per_lap']:.0f} B of messages per lap)")
    print(f"  agentrun:  {ours['total_bytes']:,} B in {ours['objects']} S3 objects "
          f"({ours['total_bytes'] / args.laps:,.0f} B/lap; lap {args.laps}: {ours['per_lap_bytes'][-1]:,} B); "
          f"resume {r_ours['p50'] * 1000:.1f} ms ({ours['resume_objects_read']} objects)")
    print(f"  LangGraph {theirs['version']} SqliteSaver: {theirs['blob_bytes']:,} B of blobs in {theirs['checkpoints']} "
          f"checkpoints, file {theirs['file_bytes']:,} B (last step {theirs['per_step_bytes'][-1]:,} B); "
          f"resume get_tuple {r_theirs['p50'] * 1000:.1f} ms")
    print(f"  ratio LangGraph/agentrun total bytes: {out['ratio_total_bytes']:.1f}x (file: {out['ratio_file_bytes']:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
