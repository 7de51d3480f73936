"""Webhook notifications of approvals (agentrun.notify) against the local control plane and a local
webhook receiver that answers 500 to the first message and 200 after:

* an approval is announced once as "requested" (after a retry: the 500) and once as
  "deadline near", across a restart of the notifier (SIGKILL between the two), because what was
  delivered is recorded in status.approval.notified;
* the messages carry owner, run, tool, an argument summary, the deadline, the inbox link and an
  Idempotency-Key.

The notifier runs as ``python -m agentrun.notify`` with the admin kubeconfig (like the operator);
the operator itself (test_operator_e2e's ``env``) runs the runs. The last test announces run
outcomes chosen by a namespace's AgentRunPolicy (notifications.outcomes). No sleeps: every wait is
on a condition. "No duplicate after the restart" is observed with sentinel runs: a run created after
the last record is announced only in a later scan, and each scan evaluates every run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from e2e.cluster import wait_tenancy_admitted
from e2e_support import wait_for
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class Receiver:
    """A webhook: 500 to the first request, 200 after; keeps (status answered, headers, body)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, dict, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    status = 500 if not outer.got else 200
                    outer.got.append((status, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/hook"

    def delivered(self, name: str, kind: str | None = None) -> list[dict]:
        with self.lock:
            return [b for s, _, b in self.got if s == 200 and b["name"] == name and (kind is None or b["kind"] == kind)]

    def attempts(self, name: str, kind: str) -> list[tuple[int, dict]]:
        with self.lock:
            return [(s, h) for s, h, b in self.got if b["name"] == name and b["kind"] == kind]


def start_notifier(e, url: str, log) -> subprocess.Popen:
    penv = e.cluster.env()
    penv.update({"AGENTRUN_NOTIFY_WEBHOOK_URL": url, "AGENTRUN_NAMESPACES": e.ns,
                 "AGENTRUN_NOTIFY_INTERVAL_SECONDS": "1", "AGENTRUN_NOTIFY_BACKOFF_SECONDS": "1",
                 "AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS": "40", "AGENTRUN_INBOX_URL": "https://inbox.example"})
    return subprocess.Popen([sys.executable, "-m", "agentrun.notify"], env=penv, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def approval_run(e, name: str, timeout: str) -> None:
    script = [{"content": "paying", "toolCalls": [{"name": "refund", "arguments": {"order": name, "amount": "12.00"}}]},
              {"content": "finished"}]
    e.apply(e.run_doc(name, script, approval_timeout=timeout))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kube_requests(port: int) -> dict[tuple[str, str], float]:
    """The operator's agentrun_kube_requests_total by (verb, resource), summed over codes; {} while
    its /metrics does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("agentrun_kube_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            key = (labels["verb"].strip('"'), labels["resource"].strip('"'))
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def notified(e, name: str) -> dict:
    return (e.status(name).get("approval") or {}).get("notified") or {}


def test_each_approval_is_announced_once_per_kind_across_a_restart(env, tmp_path):  # noqa: F811
    e = env
    rx = Receiver()
    log = open(tmp_path / "notify.log", "ab")
    procs = [start_notifier(e, rx.url, log)]
    try:
        approval_run(e, "notify-a", "60s")  # deadline near (40 s before the deadline) ~20 s after the request
        wait_for("notify-a requested, recorded", lambda: notified(e, "notify-a").get("requestedAt"), timeout=180)
        # the first delivery got the 500 and was retried
        assert [s for s, _ in rx.attempts("notify-a", "requested")] == [500, 200]
        assert not rx.delivered("notify-a", "deadline-near")
        os.killpg(procs[0].pid, signal.SIGKILL)  # a crash, between the two messages
        procs[0].wait(10)
        procs.append(start_notifier(e, rx.url, log))
        wait_for("notify-a deadline near, recorded", lambda: notified(e, "notify-a").get("deadlineNearAt"), timeout=120)
        # sentinels: B is announced in a scan that listed every run after A's last record; C in a later one
        for sentinel in ("notify-b", "notify-c"):
            approval_run(e, sentinel, "1h")
            wait_for(f"{sentinel} announced", lambda: rx.delivered(sentinel, "requested"), timeout=180)
        assert len(rx.delivered("notify-a", "requested")) == 1
        assert len(rx.delivered("notify-a", "deadline-near")) == 1
        assert len(rx.delivered("notify-b")) == 1
        msg = rx.delivered("notify-a", "requested")[0]
        status = e.get("notify-a")
        assert (msg["owner"], msg["tool"], msg["namespace"], msg["callId"]) == (
            "e2e-team", "refund", e.ns, status["status"]["approval"]["callId"])
        assert msg["arguments"] == "amount=12.00, order=notify-a"
        assert msg["deadline"] == status["status"]["approval"]["deadline"]
        assert msg["inbox"] == f"https://inbox.example/#run-{e.ns}.notify-a"
        headers = [h for s, h in rx.attempts("notify-a", "requested")]
        keys = {h.get("Idempotency-Key") for h in headers}
        target = status["status"]["approval"]["targetSha256"]  # a request asked again for a new target is new
        assert keys == {f"{status['metadata']['uid']}:{msg['callId']}:requested:{target[:16]}"}
        assert msg["target"] == f"POST {e.tool_url}/refund" and msg["headersSecret"] is None
        assert rx.url not in (tmp_path / "notify.log").read_text()  # the webhook URL is a secret
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
        rx.srv.shutdown()
        log.close()


def test_the_operator_announces_and_a_restarted_operator_does_not_repeat(env, tmp_path, monkeypatch):  # noqa: F811
    """The notifier as the chart runs it: a thread of ``agentrun operator`` (only the Lease holder
    announces). The operator is SIGKILLed between the two messages of one approval and started
    again: each kind arrives once, the first after the receiver's 500.

    Inside the operator the notifier reads the watch cache: the restarted operator LISTs the
    AgentRuns once (its informer) and never again while the notifier scans every second (the
    API-polling notifier made one LIST per scan), and its records are status patches."""
    e = env
    rx = Receiver()
    port = free_port()
    notify = {"AGENTRUN_NOTIFY_WEBHOOK_URL": rx.url, "AGENTRUN_NOTIFY_INTERVAL_SECONDS": "1",
              "AGENTRUN_NOTIFY_BACKOFF_SECONDS": "1", "AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS": "40",
              "AGENTRUN_INBOX_URL": "https://inbox.example", "AGENTRUN_METRICS_PORT": str(port)}
    plain = e.operator_env
    e.kill_operator()
    monkeypatch.setattr(e, "operator_env", lambda **extra: plain(**{**notify, **extra}))
    e.start_operator()
    try:
        approval_run(e, "notify-op", "60s")
        wait_for("notify-op requested, recorded", lambda: notified(e, "notify-op").get("requestedAt"), timeout=180)
        assert [s for s, _ in rx.attempts("notify-op", "requested")] == [500, 200]
        assert not rx.delivered("notify-op", "deadline-near")
        e.kill_operator()  # SIGKILL, between the two messages
        e.start_operator()
        # the restarted operator's informer listed the runs (its cache is being filled)
        synced = wait_for("the restarted operator's runs listed",
                          lambda: (got := kube_requests(port)).get(("list", "agentruns")) and got, timeout=120)
        wait_for("notify-op deadline near, recorded", lambda: notified(e, "notify-op").get("deadlineNearAt"),
                 timeout=120)
        approval_run(e, "notify-op-sentinel", "1h")  # announced in a scan that saw notify-op's records
        wait_for("notify-op-sentinel announced", lambda: rx.delivered("notify-op-sentinel", "requested"), timeout=180)
        assert len(rx.delivered("notify-op", "requested")) == 1
        assert len(rx.delivered("notify-op", "deadline-near")) == 1
        # ~20 one-second scans from the restart to "deadline near": no LIST of the runs but the
        # informer's own (one more only if its watch expired meanwhile: a relist)
        after = kube_requests(port)
        lists = after.get(("list", "agentruns"), 0) - synced[("list", "agentruns")]
        assert lists <= 1, f"the notifier in the operator LISTs the runs: {lists:.0f} LISTs; {after}"
        assert after.get(("get", "agentruns"), 0) == 0, after
        assert after.get(("patch", "agentruns/status"), 0) >= 2, after  # its records (and the operator's)
        assert rx.url not in e.log.read_text()  # the webhook URL is a secret: not in the operator's log
    finally:
        e.kill_operator()
        monkeypatch.setattr(e, "operator_env", plain)
        e.start_operator()
        rx.srv.shutdown()


def test_the_operator_announces_the_outcomes_a_namespaces_policy_chooses(env, tmp_path, monkeypatch):  # noqa: F811
    """Outcomes chosen by policy (issue 31, item 6): the chart's default is empty; the operator
    watches two namespaces, one under the local AgentRunPolicy (no notifications) and one labelled
    for a team AgentRunPolicy with ``notifications.outcomes: [Succeeded]``. A run without spec.notify
    is announced once in the team's namespace and never in the other; the team's run with
    ``spec.notify.outcomes: []`` is not (the run's choice comes first). "Never" is observed with a
    sentinel (a run with spec.notify, created after the others had Succeeded): each scan of the
    notifier evaluates every run."""
    from e2e_support import delete_team_policy

    from agentrun.api import tenancy as t
    from agentrun.api import tenancy_admission as ta

    e = env
    rx = Receiver()
    team_ns, pname = f"{e.ns}-team", f"notify-{e.ns}"
    c = e.cluster
    c.kubectl_run("create", "namespace", team_ns)
    c.kubectl_run("label", "namespace", team_ns, f"{t.NAMESPACE_LABEL}={pname}")
    c.kubectl_run("create", "serviceaccount", "agentrun-lap", "-n", team_ns)
    c.kubectl_run("create", "secret", "generic", "s3-creds", "-n", team_ns,
                  f"--from-literal=AWS_ACCESS_KEY_ID={e.s3.access_key}",
                  f"--from-literal=AWS_SECRET_ACCESS_KEY={e.s3.secret_key}")
    policy = ta.policy_object(pname, ta.LOCAL_POLICY)
    policy["spec"]["notifications"] = {"outcomes": ["Succeeded"]}
    for doc in (policy, ta.binding(f"{t.VAP_NAME}-{pname}", pname, {"matchLabels": {t.NAMESPACE_LABEL: pname}})):
        c.kubectl_run("apply", "-f", "-", input=json.dumps(doc))
    wait_tenancy_admitted(c, namespace=team_ns)
    notify = {"AGENTRUN_NOTIFY_WEBHOOK_URL": rx.url, "AGENTRUN_NOTIFY_INTERVAL_SECONDS": "1",
              "AGENTRUN_NOTIFY_BACKOFF_SECONDS": "1", "AGENTRUN_NOTIFY_OUTCOMES": "",
              "AGENTRUN_NAMESPACES": f"{e.ns},{team_ns}"}
    plain = e.operator_env
    e.kill_operator()
    monkeypatch.setattr(e, "operator_env", lambda **extra: plain(**{**notify, **extra}))
    e.start_operator()
    done = [{"content": "finished"}]

    def run_in(ns: str, name: str, **spec) -> None:
        c.kubectl_run("apply", "-n", ns, "-f", "-", input=json.dumps(e.run_doc(name, done, **spec)))

    def phase(ns: str, name: str) -> str | None:
        r = c.kubectl_run("get", "agentrun", name, "-n", ns, "-o", "jsonpath={.status.phase}", check=False)
        return r.stdout.strip() or None

    def record(ns: str, name: str) -> dict:
        r = c.kubectl_run("get", "agentrun", name, "-n", ns, "-o", "json", check=False)
        return ((json.loads(r.stdout).get("status") or {}).get("lifecycle") or {}).get("notified") or {} \
            if r.returncode == 0 else {}

    try:
        run_in(e.ns, "outcome-plain")                               # the local policy chooses nothing: none
        run_in(team_ns, "outcome-team")                             # the team policy chooses Succeeded: one
        run_in(team_ns, "outcome-team-optout", notify={"outcomes": []})  # the run's own choice: none
        for ns, name in ((e.ns, "outcome-plain"), (team_ns, "outcome-team"), (team_ns, "outcome-team-optout")):
            wait_for(f"{name} Succeeded", lambda: phase(ns, name) == "Succeeded", timeout=180)
        wait_for("outcome-team announced, recorded", lambda: record(team_ns, "outcome-team").get("phase"), timeout=120)
        run_in(e.ns, "outcome-sentinel", notify={"outcomes": ["Succeeded"]})
        wait_for("outcome-sentinel announced", lambda: rx.delivered("outcome-sentinel", "outcome"), timeout=180)
        assert len(rx.delivered("outcome-team", "outcome")) == 1
        assert rx.attempts("outcome-plain", "outcome") == [] and rx.attempts("outcome-team-optout", "outcome") == []
        assert record(e.ns, "outcome-plain") == {} and record(team_ns, "outcome-team-optout") == {}
        msg = rx.delivered("outcome-team", "outcome")[0]
        uid = json.loads(c.kubectl_run("get", "agentrun", "outcome-team", "-n", team_ns, "-o", "json").stdout)[
            "metadata"]["uid"]
        assert (msg["namespace"], msg["phase"], msg["idempotencyKey"]) == (team_ns, "Succeeded", f"{uid}:outcome:Succeeded:0")
        assert record(team_ns, "outcome-team")["phase"] == "Succeeded"
    finally:
        e.kill_operator()
        monkeypatch.setattr(e, "operator_env", plain)
        e.start_operator()
        rx.srv.shutdown()
        delete_team_policy(c, pname)
        c.kubectl_run("delete", "namespace", team_ns, "--wait=false", check=False)
