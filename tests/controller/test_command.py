"""``agentrun operator`` (``agentrun.controller.command``): ready only once the cache synced (and
live while it syncs), a bad notifier setting or one port for both endpoints stops it at once, naming
the variable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrun import metrics
from agentrun.controller import decide as d
from agentrun.controller.policycheck import PolicyCheck
from agentrun.controller.reconciler import Controller


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
