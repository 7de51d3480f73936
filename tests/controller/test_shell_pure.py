"""Pure parts of the I/O shell: Job/pod state mapping, logs, spec errors."""

from __future__ import annotations

import json
import logging

import pydantic
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.controller.decide.observe import job_state as _job_state
from agentrun.controller.decide.observe import pod_exit as _pod_exit
from agentrun.controller.decide.observe import spec_error_text
from agentrun.controller.decide.outcomes import pruned_field, status_refusal
from agentrun.controller.logs import JSONFormatter, run_logger


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
    from agentrun.controller.reconciler import exact_namespaces

    assert exact_namespaces(("team-a",)) and exact_namespaces(["a", "b"])
    assert not exact_namespaces(())
    assert not exact_namespaces(("team-*",)) and not exact_namespaces(("a", "!b")) and not exact_namespaces(("a?",))


def test_startup_keeps_the_controller_in_kopfs_memo_and_disables_scanning():
    """Kopf watches nothing (the controller's cache does): no namespace/CRD scanning, which a
    namespaced RBAC does not grant; the controller is the memo's, not a module global."""
    import asyncio

    from agentrun.controller import process
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.reconciler import Controller

    class _Started(Controller):
        async def start(self) -> None:  # no cluster: only the wiring is under test
            self.ready = True

    controller = _Started(OperatorConfig(namespaces=("team-a",)))
    memo = process.memo_for(controller)
    asyncio.run(process._startup(memo=memo))
    assert memo.controller is controller and controller.ready
    assert process.settings().scanning.disabled is True
    assert not hasattr(process, "CONTROLLER")


def test_kopf_runs_only_the_process_handlers_and_logs_in_with_the_loaded_credentials(tmp_path):
    """Kopf's registry holds the startup, cleanup, login and probe handlers and no resource handler;
    its login hands over the credentials the controller loaded (the kubernetes client's default
    configuration) and reads no kubeconfig again: the file is gone when it runs."""
    import kopf
    import yaml
    from kubernetes import client
    from kubernetes import config as kconfig

    from agentrun.controller import process

    activities = {h.activity.value: h for h in process.REGISTRY._activities.get_all_handlers()}
    assert sorted(activities) == ["authentication", "cleanup", "probe", "startup"]
    assert [h.id for h in process.REGISTRY._activities.get_all_handlers() if h.activity.value == "authentication"] \
        == ["_login"]
    assert not process.REGISTRY._changing.get_all_handlers() and not process.REGISTRY._watching.get_all_handlers()

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "the-loaded-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    saved = client.Configuration.get_default_copy()
    try:
        kconfig.load_kube_config(config_file=str(kubeconfig))
        kubeconfig.unlink()
        info = process._login()
    finally:
        client.Configuration.set_default(saved)
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.server, info.scheme, info.token, info.insecure) == ("https://127.0.0.1:6443", "Bearer",
                                                                     "the-loaded-token", True)


def test_the_liveness_probe_fails_only_when_the_lease_loop_stopped_and_reports_readiness():
    """Kopf's endpoint answers 500 when a probe handler raises: only the Lease probe may; the
    readiness probe reports what the replica waits for and never raises (the policies missing do
    not restart the replica: /readyz says it is not ready)."""
    import time
    from types import SimpleNamespace

    import kopf

    from agentrun.controller import process
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.reconciler import Controller

    c = Controller(OperatorConfig(lease_duration_seconds=15))
    memo = process.memo_for(c)
    assert process._probe_lease(memo=memo) == "not campaigning yet"
    assert process._probe_ready(memo=memo) == {
        "ready": False, "waitingFor": ["start", "watch cache sync", "admission policies"]}
    c._synced.set()
    c.elector = SimpleNamespace(last_tick=time.monotonic())  # type: ignore[assignment]
    assert process._probe_lease(memo=memo) == "ticking"
    c.elector.last_tick = time.monotonic() - 3 * 15 - 31  # type: ignore[union-attr]
    with pytest.raises(kopf.PermanentError, match="the Lease loop has stopped: no tick for 7[67] s"):
        process._probe_lease(memo=memo)
    assert process._probe_ready(memo=memo)["waitingFor"] == ["start", "Lease loop", "admission policies"]


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
    """A refused status write or an error: the run is queued again after its own exponential
    backoff (0.5 s doubling, capped at 5 min); a success resets it; other runs are not affected."""
    import asyncio
    from types import SimpleNamespace

    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.execute import StatusRefused
    from agentrun.controller.reconciler import Controller

    c = Controller(OperatorConfig())
    c.elector = SimpleNamespace(is_leader=True)  # type: ignore[assignment]
    delays: list[tuple[str, float]] = []
    limited = c.queue.add_rate_limited

    def spy(key):
        delays.append((key[1], limited(key)))
        return delays[-1][1]

    monkeypatch.setattr(c.queue, "add_rate_limited", spy)

    async def refused(key):
        raise StatusRefused("status.approval.decidedBy: Too long")

    async def main(reconcile, keys):
        monkeypatch.setattr(c, "reconcile", reconcile)
        for key in keys:
            await c.process(key)

    asyncio.run(main(refused, [("ns", "r")] * 12 + [("ns", "other")]))
    assert delays == [("r", dl) for dl in (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300)] + [("other", 0.5)]

    async def ok(key):
        return None

    asyncio.run(main(ok, [("ns", "r")]))
    assert c.queue.num_requeues(("ns", "r")) == 0
    asyncio.run(main(refused, [("ns", "r")]))
    assert delays[-1] == ("r", 0.5)  # a success resets the backoff
