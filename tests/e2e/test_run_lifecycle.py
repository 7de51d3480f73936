"""Run lifecycle on the real local control plane (issue 31): retry in place with the same keys,
top-up, cancel (mid-lap and while waiting for approval), the run deadline.

One operator (``test_operator_e2e.env``: its own namespace, the recording tool server of
examples/tool_server.py, which executes a key once and answers a repeat from its record), the
generated admission policies of crds/ (install_api), the chart's ``agentrun-retrier`` role rendered by
the real helm, real users by impersonation (``kubectl --as``). The scenarios run concurrently in one
test: every run is created first, then each is driven by waiting on conditions, never on time.

What fails on main before issue 31: there is no retry (a Failed run stays Failed, the annotation is
ignored), no spec.cancel (refused by the CRD schema as an unknown field), no spec.activeDeadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster import ADMISSION_APIS
from e2e_support import ToolGate, wait_for
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.api.lifecycle import (
    ANN_RETRY,
    ANN_RETRY_REQUESTED_BY,
    RETRIER_CLUSTERROLE,
    RETRY_VERB,
)
from agentrun.cli.exitcodes import ExitCode
from agentrun.inbox.view import history_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"


class Switch:
    """A tool endpoint that answers 503 while ``broken`` (the cause of the failure), then forwards to
    the recording tool server (the cause fixed): ``requests`` counts what reached it."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.broken, self.requests = upstream.rstrip("/"), True, 0
        sw = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sw.requests += 1
                if sw.broken:
                    code, body = 503, b'{"error":"down"}'
                else:
                    req = urllib.request.Request(sw.upstream + self.path, data=raw, method="POST", headers={
                        k: v for k, v in self.headers.items() if k.lower() in ("content-type", "idempotency-key")})
                    with urllib.request.urlopen(req, timeout=30) as r:
                        code, body = r.status, r.read()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _record(e: Any) -> dict[str, Any]:
    with urllib.request.urlopen(f"{e.tool_url}/_record", timeout=5) as r:
        return json.load(r)["keys"]


def _keys(e: Any, run_uid: str, tool: str) -> dict[str, dict[str, Any]]:
    """The tool server's record of ``tool``'s keys of one run (keys are r_<uid>:lap:tool:call)."""
    uid = run_uid.replace("-", "")
    return {k: v for k, v in _record(e).items() if uid in k.replace("-", "") and f":{tool}:" in k}


def _as(e: Any, user: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return e.kubectl(*args, f"--as={user}", check=False, input=input)


def _patch(e: Any, user: str, name: str, patch: dict) -> subprocess.CompletedProcess:
    return _as(e, user, "patch", "agentrun", name, "-n", e.ns, "--type=merge", "-p", json.dumps(patch))


def _retry_patch(n: int, user: str, spec: dict | None = None) -> dict:
    doc: dict[str, Any] = {"metadata": {"annotations": {ANN_RETRY: str(n), ANN_RETRY_REQUESTED_BY: user}}}
    if spec is not None:
        doc["spec"] = spec
    return doc


def _reasons(e: Any, name: str) -> list[str]:
    return [ev["reason"] for ev in e.events(name)]


def _event(e: Any, name: str, reason: str) -> str:
    return wait_for(f"{reason} Event of {name}",
                    lambda: next((ev["message"] for ev in e.events(name) if ev["reason"] == reason), None), timeout=120)


@pytest.fixture(scope="module")
def people(env):  # noqa: F811 (the fixture)
    """carol writes runs (get/list/watch/create/update/patch), dave holds the chart's agentrun-retrier role."""
    helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    out = subprocess.run([helm, "template", "agentrun-operator", str(CHART), *ADMISSION_APIS, "--show-only",
                          "templates/retrier-rbac.yaml"], check=True, capture_output=True, text=True).stdout
    assert yaml.safe_load(out)["metadata"]["name"] == RETRIER_CLUSTERROLE
    env.cluster.kubectl_run("apply", "-f", "-", input=out)
    env.kubectl("create", "role", "author", "-n", env.ns, "--verb=get,list,watch,create,update,patch",
                "--resource=agentruns.agentrun.dev")
    env.kubectl("create", "rolebinding", "lc-author", "-n", env.ns, "--role=author", "--user=carol")
    env.kubectl("create", "rolebinding", "lc-retriers", "-n", env.ns, f"--clusterrole={RETRIER_CLUSTERROLE}",
                "--user=dave")
    return env


def _wait_exits(e: Any, name: str, code: ExitCode) -> None:
    """`agentrun wait` exits with the run's outcome's documented code (docs/cli.md)."""
    r = _cli(e, "wait", name, "-n", e.ns, "--timeout", "30s")
    assert r.returncode == code, (name, r.returncode, code, r.stdout, r.stderr)


def _cli(e: Any, *args: str) -> subprocess.CompletedProcess:
    penv = {k: v for k, v in e.cluster.env().items() if not k.startswith("AGENTRUN_")}
    penv.update({"AWS_ACCESS_KEY_ID": e.s3.access_key, "AWS_SECRET_ACCESS_KEY": e.s3.secret_key,
                 "AWS_DEFAULT_REGION": e.s3.region})
    return subprocess.run([sys.executable, "-m", "agentrun.cli.main", *args], env=penv, capture_output=True,
                          text=True, timeout=120, check=False)


def test_retry_top_up_cancel_and_deadline(people):
    e = people
    ship = Switch(e.tool_url)
    gate = ToolGate(e.tool_url)
    try:
        _scenarios(e, ship, gate)
    finally:
        gate.open()
        gate.close()
        ship.close()


def _scenarios(e: Any, ship: Switch, gate: ToolGate) -> None:
    # (a) retry with no repeat: lap 1 notes, lap 2 pays (executed) then ships (503: the lap fails)
    a = e.run_doc("retry-a", [
        {"content": "start", "toolCalls": [{"name": "note", "arguments": {"order": "a-start"}}]},
        {"content": "pay and ship", "toolCalls": [{"name": "pay", "arguments": {"order": "a"}},
                                                   {"name": "ship", "arguments": {"order": "a"}}]},
        {"content": "done"}])
    a["spec"]["agent"]["tools"] += [{"name": "pay", "http": {"url": f"{e.tool_url}/pay", "timeout": "5s"}},
                                    {"name": "ship", "http": {"url": f"{ship.url}/ship", "timeout": "5s"}}]
    a["spec"]["retry"] = {"attemptsPerLap": 1, "backoff": {"initial": "1s", "max": "1s", "factor": 1}}
    # (b) top-up: lap 1 costs $0.50 against maxCostUSD $0.10
    b = e.run_doc("topup", [{"content": "spend", "toolCalls": [{"name": "note", "arguments": {"order": "b"}}],
                             "usage": {"inputTokens": 100000, "outputTokens": 0}}, {"content": "done"}],
                  budget={"maxLaps": 5, "maxCostUSD": "0.10"})
    b["spec"]["agent"]["model"]["pricing"] = {"inputPerMillionTokensUSD": "5", "outputPerMillionTokensUSD": "0"}
    # (c) cancel mid-lap: pay executes, then note is held at the gate while the cancel lands
    c = e.run_doc("cancel-mid", [
        {"content": "pay then note", "toolCalls": [{"name": "pay", "arguments": {"order": "c"}},
                                                    {"name": "note", "arguments": {"order": "c"}}]},
        {"content": "done"}])
    c["spec"]["agent"]["tools"] += [{"name": "pay", "http": {"url": f"{e.tool_url}/pay", "timeout": "5s"}}]
    for t in c["spec"]["agent"]["tools"]:
        if t["name"] == "note":
            t["http"] = {"url": f"{gate.url}/note", "timeout": "10m"}
    c["spec"]["lapTimeout"] = "15m"
    # (d) cancel while waiting for approval; (e) the deadline passes while waiting for approval
    d = e.run_doc("cancel-ap", [{"content": "refund", "toolCalls": [{"name": "refund", "arguments": {"order": "d"}}]},
                                {"content": "done"}])
    dl = e.run_doc("deadline", [{"content": "refund", "toolCalls": [{"name": "refund", "arguments": {"order": "e"}}]},
                                {"content": "done"}], activeDeadline="20s")
    for doc in (a, b, c, d, dl):
        r = _as(e, "carol", "create", "-n", e.ns, "-f", "-", input=yaml.safe_dump(doc))
        assert r.returncode == 0, r.stderr

    # ---- (c) cancel mid-lap, by its author (patch is enough); who is recorded by the API server
    wait_for("cancel-mid's note held at the gate", lambda: any(x["path"] == "/note" for x in gate.arrivals), 180)
    r = _patch(e, "carol", "cancel-mid", {"spec": {"cancel": {"reason": "wrong customer"}}})
    assert r.returncode == 0, r.stderr
    # ---- (d) cancel while waiting
    st = e.wait_phase("cancel-ap", "AwaitingApproval", "Failed", timeout=180)
    assert st["phase"] == "AwaitingApproval", st
    r = _patch(e, "carol", "cancel-ap", {"spec": {"cancel": {"reason": "not needed"}}})
    assert r.returncode == 0, r.stderr

    st = e.wait_phase("cancel-mid", "Cancelled", "Failed", "Succeeded", timeout=120)
    assert st["phase"] == "Cancelled" and st["lifecycle"]["cancelledBy"] == "carol", st
    assert st["lifecycle"]["cancelReason"] == "wrong customer" and "activeJob" not in st
    _wait_exits(e, "cancel-mid", ExitCode.CANCELLED)
    gate.open()  # the call in flight finishes (the lap journals it before it exits 143, or a retry resends its key)

    run = e.wait_phase("cancel-ap", "Cancelled", timeout=120) and e.get("cancel-ap")
    ap = run["status"]["approval"]
    assert ap["state"] == "Withdrawn" and "ApprovalWithdrawn" in _reasons(e, "cancel-ap"), run["status"]
    rows = history_rows([run])  # what the inbox's history shows
    assert [(x["state"], x["decidedBy"], x["reason"]) for x in rows] == [("Withdrawn", "carol", "not needed")]

    # ---- (e) the deadline: DeadlineExceeded with a clear message, the approval withdrawn
    st = e.wait_phase("deadline", "DeadlineExceeded", "Failed", "Succeeded", timeout=120)
    assert st["phase"] == "DeadlineExceeded" and "spec.activeDeadline=20s passed" in st["message"], st
    assert st["approval"]["state"] == "Withdrawn"
    _wait_exits(e, "deadline", ExitCode.DEADLINE_EXCEEDED)

    # ---- (a) the failed lap, and a retry refused without the verb
    st = e.wait_phase("retry-a", "Failed", "Succeeded", timeout=240)
    assert st["phase"] == "Failed" and st["lap"] == 1, st
    _wait_exits(e, "retry-a", ExitCode.FAILED)
    uid_a = e.get("retry-a")["metadata"]["uid"]
    paid = _keys(e, uid_a, "pay")
    assert [v["executions"] for v in paid.values()] == [1], paid
    r = _patch(e, "carol", "retry-a", _retry_patch(1, "carol"))
    assert r.returncode != 0 and f'needs the "{RETRY_VERB}" verb' in r.stderr and RETRIER_CLUSTERROLE in r.stderr, r.stderr
    ship.broken = False  # the cause fixed
    r = _patch(e, "dave", "retry-a", _retry_patch(1, "dave"))
    assert r.returncode == 0, r.stderr
    st = e.wait_phase("retry-a", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    assert st["lifecycle"]["retries"] == 1 and st["lifecycle"]["lastRetryBy"] == "dave", st
    assert "Retried" in _reasons(e, "retry-a")
    _wait_exits(e, "retry-a", ExitCode.OK)
    r = _cli(e, "trace", "retry-a", "-n", e.ns, "-o", "json")  # the trace says who retried, and which lap
    assert r.returncode == 0, r.stderr
    retries = json.loads(r.stdout)["retries"]
    assert retries["retries"] == 1 and retries["lastRetryBy"] == "dave" and retries["retriedLap"] == 2, retries  # status.lap was 1
    r = _cli(e, "trace", "retry-a", "-n", e.ns)
    assert "retried in place 1 time; the last by dave" in r.stdout and "lap 2 started again at attempt" in r.stdout, r.stdout
    paid = _keys(e, uid_a, "pay")
    assert [(v["executions"], v["requests"]) for v in paid.values()] == [(1, 1)], \
        f"the retry sent the payment again: {paid}"
    # the same failure forked instead: a new uid, so new keys, so the payment is made again
    r = _cli(e, "fork", "retry-a", "--from-lap", "1", "--name", "retry-a-fork", "-n", e.ns)
    assert r.returncode == 0, r.stdout + r.stderr
    st = e.wait_phase("retry-a-fork", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    uid_f = e.get("retry-a-fork")["metadata"]["uid"]
    assert [v["executions"] for v in _keys(e, uid_f, "pay").values()] == [1], "the fork paid again, under its own key"
    orders = [c for c in e.calls("/pay") if (c.get("arguments") or {}).get("order") == "a"]
    assert len(orders) == 2, orders  # once by the retried run, once more by the fork

    # ---- (b) top-up: refused without headroom, then raised and retried in one patch
    st = e.wait_phase("topup", "BudgetExceeded", "Succeeded", "Failed", timeout=180)
    assert st["phase"] == "BudgetExceeded", st
    r = _patch(e, "dave", "topup", _retry_patch(1, "dave"))
    assert r.returncode == 0, r.stderr
    msg = _event(e, "topup", "RetryRefused")
    assert "raise spec.budget.maxCostUSD" in msg, msg
    wait_for("the refused request removed", lambda: ANN_RETRY not in (e.get("topup")["metadata"].get("annotations") or {}))
    r = _patch(e, "dave", "topup", _retry_patch(1, "dave", {"budget": {"maxLaps": 5, "maxCostUSD": "5"}}))
    assert r.returncode == 0, r.stderr
    st = e.wait_phase("topup", "Succeeded", "Failed", "BudgetExceeded", timeout=180)
    assert st["phase"] == "Succeeded" and st["lap"] == 2 and st["lifecycle"]["retries"] == 1, st

    # ---- (c) a retry after the cancel repeats nothing (it removes spec.cancel in the same patch)
    uid_c = e.get("cancel-mid")["metadata"]["uid"]
    r = _patch(e, "dave", "cancel-mid", _retry_patch(1, "dave", {"cancel": None}))
    assert r.returncode == 0, r.stderr
    st = e.wait_phase("cancel-mid", "Succeeded", "Failed", timeout=240)
    assert st["phase"] == "Succeeded", st
    for tool in ("pay", "note"):
        rec = _keys(e, uid_c, tool)
        assert [v["executions"] for v in rec.values()] == [1], (tool, rec)
    assert [v["requests"] for v in _keys(e, uid_c, "pay").values()] == [1], "the journaled payment was sent again"


def test_retry_from_lap_rewinds_in_place_or_is_refused_naming_the_call(people):
    """`agentrun retry --from-lap 1` of a run whose laps after 1 made read-only calls only: the run
    stands at lap 1 again and redoes the later laps as history 1 (same uid, their objects under
    histories/001/, their own keys), and Succeeds; `agentrun trace` shows that history. The same
    rewind of a run that paid after lap 1 is refused with one Event naming the call."""
    e = people
    ship = Switch(e.tool_url)
    try:
        docs = []
        for name, second in (("rewind-ok", "look"), ("rewind-no", "pay")):
            doc = e.run_doc(name, [
                {"content": "look", "toolCalls": [{"name": "look", "arguments": {"order": name}}]},
                {"content": f"{second} again", "toolCalls": [{"name": second, "arguments": {"order": name}}]},
                {"content": "ship", "toolCalls": [{"name": "ship", "arguments": {"order": name}}]},
                {"content": "done"}])
            doc["spec"]["agent"]["tools"] += [
                {"name": "look", "sideEffects": False, "http": {"url": f"{e.tool_url}/look", "timeout": "5s"}},
                {"name": "pay", "http": {"url": f"{e.tool_url}/pay", "timeout": "5s"}},
                {"name": "ship", "sideEffects": False, "http": {"url": f"{ship.url}/ship", "timeout": "5s"}}]
            doc["spec"]["retry"] = {"attemptsPerLap": 1, "backoff": {"initial": "1s", "max": "1s", "factor": 1}}
            docs.append(doc)
        for doc in docs:
            r = _as(e, "carol", "create", "-n", e.ns, "-f", "-", input=yaml.safe_dump(doc))
            assert r.returncode == 0, r.stderr
        for name in ("rewind-ok", "rewind-no"):  # lap 3's ship answers 503: the run fails after lap 2
            st = e.wait_phase(name, "Failed", "Succeeded", timeout=120)
            assert st["phase"] == "Failed" and st["lap"] == 2, st
        ship.broken = False

        # the run that paid after lap 1: refused, naming the payment; nothing changes
        r = _cli(e, "retry", "rewind-no", "--from-lap", "1", "-n", e.ns, "--as", "dave")
        assert r.returncode == 0 and "rewinding in place to lap 1" in r.stdout, r.stdout + r.stderr
        msg = _event(e, "rewind-no", "RetryRefused")
        assert 'call call_1 of tool "pay" in lap 2 has side effects' in msg and "fork from lap 1" in msg, msg
        wait_for("the refused request removed",
                 lambda: ANN_RETRY not in (e.get("rewind-no")["metadata"].get("annotations") or {}))
        st = e.status("rewind-no")
        assert st["phase"] == "Failed" and st["lap"] == 2 and not st.get("lifecycle", {}).get("rewinds"), st

        # the read-only run: rewound to lap 1, laps 2.. redone as history 1, Succeeded
        uid = e.get("rewind-ok")["metadata"]["uid"]
        r = _cli(e, "retry", "rewind-ok", "--from-lap", "1", "-n", e.ns, "--as", "dave")
        assert r.returncode == 0, r.stdout + r.stderr
        st = e.wait_phase("rewind-ok", "Succeeded", "Failed", timeout=120)
        assert st["phase"] == "Succeeded" and st["lap"] == 4, st
        lc = st["lifecycle"]
        assert lc["rewinds"] == [1] and lc["lastRetryFromLap"] == 1 and lc["lastRetryBy"] == "dave", lc
        assert "rewound in place to lap 1" in _event(e, "rewind-ok", "Retried")
        assert e.get("rewind-ok")["metadata"]["uid"] == uid
        r = _cli(e, "trace", "rewind-ok", "-n", e.ns, "-o", "json")
        assert r.returncode == 0, r.stderr
        laps = json.loads(r.stdout)["laps"]
        assert [x["lap"] for x in laps] == [1, 2, 3, 4], laps
        assert "/histories/" not in laps[0]["key"] and all("/histories/001/laps/" in x["key"] for x in laps[1:])
        assert laps[1]["toolCalls"][0]["idempotencyKey"].endswith(".h1:2:look:call_1"), laps[1]["toolCalls"]
        assert laps[1]["prevSha256"] == laps[0]["sha256"], "the hash chain goes on across the rewind"
        r = _cli(e, "trace", "rewind-ok", "-n", e.ns)
        assert "rewound in place 1 time: history 1 (laps after 1, under histories/001/)" in r.stdout, r.stdout
        looks = [c for c in e.calls("/look") if (c.get("arguments") or {}).get("order") == "rewind-ok"]
        assert len(looks) == 3, looks  # lap 1, lap 2, and lap 2 again in the new history: read-only, redone
    finally:
        ship.close()
