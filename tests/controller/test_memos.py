"""controller/memos.py: the shell's memos over the pure observation (a run's parsed spec, each
cached Job's observation), which change no observation."""

from __future__ import annotations

from datetime import UTC, datetime

from test_decide_observe import job, run_body

from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.observe import observe, parse_run
from agentrun.controller.memos import JobMemo, SpecMemo


def test_a_runs_spec_is_parsed_once_while_its_json_is_unchanged():
    """SpecMemo: a status write returns a new body with an equal spec: the parsed spec is reused;
    a changed spec (or an invalid one) is parsed again; forget() drops it."""

    memo = SpecMemo()
    first = parse_run(run_body(), memo)
    again = parse_run(run_body(phase="Running"), memo)  # a new dict, an equal spec
    assert again[0] is first[0] and again[2].phase == "Running"
    changed = run_body()
    changed["spec"]["task"] = "another task"
    third = parse_run(changed, memo)
    assert third[0] is not first[0] and third[0].task == "another task"
    broken = run_body()
    broken["spec"]["agent"] = {"version": 3}
    spec, error, _ = parse_run(broken, memo)
    assert spec is None and error and error.startswith("spec.agent")
    memo.forget(("ns", "r"))
    assert parse_run(run_body(), memo)[0] is not first[0]


def test_finished_jobs_are_observed_once_while_the_cache_holds_the_same_object():
    memo, cfg, now = JobMemo(), OperatorConfig(checkpoint_uri="s3://b/p"), datetime(2026, 1, 1, tzinfo=UTC)
    history = [job(lap, 1, cond="Complete") for lap in range(1, 6)]
    current = job(6, 1)
    body = run_body(lap=5)
    first = observe(body, [*history, current], lambda name: [], cfg, now, job_memo=memo)
    again = observe(body, [*history, current], lambda name: [], cfg, now, job_memo=memo)
    plain = observe(body, [*history, current], lambda name: [], cfg, now)
    assert first.jobs == plain.jobs  # the memo changes no observation
    assert [a is b for a, b in zip(first.jobs, again.jobs, strict=True)] == [True] * 5 + [False]  # current: anew
    assert len(memo) == 5  # the current attempt's Job (pods read) is not memoized
    # the cache replaces a Job's dict on every event: a new object is observed again
    changed = job(3, 1, cond="Failed")
    third = observe(body, [*history[:2], changed, *history[3:], current], lambda name: [], cfg, now, job_memo=memo)
    assert third.jobs[2].state == "failed" and third.jobs[2] is not first.jobs[2]
    assert third.jobs[0] is first.jobs[0]


def test_the_job_memo_is_bounded():
    memo = JobMemo(limit=3)
    jobs = [job(lap, 1, cond="Complete") for lap in range(1, 8)]
    for j in jobs:
        assert memo.observed(j) is not None
        assert len(memo) <= 3
    assert memo.observed({"metadata": {"name": "x", "namespace": "ns"}}) is None  # not a lap Job: None, memoized
