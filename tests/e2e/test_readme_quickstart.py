"""The quickstart (docs/quickstart.md, linked from README.md), run as written; README's own short
example is a part of it (``test_readme_example_is_part_of_the_quickstart``).

The shell blocks of docs/quickstart.md marked ``<!-- quickstart -->`` are run in order in one bash session
(so ``source .localkube/dev.env`` carries over), from the repository root, with two changes a user
never sees: the state directory is a private temp dir (``LOCALKUBE_DIR``, so this test never
touches a developer's ``.localkube/``; ``.localkube/`` in a command is read as that dir) and the
tool server, MCP server and metrics ports are free ports (``DEV_TOOL_PORT=0 DEV_MCP_PORT=0
DEV_METRICS_PORT=0``), so parallel sessions cannot collide. ``make dev`` also runs the MCP agent
example (examples/mcp-agent.yaml: an Agent whose tools come from examples/mcp_tool_server.py, and a
run of it): the run Succeeded, its ``status.agent`` names the Agent, and the MCP server's own record
(``GET /_record``) has each booking executed exactly once. Between the blocks and the final ``make
dev-down`` the test runs ``DEV_APPROVE=auto make dev`` a second time and checks that it reuses what
runs (no duplicate process, no booking again). At the end nothing started from the dir may be alive
and no pid file may be left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from e2e.cluster import leftover_processes  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MARK = "<!-- quickstart -->"
# seconds: each step's own budget; the test's pytest timeout is their sum plus slack
QUICKSTART_BUDGET, SECOND_DEV_BUDGET, DOWN_BUDGET, CLEANUP_BUDGET = 900, 300, 120, 120
RUN = "invoices-2024-06"
MCP_EXAMPLE = ROOT / "examples" / "mcp-agent.yaml"
QUICKSTART = ROOT / "docs" / "quickstart.md"


def quickstart_blocks(text: str) -> list[list[str]]:
    """The commands of each ```sh block that directly follows a quickstart marker."""
    blocks = []
    for m in re.finditer(re.escape(MARK) + r"\s*\n```(?:sh|bash|console)?\n(.*?)\n```", text, re.S):
        cmds, cur = [], ""
        for line in m.group(1).splitlines():
            if cur:
                cur += "\n" + line
            elif line.strip() and not line.lstrip().startswith("#"):
                cur = line
            else:
                continue
            if not cur.endswith("\\"):
                cmds.append(cur)
                cur = ""
        assert not cur, f"unterminated continuation in a quickstart block: {cur!r}"
        blocks.append(cmds)
    return blocks


def test_quickstart_blocks_are_found():
    blocks = quickstart_blocks(QUICKSTART.read_text())
    flat = [c for b in blocks for c in b]
    assert flat[0] == "make dev" and flat[-1] == "make dev-down", flat
    assert any(c.startswith("agentrun approve ") for c in flat), flat
    assert any(c.startswith("agentrun trace ") for c in flat), flat
    assert any(c.startswith("agentrun fork ") for c in flat), flat


def test_readme_example_is_part_of_the_quickstart():
    """README's example (the sh block of "Try it on your machine") runs in the quickstart: each of
    its commands, comments stripped, begins a command the quickstart runs, and `make dev` is the
    first set-up command README names."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Try it on your machine\n", 1)[1].split("\n## ", 1)[0]
    assert section.index("`make dev`") < section.index("`make test`"), section
    (block,) = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    example = [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]
    flat = [c for b in quickstart_blocks(QUICKSTART.read_text()) for c in b]
    assert len(example) >= 5, example
    missing = [c for c in example if not any(q == c or q.startswith(c + " ") for q in flat)]
    assert not missing, f"README's example runs commands the quickstart does not: {missing}"


def _script(cmds: list[str]) -> str:
    lines = ["set -euo pipefail"]
    for i, cmd in enumerate(cmds):
        # through the variable, not the path: e2e/cluster.py down kills processes naming the dir
        cmd = cmd.replace(".localkube/", "$LOCALKUBE_DIR/")
        lines.append(f"printf '\\n@@@ %s\\n' {i}")
        lines.append(cmd)
    return "\n".join(lines) + "\n"


def _sections(out: str, cmds: list[str]) -> dict[str, str]:
    parts = re.split(r"^@@@ (\d+)$", out, flags=re.M)
    got = {}
    for k in range(1, len(parts) - 1, 2):
        got[cmds[int(parts[k])]] = parts[k + 1]
    return got


def _bash(script: str, env: dict, timeout: float, log: Path) -> subprocess.CompletedProcess:
    """Run script; its output goes to log as it comes (a timeout still shows where it stopped)."""
    with open(log, "w") as fh:
        try:
            p = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, text=True, stdout=fh,
                               stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timed out after {timeout}s; the output so far:\n{log.read_text()[-6000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, log.read_text())


def _mcp_example() -> tuple[str, str, str, int]:
    """(Agent name, its version, run name, bookings its scripted model makes) of examples/mcp-agent.yaml."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(MCP_EXAMPLE.read_text())}
    agent, run = docs["Agent"], docs["AgentRun"]
    assert run["spec"]["agentRef"]["name"] == agent["metadata"]["name"]
    bookings = sum(1 for turn in agent["spec"]["model"]["script"] for call in turn.get("toolCalls") or []
                   if call["name"] == "ledger__book_invoice")
    return agent["metadata"]["name"], agent["spec"]["version"], run["metadata"]["name"], bookings


def _kubectl_json(state: Path, env: dict, *args: str) -> dict:
    p = subprocess.run(["bash", "-c", f'source "{state}/dev.env" && kubectl "$@" -o json', "_", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _check_mcp_run(state: Path, env: dict) -> dict:
    """The MCP agent's run Succeeded running the example's Agent, and the MCP server's own record has
    each of its bookings executed exactly once, keyed by the run; returns the record."""
    agent, version, run_name, bookings = _mcp_example()
    run = _kubectl_json(state, env, "get", "agentrun", run_name)
    st = run["status"]
    assert st["phase"] == "Succeeded", st
    assert st["agent"]["name"] == agent and st["agent"]["version"] == version, st["agent"]
    assert re.fullmatch(r"[0-9a-f]{64}", st["agent"]["digest"]), st["agent"]
    port = (state / "mcp-server.port").read_text().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_record", timeout=10) as r:
        record = json.load(r)
    key_id = "r_" + run["metadata"]["uid"].replace("-", "")
    assert bookings >= 1 and record["bookings"] == bookings and record["withoutKey"] == 0, record
    assert len(record["executions"]) == bookings and set(record["executions"].values()) == {1}, record
    assert all(k.startswith(key_id + ":") and ":ledger__book_invoice:" in k for k in record["executions"]), record
    return record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


# its own budgets (the quickstart, the second `make dev`, `make dev-down`, the clean-up after a
# failure: 1,440 s) plus slack for the checks between them
@pytest.mark.timeout(QUICKSTART_BUDGET + SECOND_DEV_BUDGET + DOWN_BUDGET + 2 * CLEANUP_BUDGET)
def test_readme_quickstart_as_written(tmp_path):
    state = tmp_path / "kube"
    blocks = quickstart_blocks(QUICKSTART.read_text())
    main_cmds = [c for b in blocks[:-1] for c in b]
    down_cmds = blocks[-1]
    assert down_cmds == ["make dev-down"], down_cmds
    env = {**os.environ, "LOCALKUBE_DIR": str(state), "DEV_TOOL_PORT": "0", "DEV_MCP_PORT": "0",
           "DEV_METRICS_PORT": "0"}
    env.pop("DEV_APPROVE", None)
    env.pop("KUBECONFIG", None)
    t0 = time.monotonic()
    try:
        r = _bash(_script(main_cmds), env, timeout=QUICKSTART_BUDGET, log=tmp_path / "quickstart.log")
        assert r.returncode == 0, f"the quickstart failed (exit {r.returncode}):\n{r.stdout[-6000:]}"
        out = _sections(r.stdout, main_cmds)
        first = out["make dev"]
        assert "AwaitingApproval" in first and "] Next: type these in your shell" in first, first[-3000:]
        assert f"agentrun approve {RUN}" in first and "dev.env" in first, first[-3000:]
        assert re.search(rf"{RUN}\s+AwaitingApproval\s+8\s", first), first[-3000:]
        mcp_run = _mcp_example()[2]
        assert f"  {mcp_run}: Succeeded lap " in first and f"agentrun describe {mcp_run}" in first, first[-3000:]
        assert "finance-approvers" in out["agentrun approvals"], out["agentrun approvals"]
        assert re.search(rf"{RUN}\s+Succeeded\s+10\s", out["kubectl get agentruns"]), out["kubectl get agentruns"]
        trace = out[f"agentrun trace {RUN} --lap 9"]
        # the decider is the authenticated user (the dev kubeconfig's admin), stamped by admission
        assert "schedule_payment:ok(200)" in trace and "approved by admin: matches the PO batch" in trace, trace
        assert re.search(r"key r_[0-9a-f]{32}:8:schedule_payment:call_1", trace), trace
        show = out["python3 examples/tool_server.py --show"]
        assert "9 call(s) executed" in show and "0 key(s) executed twice" in show, show
        fork_trace = out[f"agentrun trace {RUN}-b --lap 9"]
        assert "forked from" in fork_trace and "schedule_payment:rejected" in fork_trace, fork_trace
        record = _check_mcp_run(state, env)
        agent, version = _mcp_example()[:2]
        d = subprocess.run(["bash", "-c", f'source "{state}/dev.env" && agentrun describe {mcp_run}'], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, d.stderr
        assert re.search(rf"^  Agent:\s+{agent} version {re.escape(version)}, digest sha256:[0-9a-f]{{12}}, pinned ",
                         d.stdout, re.M), d.stdout

        # a second `make dev` is quick and safe: everything reused, the operator restarted once
        pids = {n: int((state / f"{n}.pid").read_text()) for n in ("localkube", "tool-server", "mcp-server", "operator")}
        t1 = time.monotonic()
        r2 = _bash("make dev", {**env, "DEV_APPROVE": "auto"}, timeout=SECOND_DEV_BUDGET, log=tmp_path / "second.log")
        second = time.monotonic() - t1
        assert r2.returncode == 0, r2.stdout[-4000:]
        for what in ("control plane: already running", "S3 server: already running", "tool server: already running",
                     "MCP ledger server: already running"):
            assert what in r2.stdout, r2.stdout[-4000:]
        assert f"{RUN} unchanged" in r2.stdout and "0 key(s) executed twice" in r2.stdout, r2.stdout[-4000:]
        assert int((state / "localkube.pid").read_text()) == pids["localkube"]
        assert int((state / "tool-server.pid").read_text()) == pids["tool-server"]
        assert int((state / "mcp-server.pid").read_text()) == pids["mcp-server"]
        assert f"{mcp_run} unchanged" in r2.stdout and "0 key(s) executed twice, 0 without a key" in r2.stdout, \
            r2.stdout[-4000:]
        assert _check_mcp_run(state, env) == record  # the run was not run again: no booking again
        new_operator = int((state / "operator.pid").read_text())
        assert new_operator != pids["operator"] and not _alive(pids["operator"]) and _alive(new_operator)
        servers = [p for p, cmd in leftover_processes(state) if "examples/tool_server.py" in cmd]
        assert servers == [pids["tool-server"]], servers
        mcp_servers = [p for p, cmd in leftover_processes(state) if "examples/mcp_tool_server.py" in cmd]
        assert mcp_servers == [pids["mcp-server"]], mcp_servers
        print(f"quickstart (first make dev .. fork) {t1 - t0:.0f}s, second make dev {second:.1f}s")

        r3 = _bash(_script(down_cmds), env, timeout=DOWN_BUDGET, log=tmp_path / "down.log")
        assert r3.returncode == 0, r3.stdout[-4000:]
        assert not leftover_processes(state), leftover_processes(state)
        assert not _alive(new_operator)
        assert not list(state.rglob("*.pid")), list(state.rglob("*.pid"))
    finally:
        if any(state.rglob("*.pid")):  # a failure above: clean up whatever runs
            for f in state.rglob("operator.pid"):
                try:
                    os.kill(int(f.read_text()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["bash", "tools/dev.sh", "down"], cwd=ROOT, env={**os.environ, "LOCALKUBE_DIR": str(state)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=CLEANUP_BUDGET, check=False)
