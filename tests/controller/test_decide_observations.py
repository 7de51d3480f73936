"""Observations that explain themselves (issue 12, item 4): conditions per type, the cause of a
failed lap in status/Events, and every typed retry reason and lap outcome under its own metric
label, from decide()'s output to the scraped /metrics text."""

from __future__ import annotations

import dataclasses
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from controller_world import World, make_spec
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api.reasons import ConditionType, LapOutcome, Reason, RetryReason
from agentrun.controller import decide as d
from agentrun.metrics import OperatorMetrics
from agentrun.metrics.server import serve

MANY = {"attemptsPerLap": 10, "backoff": {"initial": "1s", "max": "1s", "factor": 1}}
CONNECT_ERROR_TAIL = "\n".join([
    '{"ts": "2030-01-01T00:00:00Z", "level": "info", "msg": "lap starting", "lap": 1}',
    '{"ts": "2030-01-01T00:00:01Z", "level": "warning", "msg": "model call retried", "attempt": 1}',
    '{"ts": "2030-01-01T00:00:02Z", "level": "error", "msg": "lap failed", "exit_code": 75, '
    '"error": "model endpoint http://user:hunter22@model.example:8080/v1/chat?token=abc unreachable (ConnectError)"}',
])


def conditions(w: World) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in w.status.conditions}


# ---------------------------------------------------------------------------------- conditions


def test_each_condition_type_has_its_own_reason_not_the_phases():
    w = World(make_spec(retry={"attemptsPerLap": 1, "backoff": {"initial": "1s", "max": "1s", "factor": 1}}))
    w.reconcile()
    w.fail_job(75)
    w.reconcile()
    assert w.status.phase == "Failed"
    conds = conditions(w)
    assert conds["Failed"][:2] == ("True", "RetriesExhausted")
    assert conds["Progressing"][:2] == ("False", "RetriesExhausted")  # why nothing runs: the phase
    assert conds["AwaitingApproval"][:2] == ("False", Reason.NO_APPROVAL_PENDING)
    assert conds["Suspended"][:2] == ("False", Reason.NOT_SUSPENDED)
    assert conds["Complete"][:2] == ("False", Reason.NOT_COMPLETE)
    assert "RetriesExhausted" not in conds["AwaitingApproval"][2] + conds["Suspended"][2] + conds["Complete"][2]
    assert set(conds) == set(ConditionType)


def test_a_decided_approval_names_itself_in_its_condition_while_the_run_goes_on():
    w = World(make_spec())
    w.reconcile()
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    assert conditions(w)["AwaitingApproval"][:2] == ("True", "ApprovalRequested")
    assert conditions(w)["Progressing"][:2] == ("False", "ApprovalRequested")
    w.annotations.update({"approved": "true", "agentrun.dev/decided-by": "alice"})
    w.reconcile()
    status, reason, message = conditions(w)["AwaitingApproval"]
    assert (status, reason) == ("False", Reason.APPROVAL_APPROVED)
    assert "call c1 of tool refund (lap 1) was approved by alice" == message
    assert conditions(w)["Progressing"][:2] == ("True", "LapRunning")


def test_suspended_condition_says_resumed_after_a_suspension():
    w = World(make_spec())
    w.reconcile()
    w.finish_job()
    w.spec = make_spec(suspend=True)
    w.reconcile()
    assert conditions(w)["Suspended"][:2] == ("True", "Suspended")
    w.spec = make_spec()
    w.reconcile()
    assert conditions(w)["Suspended"][:2] == ("False", Reason.RESUMED)
    assert w.reconcile().of(d.PatchStatus) == []  # stable: deciding again changes nothing


# ---------------------------------------------------------------------------------- causes


def test_a_retried_lap_carries_its_cause_redacted_into_status_event_and_retries():
    w = World(make_spec(retry=MANY))
    w.reconcile()
    w.fail_job(75, "Error", termination_message=CONNECT_ERROR_TAIL)
    w.reconcile()
    cause = "model endpoint http://model.example:8080/v1/chat unreachable (ConnectError)"
    assert w.status.retries[0].last_reason == f"RetryableError: {cause}"
    assert cause in w.status.message and w.status.phase == "Retrying"
    (ev,) = [e for e in w.events if e.reason == "LapRetry"]
    assert ev.type == "Warning" and cause in ev.message
    for text in (w.status.message, ev.message, w.status.retries[0].last_reason):
        assert "hunter22" not in text and "token=abc" not in text


def test_an_exhausted_lap_names_the_cause_not_just_retryable_error():
    w = World(make_spec(retry={"attemptsPerLap": 1, "backoff": {"initial": "1s", "max": "1s", "factor": 1}}))
    w.reconcile()
    w.fail_job(75, "Error", termination_message=CONNECT_ERROR_TAIL)
    w.reconcile()
    assert w.status.phase == "Failed"
    assert "last: RetryableError: model endpoint http://model.example:8080/v1/chat unreachable (ConnectError)" \
        in w.status.message


def test_a_permanent_failure_without_report_takes_the_pods_cause():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(2, "Error", termination_message="Traceback (most recent call last):\n  ...\n"
               "ValueError: bad api_key=sk-abcdefghijklmnopqrstuvwxyz in request")
    w.reconcile()
    assert w.status.phase == "Failed"
    assert "ValueError: bad api_key=[REDACTED] in request" in w.status.message
    assert "sk-abc" not in w.status.message


@pytest.mark.parametrize("text,cause", [
    (None, None),
    ("", None),
    ("plain crash line\n\n", "plain crash line"),
    ('2030-01-01T00:00:00Z ERROR lap failed lap=1 attempt=1 exit_code=75 error=tool "x" timed out',
     'tool "x" timed out'),
    ('{"msg": "lap configuration refused", "error": "AGENTRUN_SPEC: spec.task: field required"}\n',
     "AGENTRUN_SPEC: spec.task: field required"),
    ("Authorization: Bearer abcdefghijklmnop failed", "Authorization: [REDACTED] failed"),
    ("key AKIAABCDEFGHIJKLMNOP refused", "key [REDACTED] refused"),
    ("x" * 1000, "x" * 299 + "…"),
    ("bell\x07 and \x1b[2J", "bell\\x07 and \\x1b[2J"),
    # a lap killed mid-way: its last line is the runner's progress, no cause
    ('{"ts": "2030-01-01T00:00:00Z", "level": "info", "msg": "lap starting", "lap": 1}\n', None),
    ('Traceback\nMemoryError\n{"msg": "lap starting"}\n', "MemoryError"),
])
def test_lap_cause_is_one_bounded_redacted_line(text, cause):
    assert d.lap_cause(text) == cause


def test_a_lap_killed_by_a_signal_says_so_not_its_last_log_line():
    w = World(make_spec())
    w.reconcile()
    w.fail_job(137, "Error", termination_message='{"ts": "2030-01-01T00:00:00Z", "msg": "lap starting", "lap": 1}')
    w.reconcile()
    retry = w.status.retries[-1]
    assert retry.last_reason == "killed by SIGKILL (exit code 137)"
    assert "lap starting" not in (w.status.message or "")


# ---------------------------------------------------------------------------------- metrics


def _actions(w: World) -> list[d.Action]:
    return [a for _, dec in w.passes for a in dec.actions]


def _retry_after_backoff(w: World) -> None:
    w.now += timedelta(seconds=5)
    w.reconcile()


def _scenarios() -> list[World]:
    """Runs that make decide produce every retry reason and every lap outcome it knows."""
    worlds = []

    w = World(make_spec(retry=MANY))
    w.reconcile()
    for exit_code, reason in [(75, "Error"), (None, "DeadlineExceeded: the lap ran longer than spec.lapTimeout"),
                              (137, "OOMKilled"), (None, "Evicted"), (1, "Error")]:
        w.fail_job(exit_code, reason)
        w.reconcile()
        _retry_after_backoff(w)
    w.jobs.pop(w.status.active_job.name)  # the Job disappears
    w.reconcile()
    _retry_after_backoff(w)
    j = w.active()  # ends as if checkpointed, but no checkpoint
    w.jobs[j.name] = dataclasses.replace(j, state="succeeded", exit_code=0)
    w.reconcile()
    _retry_after_backoff(w)
    w.finish_job("continue")
    w.reconcile()
    w.finish_job("continue", exit_code=3)
    w.reconcile()
    # a lost status write, and the Job found carries another decision: not adopted, retried
    name = w.status.active_job.name
    w.status = w.status.model_copy(update={"active_job": None})
    w.jobs[name] = dataclasses.replace(w.jobs[name], approval='{"decision":"approved"}')
    w.reconcile()
    _retry_after_backoff(w)
    w.finish_job("awaiting-approval", pending=True)
    w.reconcile()
    w.annotations["approved"] = "true"
    w.reconcile()
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded", w.status
    worlds.append(w)

    w = World(make_spec())
    w.reconcile()
    w.finish_job("failed")
    w.reconcile()
    worlds.append(w)

    w = World(make_spec())
    w.reconcile()
    w.fail_job(2)
    w.reconcile()
    worlds.append(w)
    return worlds


def _scrape(registry) -> dict[tuple[str, str], float]:
    server = serve(registry, 0, "127.0.0.1", {})
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "agentrun_lap_retries_total":
                out[("reason", s.labels["reason"])] = s.value
            elif s.name == "agentrun_lap_duration_seconds_count":
                out[("outcome", s.labels["outcome"])] = s.value
    return out


def test_every_retry_reason_and_lap_outcome_of_decide_has_its_own_label_in_the_scraped_metrics():
    m = OperatorMetrics(process_metrics=False)
    retried: Counter[str] = Counter()
    finished: Counter[str] = Counter()
    for w in _scenarios():
        for a in _actions(w):  # as the shell does with them
            if isinstance(a, d.LapRetried):
                assert isinstance(a.reason, RetryReason)
                retried[a.reason] += 1
                m.lap_retried("ns", "run", a.reason)
            elif isinstance(a, d.LapFinished):
                assert isinstance(a.outcome, LapOutcome)
                finished[a.outcome] += 1
                m.lap_finished("ns", "run", a.outcome, a.duration_seconds, a.checkpoint_bytes)
    # decide produced every typed value (but "other", which it never produces) ...
    assert set(retried) == set(RetryReason) - {RetryReason.OTHER}
    assert set(finished) == set(LapOutcome) - {LapOutcome.OTHER}
    # ... and each lands under its own label, none in "other"
    scraped = _scrape(m.registry)
    for reason in RetryReason:
        assert scraped[("reason", reason.value)] == retried[reason], reason
    for outcome in LapOutcome:
        assert scraped[("outcome", outcome.value)] == finished[outcome], outcome
    assert scraped[("reason", "other")] == 0 and scraped[("outcome", "other")] == 0


def test_metrics_count_a_reason_or_outcome_decide_does_not_produce_as_other():
    from agentrun.metrics.core import lap_outcome_label, retry_reason_label

    assert retry_reason_label("something new") == "other" and retry_reason_label(None) == "other"
    assert lap_outcome_label("exit code 137") == "other"


HOSTILE = "boom \x1b[2J\u202e api_key=sk-abcdefghijklmnopqrstuvwxyz\nsecond line"


def test_a_cause_the_runner_wrote_is_escaped_and_redacted_like_one_read_from_the_log_tail():
    """The lap pod's image is the run author's, so the ``error`` of its termination message (the
    shell's ``ObservedJob.message``) is their text: it went into retries[].lastReason, status.message
    and the Warning Event raw — ESC, a bidi override and a key — while the log-tail path escaped and
    redacted. Review finding 1."""
    w = World(make_spec(retry=MANY))
    w.reconcile()
    w.fail_job(75, "Error", message=HOSTILE)
    w.reconcile()
    (ev,) = [e for e in w.events if e.reason == "LapRetry"]
    for text in (w.status.message, ev.message, w.status.retries[0].last_reason):
        assert "\x1b" not in text and "\u202e" not in text and "sk-abc" not in text and "\n" not in text, text
        assert "boom \\x1b[2J\\u202e api_key=[REDACTED]" in text
        assert "second line" not in text


def test_an_attempt_reports_message_is_escaped_and_redacted_and_so_is_the_phases_text():
    w = World(make_spec())
    w.reconcile()
    w.failure_reports[(1, 1)] = {"reason": "Error", "message": HOSTILE}
    w.fail_job(2, "Error")
    w.reconcile()
    w.reconcile()
    assert w.status.phase == "Failed"
    (ev,) = [e for e in w.events if e.type == "Warning"]
    for text in (w.status.message, ev.message, *(c.message for c in w.status.conditions)):
        assert "\x1b" not in text and "\u202e" not in text and "sk-abc" not in text and "\n" not in text, text
    assert "api_key=[REDACTED]" in w.status.message


def test_a_spec_change_without_a_phase_change_moves_every_conditions_observed_generation():
    """Review finding 16: status.observedGeneration followed the spec, the conditions' did not (set
    only when the phase was written), so a client reading a condition could not tell it was
    decided against the current spec."""
    w = World(make_spec())
    w.reconcile()
    assert {c.observed_generation for c in w.status.conditions} == {w.generation}
    w.generation += 1  # e.g. spec.budget raised: the lap goes on, the phase stays Running
    w.reconcile()
    assert w.status.observed_generation == w.generation
    assert {c.observed_generation for c in w.status.conditions} == {w.generation}
    assert w.reconcile().of(d.PatchStatus) == []  # stable
