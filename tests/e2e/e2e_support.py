"""Helpers shared by the e2e test modules."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


class _World(Protocol):
    def start(self) -> None: ...

    def stop(self) -> list[str]: ...


W = TypeVar("W", bound=_World)


def running_world(world: W) -> Iterator[W]:
    """The body of a module fixture holding a chaos world (e2e/chaos/world.py ``World`` or a
    subclass): ``yield from running_world(World(tmp))``. The world is started, yielded, and stopped
    even when starting it failed; what its stop reports (processes left behind) fails the fixture."""
    try:
        world.start()
        yield world
    finally:
        problems = world.stop()
    assert not problems, problems


def delete_team_policy(cluster: Any, pname: str) -> None:
    """Delete the AgentRunPolicy ``pname`` and its binding (``agentrun.api.tenancy.VAP_NAME-<pname>``,
    as ``tenancy_admission.binding`` names a team's), whichever of them exists."""
    from agentrun.api.tenancy import VAP_NAME

    cluster.kubectl_run("delete", "validatingadmissionpolicybinding", f"{VAP_NAME}-{pname}", "--ignore-not-found")
    cluster.kubectl_run("delete", "agentrunpolicy", pname, "--ignore-not-found")


class ToolGate:
    """A gate in front of a tool server, for tests whose point is a lap *in flight*.

    Point a tool's URL at ``gate.url + path``: every request is held, unanswered, until
    ``gate.open()``, then forwarded as it came (method, body, ``Idempotency-Key``) to
    ``upstream + path`` and the upstream answer returned. So a lap is in flight for as long as the
    test needs (a kill, a patch, a helm upgrade lands while it is), whatever the box's speed, instead
    of for a tool's fixed ``sleepSeconds`` that the test must beat. A held request whose client is
    gone (its lap pod was killed) is still forwarded on ``open()``, as a tool server would still
    finish a call it had begun. Give the tool a long ``http.timeout`` and the run a long
    ``lapTimeout``: the gate is the only thing that should end the call. With ``hold``, only the
    requests whose JSON arguments it accepts are held; the others pass straight through."""

    def __init__(self, upstream: str, hold: Callable[[Any], bool] | None = None) -> None:
        import json
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.upstream = upstream.rstrip("/")
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.arrivals: list[dict[str, Any]] = []  # every request that reached the gate, in order
        self._held = 0
        self._hold = hold
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    args = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    args = None
                held = gate._hold is None or gate._hold(args)
                with gate._lock:
                    gate.arrivals.append({"path": self.path, "arguments": args,
                                          "idempotencyKey": self.headers.get("Idempotency-Key")})
                    gate._held += held
                try:
                    if held:
                        gate._open.wait()
                finally:
                    with gate._lock:
                        gate._held -= held
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "idempotency-key")}
                req = urllib.request.Request(gate.upstream + self.path, data=raw or None, headers=headers,
                                             method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        code, body, replayed = r.status, r.read(), r.headers.get("Idempotent-Replayed")
                except urllib.error.HTTPError as e:
                    code, body, replayed = e.code, e.read(), None
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    if replayed:
                        self.send_header("Idempotent-Replayed", replayed)
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller is gone (its lap pod was killed): the call was still made

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def held(self) -> int:
        """Requests waiting at the gate right now."""
        with self._lock:
            return self._held

    def arrived(self, order: str | None = None, where: Callable[[Any], bool] | None = None) -> int:
        """Requests that reached the gate so far: all, those with ``arguments.order == order``, or
        those whose JSON arguments ``where`` accepts."""
        if order is not None:
            where = lambda args: isinstance(args, dict) and args.get("order") == order  # noqa: E731
        with self._lock:
            return len([a for a in self.arrivals if where is None or where(a["arguments"])])

    def open(self) -> None:
        """Let every held request through, and every later one."""
        self._open.set()

    def close(self) -> None:
        self._open.set()
        self._server.shutdown()
        self._server.server_close()


class JobWatch:
    """``kubectl get jobs -w`` of a namespace (``resource``: another kind, e.g. pods), read in a
    thread: ``on_event(type, object)`` for each watch event (ADDED, MODIFIED, DELETED) as it comes.
    ``stop()`` ends it."""

    def __init__(self, cluster: Any, ns: str, on_event: Callable[[str, dict[str, Any]], None],
                 resource: str = "jobs") -> None:
        import json
        import subprocess
        import threading

        self._on_event = on_event
        self._json = json
        self._proc = subprocess.Popen(
            [cluster.kubectl, "get", resource, "-n", ns, "-w", "--output-watch-events", "-o", "json"],
            env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        dec, buf = self._json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buf += line
            while buf.strip():
                try:
                    ev, end = dec.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                self._on_event(str(ev.get("type")), ev.get("object") or {})

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait(10)


def note_run(name: str, task: str, tool_url: str) -> dict[str, Any]:
    """A two-lap AgentRun: lap 1 calls the ``note`` tool at ``tool_url``/note once, lap 2 ends."""
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"task": task,
                     "agent": {"version": "v1", "model": {"provider": "scripted", "script": [
                         {"content": "note", "toolCalls": [{"name": "note", "arguments": {"text": "hi"}}],
                          "usage": {"inputTokens": 10, "outputTokens": 5}},
                         {"content": "done", "usage": {"inputTokens": 10, "outputTokens": 5}}]},
                         "tools": [{"name": "note", "http": {"url": f"{tool_url}/note", "timeout": "20s"}}]},
                     "budget": {"maxLaps": 5}, "lapTimeout": "120s",
                     "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s", "factor": 2}}}}
