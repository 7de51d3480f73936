"""The operator process under Kopf (``agentrun.controller.process``): the startup keeps the controller
in Kopf's memo and a bad setting is a PermanentError, Kopf runs only the process handlers and logs in
with the loaded credentials, the liveness and readiness probes."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.controller import reconciler
from agentrun.controller.config import OperatorConfig
from agentrun.controller.reconciler import Controller


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
