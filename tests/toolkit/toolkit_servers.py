"""Start the example tool servers (examples/kit_tool_server.py, examples/mcp_tool_server.py) as real
processes on a free port, for the toolkit tests and the benchmark."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def example_server(script: str, db: Path, *extra: str, timeout: float = 30.0) -> Iterator[str]:
    """Run ``examples/<script> --port P --db DB``; yield ``http://127.0.0.1:P`` once GET /_record answers."""
    port = free_port()
    log = db.with_suffix(f".{port}.log")
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, str(EXAMPLES / script), "--port", str(port), "--db", str(db), *extra],
                             stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url + "/_record", timeout=2).read()
                break
            except OSError:
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{script} did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def record(url: str) -> dict:  # type: ignore[type-arg]
    import json

    return json.loads(urllib.request.urlopen(url + "/_record", timeout=5).read())
