"""Pure parts of the I/O shell: lease decisions, Job/pod state mapping, logs, spec errors."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pydantic
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.controller.handlers import _job_state, _pod_exit, pruned_field, spec_error_text, status_refusal
from agentrun.controller.lease import lease_action
from agentrun.controller.logs import JSONFormatter, run_logger

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("spec,expected", [
    (None, "create"),
    ({"holderIdentity": "me", "renewTime": NOW}, "renew"),
    ({"holderIdentity": None}, "take"),
    ({"holderIdentity": "other", "renewTime": NOW - timedelta(seconds=5), "leaseDurationSeconds": 15}, "wait"),
    ({"holderIdentity": "other", "renewTime": NOW - timedelta(seconds=16), "leaseDurationSeconds": 15}, "take"),
    ({"holderIdentity": "other", "renewTime": "2029-12-31T23:59:59.000000Z", "leaseDurationSeconds": 15}, "wait"),
])
def test_lease_action(spec, expected):
    assert lease_action(spec, "me", NOW, 15) == expected


def test_job_state():
    assert _job_state({"status": {}}) == ("active", None)
    assert _job_state({"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}) == ("active", None)
    assert _job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == ("succeeded", None)
    assert _job_state({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}) \
        == ("failed", "DeadlineExceeded")


def test_pod_exit():
    pod = {"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"},
           "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 75, "reason": "Error"}}}]}}
    assert _pod_exit([pod]) == (75, "Error")
    evicted = {"metadata": {"creationTimestamp": "2030-01-01T00:00:01Z"}, "status": {"reason": "Evicted"}}
    assert _pod_exit([pod, evicted]) == (None, "Evicted")
    assert _pod_exit([]) == (None, None)


def test_spec_error_names_the_field():
    with pytest.raises(pydantic.ValidationError) as err:
        AgentRunSpec.model_validate({"task": "t", "agent": {"version": "1", "model": {"provider": "nope"}}})
    assert "spec.agent.model.provider" in spec_error_text(err.value)


def test_json_log_lines_carry_run_fields():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("agentrun.controller")
    logger.addHandler(handler)
    try:
        run_logger("ns", "run", 3).warning("hello %s", "x")
    finally:
        logger.removeHandler(handler)
    doc = json.loads(JSONFormatter().format(records[0]))
    assert doc["msg"] == "hello x" and doc["namespace"] == "ns" and doc["name"] == "run"
    assert doc["lap"] == 3 and "attempt" in doc and doc["attempt"] is None


def test_exact_namespaces():
    from agentrun.controller.handlers import exact_namespaces

    assert exact_namespaces(("team-a",)) and exact_namespaces(["a", "b"])
    assert not exact_namespaces(())
    assert not exact_namespaces(("team-*",)) and not exact_namespaces(("a", "!b")) and not exact_namespaces(("a?",))


@pytest.mark.parametrize("namespaces,disabled", [(("team-a", "team-b"), True), ((), False), (("team-*",), False)])
def test_startup_disables_kopf_scanning_for_exact_namespaces(monkeypatch, namespaces, disabled):
    import asyncio

    import kopf

    from agentrun.controller import handlers
    from agentrun.controller.config import OperatorConfig

    class _Started(handlers.Controller):
        async def start(self) -> None:  # no cluster: only the settings are under test
            self.ready = True

    monkeypatch.setattr(handlers, "CONTROLLER", _Started(OperatorConfig(namespaces=namespaces)))
    settings = kopf.OperatorSettings()
    asyncio.run(handlers._startup(settings=settings))
    assert settings.scanning.disabled is disabled
    assert settings.persistence.finalizer == "kopf.agentrun.dev/finalizer"


def test_lease_standby_logs_the_holder_once(monkeypatch, caplog):
    import asyncio

    from agentrun.controller.lease import LeaseElector

    e = LeaseElector("l", "ns", "me", 0.3)
    calls = {"n": 0}

    def fake_try() -> bool:
        calls["n"] += 1
        e.holder = "other"
        return False

    monkeypatch.setattr(e, "_try", fake_try)

    async def run() -> None:
        task = asyncio.create_task(e.run())
        while calls["n"] < 3:
            await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="agentrun.lease"):
        asyncio.run(run())
    standby = [r.getMessage() for r in caplog.records if "standby" in r.getMessage()]
    assert standby == ["lease ns/l held by other: this replica (me) is standby"]
    assert not e.is_leader


def test_losing_the_lease_calls_on_lose_once_and_stops_acting():
    """A replica whose renewals fail past the lease's life stops acting and drops its per-run
    metrics (on_lose), so a standby never exports stale runs. _try is replaced: no API here."""
    import asyncio

    from agentrun.controller.lease import LeaseElector

    answers = iter([True, False, False, False])
    lost: list[bool] = []
    acquired: list[bool] = []

    async def on_acquire() -> None:
        acquired.append(True)

    elector = LeaseElector("l", "ns", "me", duration=0.6, on_acquire=on_acquire, on_lose=lambda: lost.append(True))
    elector._try = lambda: next(answers, False)  # type: ignore[method-assign]

    async def drive() -> None:
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(0.2)
        assert elector.is_leader and acquired == [True]
        await asyncio.sleep(1.6)
        task.cancel()

    asyncio.run(drive())
    assert lost == [True]
    assert not elector.is_leader


def test_a_failing_on_acquire_does_not_stop_the_elector():
    """Regression (found by the chaos suite, e2e/chaos): the Lease was renewed just before the
    apiserver went away, so on_acquire (a resync listing the runs) raised; the exception ended
    LeaseElector.run, the replica never renewed again and sat idle for good. The elector keeps
    renewing and runs on_acquire again until it succeeds. _try is replaced: no API here."""
    import asyncio

    from agentrun.controller.lease import LeaseElector

    attempts: list[int] = []

    async def on_acquire() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("apiserver unavailable")

    elector = LeaseElector("l", "ns", "me", duration=1.5, on_acquire=on_acquire)
    renewals = {"n": 0}

    def renew() -> bool:
        renewals["n"] += 1
        return True

    elector._try = renew  # type: ignore[method-assign]

    async def drive() -> None:
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(2.2)
        assert not task.done(), task.exception()
        task.cancel()

    asyncio.run(drive())
    assert len(attempts) == 3  # retried at the next renewals until it succeeded, then not again
    assert renewals["n"] >= 4 and elector.is_leader


def test_status_refusal_tells_a_validation_error_from_a_conflict():
    stale_test = json.dumps({"kind": "Status", "message": "the server rejected our request due to an error in our "
                             "request", "reason": "Invalid", "details": {}, "code": 422})
    assert status_refusal(422, stale_test) is None  # the json-patch test of resourceVersion failed: read again
    assert status_refusal(409, "{}") is None
    invalid = json.dumps({"reason": "Invalid", "code": 422, "details": {"name": "r1", "kind": "AgentRun", "causes": [
        {"reason": "FieldValueTooLong", "message": "Too long: may not be more than 256 bytes",
         "field": "status.approval.decidedBy"},
        {"reason": "FieldValueInvalid", "message": "some validation rules were not checked", "field": "<nil>"}]}})
    assert status_refusal(422, invalid) == "status.approval.decidedBy: Too long: may not be more than 256 bytes"
    denied = json.dumps({"message": "agentruns.agentrun.dev \"r1\" is forbidden: ValidatingAdmissionPolicy 'p' "
                         "denied request: no\x1b[2J", "code": 422,
                         "details": {"name": "r1", "causes": [{"message": "denied"}]}})
    text = status_refusal(422, denied)
    assert "ValidatingAdmissionPolicy 'p' denied request" in text and "\x1b" not in text
    assert status_refusal(403, "not json") == "HTTP 403"


def test_pruned_field_finds_what_an_older_crd_dropped():
    sent = {"phase": "Running", "store": {"uri": "s3://b/p"}, "approval": {"argumentsSha256": "ab"}}
    assert pruned_field(sent, dict(sent)) is None
    assert pruned_field(sent, {"phase": "Running", "approval": {"argumentsSha256": "ab"}}) == "status.store"
    assert pruned_field(sent, {"phase": "Running", "store": {"uri": "s3://b/p"}, "approval": {}}) == \
        "status.approval.argumentsSha256"
    assert pruned_field(sent, None) == "status"


def test_failed_reconciles_back_off_exponentially_per_run(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.handlers import Controller, StatusRefused

    c = Controller(OperatorConfig())
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]
    delays: list[tuple[str, float]] = []
    monkeypatch.setattr(c, "enqueue", lambda ns, name, delay=0.0: delays.append((name, delay)))

    async def refused(ns, name):
        raise StatusRefused("status.approval.decidedBy: Too long")

    monkeypatch.setattr(c, "reconcile", refused)
    for _ in range(8):
        asyncio.run(c._worker(("ns", "r")))
    asyncio.run(c._worker(("ns", "other")))
    assert delays == [("r", d) for d in (5, 10, 20, 40, 80, 160, 300, 300)] + [("other", 5)]

    async def ok(ns, name):
        return None

    monkeypatch.setattr(c, "reconcile", ok)
    asyncio.run(c._worker(("ns", "r")))
    assert ("ns", "r") not in c._failures
    monkeypatch.setattr(c, "reconcile", refused)
    asyncio.run(c._worker(("ns", "r")))
    assert delays[-1] == ("r", 5)  # a success resets the backoff
