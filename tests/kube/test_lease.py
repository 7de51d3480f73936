"""The Lease elector (``agentrun.kube.lease``), driven by an injected clock and an in-memory Lease
API: no sleeps, no wall-clock windows."""

from __future__ import annotations

import logging

import pytest

# ---------------------------------------------------------------------------------------------------
# The Lease elector, driven by an injected clock and an in-memory Lease API: no sleeps, no wall-clock
# windows. Virtual time only moves when every elector under test is parked in its clock's sleep.


def test_lease_action_expires_by_the_replicas_own_observed_time():
    from agentrun.kube.lease import lease_action

    other = {"holderIdentity": "other", "renewTime": "2000-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15}
    assert lease_action(None, "me", 0.0, 0.0, 15) == "create"
    assert lease_action({"holderIdentity": "me"}, "me", 0.0, 100.0, 15) == "renew"
    assert lease_action({"holderIdentity": None}, "me", 0.0, 0.0, 15) == "take"
    # a renewTime far in the past (a holder whose clock is behind) is NOT expired: only the time this
    # replica has watched the record stay unchanged counts
    assert lease_action(other, "me", 100.0, 114.9, 15) == "wait"
    assert lease_action(other, "me", 100.0, 115.0, 15) == "take"
    future = {**other, "renewTime": "2999-01-01T00:00:00.000000Z"}  # a holder whose clock is ahead
    assert lease_action(future, "me", 100.0, 115.0, 15) == "take"
    assert lease_action({**other, "leaseDurationSeconds": None}, "me", 0.0, 9.9, 10) == "wait"


def test_observe_restarts_the_observed_time_only_when_the_record_changes():
    from agentrun.kube.lease import observe

    spec = {"holderIdentity": "a", "renewTime": "t1", "leaseDurationSeconds": 3}
    o1 = observe(None, spec, 10.0, "5")
    assert observe(o1, dict(spec), 20.0, "5").at == 10.0  # unchanged: keeps the first observation
    assert observe(o1, {**spec, "renewTime": "t2"}, 20.0, "6").at == 20.0
    assert observe(o1, dict(spec), 20.0, "7").at == 20.0  # same fields, new write (resourceVersion)
    assert observe(o1, None, 20.0).at == 20.0


class VirtualTime:
    """Shared virtual time. ``sleep`` parks the caller; ``advance`` wakes the earliest sleeper once
    all ``parties`` are parked (so a renewal in flight in flight is never overtaken)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleepers: list = []  # (wake_at, seq, future)
        self.seq = 0

    async def sleep(self, seconds: float) -> None:
        import asyncio

        fut = asyncio.get_running_loop().create_future()
        self.seq += 1
        self.sleepers.append((self.t + seconds, self.seq, fut))
        await fut

    async def run_until(self, t_end: float, parties: int, each_step=None) -> None:
        import asyncio

        while self.t < t_end:
            polls = 0
            while True:  # wait (by condition, not by time) until everybody is parked
                self.sleepers = [s for s in self.sleepers if not s[2].done()]  # cancelled sleepers
                if len(self.sleepers) >= parties:
                    for _ in range(10):  # let tasks the electors spawned (on_acquire) run first
                        await asyncio.sleep(0)
                    break
                polls += 1  # a generous bound, only so a blocked elector fails instead of hanging
                assert polls < 30_000, f"an elector never got back to its clock's sleep (virtual t={self.t})"
                await asyncio.sleep(0.001)
            self.sleepers.sort(key=lambda s: (s[0], s[1]))
            wake, _, fut = self.sleepers.pop(0)
            self.t = max(self.t, wake)
            fut.set_result(None)
            await asyncio.sleep(0)
            if each_step is not None:
                each_step(self.t)


class ViewClock:
    """One replica's view of the virtual time: its wall clock off by ``offset`` seconds, its clock
    running at ``rate`` (1.0 = true time)."""

    def __init__(self, vt: VirtualTime, offset: float = 0.0, rate: float = 1.0) -> None:
        self.vt, self.offset, self.rate = vt, offset, rate

    def wall(self):
        from datetime import UTC, datetime, timedelta

        return datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=self.vt.t * self.rate + self.offset)

    def monotonic(self) -> float:
        return self.vt.t * self.rate

    async def sleep(self, seconds: float) -> None:
        await self.vt.sleep(seconds / self.rate)


class FakeLeaseAPI:
    """An in-memory coordination/v1 Lease endpoint with resourceVersion conflicts (the elector's
    ``LeaseAPI``). ``down`` makes every call fail like an unreachable API; ``calls`` counts them."""

    def __init__(self) -> None:
        self.spec: dict | None = None
        self.rv = 0
        self.down = False
        self.writes: list[tuple[str, str]] = []  # (holder, kind)
        self.calls: list[str] = []
        self.now = lambda: 0.0  # the time of each write, in ``written_at`` (a test's clock)
        self.written_at: list[float] = []

    def _check(self, verb: str) -> None:
        self.calls.append(verb)
        if self.down:
            raise ConnectionError("apiserver unavailable")

    def _doc(self) -> dict:
        return {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": str(self.rv)}, "spec": dict(self.spec)}

    async def read(self, name, ns, timeout):
        self._check("get")
        return None if self.spec is None else self._doc()

    async def create(self, ns, body, timeout):
        self._check("create")
        if self.spec is not None:
            return None
        self.spec, self.rv = dict(body["spec"]), self.rv + 1
        self.writes.append((self.spec["holderIdentity"], "create"))
        return self._doc()

    async def replace(self, name, ns, body, timeout):
        self._check("update")
        if body["metadata"].get("resourceVersion") != str(self.rv):
            return None
        before = (self.spec or {}).get("holderIdentity")
        self.spec, self.rv = dict(body["spec"]), self.rv + 1
        self.writes.append((self.spec["holderIdentity"], "renew" if before == self.spec["holderIdentity"] else "take"))
        self.written_at.append(self.now())
        return self._doc()

    async def patch(self, name, ns, body, timeout):
        self._check("patch")
        self.spec, self.rv = {**self.spec, **body["spec"]}, self.rv + 1


def _elector(identity, api, clock, duration=3.0, **kw):
    from agentrun.kube.lease import LeaseElector

    return LeaseElector("l", "ns", identity, duration, clock=clock, api=api, **kw)


def _drive(vt: VirtualTime, electors, t_end: float, each_step=None) -> None:
    import asyncio

    async def go() -> None:
        tasks = [asyncio.create_task(e.run()) for e in electors]
        try:
            await vt.run_until(t_end, len(tasks), each_step)
            for t in tasks:
                assert not t.done(), t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())


def test_lease_standby_logs_the_holder_once(caplog):
    vt, api = VirtualTime(), FakeLeaseAPI()
    api.spec = {"holderIdentity": "other", "renewTime": "x", "leaseDurationSeconds": 3}
    standby = _elector("me", api, ViewClock(vt))

    def holder_renews(t: float) -> None:  # the other replica keeps renewing: the record changes
        api.spec = {**api.spec, "renewTime": f"t{t}"}
        api.rv += 1

    with caplog.at_level(logging.INFO, logger="agentrun.lease"):
        _drive(vt, [standby], 30.0, holder_renews)
    msgs = [r.getMessage() for r in caplog.records if "standby" in r.getMessage()]
    assert msgs == ["lease ns/l held by other: this replica (me) is standby"]
    assert not standby.is_leader and api.spec["holderIdentity"] == "other"


def test_a_standby_takes_over_a_dead_holder_after_the_lease_duration_on_its_own_clock():
    vt, api = VirtualTime(), FakeLeaseAPI()
    # the dead holder's last renewTime is "now" by the standby's wall clock: irrelevant either way
    api.spec = {"holderIdentity": "dead", "renewTime": "2030-01-01T00:00:00.000000Z", "leaseDurationSeconds": 3}
    standby = _elector("me", api, ViewClock(vt))
    took_at: list[float] = []
    _drive(vt, [standby], 10.0, lambda t: took_at.append(t) if standby.is_leader and not took_at else None)
    assert api.spec["holderIdentity"] == "me" and api.spec["leaseTransitions"] == 1
    assert took_at and 3.0 <= took_at[0] <= 3.0 + 1.0 + 1e-9  # one duration of unchanged record, + one period


def test_losing_the_lease_calls_on_lose_once_and_stops_acting():
    """A replica whose renewals fail past 0.8 x the lease's life stops acting and drops its per-run
    metrics (on_lose), so a standby never exports stale runs."""
    vt, api = VirtualTime(), FakeLeaseAPI()
    lost: list[float] = []
    acquired: list[float] = []

    async def on_acquire() -> None:
        acquired.append(vt.t)

    e = _elector("me", api, ViewClock(vt), on_acquire=on_acquire, on_lose=lambda: lost.append(vt.t))
    leader_at: dict[float, bool] = {}

    def step(t: float) -> None:
        leader_at[t] = e.is_leader
        if t >= 5.0:
            api.down = True  # renewals fail from t=5 on

    api.now = lambda: vt.t
    _drive(vt, [e], 12.0, step)
    assert acquired == [0.0]
    assert all(v for t, v in leader_at.items() if t < 5.0)
    assert lost and len(lost) == 1
    # the last renewal that went through (the round of t=5 has ended when step(5) runs)
    last_renewal = max(api.written_at)
    assert 4.0 <= last_renewal <= 5.0
    assert not e.is_leader and lost[0] >= last_renewal + 0.8 * 3.0 - 1e-9
    # it stopped acting no later than 0.8 x duration after the start of its last renewal
    assert all(not v for t, v in leader_at.items() if t >= last_renewal + 0.8 * 3.0)


def test_a_replica_that_must_not_lead_steps_down_and_a_standby_takes_over():
    """A holder whose watch cache lost its list access (``eligible`` says why) releases the Lease and
    stops acting (on_lose once), campaigns no more while it must not lead, and the standby takes
    the released Lease at its next round; once it may lead again it is a standby like any other."""
    vt, api = VirtualTime(), FakeLeaseAPI()
    blind: dict[str, str | None] = {"why": None}
    lost: list[float] = []
    a = _elector("a", api, ViewClock(vt), eligible=lambda: blind["why"],
                 on_lose=lambda: lost.append(vt.t))
    b = _elector("b", api, ViewClock(vt),  # a standby: it campaigns once a holds
                 eligible=lambda: "starts later" if vt.t < 2.0 else None)
    holders: dict[float, str | None] = {}

    def step(t: float) -> None:
        holders[t] = (api.spec or {}).get("holderIdentity")
        if t >= 4.0:
            blind["why"] = "the API server has refused to list agentruns"

    _drive(vt, [a, b], 12.0, step)
    assert holders[3.0] == "a"
    assert not a.is_leader and not a.holds and lost and len(lost) == 1 and 4.0 <= lost[0] <= 5.0
    assert b.is_leader and api.spec["holderIdentity"] == "b"
    took = min(t for t, h in holders.items() if h == "b")
    assert took <= lost[0] + 1.0 + 1e-9  # released: no lease duration to wait out
    # the blind replica wrote nothing after it stepped down: every write from b's take on is b's
    first_b = next(i for i, w in enumerate(api.writes) if w[0] == "b")
    assert api.writes[first_b] == ("b", "take") and all(w[0] == "b" for w in api.writes[first_b:])


def test_a_failing_on_acquire_does_not_stop_the_elector():
    """Regression (found by the chaos suite, e2e/chaos): the Lease was renewed just before the
    apiserver went away, so on_acquire (a resync listing the runs) raised; the exception ended
    LeaseElector.run, the replica never renewed again and sat idle for good. The elector keeps
    renewing and runs on_acquire again until it succeeds."""
    vt, api = VirtualTime(), FakeLeaseAPI()
    attempts: list[float] = []

    async def on_acquire() -> None:
        attempts.append(vt.t)
        if len(attempts) < 3:
            raise ConnectionError("apiserver unavailable")

    e = _elector("me", api, ViewClock(vt, rate=1.0), duration=1.5, on_acquire=on_acquire)
    _drive(vt, [e], 5.0)
    assert len(attempts) == 3  # retried at the next renewals until it succeeded, then not again
    assert sum(1 for _, k in api.writes if k == "renew") >= 4 and e.is_leader


@pytest.mark.parametrize("offsets,rates", [
    ((0.0, 3600.0), (1.0, 1.0)),  # the standby's wall clock an hour ahead
    ((0.0, -3600.0), (1.0, 1.0)),  # ... an hour behind
    ((-7.0, 7.0), (1.0, 1.0)),  # both off, by more than the lease duration
    ((0.0, 0.0), (1.0, 1.1)),  # the standby's clock runs 10 % fast
])
def test_clock_skew_between_replicas_never_makes_two_leaders(offsets, rates):
    """Two replicas whose clocks disagree share one Lease. The holder renews; the standby must never
    take over while it does, and at no instant may both act. Then the holder dies: the standby takes
    over, once, after a lease duration of its own observing. (Comparing the holder's renewTime with
    the local clock, as the elector once did, fails every case: checked when this test was written.)"""
    vt, api = VirtualTime(), FakeLeaseAPI()
    a = _elector("a", api, ViewClock(vt, offsets[0], rates[0]))
    both: list[float] = []

    def step(t: float) -> None:
        if a.is_leader and b.is_leader:
            both.append(t)

    b_box: list = []

    async def scenario() -> None:
        import asyncio

        ta = asyncio.create_task(a.run())
        await vt.run_until(0.5, 1)  # a is first
        nonlocal b
        b = _elector("b", api, ViewClock(vt, offsets[1], rates[1]))
        b_box.append(b)
        tb = asyncio.create_task(b.run())
        await vt.run_until(60.0, 2, step)
        assert api.spec["holderIdentity"] == "a" and not [w for w in api.writes if w == ("b", "take")]
        ta.cancel()  # a dies (SIGKILL: no release)
        await asyncio.gather(ta, return_exceptions=True)
        a._leader = False
        await vt.run_until(80.0, 1, step)
        tb.cancel()
        await asyncio.gather(tb, return_exceptions=True)

    import asyncio

    b = _elector("b-placeholder", FakeLeaseAPI(), ViewClock(vt))
    asyncio.run(scenario())
    assert not both, f"two leaders at {both[:5]}"
    assert api.spec["holderIdentity"] == "b"
    assert [k for h, k in api.writes if k == "take"] == ["take"]


def test_a_slow_on_acquire_does_not_hold_up_the_renewals():
    """Regression (found by the chaos suite's leader-kill scenario on a loaded box): on_acquire (the
    resync) was awaited inside the renewal loop, so a replica that just took the Lease stopped
    renewing while it resynced, lost the Lease to the standby and the two swapped back and forth.
    It runs in its own task now: here it never finishes, and the renewals go on."""
    import asyncio

    vt, api = VirtualTime(), FakeLeaseAPI()
    started: list[float] = []

    async def on_acquire() -> None:
        started.append(vt.t)
        await asyncio.Event().wait()  # a resync that takes forever

    e = _elector("me", api, ViewClock(vt), on_acquire=on_acquire)
    _drive(vt, [e], 10.0)
    assert len(started) == 1  # once: it is still running
    assert sum(1 for _, k in api.writes if k == "renew") >= 9 and e.is_leader


def test_a_holder_renews_with_one_update_and_reads_only_after_a_conflict():
    """client-go's fast path: the holder updates the Lease it wrote last without reading it first;
    when someone else wrote the Lease meanwhile (a conflict), it reads it and decides again: here
    the other replica took it, so this one stops acting."""
    vt, api = VirtualTime(), FakeLeaseAPI()
    e = _elector("me", api, ViewClock(vt))
    _drive(vt, [e], 10.0)
    assert api.calls[:2] == ["get", "create"]
    renewals = api.calls[2:]
    assert len(renewals) >= 9 and set(renewals) == {"update"}, api.calls  # one request per renewal
    assert e.is_leader and api.spec["holderIdentity"] == "me"

    api.calls.clear()
    api.spec, api.rv = {**api.spec, "holderIdentity": "other", "renewTime": "x"}, api.rv + 1  # taken over

    def other_renews(t: float) -> None:
        api.spec = {**api.spec, "renewTime": f"t{t}"}
        api.rv += 1

    _drive(vt, [e], 20.0, other_renews)
    assert api.calls[:2] == ["update", "get"], api.calls  # the conflict, then the read
    assert set(api.calls[2:]) == {"get"}  # a standby only reads
    assert not e.is_leader and api.spec["holderIdentity"] == "other"
    assert ("me", "take") not in api.writes
