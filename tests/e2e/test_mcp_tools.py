"""MCP tools end to end (issue 32, item 2) on the local control plane with the real S3 server: an
agent whose tools come from a real MCP server (examples/mcp_tool_server.py, the toolkit's ledger,
through tests/e2e/mcp_ledger_server.py which adds a route to remove a tool), started by the test.

One run shows the approval-gated MCP tool, the lap pod SIGKILLed mid-call (its deletion's grace
period of 1 s passes while the server is still executing the booking) with every side effect
exactly once by the server's own ``GET /_record``, and a tool-list change between laps giving ONE
``ToolsChanged`` Event. Beside it, the bad inputs: an MCP URL outside policy (refused at apply) and
an unknown MCP tool in the allow list (the run fails at discovery, naming the field).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_operator_e2e import Env, _diagnostics_on_failure, _one_job_per_attempt, _wait, running_env  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
KEY_TABLE = "agentrun_idempotency"  # agentrun.toolkit.store.SQLiteStore's default table


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    yield from running_env(Env(cluster, s3, tmp_path_factory.mktemp("mcp")))


class Ledger:
    """The MCP server process: ``url`` its MCP endpoint, ``record()`` its own count of executions."""

    def __init__(self, db: Path, delay: float) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.db, self.base = db, f"http://127.0.0.1:{port}"
        self.url = self.base + "/mcp"
        self.log = db.with_suffix(".log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "mcp_ledger_server.py"), "--port", str(port), "--db", str(db),
                 "--delay", str(delay)], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _wait("the MCP ledger server", self._up, timeout=60)

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            self.record()
            return True
        except OSError:
            return False

    def record(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/_record", timeout=5) as r:
            return json.load(r)

    def remove_tool(self, name: str) -> None:
        req = urllib.request.Request(f"{self.base}/_remove_tool?name={name}", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=5).read()

    def keys_begun(self) -> list[str]:
        """Keys the toolkit began executing (its own table in the ledger's SQLite file)."""
        with sqlite3.connect(self.db, timeout=5) as c:
            try:
                return [r[0] for r in c.execute(f"SELECT key FROM {KEY_TABLE}")]
            except sqlite3.OperationalError:  # the table is made on first use
                return []

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> Iterator[Ledger]:
    # each booking takes 8 s: the lap pod is killed (grace period 1 s) while the server executes it
    led = Ledger(tmp_path_factory.mktemp("ledger") / "ledger.sqlite3", delay=8.0)
    yield led
    led.stop()


def _run(env: Env, name: str, script: list[dict], servers: list[dict]) -> dict:
    doc = env.run_doc(name, script)
    doc["spec"]["agent"]["tools"] = []
    doc["spec"]["agent"]["mcpServers"] = servers
    doc["spec"]["lapTimeout"] = "5m"
    return doc


def _pods(env: Env, run: str) -> list[dict]:
    out = env.kubectl("get", "pods", "-n", env.ns, "-l", f"agentrun.dev/run={run}", "-o", "json").stdout
    return json.loads(out)["items"]


def test_mcp_tools_approval_sigkill_mid_call_once_tools_changed_and_bad_input(env, ledger):
    booking = {"invoice": "INV-E2E", "amount_cents": 500}
    script = [
        {"content": "looking up, then booking", "toolCalls": [
            {"name": "ledger__lookup_invoice", "arguments": {"invoice": "INV-E2E"}},
            {"name": "ledger__book_invoice", "arguments": booking}]},
        {"content": "booked"},
    ]
    server = {"name": "ledger", "url": ledger.url, "requiresApproval": ["book_*"], "sideEffects": ["book_*"]}
    env.apply(_run(env, "mcp-book", script, [server]))

    # bad input, beside it: an allow-listed tool the server does not list fails the run at discovery
    bad_tools = {"name": "ledger", "url": ledger.url, "tools": ["lookup_invoice", "no_such_tool"]}
    env.apply(_run(env, "mcp-unknown", [{"content": "never asked"}], [bad_tools]))
    # and an MCP URL outside policy (a cloud metadata address: refused by every AgentRunPolicy) at apply
    meta = {"name": "meta", "url": "http://169.254.169.254/mcp"}
    refused = env.apply(_run(env, "mcp-metadata", [{"content": "x"}], [meta]), check=False)
    assert refused.returncode != 0
    assert ('spec.agent.mcpServers[meta].url "http://169.254.169.254/mcp" has address 169.254.169.254: cloud '
            "metadata, link-local and unspecified addresses are always refused (AgentRunPolicy rule "
            "destinations.alwaysDenied)") in refused.stderr, refused.stderr
    assert not env.get("mcp-metadata")

    st = env.wait_phase("mcp-book", "AwaitingApproval", "Failed", "Succeeded")
    assert st["phase"] == "AwaitingApproval", st
    ap = st["approval"]
    assert ap["tool"] == "ledger__book_invoice" and ap["target"]["method"] == "MCP"
    assert ap["target"]["url"] == ledger.url
    assert ledger.record()["bookings"] == 0, "the approval-gated call did not run before its approval"

    bad = env.wait_phase("mcp-unknown", "Failed", "Succeeded")
    assert bad["phase"] == "Failed", bad
    assert ("spec.agent.mcpServers[0].tools names 'no_such_tool', which MCP server 'ledger' "
            f"({ledger.url}) does not list; it lists: book_invoice, lookup_invoice") in bad["message"], bad

    # between the laps the server stops listing a tool: lap 2 records tools version 2
    ledger.remove_tool("lookup_invoice")
    env.kubectl("annotate", "agentrun", "mcp-book", "-n", env.ns, "approved=true")
    key = _wait("the approved booking in flight at the server", lambda: next(iter(ledger.keys_begun()), None),
                timeout=240)
    assert ":1:ledger__book_invoice:" in key, key  # the key of lap 1's call, where it was asked for
    pod = next(p for p in _pods(env, "mcp-book") if p["metadata"]["labels"].get("agentrun.dev/lap") == "2")
    env.kubectl("delete", "pod", pod["metadata"]["name"], "-n", env.ns, "--grace-period=1", "--wait=false")
    assert ledger.record()["bookings"] == 0, "the pod was killed while the booking was still executing"

    st = env.wait_phase("mcp-book", "Succeeded", "Failed", timeout=300)
    assert st["phase"] == "Succeeded", st
    assert st["totalRetries"] >= 1, st
    _one_job_per_attempt(env.jobs("mcp-book"))
    rec = ledger.record()
    assert rec["executions"] == {key: 1} and rec["bookings"] == 1 and rec["withoutKey"] == 0, rec

    changed = [e for e in env.events("mcp-book") if e["reason"] == "ToolsChanged"]
    assert len(changed) == 1 and changed[0].get("count", 1) == 1, changed
    assert changed[0]["message"] == ("lap 2 listed changed MCP tools, recorded as tools version 2 (was 1): "
                                     "ledger: removed lookup_invoice")
    time.sleep(6)  # a resync later: still one
    assert len([e for e in env.events("mcp-book") if e["reason"] == "ToolsChanged"]) == 1
