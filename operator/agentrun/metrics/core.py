"""Prometheus metrics of the agentrun operator.

Two kinds of metrics live here:

* **Event metrics** (counters, histograms) are updated by the controller when something
  happens: a lap finished, a lap was retried, a reconcile finished, a run's cost grew.
* **State metrics** (per-run gauges, runs by phase, pending approvals) are computed at scrape
  time by :class:`RunStateCollector` from an in-memory index of every run's latest spec and
  status (filled by :meth:`OperatorMetrics.observe_run`). Gauges that depend on "now" (ages) are
  therefore exact at every scrape without a ticking loop, and the index is the only state.

Label cardinality is bounded: per-run series exist only for runs in a non-terminal phase
(dropped as soon as a run is terminal or deleted); ``phase``, ``outcome``, ``reason``,
``result`` and ``direction`` come from fixed sets (unknown values map to ``other``).
See docs/operations.md for every metric.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from agentrun.api.reasons import LapOutcome, RetryReason
from agentrun.api.status import TERMINAL_PHASES as _TERMINAL_PHASES
from agentrun.api.status import Phase
from agentrun.api.types import parse_duration as _parse_duration
from agentrun.api.types import parse_time

log = logging.getLogger(__name__)

PREFIX = "agentrun"

#: Every phase of an AgentRun (agentrun.api.status.Phase); ``agentrun_runs`` always has all of them.
PHASES: tuple[str, ...] = tuple(get_args(Phase))
TERMINAL_PHASES: frozenset[str] = _TERMINAL_PHASES
WAIT_PHASES: frozenset[str] = frozenset({"AwaitingApproval", "Suspended", "Queued"})
ACTIVE_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p not in TERMINAL_PHASES)

#: Values of the ``outcome`` label of ``agentrun_lap_duration_seconds``: every
#: :class:`~agentrun.api.reasons.LapOutcome` decide produces (the checkpointed outcomes, and the
#: attempts that ended without a checkpoint of their own), and ``other``.
LAP_OUTCOMES: tuple[str, ...] = tuple(o.value for o in LapOutcome)

#: Values of the ``reason`` label of ``agentrun_lap_retries_total``: every
#: :class:`~agentrun.api.reasons.RetryReason` decide produces, and ``other``.
RETRY_REASONS: tuple[str, ...] = tuple(r.value for r in RetryReason)

def retry_reason_label(reason: object) -> str:
    """The ``reason`` label of a retry: a :class:`RetryReason` as it is, else ``other``."""
    return normalize_label(reason, RETRY_REASONS)


def lap_outcome_label(outcome: object) -> str:
    """The ``outcome`` label of a lap attempt: a :class:`LapOutcome` as it is, else ``other``."""
    return normalize_label(outcome, LAP_OUTCOMES)


#: Values of the ``result`` label of ``agentrun_reconcile_total`` (as controller-runtime).
RECONCILE_RESULTS: tuple[str, ...] = ("success", "error", "requeue", "requeue_after")

TOKEN_DIRECTIONS: tuple[str, ...] = ("input", "output")

LAP_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
#: Buckets of ``agentrun_lap_checkpoint_bytes``: 256 B .. 16 MiB (a lap's maxLapBytes default is 8 MiB).
LAP_BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
RECONCILE_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: Longest label value kept for ``owner`` (approval owner); longer values are truncated.
MAX_OWNER_LABEL_LENGTH = 128
_TRACE_ID = re.compile(r"[0-9a-f]{32}")

def normalize_label(value: object, allowed: Iterable[str], default: str = "other") -> str:
    """``value`` when it is one of ``allowed``, else ``default``."""
    text = str(value or "").strip()
    return text if text in allowed else default


def parse_timestamp(value: Any) -> float | None:
    """Unix seconds of an RFC 3339 string (``2024-05-01T10:00:00Z``) or datetime; None if unset
    or unparseable (a malformed time never breaks a scrape)."""
    dt = parse_time(value)
    return None if dt is None else dt.timestamp()


def parse_number(value: Any) -> float | None:
    """Float of a decimal string / number; None if unset or unparseable."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_duration(value: Any, default: float) -> float:
    """Seconds of a Go-style duration (``10m``, ``1h30m``); ``default`` if unset or invalid."""
    try:
        return _parse_duration(value)
    except (TypeError, ValueError):
        return default


# Defaults of the spec (agentrun.api.spec), used when a field is absent from the wire form.
DEFAULT_LAP_TIMEOUT_SECONDS = 600.0
DEFAULT_ATTEMPTS_PER_LAP = 3
DEFAULT_MAX_LAPS = 100
DEFAULT_MAX_RUN_BYTES = float(1024**3)  # spec.checkpoint.maxRunBytes's default (api/spec.py)


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = d
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


@dataclass(frozen=True)
class RunView:
    """What the collector keeps of one run: numbers only, no spec or status text."""

    namespace: str
    name: str
    phase: str
    lap: int
    started_at: float | None
    last_checkpoint_at: float | None
    lap_timeout_seconds: float
    attempts_per_lap: int
    max_laps: int
    budget_usd: float | None
    cost_usd: float
    input_tokens: int
    output_tokens: int
    total_retries: int
    current_lap_retries: int
    approval_pending: bool
    approval_owner: str | None
    approval_requested_at: float | None
    approval_deadline: float | None
    # latest status time that shows the run moving: approval decided, resumed from suspension
    resumed_at: float | None = None
    checkpoint_bytes: float | None = None
    checkpoint_max_bytes: float = DEFAULT_MAX_RUN_BYTES
    trace_id: str | None = None
    """``status.traceId`` (32 hex digits; set while the operator's tracing is on): the ``trace_id``
    label of ``agentrun_run_info``, one series per live run (low cardinality: it never changes)."""

    @property
    def last_progress_at(self) -> float | None:
        """Latest of: last checkpoint, start, end of a wait (approval decision, resume)."""
        times = [t for t in (self.last_checkpoint_at, self.started_at, self.resumed_at) if t is not None]
        return max(times) if times else None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @classmethod
    def from_resource(
        cls, namespace: str, name: str, spec: Mapping[str, Any] | None, status: Mapping[str, Any] | None
    ) -> RunView:
        spec = spec or {}
        status = status or {}
        phase = status.get("phase") or "Pending"
        if phase not in PHASES:
            log.warning("metrics: unknown phase %r of %s/%s, counted as Pending", phase, namespace, name)
            phase = "Pending"
        lap = int(parse_number(status.get("lap")) or 0)
        # retries of the lap now in progress: the active job's lap, else the lap after the last checkpoint
        lap_in_progress = _get(status, "activeJob", "lap") or lap + 1
        current_retries = 0
        for entry in status.get("retries") or []:
            if isinstance(entry, Mapping) and entry.get("lap") == lap_in_progress:
                current_retries = int(parse_number(entry.get("retries")) or 0)
        raw_approval = status.get("approval")
        approval: Mapping[str, Any] = raw_approval if isinstance(raw_approval, Mapping) else {}
        pending = bool(approval) and approval.get("state") == "Pending" and phase not in TERMINAL_PHASES
        owner = None
        if pending:
            owner = str(approval.get("owner") or status.get("waitingOn") or "unassigned")
            owner = owner[:MAX_OWNER_LABEL_LENGTH]
        raw_cost = status.get("cost")
        cost: Mapping[str, Any] = raw_cost if isinstance(raw_cost, Mapping) else {}
        resumed = [parse_timestamp(approval.get("decidedAt"))] if approval else []
        for cond in status.get("conditions") or []:
            if isinstance(cond, Mapping) and cond.get("type") == "Suspended" and cond.get("status") == "False":
                resumed.append(parse_timestamp(cond.get("lastTransitionTime")))
        resumed_times = [t for t in resumed if t is not None]
        return cls(
            namespace=namespace,
            name=name,
            phase=phase,
            lap=lap,
            started_at=parse_timestamp(status.get("startedAt")),
            last_checkpoint_at=parse_timestamp(status.get("lastCheckpointTime")),
            lap_timeout_seconds=parse_duration(spec.get("lapTimeout"), DEFAULT_LAP_TIMEOUT_SECONDS),
            attempts_per_lap=int(
                parse_number(_get(spec, "retry", "attemptsPerLap")) or DEFAULT_ATTEMPTS_PER_LAP
            ),
            max_laps=int(parse_number(_get(spec, "budget", "maxLaps")) or DEFAULT_MAX_LAPS),
            budget_usd=parse_number(_get(spec, "budget", "maxCostUSD")),
            cost_usd=parse_number(cost.get("usd")) or 0.0,
            input_tokens=int(parse_number(cost.get("inputTokens")) or 0),
            output_tokens=int(parse_number(cost.get("outputTokens")) or 0),
            total_retries=int(parse_number(status.get("totalRetries")) or 0),
            current_lap_retries=current_retries,
            approval_pending=pending,
            approval_owner=owner,
            approval_requested_at=parse_timestamp(approval.get("requestedAt")) if pending else None,
            approval_deadline=parse_timestamp(approval.get("deadline")) if pending else None,
            resumed_at=max(resumed_times) if resumed_times else None,
            checkpoint_bytes=parse_number(_get(status, "storage", "bytes")),
            checkpoint_max_bytes=parse_number(_get(spec, "checkpoint", "maxRunBytes")) or DEFAULT_MAX_RUN_BYTES,
            trace_id=trace_id_label(status.get("traceId")),
        )


def trace_id_label(value: Any) -> str | None:
    """``status.traceId`` as a label value: 32 lowercase hex digits, else None (no series)."""
    return value if isinstance(value, str) and _TRACE_ID.fullmatch(value) else None


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


class RunStateCollector(Collector):
    """Computes the state metrics from the run index at scrape time."""

    def __init__(self, index: Callable[[], list[RunView]], clock: Callable[[], float]) -> None:
        self._index = index
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # Describing lets the registry detect name clashes without running collect().
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        run = ["namespace", "name"]
        return [
            _gauge("runs", "AgentRuns known to the operator by phase (all phases, terminal included).", ["phase"]),
            _gauge("run_phase", "1 for the current phase of a non-terminal run, 0 for its other non-terminal phases.", [*run, "phase"]),
            _gauge("run_lap", "Last checkpointed lap of the run (0: none yet).", run),
            _gauge("run_max_laps", "spec.budget.maxLaps of the run.", run),
            _gauge("run_started_timestamp_seconds", "Unix time the first lap of the run started.", run),
            _gauge("run_last_checkpoint_timestamp_seconds", "Unix time the run's last lap checkpoint was written.", run),
            _gauge("run_last_progress_timestamp_seconds", "Unix time the run last moved: latest of its last checkpoint, its start, the end of its last wait (approval decided, resumed).", run),
            _gauge("run_last_checkpoint_age_seconds", "Seconds since the run's last checkpoint (since its start if none yet), at scrape time.", run),
            _gauge("run_lap_timeout_seconds", "spec.lapTimeout of the run in seconds.", run),
            _gauge("run_lap_attempts_max", "spec.retry.attemptsPerLap of the run (the first attempt included).", run),
            _gauge("run_retries", "Failed lap attempts over the whole run (status.totalRetries).", run),
            _gauge("run_current_lap_retries", "Failed attempts of the lap now in progress.", run),
            _gauge("run_cost_usd", "Cost of the run so far in USD (status.cost.usd).", run),
            _gauge("run_checkpoint_bytes", "Stored bytes of the run's checkpoints so far (status.storage.bytes).", run),
            _gauge("run_checkpoint_max_bytes", "spec.checkpoint.maxRunBytes of the run.", run),
            _gauge("run_budget_usd", "spec.budget.maxCostUSD of the run in USD (absent when unlimited).", run),
            _gauge("run_tokens", "Tokens used by the run so far (status.cost.inputTokens/outputTokens).", [*run, "direction"]),
            _gauge("run_info", "1 for each non-terminal run whose trace the operator records (status.traceId, "
                   "while its tracing is on), labelled with the trace id: the dashboard links the run to its trace.",
                   [*run, "trace_id"]),
            _gauge("approvals_pending", "Approvals waiting for a human decision."),
            _gauge("approval_requested_timestamp_seconds", "Unix time a pending approval was requested.", [*run, "owner"]),
            _gauge("approval_deadline_timestamp_seconds", "Unix time a pending approval times out (onTimeout applies).", [*run, "owner"]),
            _gauge("approval_age_seconds", "Seconds a pending approval has waited, at scrape time.", [*run, "owner"]),
        ]

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        fam = {f.name.removeprefix(PREFIX + "_"): f for f in self._families()}
        runs = self._index()
        by_phase = dict.fromkeys(PHASES, 0)
        pending = 0
        for r in runs:
            by_phase[r.phase] += 1
            if r.terminal:
                continue
            key = [r.namespace, r.name]
            for p in ACTIVE_PHASES:
                fam["run_phase"].add_metric([*key, p], 1.0 if p == r.phase else 0.0)
            fam["run_lap"].add_metric(key, r.lap)
            fam["run_max_laps"].add_metric(key, r.max_laps)
            if r.started_at is not None:
                fam["run_started_timestamp_seconds"].add_metric(key, r.started_at)
            if r.last_checkpoint_at is not None:
                fam["run_last_checkpoint_timestamp_seconds"].add_metric(key, r.last_checkpoint_at)
            if r.last_progress_at is not None:
                fam["run_last_progress_timestamp_seconds"].add_metric(key, r.last_progress_at)
            since = r.last_checkpoint_at if r.last_checkpoint_at is not None else r.started_at
            if since is not None:
                fam["run_last_checkpoint_age_seconds"].add_metric(key, max(0.0, now - since))
            fam["run_lap_timeout_seconds"].add_metric(key, r.lap_timeout_seconds)
            fam["run_lap_attempts_max"].add_metric(key, r.attempts_per_lap)
            fam["run_retries"].add_metric(key, r.total_retries)
            fam["run_current_lap_retries"].add_metric(key, r.current_lap_retries)
            fam["run_cost_usd"].add_metric(key, r.cost_usd)
            if r.checkpoint_bytes is not None:
                fam["run_checkpoint_bytes"].add_metric(key, r.checkpoint_bytes)
            fam["run_checkpoint_max_bytes"].add_metric(key, r.checkpoint_max_bytes)
            if r.budget_usd is not None:
                fam["run_budget_usd"].add_metric(key, r.budget_usd)
            fam["run_tokens"].add_metric([*key, "input"], r.input_tokens)
            fam["run_tokens"].add_metric([*key, "output"], r.output_tokens)
            if r.trace_id is not None:
                fam["run_info"].add_metric([*key, r.trace_id], 1.0)
            if r.approval_pending:
                pending += 1
                akey = [*key, r.approval_owner or "unassigned"]
                if r.approval_requested_at is not None:
                    fam["approval_requested_timestamp_seconds"].add_metric(akey, r.approval_requested_at)
                    fam["approval_age_seconds"].add_metric(akey, max(0.0, now - r.approval_requested_at))
                if r.approval_deadline is not None:
                    fam["approval_deadline_timestamp_seconds"].add_metric(akey, r.approval_deadline)
        for p in PHASES:
            fam["runs"].add_metric([p], by_phase[p])
        fam["approvals_pending"].add_metric([], pending)
        yield from fam.values()


class OperatorMetrics:
    """All metrics of one operator process, on their own registry (so tests can make fresh ones).

    ``clock`` returns Unix seconds; it is only used for the age gauges.
    """

    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time,
                 process_metrics: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], RunView] = {}
        # per run: highest (usd, input tokens, output tokens) already counted in the counters
        self._counted: dict[tuple[str, str], tuple[float, int, int]] = {}
        r = self.registry
        self.lap_duration = Histogram(
            f"{PREFIX}_lap_duration_seconds",
            "Duration of lap attempts, from Job creation to its end, by outcome.",
            ["outcome"], buckets=LAP_DURATION_BUCKETS, registry=r,
        )
        self.lap_checkpoint_bytes = Histogram(
            f"{PREFIX}_lap_checkpoint_bytes",
            "Stored (compressed) checkpoint bytes each lap added: its record and journal entries, and the "
            "previous lap's snapshot.",
            buckets=LAP_BYTES_BUCKETS, registry=r,
        )
        self.lap_retries = Counter(
            f"{PREFIX}_lap_retries", "Failed lap attempts that will be retried, by reason.", ["reason"], registry=r,
        )
        self.reconcile_total = Counter(
            f"{PREFIX}_reconcile", "Reconciles of AgentRuns by result (as controller-runtime).", ["result"], registry=r,
        )
        self.reconcile_errors = Counter(
            f"{PREFIX}_reconcile_errors", "Reconciles of AgentRuns that ended in an error.", registry=r,
        )
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds", "Duration of AgentRun reconciles.",
            buckets=RECONCILE_DURATION_BUCKETS, registry=r,
        )
        self.cost_total = Counter(
            f"{PREFIX}_cost_usd",
            "USD spent by laps, summed from the growth of every run's status.cost.usd seen by this process.",
            registry=r,
        )
        self.tokens_total = Counter(
            f"{PREFIX}_tokens", "Tokens used by laps, from the growth of every run's status.cost seen by this process.",
            ["direction"], registry=r,
        )
        # Every label value of a fixed set starts at 0 so that rate()/increase() see the first event.
        for o in LAP_OUTCOMES:
            self.lap_duration.labels(o)
        for reason in RETRY_REASONS:
            self.lap_retries.labels(reason)
        for res in RECONCILE_RESULTS:
            self.reconcile_total.labels(res)
        for d in TOKEN_DIRECTIONS:
            self.tokens_total.labels(d)
        self._clock = clock
        self.collector = RunStateCollector(self.snapshot, clock)
        r.register(self.collector)
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)

    # -- the run index -------------------------------------------------------------------------
    def observe_run(self, namespace: str, name: str, spec: Mapping[str, Any] | None,
                    status: Mapping[str, Any] | None) -> None:
        """Record the latest spec/status of a run (camelCase wire form). Never raises."""
        try:
            view = RunView.from_resource(namespace, name, spec, status)
        except Exception:  # a metrics bug must never break a reconcile
            log.exception("metrics: cannot index %s/%s", namespace, name)
            return
        key = (namespace, name)
        with self._lock:
            prev = self._runs.get(key)
        if prev is not None:
            resumed = view.resumed_at
            if prev.phase in WAIT_PHASES and view.phase not in WAIT_PHASES:
                # seen leaving a wait; the status may carry no time for it
                resumed = max(self._clock(), resumed or 0.0)
            if prev.resumed_at is not None:
                resumed = max(prev.resumed_at, resumed or 0.0)
            if resumed != view.resumed_at:
                view = dataclasses.replace(view, resumed_at=resumed)
        now = (view.cost_usd, view.input_tokens, view.output_tokens)
        with self._lock:
            self._runs[key] = view
            seen = self._counted.get(key)
            # High-water marks: a status without cost never lowers them, so nothing is counted twice.
            self._counted[key] = now if seen is None else tuple(map(max, seen, now))  # type: ignore[assignment]
        if seen is None:
            # The first observation of a run by this process (start, failover) is a baseline, so a
            # restart never counts a run's past spend again: the counters count growth only.
            return
        if now[0] > seen[0]:
            self.cost_total.inc(now[0] - seen[0])
        if now[1] > seen[1]:
            self.tokens_total.labels("input").inc(now[1] - seen[1])
        if now[2] > seen[2]:
            self.tokens_total.labels("output").inc(now[2] - seen[2])

    def forget_run(self, namespace: str, name: str) -> None:
        """Drop a deleted run: its per-run series disappear and it leaves ``agentrun_runs``."""
        with self._lock:
            self._runs.pop((namespace, name), None)
            self._counted.pop((namespace, name), None)

    def clear_runs(self) -> None:
        """Forget every run (e.g. when this replica stops being the active one)."""
        with self._lock:
            self._runs.clear()
            self._counted.clear()

    def snapshot(self) -> list[RunView]:
        with self._lock:
            return list(self._runs.values())

    # -- events --------------------------------------------------------------------------------
    def lap_finished(self, namespace: str, name: str, outcome: str, duration_seconds: float,
                     checkpoint_bytes: int | None = None) -> None:
        self.lap_duration.labels(lap_outcome_label(outcome)).observe(max(0.0, float(duration_seconds)))
        if checkpoint_bytes is not None:
            self.lap_checkpoint_bytes.observe(max(0, int(checkpoint_bytes)))

    def lap_retried(self, namespace: str, name: str, reason: str) -> None:
        self.lap_retries.labels(retry_reason_label(reason)).inc()

    def reconcile_finished(self, result: str, duration_seconds: float) -> None:
        res = normalize_label(result, RECONCILE_RESULTS, default="error")
        self.reconcile_total.labels(res).inc()
        if res == "error":
            self.reconcile_errors.inc()
        self.reconcile_duration.observe(max(0.0, float(duration_seconds)))
