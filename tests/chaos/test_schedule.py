"""The chaos schedules are a pure function of the seed: the same seed gives the same plan, the new
fault kinds are scheduled, and every soak wave carries faults."""

from __future__ import annotations

import pytest
from e2e.chaos import schedule as sch


def _plan(scns):
    return [(s.name, [(p.name, p.approval, p.laps) for p in s.runs],
             [(f.kind, round(f.at, 6), f.down_seconds, f.delay) for f in s.faults], s.replicas, s.skews)
            for s in scns]


def test_the_same_seed_gives_the_same_plan():
    for name in ("ci", "full", "smoke", "new"):
        assert _plan(sch.build(name, 7)) == _plan(sch.build(name, 7))
        assert _plan(sch.build(name, 7)) != _plan(sch.build(name, 8))
    assert _plan(sch.build_soak(7, 10, 4, 30)) == _plan(sch.build_soak(7, 10, 4, 30))


def test_the_new_faults_are_scheduled():
    new = {s.name: s for s in sch.build("new", 7)}
    assert {f.kind for f in new["etcd-kubelet"].faults} == {sch.ETCD_RESTART, sch.KUBELET_RESTART}
    for name in ("leader-kill", "clock-skew"):
        s = new[name]
        assert s.replicas == 2 and s.approval_burst > 0 and [f.kind for f in s.faults] == [sch.LEADER_KILL]
        assert all(p.approval for p in s.runs)
    lo, hi = new["clock-skew"].skews
    assert lo < 0 < hi  # the holder (first replica) behind, the standby ahead
    assert set(new) <= {s.name for s in sch.build("full", 7)}


def test_soak_waves_draw_every_fault_kind():
    waves = sch.build_soak(3, 10, 4, 60)
    kinds = {f.kind for w in waves for f in w.faults}
    assert set(sch.SOAK_KINDS) | {sch.LEADER_KILL} <= kinds
    assert all(w.faults for w in waves) and any(w.replicas == 2 and w.skews for w in waves)


def test_default_seed_reads_chaos_seed(monkeypatch):
    monkeypatch.setenv("CHAOS_SEED", "4242")
    assert sch.default_seed() == (4242, "CHAOS_SEED")
    monkeypatch.delenv("CHAOS_SEED")
    seed, source = sch.default_seed()  # without it: derived from the git commit, the same for every run
    from pathlib import Path
    if (Path(sch.__file__).resolve().parents[2] / ".git").exists():
        assert source.startswith("commit ") and sch.default_seed() == (seed, source)
    else:  # a tarball: a random seed each time (the next test)
        assert source.startswith("no git commit found: a random seed")


def test_without_git_the_seed_is_random_and_named_never_a_fixed_zero(monkeypatch, tmp_path):
    """A source tree without .git (a tarball): outside any repository, with git on PATH and without
    it, each call takes a fresh random seed and says so (issue 36: it silently became 0)."""
    monkeypatch.delenv("CHAOS_SEED", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repository above
    seeds = set()
    for path in ("", None):
        if path is None:
            monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
        for _ in range(3):
            seed, source = sch.default_seed(cwd=tmp_path)
            assert 0 < seed < 10**6 and source == f"no git commit found: a random seed, replay with CHAOS_SEED={seed}"
            seeds.add(seed)
    assert len(seeds) > 1  # random, not a fixed default


def test_the_cli_prints_the_random_seed_first(monkeypatch, tmp_path, capsys):
    from e2e.chaos import __main__ as cli

    monkeypatch.delenv("CHAOS_SEED", raising=False)
    monkeypatch.setattr(cli, "default_seed", lambda: sch.default_seed(cwd=tmp_path))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    ran: list = []
    monkeypatch.setattr(cli, "run_schedule", lambda schedule, seed, *a, **kw: ran.append(seed))
    assert cli.main(["--schedule", "smoke", "--dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"chaos seed {ran[0]} (no git commit found: a random seed, replay with CHAOS_SEED={ran[0]})"


def test_soak_waves_stay_recoverable():
    """At most one S3 outage per wave, short enough for the runs' attempts (10 per lap, 1-3 s backoff)."""
    for seed in range(20):
        for w in sch.build_soak(seed, 10, 4, 60):
            outages = [f for f in w.faults if f.kind == sch.S3_OUTAGE]
            assert len(outages) <= 1 and all(f.down_seconds <= 20 for f in outages)


def _orders(plan) -> dict[str, int]:
    """order -> lap (1-based) of every scripted `note` call of a run."""
    return {c["arguments"]["order"]: s + 1 for s, st in enumerate(plan.steps)
            for c in st.get("toolCalls") or [] if c["name"] == "note"}


@pytest.mark.parametrize("seed", [1, 7, 363823])
def test_every_fault_that_needs_a_running_lap_has_its_own_victim_call(seed):
    """Pod deletes/SIGKILLs and kubelet restarts are given a scripted call each, held at the tool
    server until the fault lands (so it never races a short lap): a `note` call of a lap that is not
    the run's last, one fault per lap, the same for the same seed."""
    scns = sch.build("full", seed) + sch.build("ci", seed) + sch.build_soak(seed, 10, 4, 30)
    for s in scns:
        taken = set()
        orders = {o: (p, lap) for p in s.runs for o, lap in _orders(p).items()}
        for f in s.faults:
            if f.kind not in sch.LAP_FAULTS:
                assert f.target is None
                continue
            assert f.target in orders, (s.name, f)
            plan, lap = orders[f.target]
            assert lap < plan.laps and (plan.name, lap) not in taken
            taken.add((plan.name, lap))
    again = sch.build("full", seed)
    # most victims are the second call of a two-call lap: check_journaled is not vacuous
    victims = [f.target for s in scns for f in s.faults if f.target]
    assert sum(1 for v in victims if v.endswith("/2")) * 2 > len(victims), victims
    assert [f.target for s in again for f in s.faults] == [f.target for s in sch.build("full", seed) for f in s.faults]


def test_a_fault_without_a_free_call_lap_keeps_the_old_way():
    plan = sch.RunPlan(name="r", steps=[{"content": "lap 1", "toolCalls": [sch._note("r/1/1")]}, {"content": "done"}])
    faults = [sch.Fault(kind=sch.POD_SIGKILL, at=0.5, pick=0.0), sch.Fault(kind=sch.POD_DELETE, at=0.5, pick=0.9)]
    sch.assign_targets(sch.Scenario(name="x", runs=[plan], faults=faults))
    assert [f.target for f in faults] == ["r/1/1", None]


def test_the_victim_is_the_last_call_of_a_lap_with_two():
    """invariants.check_journaled checks the calls of the victim's lap sent before it: with the
    lap's first call as the victim there are none (the check was vacuous in the ci schedule)."""
    steps = [{"content": "lap 1", "toolCalls": [sch._note("r/1/1")]},
             {"content": "lap 2", "toolCalls": [sch._note("r/2/1"), sch._note("r/2/2")]}, {"content": "done"}]
    faults = [sch.Fault(kind=sch.POD_SIGKILL, at=0.0, pick=0.0)]
    sch.assign_targets(sch.Scenario(name="x", runs=[sch.RunPlan(name="r", steps=steps)], faults=faults))
    assert [f.target for f in faults] == ["r/2/2"]
