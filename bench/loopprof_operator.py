"""Run the operator with its event loop's CPU attributed: every callback the loop runs (a task's
step by its coroutine's name, a transport's read by its method) and the selector's wait (the
syscall and the wake-up after it) get this thread's CPU time (``time.thread_time``, CFS's exact
clock) around them; each thread's CPU and context switches (voluntary, involuntary) from /proc.
Written when the process exits: ``OUT.txt``. About 1 µs per callback of its own cost, so the times
are the operator's own (unlike cProfile or yappi, which inflate Python-heavy code several times
more than C-heavy code). A profiling aid for bench_operator_cluster.py
(``BENCH_OPERATOR_LOOPPROF=OUT``).

It patches asyncio's ``Handle._run`` and ``EpollSelector.select``, so the operator runs on asyncio's
loop here (``AGENTRUN_EVENT_LOOP=asyncio`` is set): uvloop's callbacks are not Python objects it can
time. ``LOOPPROF_STEPS=1`` also splits each task's steps by where it resumed and where it waited next
(file:line of the innermost awaited frame); ``LOOPPROF_CPROFILE=1`` adds a cProfile of the process
(``OUT.prof``; shares only: its cost is uneven).

    python bench/loopprof_operator.py OUT operator [args...]
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import runpy
import selectors
import sys
import time
from collections import defaultdict
from typing import Any

STEPS = bool(os.environ.get("LOOPPROF_STEPS"))
cpu: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)
clock = time.thread_time
wall = time.perf_counter


def _key(handle: asyncio.Handle) -> str:
    cb = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return "task " + getattr(coro, "__qualname__", type(coro).__name__)
    name = getattr(cb, "__qualname__", None) or type(cb).__name__
    if owner is not None and not isinstance(owner, type):
        name = f"{type(owner).__name__}.{getattr(cb, '__name__', name)}"
    return name


_run = asyncio.events.Handle._run


_where: dict[int, str] = {}


def _suspended_at(task: asyncio.Task[Any]) -> str:
    """The innermost frame a task waits in (file:line function), through the awaited coroutines
    and async generators."""
    obj = task.get_coro()
    last = "?"
    for _ in range(40):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        last = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
        nxt = getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None) or getattr(obj, "gi_yieldfrom", None)
        if nxt is None:
            break
        obj = nxt
    return last


def _timed_run(self: asyncio.Handle) -> None:
    key = _key(self)
    owner = getattr(self._callback, "__self__", None)  # type: ignore[attr-defined]
    c0 = clock()
    try:
        _run(self)
    finally:
        c = clock() - c0
        cpu[key] += c
        calls[key] += 1
        if STEPS and isinstance(owner, asyncio.Task):
            if owner.done():
                before, after = _where.pop(id(owner), "start"), "done"
            else:
                before, after = _where.get(id(owner), "start"), _suspended_at(owner)
                _where[id(owner)] = after
            sk = f"  {key}: {before}  ->  {after}"
            cpu[sk] += c
            calls[sk] += 1


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
_select = selectors.EpollSelector.select


def _timed_select(self: selectors.EpollSelector, timeout: float | None = None) -> list[Any]:
    c0, w0 = clock(), wall()
    try:
        return _select(self, timeout)
    finally:
        c, w = clock() - c0, wall() - w0
        k = "select (blocked)" if w > 0.0002 else "select (ready)"
        cpu[k] += c
        calls[k] += 1


selectors.EpollSelector.select = _timed_select  # type: ignore[method-assign,assignment]

_gc_started: list[float] = []


def _timed_gc(phase: str, info: dict[str, Any]) -> None:
    """The collector's passes (each generation's count and CPU; also inside the callbacks above)."""
    if phase == "start":
        _gc_started.append(clock())
    elif _gc_started:
        k = f"gc (inside the above) generation {info.get('generation')}"
        cpu[" " + k] += clock() - _gc_started.pop()
        calls[" " + k] += 1


gc.callbacks.append(_timed_gc)


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["agentrun", *sys.argv[2:]]
    os.environ["AGENTRUN_EVENT_LOOP"] = "asyncio"  # the patched loop (see the module's docstring)
    t0 = os.times()
    loop_thread_cpu0 = clock()

    def dump() -> None:
        t = os.times()
        proc = (t.user + t.system) - (t0.user + t0.system)
        main_cpu = clock() - loop_thread_cpu0
        total = sum(v for k, v in cpu.items() if not k.startswith(" "))
        with open(out + ".txt", "w", encoding="utf-8") as fh:
            fh.write(f"process cpu {proc:.3f} s (ticks); main thread {main_cpu:.3f} s; in loop callbacks+select {total:.3f} s\n")
            import threading
            names = {t.native_id: t.name for t in threading.enumerate()}
            for tid in sorted(os.listdir("/proc/self/task"), key=int):
                try:
                    stat = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                    status = open(f"/proc/self/task/{tid}/status").read()
                except OSError:
                    continue
                sw = {ln.split(":")[0]: int(ln.split()[1]) for ln in status.splitlines() if "ctxt_switches" in ln}
                comm = open(f"/proc/self/task/{tid}/comm").read().strip()
                fh.write(f"thread {tid} {names.get(int(tid), comm)!r}: cpu {(int(stat[11]) + int(stat[12])) / 100:.2f} s, "
                         f"switches vol {sw.get('voluntary_ctxt_switches')} invol {sw.get('nonvoluntary_ctxt_switches')}\n")
            for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])[:120]:  # " gc ...": part of the callbacks' times
                fh.write(f"{v * 1e3:10.1f} ms {100 * v / max(total, 1e-9):5.1f} % {calls[k]:9d} calls {v / calls[k] * 1e6:8.1f} us/call  {k}\n")

    prof = None
    if os.environ.get("LOOPPROF_CPROFILE"):
        import cProfile
        prof = cProfile.Profile(time.thread_time)
        prof.enable()

        def dump_prof() -> None:
            prof.disable()
            prof.dump_stats(out + ".prof")

        atexit.register(dump_prof)
    atexit.register(dump)
    runpy.run_module("agentrun.cli.main", run_name="__main__")


if __name__ == "__main__":
    main()
