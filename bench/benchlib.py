"""Pure helpers shared by the benchmarks and ``run_all.py``: percentiles, summaries, ratios,
Markdown tables, the machine's load. No I/O beyond reading /proc; tested in tests/bench/."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Any


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]): the smallest value with at least ``q`` of the
    samples at or below it. With fewer than 100 samples p99 is the maximum."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 1:
        raise ValueError(f"q must be within [0, 1], got {q}")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50 (the median, averaged for an even count), p99 (nearest rank), min, max, mean."""
    if not values:
        raise ValueError("summary of no samples")
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"n": n, "p50": median, "p99": percentile(ordered, 0.99), "min": ordered[0], "max": ordered[-1],
            "mean": sum(ordered) / n}


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; inf when the denominator is 0 and the numerator is not."""
    if denominator == 0:
        return math.inf if numerator else math.nan
    return numerator / denominator


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells are str()-ed, pipes escaped; numeric-looking columns are
    right-aligned."""
    rows = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells, expected {len(headers)}")

    def numeric(col: int) -> bool:
        cells = [r[col] for r in rows]
        return bool(cells) and all(c[:1].isdigit() or c[:2] in ("-", "~") or c[:1] in ("-", "~") for c in cells if c)

    align = ["---:" if numeric(i) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def proc_status_kb(pid: int, field: str = "VmRSS") -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (not its children), in seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _threads(pid: int) -> list[str] | None:
    """The ids of a process's live threads (``/proc/PID/task``); None if it is gone."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None


def proc_thread_cpu(pid: int) -> dict[int, int] | None:
    """Each live thread's CPU time so far in nanoseconds (``/proc/PID/task/TID/schedstat``'s first
    field: the scheduler's exact run time, where utime and stime count 10 ms ticks); None if the
    process is gone or the kernel has no schedstat."""
    out: dict[int, int] = {}
    tasks = _threads(pid)
    if tasks is None:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile (cpu_between then falls back)
            return None  # no schedstat on this kernel
        except (OSError, ValueError, IndexError):
            return None
    return out or None


def cpu_between(before: dict[int, int] | None, after: dict[int, int] | None) -> float | None:
    """Seconds of CPU a process used from ``before`` to ``after`` (:func:`proc_thread_cpu`), or None
    when that cannot be told exactly: a thread alive at ``before`` ended since (it took its time
    with it) or its id was reused (its time went back). Threads started since count whole."""
    if before is None or after is None:
        return None
    if any(tid not in after or after[tid] < ns for tid, ns in before.items()):
        return None
    return (sum(after.values()) - sum(before.values())) / 1e9


def proc_switches(pid: int) -> int | None:
    """Context switches of a process so far, over all its live threads (voluntary: it slept, each
    a wake-up after; and involuntary); None if it is gone. A thread that ended takes its count."""
    total = 0
    tasks = _threads(pid)
    if tasks is None:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def wakeup_price_us(n: int = 60, period: float = 0.05) -> float:
    """What this box charges a process for one sleep and wake-up: the CPU time (µs) of ``n``
    ``time.sleep(period)`` calls, per call. A few µs on most machines; on a virtual machine whose
    timers trap to the hypervisor it is much more, and every figure of CPU per lap grows with the
    wake-ups the lap costs (reported beside it)."""
    c0 = time.thread_time()  # this thread's CPU clock (ns resolution; os.times has 10 ms ticks)
    for _ in range(n):
        time.sleep(period)
    return (time.thread_time() - c0) * 1e6 / n


#: Where the kernel's autogroup of a process's session is (``sched_autogroup_enabled``: each session
#: its own CPU scheduling group, with its own nice; see sched(7), "The autogroup feature").
AUTOGROUP = "/proc/self/autogroup"


def autogroup_enabled() -> bool | None:
    """Whether the kernel schedules each session as a group (None: the kernel has no autogroup)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return None


def lowered(command: Sequence[str], nice: int, autogroup: bool = True) -> list[str]:
    """``command`` at CPU priority ``nice``, also when it runs in a session of its own (as the
    process kubelet starts each pod). With autogroup on, a process's nice weighs only against the
    processes of its own session: ``nice -n 19`` alone leaves a pod's process competing with the
    operator (each its own session) as an equal. So the session's autogroup gets the same nice
    (sched(7)); where the kernel has no autogroup the write fails quietly and ``nice`` is what counts.
    ``autogroup=False``: the process's nice only (``nice -n``)."""
    if not autogroup:
        return ["nice", "-n", str(nice), *command]
    script = f'echo "$0" > {AUTOGROUP} 2>/dev/null; exec nice -n "$0" "$@"'
    return ["sh", "-c", script, str(nice), *command]


def seen_priority(nice: int | None) -> tuple[str, str]:
    """(its nice, its autogroup line or "none") as a process started in a session of its own reports
    them: through :func:`lowered` at ``nice``, or as it is (None)."""
    probe = ["sh", "-c", f'echo "$(nice)"; cat {AUTOGROUP} 2>/dev/null || echo none']
    done = subprocess.run(probe if nice is None else lowered(probe, nice), capture_output=True, text=True,
                          start_new_session=True, timeout=10, check=True)
    lines = [line.strip() for line in done.stdout.splitlines()]
    return lines[0], lines[1]


def folded_profile_top(lines: Iterable[str], n: int = 15, keep: Sequence[str] = ()) -> list[tuple[float, str]]:
    """Inclusive share of each frame in a folded-stack profile (``py-spy record -f raw``: one
    ``frame;frame;... count`` per line; a frame is ``function (path:line)``), highest first.
    Frames are keyed by function and file name (not line); ``keep``: only frames whose text
    contains one of these substrings."""
    total = 0
    incl: dict[str, int] = {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        seen = set()
        for frame in stack.split(";"):
            func, _, where = frame.partition(" (")
            key = f"{func} ({os.path.basename(where.split(':')[0])})" if where else func
            if key in seen or (keep and not any(k in frame for k in keep)):
                continue
            seen.add(key)
            incl[key] = incl.get(key, 0) + int(count)
    if not total:
        return []
    ranked = sorted(incl.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [(100.0 * v / total, k) for k, v in ranked]


# ------------------------------------------------------------------ shared by the cluster benchmarks


def parse_time(value: Any) -> float:
    """An S3 LastModified (datetime) or an ISO 8601 string (``Z`` or an offset) as epoch seconds."""
    from datetime import datetime

    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


#: A ``lap checkpointed`` line of the lap runner (agentrun.lap.logs.LapLogger) in text form.
_CHECKPOINTED_TEXT = re.compile(r"^(?P<ts>\S+) INFO lap checkpointed (?P<fields>.*)$")


def checkpointed_at(line: str) -> tuple[str, int, float] | None:
    """(run name, lap, ts) of a ``lap checkpointed`` log line of the lap runner, text or JSON; None
    for any other line."""
    line = line.strip()
    if line.startswith("{"):
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if doc.get("msg") != "lap checkpointed":
            return None
        return str(doc["name"]), int(doc["lap"]), parse_time(str(doc["ts"]))
    m = _CHECKPOINTED_TEXT.match(line)
    if not m:
        return None
    fields = dict(kv.split("=", 1) for kv in m["fields"].split() if "=" in kv)
    if "name" not in fields or "lap" not in fields:
        return None
    return fields["name"], int(fields["lap"]), parse_time(m["ts"])


def stamp_events(client: Any, ns: str, kind: str, events: dict[tuple[str, str], float], stop: Any) -> None:
    """Watch ``kind`` in namespace ``ns`` until ``stop`` (a threading.Event) is set, and stamp the
    first arrival of each event in ``events``: ``job`` (lap Jobs: ``job:<name>`` by event type and
    ``Complete``), ``pod`` (lap pods, keyed by their Job: ``pod:<job>`` ``Succeeded``, ``Running``,
    ``Terminated`` as the kubelet reports its container) or ``run`` (AgentRuns: ``run:<uid>`` by
    event type and by each phase). An ended watch resumes from the last version seen; an expired one
    lists again."""
    from kubernetes import watch

    if kind == "run":
        api = client.CustomObjectsApi()
        lister, args, selector = api.list_namespaced_custom_object, ("agentrun.dev", "v1alpha1", ns, "agentruns"), None
    elif kind == "job":
        lister, args, selector = client.BatchV1Api().list_namespaced_job, (ns,), "agentrun.dev/run-uid"
    else:
        lister, args, selector = client.CoreV1Api().list_namespaced_pod, (ns,), "job-name"
    rv = None
    while not stop.is_set():
        w = watch.Watch()
        try:
            for ev in w.stream(lister, *args, label_selector=selector, resource_version=rv, timeout_seconds=30,
                               _request_timeout=60):
                now = time.time()
                obj = ev["object"]
                if kind == "run":
                    md, phase = obj["metadata"], (obj.get("status") or {}).get("phase")
                    rv = md["resourceVersion"]
                    events.setdefault((f"run:{md['uid']}", ev["type"]), now)
                    if phase:
                        events.setdefault((f"run:{md['uid']}", str(phase)), now)
                elif kind == "job":
                    rv, key = obj.metadata.resource_version, obj.metadata.name
                    events.setdefault((f"job:{key}", ev["type"]), now)
                    if any(c.type == "Complete" and c.status == "True" for c in obj.status.conditions or []):
                        events.setdefault((f"job:{key}", "Complete"), now)
                else:
                    rv, key = obj.metadata.resource_version, (obj.metadata.labels or {}).get("job-name", "")
                    events.setdefault((f"pod:{key}", ev["type"]), now)
                    if obj.status.phase == "Succeeded":
                        events.setdefault((f"pod:{key}", "Succeeded"), now)
                    for cs in obj.status.container_statuses or []:  # the container's own states
                        if cs.state is not None and cs.state.running is not None:
                            events.setdefault((f"pod:{key}", "Running"), now)
                        if cs.state is not None and cs.state.terminated is not None:
                            events.setdefault((f"pod:{key}", "Terminated"), now)
                if stop.is_set():
                    break
        except Exception:  # noqa: BLE001 - an expired watch restarts from a new listing
            rv = None
            time.sleep(0.2)
