"""The notifier's delivery loop (agentrun.notify.sender) against a real local HTTP receiver, with
the Kubernetes API as a small in-memory port (list and status patch) and a controlled clock:
retries back off per message, a delivered message is recorded once and never sent again, and a
failed status write is retried without sending again."""
from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrun.notify import plan
from agentrun.notify.sender import Notifier, from_env

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class Api:
    """The notifier's ports (the runs, the status writer) over one run dict."""

    def __init__(self, run: dict) -> None:
        self.run, self.patches, self.fail_patches = run, [], 0

    def runs(self):  # the notifier's source port
        return [json.loads(json.dumps(self.run))]

    def patch_status(self, ns, name, patch):  # its status writer port
        if self.fail_patches:
            self.fail_patches -= 1
            raise RuntimeError("409")
        self.patches.append(patch)
        self.run["status"]["approval"]["notified"] = patch["status"]["approval"]["notified"]


def ports(api) -> dict:
    """The notifier's ports of a fake: its runs and its status writer."""
    return {"runs": api.runs, "patch_status": api.patch_status}


#: Ports for a notifier that is only configured, never run.
NO_PORTS: dict = {"runs": tuple, "patch_status": lambda *a: None}


@pytest.fixture()
def receiver():
    answers: list[int] = []
    got: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(answers.pop(0) if answers else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/", answers, got
    srv.shutdown()
    srv.server_close()


def waiting(deadline_in=3600):
    return {"metadata": {"namespace": "ns", "name": "r", "uid": "u"},
            "spec": {"approval": {"owner": "o"}},
            "status": {"phase": "AwaitingApproval", "approval": {
                "state": "Pending", "callId": "c1", "tool": "pay", "lap": 1, "owner": "o",
                "deadline": (NOW + timedelta(seconds=deadline_in)).isoformat(), "arguments": "{}"}}}


def test_backoff_per_message_then_recorded_once(receiver):
    url, answers, got = receiver
    answers += [500, 503]
    api = Api(waiting())
    t = [0.0]
    n = Notifier(**ports(api), url=url, settings=plan.Settings(deadline_near_seconds=60), backoff=1.0, clock=lambda: t[0])
    n.scan(NOW)  # 500: retry after 1 s
    n.scan(NOW)  # too early: nothing sent
    assert len(got) == 1
    t[0] = 1.0
    n.scan(NOW)  # 503: retry after 2 s
    t[0] = 2.5
    n.scan(NOW)
    assert len(got) == 2
    t[0] = 3.0
    n.scan(NOW)  # delivered, recorded
    assert len(got) == 3 and [p["status"]["approval"]["notified"]["callId"] for p in api.patches] == ["c1"]
    for _ in range(3):
        n.scan(NOW)
    assert len(got) == 3  # never again
    n.scan(NOW + timedelta(seconds=3590))  # now the deadline is near
    assert [b["kind"] for b in got] == ["requested", "requested", "requested", "deadline-near"]
    n.stop()


def test_a_failed_status_write_is_retried_without_sending_again(receiver):
    url, _, got = receiver
    api = Api(waiting())
    api.fail_patches = 2
    n = Notifier(**ports(api), url=url, clock=lambda: 0.0)
    for _ in range(4):
        n.scan(NOW)
    assert len(got) == 1 and len(api.patches) == 1
    n.stop()


def test_a_restarted_notifier_reads_the_record(receiver):
    url, _, got = receiver
    api = Api(waiting())
    Notifier(**ports(api), url=url, clock=lambda: 0.0).scan(NOW)
    Notifier(**ports(api), url=url, clock=lambda: 0.0).scan(NOW)  # a new process: only the status record
    assert len(got) == 1


def test_configuration_from_the_environment():
    assert from_env({}, **NO_PORTS) is None
    n = from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "https://hooks.example/x", "AGENTRUN_NOTIFY_FORMAT": "teams",
                  "AGENTRUN_NAMESPACES": "a, b", "AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS": "120"}, **NO_PORTS)
    assert (n.fmt, n.namespaces, n.settings.deadline_near_seconds) == ("teams", ("a", "b"), 120)
    n.stop()
    for env, field in [({"AGENTRUN_NOTIFY_FORMAT": "discord"}, "AGENTRUN_NOTIFY_FORMAT"),
                       ({"AGENTRUN_NOTIFY_INTERVAL_SECONDS": "soon"}, "AGENTRUN_NOTIFY_INTERVAL_SECONDS"),
                       ({"AGENTRUN_NOTIFY_BACKOFF_SECONDS": "0"}, "AGENTRUN_NOTIFY_BACKOFF_SECONDS")]:
        with pytest.raises(ValueError, match=field):
            from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "https://hooks.example/x", **env}, **NO_PORTS)
    with pytest.raises(ValueError, match="http"):
        from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "hooks.example/x"}, **NO_PORTS)


def test_only_an_active_notifier_announces(receiver):
    url, _, got = receiver
    leader = threading.Event()
    # the notifier's own loop reads the wall clock: a deadline an hour after *now* (not the fixed
    # NOW), so "deadline near" is not due whenever this runs
    ahead = int((datetime.now(UTC) - NOW).total_seconds()) + 3600
    n = Notifier(**ports(Api(waiting(deadline_in=ahead))), url=url, interval=0.05, active=leader.is_set).start()
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        # not the leader: it turns (ticks) without scanning
        while n.ticks < 3 and datetime.now(UTC) < deadline:
            leader.wait(0.05)
        assert n.ticks >= 3 and n.scans == 0 and not got
        leader.set()
        # the delivery lands before the scan that made it is counted: wait for both
        while (not got or n.scans < 1) and datetime.now(UTC) < deadline:
            threading.Event().wait(0.05)
        assert len(got) == 1 and n.scans >= 1
    finally:
        n.stop()


def test_the_runs_come_from_the_source_and_the_record_goes_through_the_writer(receiver):
    """The operator's wiring (its watch cache, its own-write path) as the standalone's
    (WatchedRuns): each scan asks the source, each record is one call of the writer."""
    url, _, got = receiver
    run = waiting()
    reads: list[int] = []
    writes: list[tuple[str, str, dict]] = []

    def runs() -> list[dict]:
        reads.append(1)
        return [run]

    def patch_status(ns: str, name: str, patch: dict) -> None:
        writes.append((ns, name, patch))
        run["status"]["approval"]["notified"] = patch["status"]["approval"]["notified"]

    n = Notifier(runs=runs, patch_status=patch_status, url=url, clock=lambda: 0.0)
    n.scan(NOW)
    n.scan(NOW)
    assert len(reads) == 2 and len(got) == 1
    assert [(ns, name, p["status"]["approval"]["notified"]["callId"]) for ns, name, p in writes] == [("ns", "r", "c1")]
    n.stop()


def test_a_woken_notifier_scans_before_its_interval(receiver):
    url, _, got = receiver
    run = {"metadata": {"namespace": "ns", "name": "r", "uid": "u"}, "status": {"phase": "Running"}}
    n = Notifier(runs=lambda: [run], patch_status=lambda *a: None, url=url, interval=3600.0).start()
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        while n.scans < 1 and datetime.now(UTC) < deadline:  # the first scan, at start
            threading.Event().wait(0.02)
        ahead = int((datetime.now(UTC) - NOW).total_seconds()) + 3600
        run.update(waiting(deadline_in=ahead))  # the run starts waiting; the cache wakes the notifier
        n.wake()
        # the delivery lands before the scan that made it is counted: wait for both
        while (not got or n.scans < 2) and datetime.now(UTC) < deadline:
            threading.Event().wait(0.02)
        assert [b["kind"] for b in got] == ["requested"] and n.scans >= 2  # long before the hour's interval
    finally:
        n.stop()


def test_the_retries_and_unrecorded_deliveries_of_messages_no_longer_due_are_forgotten(receiver):
    """_retry (a failing delivery) and _sent (delivered, record failing) are kept only for messages
    still due: once the approval is decided (or the run deleted) they are dropped at the next scan."""
    url, answers, got = receiver
    answers += [500]
    api = Api(waiting())
    n = Notifier(**ports(api), url=url, settings=plan.Settings(deadline_near_seconds=60), clock=lambda: 0.0)
    n.scan(NOW)  # 500: the message waits in _retry
    assert len(n._retry) == 1
    api.run["status"]["approval"]["state"] = "Approved"  # decided meanwhile: nothing is due
    n.scan(NOW)
    assert n._retry == {} and n._sent == {}

    api2 = Api(waiting())
    api2.fail_patches = 1
    n2 = Notifier(**ports(api2), url=url, settings=plan.Settings(deadline_near_seconds=60))
    n2.scan(NOW)  # delivered, the record failed: kept in _sent
    assert len(n2._sent) == 1
    api2.run["status"]["phase"] = "Running"
    n2.scan(NOW)
    assert n2._sent == {}


def test_check_env_names_the_variable_of_a_bad_setting():
    from agentrun.notify.sender import check_env

    check_env({})  # no webhook: nothing to check
    check_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "https://hooks.example/x"})
    with pytest.raises(ValueError, match="AGENTRUN_NOTIFY_WEBHOOK_URL") as err:
        check_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "hooks.example/secret-token"})
    assert "secret-token" not in str(err.value)
    with pytest.raises(ValueError, match="AGENTRUN_NOTIFY_INTERVAL_SECONDS"):
        check_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "https://h/x", "AGENTRUN_NOTIFY_INTERVAL_SECONDS": "0"})


def test_the_standalone_source_keeps_the_runs_its_informer_lists_and_watches():
    """WatchedRuns, the informer's sink (python -m agentrun.notify): a relist drops the runs of its
    scope no longer listed, a deletion drops the run, and an event older than what a status
    write's answer left is not applied over it (the record would read as missing)."""
    from types import SimpleNamespace

    from agentrun.notify.sender import WatchedRuns

    def run(ns: str, name: str, rv: int, notified: bool = False) -> dict:
        return {"metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv)},
                "status": {"approval": {"notified": {"callId": "c1"}}} if notified else {}}

    src = WatchedRuns(SimpleNamespace(configuration=SimpleNamespace(host="https://10.0.0.1:6443")), ("a", "b"))
    assert [inf.path for inf in src.informers] == ["/apis/agentrun.dev/v1alpha1/namespaces/a/agentruns",
                                                   "/apis/agentrun.dev/v1alpha1/namespaces/b/agentruns"]
    src.replace("runs", "a", [run("a", "x", 1), run("a", "y", 1)])
    src.replace("runs", "b", [run("b", "z", 1)])
    src.replace("runs", "a", [run("a", "x", 2)])  # y went while the watch was expired
    assert sorted((r["metadata"]["name"], r["metadata"]["resourceVersion"]) for r in src.runs()) == [
        ("x", "2"), ("z", "1")]
    with src._lock:
        src._keep(run("a", "x", 5, notified=True))  # a status write's answer
    src.event("runs", "MODIFIED", run("a", "x", 4))  # an older event, delivered after it
    assert [r["status"] for r in src.runs() if r["metadata"]["name"] == "x"] == [{"approval": {"notified": {"callId": "c1"}}}]
    src.event("runs", "DELETED", run("b", "z", 6))
    assert [r["metadata"]["name"] for r in src.runs()] == ["x"]
    src.loop.close()
