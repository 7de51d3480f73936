"""A TCP proxy in front of the S3 server that the chaos suite can cut.

moto keeps its objects in memory: a killed server loses every checkpoint. The chaos suite keeps the
S3 server up and makes it unavailable at the network level instead: ``cut()`` resets every open
connection (pooled keep-alive ones too) and every new one until ``resume()``. For a client that is
an S3 endpoint refusing connections: an honest outage, with the data kept.
"""

from __future__ import annotations

import socket
import threading


class CuttableProxy:
    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", port))
        self.lsock.listen(512)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.up = True
        self.refused = 0  # connections reset while cut: clients did meet the outage
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="s3-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _reset(s: socket.socket) -> None:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        except OSError:
            pass
        # shutdown() first: close() alone does not end a socket another pipe thread is blocked in
        # recv() on, so the peer never learnt the connection was gone. The S3 server then waited
        # for the rest of a PUT body forever, holding its write lock: every later PUT hung and the
        # chaos run stalled (found by the ci schedule, seed 7)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue  # e.g. a client that reset before it was accepted: keep serving
            with self._lock:
                if not self.up:
                    self.refused += 1
                    self._reset(client)
                    continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                self._reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                if not self.up:  # cut while connecting
                    self._reset(client)
                    self._reset(server)
                    continue
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for s in (src, dst):
                    if s in self._conns:
                        self._conns.discard(s)
                        self._reset(s)

    def cut(self) -> None:
        with self._lock:
            self.up = False
            conns, self._conns = list(self._conns), set()
        for s in conns:
            self._reset(s)

    def resume(self) -> None:
        with self._lock:
            self.up = True

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self.lsock.close()
