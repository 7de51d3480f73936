"""The chaos suite's cuttable S3 proxy (e2e/chaos/proxy.py)."""

from __future__ import annotations

import socket
import threading

from e2e.chaos.proxy import CuttableProxy


def test_a_cut_ends_the_upstream_half_of_a_connection_in_the_middle_of_a_request():
    """Regression (found by the chaos ci schedule, seed 7): the proxy closed its sockets on a cut,
    but close() does not end a socket another thread is blocked in recv() on, so the S3 server never
    learnt the connection was gone. It waited for the rest of a PUT body forever while holding its
    write lock (e2e/s3_server.py), every later PUT hung, and the laps ran into lapTimeout. Now the
    upstream sees the end of the connection as soon as the proxy is cut."""
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(5)
    got: dict = {}
    headers_seen = threading.Event()

    def server() -> None:
        conn, _ = upstream.accept()
        conn.settimeout(60)  # a generous bound: the fix makes the read end at once
        try:
            got["headers"] = conn.recv(1000)
            headers_seen.set()
            got["rest"] = conn.recv(1000)  # the body never comes: the cut must end this read
        except OSError as e:
            got["error"] = e
        finally:
            headers_seen.set()

    t = threading.Thread(target=server, daemon=True)
    t.start()
    proxy = CuttableProxy(upstream.getsockname()[1])
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        client.sendall(b"PUT /b/k HTTP/1.1\r\nContent-Length: 10\r\n\r\n")  # headers, no body yet
        assert headers_seen.wait(60)
        proxy.cut()
        t.join(90)
        assert not t.is_alive()
        assert not isinstance(got.get("error"), TimeoutError), got
        assert got.get("rest") == b"" or isinstance(got.get("error"), ConnectionError), got
        assert proxy.refused == 0
        client.close()
    finally:
        proxy.close()
        upstream.close()
