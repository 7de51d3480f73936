"""The operator's metrics: feed run statuses and events, scrape the registry with
``generate_latest`` and read the exposition back with ``prometheus_client.parser``."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.metrics import (
    LAP_OUTCOMES,
    PHASES,
    RETRY_REASONS,
    OperatorMetrics,
    normalize_label,
)
from agentrun.metrics.server import serve

T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z


def iso(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + 3600)


@pytest.fixture
def m(clock: Clock) -> OperatorMetrics:
    return OperatorMetrics(clock=clock, process_metrics=False)


def scrape(m: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    text = generate_latest(m.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(samples, metric, /, **labels):
    return samples[(metric, tuple(sorted(labels.items())))]


def names_of(samples, name):
    return {dict(lbl).get("name") for (n, lbl) in samples if n == name}


SPEC = {
    "task": "t",
    "lapTimeout": "5m",
    "budget": {"maxLaps": 20, "maxCostUSD": "2.50"},
    "retry": {"attemptsPerLap": 4},
    "approval": {"owner": "team-payments", "timeout": "24h"},
}


def running_status(**over):
    st = {
        "phase": "Running",
        "lap": 3,
        "startedAt": iso(T0),
        "lastCheckpointTime": iso(T0 + 600),
        "cost": {"usd": "0.75", "inputTokens": 1200, "outputTokens": 300},
        "totalRetries": 2,
        "retries": [{"lap": 2, "retries": 1}, {"lap": 4, "retries": 1, "lastReason": "Evicted"}],
        "activeJob": {"name": "r-4-2", "lap": 4, "attempt": 2, "agentVersion": "v1"},
    }
    st.update(over)
    return st


def test_runs_by_phase_has_every_phase_even_when_empty(m):
    s = scrape(m)
    assert {dict(lbl)["phase"] for (n, lbl) in s if n == "agentrun_runs"} == set(PHASES)
    assert all(val(s, "agentrun_runs", phase=p) == 0 for p in PHASES)
    assert val(s, "agentrun_approvals_pending") == 0


def test_per_run_gauges_of_a_running_run(m):
    m.observe_run("ns1", "r", SPEC, running_status())
    s = scrape(m)
    run = {"namespace": "ns1", "name": "r"}
    assert val(s, "agentrun_runs", phase="Running") == 1
    assert val(s, "agentrun_run_phase", phase="Running", **run) == 1
    assert val(s, "agentrun_run_phase", phase="AwaitingApproval", **run) == 0
    assert val(s, "agentrun_run_lap", **run) == 3
    assert val(s, "agentrun_run_max_laps", **run) == 20
    assert val(s, "agentrun_run_started_timestamp_seconds", **run) == T0
    assert val(s, "agentrun_run_last_checkpoint_timestamp_seconds", **run) == T0 + 600
    assert val(s, "agentrun_run_last_checkpoint_age_seconds", **run) == 3000  # clock T0+3600
    assert val(s, "agentrun_run_lap_timeout_seconds", **run) == 300
    assert val(s, "agentrun_run_lap_attempts_max", **run) == 4
    assert val(s, "agentrun_run_retries", **run) == 2
    assert val(s, "agentrun_run_current_lap_retries", **run) == 1  # lap 4 is in flight
    assert val(s, "agentrun_run_cost_usd", **run) == 0.75
    assert val(s, "agentrun_run_budget_usd", **run) == 2.5
    assert val(s, "agentrun_run_tokens", direction="input", **run) == 1200
    assert val(s, "agentrun_run_tokens", direction="output", **run) == 300


def test_ages_are_computed_at_scrape_time(m, clock):
    m.observe_run("ns1", "r", SPEC, running_status())
    assert val(scrape(m), "agentrun_run_last_checkpoint_age_seconds", namespace="ns1", name="r") == 3000
    clock.now += 120
    assert val(scrape(m), "agentrun_run_last_checkpoint_age_seconds", namespace="ns1", name="r") == 3120


def test_spec_defaults_apply_when_fields_are_absent(m, clock):
    m.observe_run("ns1", "r", {"task": "t"}, {"phase": "Pending"})
    s = scrape(m)
    run = {"namespace": "ns1", "name": "r"}
    assert val(s, "agentrun_run_lap_timeout_seconds", **run) == 600  # 10m
    assert val(s, "agentrun_run_lap_attempts_max", **run) == 3
    assert val(s, "agentrun_run_max_laps", **run) == 100
    assert val(s, "agentrun_run_lap", **run) == 0
    # no budget, no checkpoint, no start: those series are absent rather than made up
    assert ("agentrun_run_budget_usd", tuple(sorted(run.items()))) not in s
    assert ("agentrun_run_last_checkpoint_timestamp_seconds", tuple(sorted(run.items()))) not in s
    assert ("agentrun_run_last_checkpoint_age_seconds", tuple(sorted(run.items()))) not in s


def test_age_counts_from_start_before_the_first_checkpoint(m, clock):
    m.observe_run("ns1", "r", SPEC, running_status(lastCheckpointTime=None, lap=0))
    s = scrape(m)
    assert val(s, "agentrun_run_last_checkpoint_age_seconds", namespace="ns1", name="r") == 3600
    assert ("agentrun_run_last_checkpoint_timestamp_seconds", (("name", "r"), ("namespace", "ns1"))) not in s


def test_pending_approval_series(m, clock):
    st = running_status(
        phase="AwaitingApproval",
        activeJob=None,
        waitingOn="team-payments",
        approval={
            "state": "Pending", "lap": 3, "tool": "refund", "callId": "c1", "idempotencyKey": "k",
            "owner": "team-payments", "requestedAt": iso(T0 + 1800), "deadline": iso(T0 + 1800 + 86400),
        },
    )
    m.observe_run("ns1", "r", SPEC, st)
    m.observe_run("ns2", "other", SPEC, running_status())
    s = scrape(m)
    a = {"namespace": "ns1", "name": "r", "owner": "team-payments"}
    assert val(s, "agentrun_approvals_pending") == 1
    assert val(s, "agentrun_approval_requested_timestamp_seconds", **a) == T0 + 1800
    assert val(s, "agentrun_approval_deadline_timestamp_seconds", **a) == T0 + 1800 + 86400
    assert val(s, "agentrun_approval_age_seconds", **a) == 1800
    assert names_of(s, "agentrun_approval_age_seconds") == {"r"}
    assert val(s, "agentrun_runs", phase="AwaitingApproval") == 1
    # decided: the approval leaves the queue
    st["approval"] = dict(st["approval"], state="Approved", decision="approved")
    st["phase"] = "Running"
    m.observe_run("ns1", "r", SPEC, st)
    s = scrape(m)
    assert val(s, "agentrun_approvals_pending") == 0
    assert names_of(s, "agentrun_approval_age_seconds") == set()


def test_terminal_runs_count_by_phase_but_drop_their_series(m):
    m.observe_run("ns1", "r", SPEC, running_status())
    m.observe_run("ns1", "done", SPEC, running_status(phase="Succeeded"))
    m.observe_run("ns1", "broke", SPEC, running_status(phase="Failed"))
    m.observe_run("ns1", "poor", SPEC, running_status(phase="BudgetExceeded"))
    s = scrape(m)
    assert val(s, "agentrun_runs", phase="Succeeded") == 1
    assert val(s, "agentrun_runs", phase="Failed") == 1
    assert val(s, "agentrun_runs", phase="BudgetExceeded") == 1
    assert val(s, "agentrun_runs", phase="Running") == 1
    for metric in ("agentrun_run_lap", "agentrun_run_cost_usd", "agentrun_run_phase", "agentrun_run_tokens"):
        assert names_of(s, metric) == {"r"}, metric
    # r finishes: its series go, the Succeeded count grows
    m.observe_run("ns1", "r", SPEC, running_status(phase="Succeeded"))
    s = scrape(m)
    assert names_of(s, "agentrun_run_lap") == set()
    assert val(s, "agentrun_runs", phase="Succeeded") == 2
    assert val(s, "agentrun_runs", phase="Running") == 0


def test_forget_run_removes_it(m):
    m.observe_run("ns1", "r", SPEC, running_status())
    m.observe_run("ns1", "s", SPEC, running_status(phase="Succeeded"))
    m.forget_run("ns1", "r")
    m.forget_run("ns1", "s")
    m.forget_run("ns1", "never-seen")  # harmless
    s = scrape(m)
    assert names_of(s, "agentrun_run_lap") == set()
    assert all(val(s, "agentrun_runs", phase=p) == 0 for p in PHASES)


def test_same_name_in_two_namespaces_are_two_runs(m):
    m.observe_run("a", "r", SPEC, running_status(lap=1))
    m.observe_run("b", "r", SPEC, running_status(lap=7))
    s = scrape(m)
    assert val(s, "agentrun_run_lap", namespace="a", name="r") == 1
    assert val(s, "agentrun_run_lap", namespace="b", name="r") == 7
    assert val(s, "agentrun_runs", phase="Running") == 2


def test_cost_and_token_counters_count_growth_only(m):
    cost = lambda usd, i, o: running_status(cost={"usd": usd, "inputTokens": i, "outputTokens": o})  # noqa: E731
    m.observe_run("ns1", "r", SPEC, cost("1.00", 100, 10))  # first sight: a baseline (failover-safe)
    s = scrape(m)
    assert val(s, "agentrun_cost_usd_total") == 0
    m.observe_run("ns1", "r", SPEC, cost("1.25", 150, 20))
    m.observe_run("ns1", "r", SPEC, running_status(cost={}))  # a status without cost lowers nothing
    m.observe_run("ns1", "r", SPEC, cost("1.50", 160, 25))
    m.observe_run("ns1", "other", SPEC, cost("0.10", 1, 1))
    m.observe_run("ns1", "other", SPEC, dict(cost("0.30", 5, 2), phase="Succeeded"))  # last lap counted
    s = scrape(m)
    assert val(s, "agentrun_cost_usd_total") == pytest.approx(0.70)
    assert val(s, "agentrun_tokens_total", direction="input") == 64
    assert val(s, "agentrun_tokens_total", direction="output") == 16
    # the per-run gauge is the status value, not the counter
    assert val(s, "agentrun_run_cost_usd", namespace="ns1", name="r") == 1.5


def test_lap_duration_histogram_by_outcome(m):
    m.lap_finished("ns1", "r", "continue", 12.0)
    m.lap_finished("ns1", "r", "continue", 400.0)
    m.lap_finished("ns1", "r", "awaiting_approval", 3.0)
    m.lap_finished("ns1", "r", "something we never heard of", 1.0)
    s = scrape(m)
    assert val(s, "agentrun_lap_duration_seconds_count", outcome="continue") == 2
    assert val(s, "agentrun_lap_duration_seconds_sum", outcome="continue") == 412
    assert val(s, "agentrun_lap_duration_seconds_bucket", outcome="continue", le="15.0") == 1
    assert val(s, "agentrun_lap_duration_seconds_bucket", outcome="continue", le="600.0") == 2
    assert val(s, "agentrun_lap_duration_seconds_count", outcome="awaiting_approval") == 1
    assert val(s, "agentrun_lap_duration_seconds_count", outcome="other") == 1
    assert {dict(lbl)["outcome"] for (n, lbl) in s if n == "agentrun_lap_duration_seconds_count"} == set(LAP_OUTCOMES)


def test_retries_counter_reasons_are_a_fixed_set(m):
    m.lap_retried("ns1", "r", "evicted")
    m.lap_retried("ns1", "r", "timeout")
    m.lap_retried("ns1", "r", "timeout")
    m.lap_retried("ns1", "r", "pod said: secret=hunter2")  # free text never becomes a label
    s = scrape(m)
    assert val(s, "agentrun_lap_retries_total", reason="evicted") == 1
    assert val(s, "agentrun_lap_retries_total", reason="timeout") == 2
    assert val(s, "agentrun_lap_retries_total", reason="other") == 1
    assert {dict(lbl)["reason"] for (n, lbl) in s if n == "agentrun_lap_retries_total"} == set(RETRY_REASONS)


def test_reconcile_metrics(m):
    for result, d in [("success", 0.02), ("success", 0.2), ("requeue", 0.01), ("error", 1.5), ("bogus", 0.1)]:
        m.reconcile_finished(result, d)
    s = scrape(m)
    assert val(s, "agentrun_reconcile_total", result="success") == 2
    assert val(s, "agentrun_reconcile_total", result="requeue") == 1
    assert val(s, "agentrun_reconcile_total", result="error") == 2  # unknown result counts as an error
    assert val(s, "agentrun_reconcile_total", result="requeue_after") == 0
    assert val(s, "agentrun_reconcile_errors_total") == 2
    assert val(s, "agentrun_reconcile_duration_seconds_count") == 5
    assert val(s, "agentrun_reconcile_duration_seconds_bucket", le="0.025") == 2


def test_garbage_never_breaks_observe_or_scrape(m):
    m.observe_run("ns1", "r", None, None)
    m.observe_run("ns1", "x", {"lapTimeout": "forever", "budget": {"maxCostUSD": "lots"}},
                  {"phase": "Dancing", "lap": "x", "lastCheckpointTime": "yesterday", "cost": {"usd": None},
                   "approval": {"state": "Pending"}})
    s = scrape(m)
    assert val(s, "agentrun_runs", phase="Pending") == 2  # unknown phase counted as Pending
    assert val(s, "agentrun_run_lap_timeout_seconds", namespace="ns1", name="x") == 600
    assert val(s, "agentrun_approvals_pending") == 1
    # no requestedAt: no age series is made up for it
    assert names_of(s, "agentrun_approval_age_seconds") == set()


def test_no_secret_or_free_text_reaches_the_exposition(m):
    st = running_status(message="model key sk-live-SECRET leaked?",
                        approval={"state": "Pending", "owner": "o", "arguments": '{"card": "4111-SECRET"}',
                                  "requestedAt": iso(T0), "deadline": iso(T0 + 60)},
                        phase="AwaitingApproval")
    spec = dict(SPEC, task="use token SECRET-TASK", agent={"model": {"apiKeySecretRef": {"name": "SECRET-REF", "key": "k"}}})
    m.observe_run("ns1", "r", spec, st)
    text = generate_latest(m.registry).decode()
    assert "SECRET" not in text


def test_normalize_label():
    assert normalize_label("oom_killed", RETRY_REASONS) == "oom_killed"
    assert normalize_label("OOMKilled", RETRY_REASONS) == "other"
    assert normalize_label(None, RETRY_REASONS) == "other"


def test_http_server_serves_metrics_and_readiness(m):
    checks = {}
    httpd = serve(m.registry, 0, "127.0.0.1", checks)
    try:
        base = f"http://127.0.0.1:{httpd.server_port}"
        m.observe_run("ns1", "r", SPEC, running_status())
        body = urllib.request.urlopen(base + "/metrics").read().decode()
        assert 'agentrun_run_lap{name="r",namespace="ns1"} 3.0' in body
        assert urllib.request.urlopen(base + "/readyz").status == 200  # no check registered: serving
        with pytest.raises(urllib.error.HTTPError) as err:  # liveness is Kopf's endpoint (controller/process.py)
            urllib.request.urlopen(base + "/healthz")
        assert err.value.code == 404
        checks["readyz"] = lambda: False
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/readyz")
        assert err.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/nope")
        assert err.value.code == 404
    finally:
        # the serving thread polls every POLL_SECONDS (300): shutdown wakes it instead of waiting
        import threading

        stopping = threading.Thread(target=httpd.shutdown)
        stopping.start()
        stopping.join(60)
        assert not stopping.is_alive(), "shutdown waited for the serving thread's poll"
        httpd.server_close()


def test_module_level_api_is_what_the_controller_calls():
    from agentrun import metrics

    for fn in ("observe_run", "forget_run", "lap_finished", "lap_retried", "reconcile_finished", "start_server"):
        assert callable(getattr(metrics, fn))
    metrics.observe_run("api-test-ns", "api-test", {}, {"phase": "Running", "lap": 2})
    try:
        text = generate_latest(metrics.REGISTRY).decode()
        assert 'agentrun_run_lap{name="api-test",namespace="api-test-ns"} 2.0' in text
        assert "process_cpu_seconds_total" in text or "python_info" in text
    finally:
        metrics.forget_run("api-test-ns", "api-test")


def test_last_progress_includes_the_end_of_a_wait(m, clock):
    run = {"namespace": "ns1", "name": "r"}
    waiting = running_status(phase="AwaitingApproval", activeJob=None,
                             approval={"state": "Pending", "owner": "o", "requestedAt": iso(T0 + 600),
                                       "deadline": iso(T0 + 90000)})
    m.observe_run("ns1", "r", SPEC, waiting)
    assert val(scrape(m), "agentrun_run_last_progress_timestamp_seconds", **run) == T0 + 600  # the checkpoint
    # decided two days later: the decision time counts as progress, the checkpoint is old
    decided = dict(waiting, phase="Running",
                   approval=dict(waiting["approval"], state="Approved", decidedAt=iso(T0 + 172800)))
    m.observe_run("ns1", "r", SPEC, decided)
    s = scrape(m)
    assert val(s, "agentrun_run_last_progress_timestamp_seconds", **run) == T0 + 172800
    assert val(s, "agentrun_run_last_checkpoint_timestamp_seconds", **run) == T0 + 600


def test_leaving_suspension_is_progress_even_without_a_status_time(m, clock):
    run = {"namespace": "ns1", "name": "r"}
    m.observe_run("ns1", "r", SPEC, running_status(phase="Suspended", activeJob=None))
    clock.now = T0 + 50_000
    m.observe_run("ns1", "r", SPEC, running_status(phase="Running"))
    assert val(scrape(m), "agentrun_run_last_progress_timestamp_seconds", **run) == T0 + 50_000
    clock.now += 10
    m.observe_run("ns1", "r", SPEC, running_status(phase="Running"))  # kept on later observations
    assert val(scrape(m), "agentrun_run_last_progress_timestamp_seconds", **run) == T0 + 50_000


def test_leaving_the_queue_is_progress(m, clock):
    """A run that waited Queued (an AgentRunPolicy's maxActiveRuns) for longer than the stall alert's
    threshold does not fire it when it is admitted: leaving the queue is progress."""
    run = {"namespace": "ns1", "name": "q"}
    m.observe_run("ns1", "q", SPEC, {"phase": "Queued", "lap": 0})
    clock.now = T0 + 86_400
    m.observe_run("ns1", "q", SPEC, {"phase": "Pending", "lap": 0})
    assert val(scrape(m), "agentrun_run_last_progress_timestamp_seconds", **run) == T0 + 86_400


def test_checkpoint_bytes_gauges_and_the_per_lap_histogram(m):
    from agentrun import metrics

    m.observe_run("ns1", "r", {**SPEC, "checkpoint": {"maxRunBytes": 5_000_000}},
                  running_status(storage={"bytes": 123456, "objects": 42}))
    m.observe_run("ns1", "legacy", SPEC, running_status())  # no status.storage: no bytes series, default ceiling
    m.lap_finished("ns1", "r", "continue", 5.0, 900)
    m.lap_finished("ns1", "r", "continue", 5.0, 70_000)
    m.lap_finished("ns1", "r", "continue", 5.0)  # unknown: not observed
    s = scrape(m)
    assert val(s, "agentrun_run_checkpoint_bytes", namespace="ns1", name="r") == 123456
    assert val(s, "agentrun_run_checkpoint_max_bytes", namespace="ns1", name="r") == 5_000_000
    assert "legacy" not in names_of(s, "agentrun_run_checkpoint_bytes")
    assert val(s, "agentrun_run_checkpoint_max_bytes", namespace="ns1", name="legacy") == 1024**3
    assert val(s, "agentrun_lap_checkpoint_bytes_count") == 2 and val(s, "agentrun_lap_checkpoint_bytes_sum") == 70_900
    assert val(s, "agentrun_lap_checkpoint_bytes_bucket", le="1024.0") == 1
    import inspect

    assert "checkpoint_bytes" in inspect.signature(metrics.lap_finished).parameters  # what the executor passes


def test_run_info_carries_the_trace_id_of_live_traced_runs_only(m):
    """``agentrun_run_info{namespace,name,trace_id} 1``: the dashboard's link from a run to its trace.
    Only runs with a well-formed status.traceId (tracing on), only while they live."""
    trace = "0123456789abcdef0123456789abcdef"
    m.observe_run("ns1", "traced", SPEC, running_status(traceId=trace))
    m.observe_run("ns1", "untraced", SPEC, running_status())
    m.observe_run("ns1", "odd", SPEC, running_status(traceId='x"} 1\nagentrun_evil{a="'))
    s = scrape(m)
    assert val(s, "agentrun_run_info", namespace="ns1", name="traced", trace_id=trace) == 1
    assert names_of(s, "agentrun_run_info") == {"traced"}
    m.observe_run("ns1", "traced", SPEC, running_status(phase="Succeeded", traceId=trace))
    assert names_of(scrape(m), "agentrun_run_info") == set()
    m.observe_run("ns1", "again", SPEC, running_status(traceId=trace))
    m.forget_run("ns1", "again")
    assert names_of(scrape(m), "agentrun_run_info") == set()
