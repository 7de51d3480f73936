"""The chaos tool server's holds (e2e/chaos/holds.py), over real HTTP: the first request of a named
call waits, unanswered and not executed, until released; its retry passes and is answered from the
record; a hold nobody releases lets go by itself."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from e2e.chaos.holds import HoldingRecorder, tool_server


@pytest.fixture
def server():
    srv = tool_server.serve(0, None, recorder=HoldingRecorder({"r/1/1"}, max_seconds=30))
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.recorder.release_all()
    srv.shutdown()


def _post(url: str, order: str, key: str, out: list | None = None) -> dict:
    req = urllib.request.Request(f"{url}/note", data=json.dumps({"order": order}).encode(),
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        got = {"replayed": r.headers.get("Idempotent-Replayed") == "true", **json.load(r)}
    if out is not None:
        out.append(got)
    return got


def _until(cond, timeout: float = 30.0) -> None:
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, "condition not reached"
        time.sleep(0.02)


def test_a_named_call_is_held_until_released_then_executed_once(server):
    srv, url = server
    rec: HoldingRecorder = srv.recorder
    assert _post(url, "r/0/1", "k0")["ok"]  # not named: straight through
    answers: list = []
    t = threading.Thread(target=_post, args=(url, "r/1/1", "k1", answers), daemon=True)
    t.start()
    _until(lambda: "r/1/1" in rec.held())
    time.sleep(0.3)  # held means held: no answer, no execution, listed in flight
    assert answers == [] and rec.record()["keys"]["k1"]["executions"] == 0
    assert [e["idempotencyKey"] for e in rec.inflight] == ["k1"]
    rec.release("r/1/1")
    t.join(30)
    assert answers and answers[0]["ok"] and not answers[0]["replayed"]
    assert rec.let_go["r/1/1"] == "released" and rec.held() == {}
    # the retried attempt sends the same key: not held again, answered from the record
    again = _post(url, "r/1/1", "k1")
    assert again["replayed"]
    k1 = rec.record()["keys"]["k1"]
    assert (k1["requests"], k1["executions"], k1["replays"]) == (2, 1, 1)


def test_a_held_call_whose_client_is_gone_is_still_executed_on_release(server):
    """A SIGKILLed lap: the connection closes while the call is held; the tool finishes the call it
    had begun when released, so the retry must be answered from the record."""
    import socket

    srv, url = server
    rec: HoldingRecorder = srv.recorder
    body = json.dumps({"order": "r/1/1"}).encode()
    s = socket.create_connection(("127.0.0.1", srv.server_address[1]))
    s.sendall(b"POST /note HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    _until(lambda: "r/1/1" in rec.held())
    s.close()
    rec.release("r/1/1")
    _until(lambda: rec.record()["keys"]["k1"]["executions"] == 1)
    assert _post(url, "r/1/1", "k1")["replayed"]


def test_a_hold_nobody_releases_lets_go_by_itself():
    srv = tool_server.serve(0, None, recorder=HoldingRecorder({"r/1/1"}, max_seconds=0.5))
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert _post(url, "r/1/1", "k1")["ok"]
        assert srv.recorder.let_go == {"r/1/1": "timed out"}
    finally:
        srv.shutdown()


def test_release_before_arrival_cancels_the_hold(server):
    srv, url = server
    srv.recorder.release("r/1/1")
    assert _post(url, "r/1/1", "k1")["ok"] and srv.recorder.let_go == {}


# ------------------------------------------------------------------ count_before_dedup (issue 36)


def _post_slow(url: str, order: str, key: str, out: list) -> None:
    """A call that takes 0.5 s at the tool (its ``sleepSeconds``), so a second one can overlap it."""
    req = urllib.request.Request(f"{url}/note", data=json.dumps({"order": order, "sleepSeconds": 0.5}).encode(),
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        out.append(json.load(r))


def _twice_at_once(recorder: HoldingRecorder, key: str = "k9") -> dict:
    """The same key sent twice concurrently (what a lap sending a call twice, or two Jobs of one
    lap, would do) to a real server; that key's entry of the record."""
    srv = tool_server.serve(0, None, recorder=recorder)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        out: list = []
        first = threading.Thread(target=_post_slow, args=(url, "r/9/1", key, out), daemon=True)
        first.start()
        _until(lambda: any(e["idempotencyKey"] == key for e in recorder.inflight))
        _post_slow(url, "r/9/1", key, out)
        first.join(30)
        assert len(out) == 2
        return recorder.record()
    finally:
        srv.shutdown()


def test_counting_before_dedup_shows_a_key_sent_twice_concurrently_as_executed_twice():
    """The negative control of "executions per key == 1" (issue 36): the plain server deduplicates
    under its lock after the call's work, so it executes the key once and the invariant cannot see
    the double send; counted at arrival (the ci schedule's mode), the invariant fires."""
    from e2e.chaos import invariants as inv

    plain = _twice_at_once(HoldingRecorder())
    assert (plain["keys"]["k9"]["executions"], plain["keys"]["k9"]["replays"]) == (1, 1)
    counted = _twice_at_once(HoldingRecorder(count_before_dedup=True))
    k9 = counted["keys"]["k9"]
    assert (k9["requests"], k9["executions"], k9["replays"], k9["executionsAtDedup"]) == (2, 2, 0, 1)
    assert counted["totals"]["requests"] == counted["totals"]["executions"] + counted["totals"]["replays"]
    ev = inv.Evidence(plans=[], runs={}, tool=counted)
    assert any("key k9: executed 2 times" in v for v in inv.check_side_effects(ev)), inv.check_side_effects(ev)
    ev.tool = plain
    assert not any("executed 2 times" in v for v in inv.check_side_effects(ev))


def test_counting_before_dedup_leaves_sequential_retries_and_a_fault_victims_call_alone():
    """A retry after the first call was answered is a replay, not an execution; a retry arriving while
    the held call of a fault's victim (its lap killed) is still at the tool is the one call in flight
    at a crash, left to the tool's Idempotency-Key handling: counted apart, not as an execution."""
    rec = HoldingRecorder({"r/1/1"}, max_seconds=30, count_before_dedup=True)
    srv = tool_server.serve(0, None, recorder=rec)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        _post(url, "r/0/1", "k0")
        assert _post(url, "r/0/1", "k0")["replayed"]
        held: list = []
        t = threading.Thread(target=_post, args=(url, "r/1/1", "k1", held), daemon=True)
        t.start()
        _until(lambda: "r/1/1" in rec.held())
        assert _post(url, "r/1/1", "k1")["ok"]  # the retried attempt, while the victim's call is still held
        rec.release("r/1/1")
        t.join(30)
        got = rec.record()
    finally:
        rec.release_all()
        srv.shutdown()
    assert (got["keys"]["k0"]["executions"], got["keys"]["k0"]["replays"]) == (1, 1)
    k1 = got["keys"]["k1"]
    assert (k1["requests"], k1["executions"], k1["overlapsAbandoned"]) == (2, 1, 1), k1
    assert got["mode"] == "count-before-dedup" and got["totals"]["overlapsAbandoned"] == 1
