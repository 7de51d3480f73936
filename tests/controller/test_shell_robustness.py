"""The shell under refusals and outages, with an in-memory API server (``FakeKube``): a refused
Job create, a store outage while deleting a run, a decision that never converges, a watch cache
that never syncs, a bad notifier setting, and the resync's period."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from controller_world import STORE, UID, World, make_spec
from kubernetes.client.exceptions import ApiException

from agentrun import metrics
from agentrun.checkpoint.schema import RunRef
from agentrun.controller import decide as d
from agentrun.controller import reconciler
from agentrun.controller.config import OperatorConfig
from agentrun.controller.execute import Executor, Outcome, RetryWithBackoff
from agentrun.controller.policycheck import PolicyCheck
from agentrun.controller.reconciler import Controller

KEY = ("ns", "run")
BODY = {"metadata": {"namespace": "ns", "name": "run", "uid": UID, "resourceVersion": "5"}, "spec": {}}


def api_error(status: int, reason: str, doc: dict[str, Any] | None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(doc) if doc is not None else None
    return exc


class FakeKube:
    """Answers the Executor's requests: Job creates with ``job_error`` (None: created), status
    patches with the patched object; records every request."""

    def __init__(self, job_error: ApiException | None = None) -> None:
        self.job_error = job_error
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        self.requests.append((method, path_, kw.get("body")))
        if method == "POST" and path_.endswith("/jobs"):
            if self.job_error is not None:
                raise self.job_error
            return kw["body"]
        if method == "PATCH" and path_.endswith("/status"):
            return {"metadata": {**BODY["metadata"], "resourceVersion": "6"}, "status": kw["body"][1]["value"]}
        return {}

    def events(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if m == "POST" and p.endswith("/events")]

    def status_patches(self) -> list[Any]:
        return [b for m, p, b in self.requests if m == "PATCH" and p.endswith("/status")]


def executor(kube: FakeKube) -> Executor:
    from agentrun.controller.cache import Cache

    return Executor(OperatorConfig(), kube, Cache(on_change=lambda k: None))  # type: ignore[arg-type]


def create_job() -> tuple[d.Observed, d.Decision]:
    o = World(spec=make_spec()).observed()
    return o, d.Decision(actions=[d.CreateJob(lap=1, attempt=1, agent_version="v1", name="run-l1-a1", store=STORE)])


def execute(ex: Executor, o: d.Observed, decision: d.Decision) -> Any:
    run = RunRef(namespace="ns", name="run", uid=UID)
    return asyncio.run(ex.execute(json.loads(json.dumps(BODY)), o, decision, run, o.spec))


QUOTA = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
         "message": 'jobs.batch "run-l1-a1" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
                    "used: count/jobs.batch=5, limited: count/jobs.batch=5",
         "details": {"name": "run-l1-a1", "group": "batch", "kind": "jobs"}}


@pytest.mark.parametrize("error", [
    api_error(403, "Forbidden", QUOTA),
    api_error(500, "Internal Server Error", {"kind": "Status", "code": 500, "message": "etcdserver: timeout"}),
    api_error(429, "Too Many Requests", None),
    api_error(403, "Forbidden", {"kind": "Status", "code": 403, "reason": "Forbidden",
                                 "message": 'jobs.batch "run-l1-a1" is forbidden: status unknown for quota: jobs, '
                                            "resources: count/jobs.batch"}),
])
def test_a_job_create_refused_for_a_quota_or_a_busy_api_server_is_retried_with_one_event(error):
    """A ResourceQuota on count/jobs.batch (403 "exceeded quota"), 5xx or 429 pass: the run is not
    failed; the reconcile is retried with the run's backoff and ONE Warning Event names the cause."""
    kube = FakeKube(error)
    ex = executor(kube)
    for _ in range(3):
        o, decision = create_job()
        decision.actions.append(d.PatchStatus(o.status.model_copy(update={"phase": "Running"})))
        with pytest.raises(RetryWithBackoff):
            execute(ex, o, decision)
    # nothing of the decision after the Job (no Failed, no Running): the status says why it waits,
    # once per streak, as the Event does
    [patch] = kube.status_patches()
    said = patch[1]["value"]
    assert said.get("phase") == o.status.phase and said["message"].startswith("the lap Job run-l1-a1 was refused")
    [progressing] = [c for c in said["conditions"] if c["type"] == "Progressing"]
    assert progressing["status"] == "False" and progressing["reason"] == "JobRefused"
    assert progressing["message"] == said["message"]
    events = kube.events()
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "JobRefused")]
    if error.status == 403:  # the API server's words: the quota and the resource
        assert "quota: jobs" in events[0]["message"] and "count/jobs.batch" in events[0]["message"]
    ex.succeeded(KEY)  # the Job was created at last: a later refusal is a new streak with its Event
    o, decision = create_job()
    with pytest.raises(RetryWithBackoff):
        execute(ex, o, decision)
    assert len(kube.events()) == 2 and len(kube.status_patches()) == 2


def test_an_invalid_job_fails_the_run_naming_the_field():
    """422 Invalid (the Job itself is bad): the run fails for good, and the message names the field
    from the API server's causes, not the HTTP reason phrase."""
    invalid = {"kind": "Status", "code": 422, "reason": "Invalid",
               "message": 'Job.batch "run-l1-a1" is invalid: spec.template.spec.containers[0].image: Required value',
               "details": {"name": "run-l1-a1", "kind": "Job", "causes": [
                   {"reason": "FieldValueRequired", "message": "Required value",
                    "field": "spec.template.spec.containers[0].image"}]}}
    kube = FakeKube(api_error(422, "Unprocessable Entity", invalid))
    o, decision = create_job()
    execute(executor(kube), o, decision)
    [patch] = kube.status_patches()
    status = patch[1]["value"]
    assert status["phase"] == "Failed"
    assert "spec.template.spec.containers[0].image: Required value" in status["message"]
    assert "Unprocessable Entity" not in status["message"]
    assert [e["reason"] for e in kube.events()] == ["JobRefused"]


def test_a_forbidden_job_names_what_the_api_server_said_bounded():
    denied = {"kind": "Status", "code": 403, "reason": "Forbidden",
              "message": "admission webhook \"deny.example\" denied the request: " + "x\x1b" * 2000}
    kube = FakeKube(api_error(403, "Forbidden", denied))
    o, decision = create_job()
    execute(executor(kube), o, decision)
    status = kube.status_patches()[0][1]["value"]
    assert status["phase"] == "Failed" and 'admission webhook "deny.example" denied' in status["message"]
    assert "\x1b" not in status["message"] and len(status["message"]) < 800


def test_a_checkpoint_delete_failing_during_a_store_outage_posts_one_event_per_streak():
    """Retention Delete with the store away: ONE CheckpointDeleteFailed Event per failure streak,
    and the run's rate-limited backoff (RetryWithBackoff), not an Event every store_retry_seconds."""
    kube = FakeKube()
    ex = executor(kube)
    calls = []

    class Store:
        def delete_run(self, run: RunRef) -> int:
            calls.append(run)
            raise ConnectionError("store unreachable")

    ex.store = lambda spec, loc: Store()  # type: ignore[method-assign]  # the store port: an outage
    o = World(spec=make_spec(), deleting=True).observed()
    for _ in range(5):
        with pytest.raises(RetryWithBackoff, match="store unreachable"):
            execute(ex, o, d.Decision(actions=[d.DeleteCheckpoints()]))
    assert len(calls) == 5
    assert [e["reason"] for e in kube.events()] == ["CheckpointDeleteFailed"]
    ex.succeeded(KEY)
    with pytest.raises(RetryWithBackoff):
        execute(ex, o, d.Decision(actions=[d.DeleteCheckpoints()]))
    assert len(kube.events()) == 2


def leader(c: Controller) -> None:
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]


def test_a_decision_that_never_converges_backs_off(monkeypatch, caplog):
    """Still writing after MAX_PASSES: the run is queued again with its growing backoff (and a log
    line), not at once with the backoff reset."""
    c = Controller(OperatorConfig())
    leader(c)
    c.kube = FakeKube()  # type: ignore[assignment]
    c.executor = executor(c.kube)  # type: ignore[arg-type]
    c.cache.put("runs", {**BODY, "spec": make_spec().model_dump(by_alias=True, mode="json")})
    monkeypatch.setattr(d, "decide", lambda o: d.Decision())
    passes = []

    async def always_writes(*a: Any) -> Any:
        passes.append(1)
        return Outcome(requeue=None, wrote=True)

    monkeypatch.setattr(c.executor, "execute", always_writes)

    async def main() -> list[float | None]:
        delays = []
        for _ in range(3):
            await c.process(KEY)
            delays.append(c.queue.pending_delay(KEY))
            assert len(c.queue) == 0, "queued again at once"
        c.queue.shut_down()
        return delays

    with caplog.at_level(logging.WARNING, "agentrun.controller"):
        delays = asyncio.run(main())
    assert len(passes) == 3 * reconciler.MAX_PASSES
    assert c.queue.num_requeues(KEY) == 3
    assert all(x is not None and x > 0 for x in delays)
    assert any(f"{reconciler.MAX_PASSES} passes" in r.getMessage() for r in caplog.records)


def test_the_resync_reconciles_every_run_within_its_period_and_spares_recent_ones(monkeypatch):
    """AGENTRUN_RESYNC_SECONDS promises "at least this often": an idle run (nothing but the resync
    reconciles it) is reconciled within every period, once per period; a run reconciled often by
    its own events is never queued by the resync."""
    period = 300.0
    c = Controller(OperatorConfig(resync_seconds=period))
    leader(c)
    slept: list[float] = []

    class Stop(Exception):
        pass

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        raise Stop

    monkeypatch.setattr(reconciler.asyncio, "sleep", fake_sleep)
    with pytest.raises(Stop):
        asyncio.run(c._resync_loop())
    monkeypatch.undo()
    tick = slept[0]

    now = [0.0]
    monkeypatch.setattr(reconciler, "time", SimpleNamespace(monotonic=lambda: now[0]))
    idle, busy = ("ns", "idle"), ("ns", "busy")
    for key in (idle, busy):
        c.cache.runs[key] = {}
        c._reconciled_at[key] = 0.0
    queued: list[tuple[str, str]] = []
    monkeypatch.setattr(c.cache, "enqueue", lambda key, cause: queued.append(key))
    reconciled = {idle: [0.0], busy: [0.0]}
    t, horizon = 0.0, 20 * period
    next_tick, next_event = tick, period / 4
    while t < horizon:
        t = min(next_tick, next_event)
        now[0] = t
        if t == next_event:  # the busy run's own events
            c._reconciled_at[busy] = t
            reconciled[busy].append(t)
            next_event += period / 4
            continue
        next_tick += tick
        asyncio.run(c.resync(full=False))
        for key in queued:  # a worker takes it a moment later
            c._reconciled_at[key] = t + 0.5
            reconciled[key].append(t + 0.5)
        queued.clear()
    gaps = [b - a for a, b in zip(reconciled[idle], reconciled[idle][1:], strict=False)]
    assert max(gaps) <= period + 1.0
    assert len(reconciled[idle]) <= horizon / period + 2  # about one per period: not more
    assert len(reconciled[busy]) == len(set(reconciled[busy])) == int(horizon / (period / 4)) + 1  # none added


class FakeInformer:
    def __init__(self, kind: str, error: str | None = None) -> None:
        self.path = f"/api/v1/{kind}"
        self.namespace = None
        self.synced = asyncio.Event()
        self.last_error = error


def test_a_replica_whose_cache_never_syncs_does_not_campaign_for_the_lease(monkeypatch, caplog):
    """An informer whose list is refused (RBAC without watch on pods) keeps the replica out of the
    Lease (so a standby can act), not ready, with a warning naming the resource and the error and
    agentrun_informer_synced{resource} 0, until it lists."""
    monkeypatch.setattr(reconciler, "UNSYNCED_WARNING_SECONDS", 0.01)
    c = Controller(OperatorConfig())
    ran: list[bool] = []

    class Elector:
        is_leader = False

        async def run(self) -> None:
            ran.append(True)

    async def main() -> None:
        runs, pods = FakeInformer("agentruns"), FakeInformer("pods", "403 Forbidden")
        runs.synced.set()
        c.informers = [runs, pods]  # type: ignore[list-item]
        c.elector = Elector()  # type: ignore[assignment]
        tasks = [asyncio.create_task(c._wait_synced()), asyncio.create_task(c._elect())]
        while not any("pods in all namespaces (403 Forbidden)" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
        assert not ran and not c.synced
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "pods"}) == 0.0
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "agentruns"}) == 1.0
        pods.synced.set()  # RBAC fixed: the list passed
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert ran == [True] and c.synced
        assert metrics.REGISTRY.get_sample_value("agentrun_informer_synced", {"resource": "pods"}) == 1.0

    with caplog.at_level(logging.WARNING, "agentrun.controller"):
        asyncio.run(main())


def test_the_operator_is_ready_only_once_its_cache_synced_and_live_while_it_syncs(monkeypatch):
    from click.testing import CliRunner

    from agentrun.controller import command, process

    started: list[Controller] = []
    monkeypatch.setattr(process, "run", lambda controller: started.append(controller))
    monkeypatch.setattr("agentrun.controller.logs.setup_logging", lambda *a: None)
    monkeypatch.setattr(metrics, "start_server", lambda port: None)
    monkeypatch.setattr(metrics, "_checks", {})
    r = CliRunner().invoke(command.operator_command, [], env={"AGENTRUN_METRICS_PORT": "19999",
                                                              "AGENTRUN_NOTIFY_WEBHOOK_URL": ""})
    assert r.exit_code == 0, r.output
    [c] = started
    ready = metrics._checks["readyz"]

    def live() -> bool:  # what Kopf's liveness probe asks (controller/process.py)
        return process.live(c)

    c.ready = True
    c.elector = SimpleNamespace(last_tick=-1e9)  # type: ignore[assignment]  # not ticking: waits for the sync
    assert not ready() and live()
    c._synced.set()
    assert not ready() and not live()  # synced, and the Lease loop does not tick: broken
    c.elector.last_tick = __import__("time").monotonic()  # type: ignore[union-attr]
    assert not ready() and live()  # the admission policies not checked yet (policycheck.py)
    c.admission = PolicyCheck(("approvals",), False, None)
    c.admission._record(d.AdmissionProblem("AdmissionPoliciesMissing", "missing: x"))
    assert not ready() and live()  # checked: missing
    c.admission._record(None)
    assert ready() and live()


@pytest.mark.parametrize("env, variable", [
    ({"AGENTRUN_NOTIFY_WEBHOOK_URL": "hooks.example/T0/secret"}, "AGENTRUN_NOTIFY_WEBHOOK_URL"),
    ({"AGENTRUN_NOTIFY_WEBHOOK_URL": "https://h/x", "AGENTRUN_NOTIFY_INTERVAL_SECONDS": "0"},
     "AGENTRUN_NOTIFY_INTERVAL_SECONDS"),
])
def test_a_bad_notifier_setting_stops_the_operator_at_once_naming_the_variable(monkeypatch, env, variable):
    from click.testing import CliRunner

    from agentrun.controller import command, process

    monkeypatch.setattr(process, "run", lambda controller: pytest.fail("started with a bad setting"))
    monkeypatch.setattr("agentrun.controller.logs.setup_logging", lambda *a: None)
    r = CliRunner().invoke(command.operator_command, [], env={"AGENTRUN_METRICS_PORT": "0", **env})
    assert r.exit_code == 2 and variable in r.output
    assert "secret" not in r.output


def test_the_liveness_port_and_the_metrics_port_must_differ(monkeypatch):
    from click.testing import CliRunner

    from agentrun.controller import command, process

    monkeypatch.setattr(process, "run", lambda controller: pytest.fail("started with one port for both"))
    monkeypatch.setattr("agentrun.controller.logs.setup_logging", lambda *a: None)
    r = CliRunner().invoke(command.operator_command, ["--liveness-port", "9090"],
                           env={"AGENTRUN_METRICS_PORT": "9090", "AGENTRUN_NOTIFY_WEBHOOK_URL": ""})
    assert r.exit_code == 2 and "--liveness-port, AGENTRUN_LIVENESS_PORT" in r.output, r.output


def test_a_failed_start_is_permanent_for_kopf_and_start_is_idempotent(monkeypatch):
    """Under Kopf alone, a bad notifier setting is a PermanentError (no retry every 60 s); a start
    retried after a failure, or called twice, adds no informer twice."""
    from types import SimpleNamespace

    import kopf

    from agentrun.controller import process

    monkeypatch.setattr(reconciler, "load_api_client",
                        lambda: SimpleNamespace(configuration=SimpleNamespace(host="https://10.0.0.1:6443")))
    monkeypatch.setattr(reconciler.Informer, "start", lambda self: None)
    monkeypatch.setenv("AGENTRUN_NOTIFY_WEBHOOK_URL", "ftp://nope")

    class Elector:
        is_leader = False

        async def run(self) -> None:
            await asyncio.Event().wait()

        async def release(self) -> None:
            pass

    c = Controller(OperatorConfig())
    c.elector = Elector()  # type: ignore[assignment]
    memo = process.memo_for(c)

    async def main() -> tuple[int, int]:
        with pytest.raises(kopf.PermanentError, match="AGENTRUN_NOTIFY_WEBHOOK_URL"):
            await process._startup(memo=memo)
        monkeypatch.delenv("AGENTRUN_NOTIFY_WEBHOOK_URL")
        await c.start()
        first = (len(c.informers), len(c._tasks))
        await c.start()
        second = (len(c.informers), len(c._tasks))
        assert first == second
        await c.stop()
        return first

    informers, _ = asyncio.run(main())
    assert informers == len(reconciler.TENANCY_KINDS) + 4  # one of each (runs, jobs, agents, exited pods), once
