"""The chaos runner's own checks (issue 36), each shown able to fire: the apiserver restart's
"landed" (a new process and a request refused while it was down, not the time it took, which is
always > 0), the probe behind it against a real closed port and a real live server, and the stall
bound that replaced the ci schedule's fixed deadlines (derived from the pace measured so far)."""

from __future__ import annotations

import socket
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

from e2e.chaos import runner
from e2e.chaos.schedule import build


def test_an_apiserver_restart_lands_only_with_a_new_process_and_a_refused_request():
    assert runner.apiserver_restart_landed(100, 200, True) == (True, "")
    landed, why = runner.apiserver_restart_landed(100, 100, True)
    assert not landed and "pid did not change (100 -> 100)" in why
    landed, why = runner.apiserver_restart_landed(100, 200, False)
    assert not landed and "was answered" in why
    assert not runner.apiserver_restart_landed(None, 200, True)[0]


def test_the_probe_sees_a_stopped_server_and_a_live_one():
    with socket.socket() as s:  # a port nobody listens on: what the apiserver's is while it is stopped
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert runner.probe_refused(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5))

    class OK(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), OK)
    Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/"
        assert not runner.probe_refused(lambda: urllib.request.urlopen(url, timeout=5).read())
    finally:
        srv.shutdown()


def test_the_stall_bound_grows_with_the_pace_measured():
    assert runner.stall_bound([]) == runner.STALL_SECONDS
    assert runner.stall_bound([1.0, 2.0, 3.0]) == runner.STALL_SECONDS  # a quick box: the floor
    assert runner.stall_bound([1.0, 40.0]) == runner.STALL_FACTOR * 40.0  # a loaded one: ten of its worst gaps


def test_the_ci_schedule_has_no_fixed_deadline_and_counts_executions_before_dedup():
    for scn in build("ci", 7):
        assert scn.timeout is None and scn.count_before_dedup, scn.name
