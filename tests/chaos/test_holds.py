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
