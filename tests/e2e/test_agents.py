"""Agents on the real local control plane (issue 32): an Agent declared once and run by name.

* Three parameterised runs of two Agents (one ``rollout: Pinned``, one ``FollowLatest``); both Agents
  are edited (v1 -> v2) while every run's lap 1 is in flight (held at a ToolGate). The Pinned runs
  finish on v1, the FollowLatest run switches to v2 at its next lap boundary (an ``AgentRolledOut``
  Event); ``agentrun trace`` shows the agent version of every lap. The pinned copy is in the store,
  content-addressed, with the rendered task and the typed parameters.
* Bad input: a run of an Agent that does not exist, and a run missing a required parameter, each
  held Pending with a condition naming the field and ONE Warning Event; creating the Agent starts
  the first (nothing lost). Both agent and agentRef set is refused at apply (CEL).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from e2e_support import ToolGate
from test_cli_e2e import cli, store_of
from test_operator_e2e import _diagnostics_on_failure, _wait, env  # noqa: F401

from agentrun.checkpoint.schema import RunRef

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

API = "agentrun.dev/v1alpha1"


def agent_doc(name: str, version: str, rollout: str, note_url: str, script: list[dict] | None = None) -> dict:
    return {"apiVersion": API, "kind": "Agent", "metadata": {"name": name}, "spec": {
        "version": version, "rollout": rollout,
        "task": "Write about {{ topic }} in {{ words }} words",
        "model": {"provider": "scripted", "script": script or [
            {"content": "noting", "toolCalls": [{"name": "note", "arguments": {"order": "agents"}}]},
            {"content": "noting again", "toolCalls": [{"name": "note", "arguments": {"order": "agents-2"}}]},
            {"content": "done"}]},
        "tools": [{"name": "note", "http": {"url": f"{note_url}/note", "timeout": "10m"}}],
        "parameters": [{"name": "topic", "required": True, "description": "what to write about"},
                       {"name": "words", "type": "integer", "default": "100"}],
        "budget": {"maxLaps": 10},
        "retry": {"attemptsPerLap": 3, "backoff": {"initial": "1s", "max": "2s"}},
    }}


def run_doc(name: str, agent_name: str, params: dict[str, str], **spec: Any) -> dict:
    return {"apiVersion": API, "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agentRef": {"name": agent_name}, "parameters": params, "lapTimeout": "15m", **spec}}


def versions(env: Any, name: str) -> list[str]:  # noqa: F811
    r = cli(env, "trace", name, "-n", env.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    return [lap["agentVersion"] for lap in json.loads(r.stdout)["laps"]]


def warnings(env: Any, name: str, reason: str) -> list[dict]:  # noqa: F811
    return [e for e in env.events(name) if e.get("reason") == reason]


def progressing(env: Any, name: str) -> dict:  # noqa: F811
    return next((c for c in env.status(name).get("conditions") or [] if c["type"] == "Progressing"), {})


def test_pinned_runs_keep_their_agent_and_follow_latest_switches_at_a_lap_boundary(env):  # noqa: F811
    gate = ToolGate(env.tool_url, hold=lambda a: isinstance(a, dict) and a.get("order") == "agents")
    try:
        env.apply(agent_doc("writer", "v1", "Pinned", gate.url))
        env.apply(agent_doc("follower", "v1", "FollowLatest", gate.url))
        env.apply(run_doc("pin-a", "writer", {"topic": "etcd"}))
        env.apply(run_doc("pin-b", "writer", {"topic": "CRDs", "words": "300"}, budget={"maxLaps": 5}))
        env.apply(run_doc("follow-c", "follower", {"topic": "Leases"}))
        _wait("lap 1 of the three runs held at the gate", lambda: gate.arrived() >= 3, timeout=240)
        for name in ("pin-a", "pin-b", "follow-c"):
            assert env.status(name)["agent"]["version"] == "v1"
        first = {n: env.status(n)["agent"]["digest"] for n in ("pin-a", "pin-b", "follow-c")}

        # both Agents edited mid-run (v2: another version, the same script)
        env.apply(agent_doc("writer", "v2", "Pinned", gate.url))
        env.apply(agent_doc("follower", "v2", "FollowLatest", gate.url))
        time.sleep(2)  # the operator sees the edits while every lap 1 is in flight: nothing moves
        assert env.status("follow-c")["agent"]["digest"] == first["follow-c"]
        gate.open()

        for name in ("pin-a", "pin-b", "follow-c"):
            assert env.wait_phase(name, "Succeeded", "Failed", timeout=240)["phase"] == "Succeeded", env.status(name)
        assert versions(env, "pin-a") == ["v1", "v1", "v1"]
        assert versions(env, "pin-b") == ["v1", "v1", "v1"]
        assert versions(env, "follow-c") == ["v1", "v2", "v2"]
        assert env.status("pin-a")["agent"]["digest"] == first["pin-a"]
        assert env.status("follow-c")["agent"]["version"] == "v2"
        assert len(warnings(env, "follow-c", "AgentRolledOut")) == 1
        assert not warnings(env, "pin-a", "AgentRolledOut")

        # the pinned copy: content-addressed in the run's prefix, the task rendered, the values typed,
        # the run's own budget field over the Agent's
        run = env.get("pin-b")
        copy = store_of(env).get_agent(RunRef(namespace=env.ns, name="pin-b", uid=run["metadata"]["uid"]),
                                       run["status"]["agent"]["digest"])
        assert copy.task == "Write about CRDs in 300 words" and copy.parameters == {"topic": "CRDs", "words": 300}
        assert copy.budget.max_laps == 5 and copy.agent.version == "v1"
    finally:
        gate.close()


def test_bad_agent_ref_and_missing_parameter_are_held_with_a_condition_naming_the_field(env):  # noqa: F811
    env.apply(run_doc("no-agent", "ghost", {"topic": "x"}))
    env.apply(agent_doc("strict", "v1", "Pinned", env.tool_url, script=[{"content": "done"}]))
    env.apply(run_doc("no-topic", "strict", {"words": "5"}))

    cond = _wait("no-agent held", lambda: (c := progressing(env, "no-agent")).get("reason") == "AgentNotFound" and c,
                 timeout=120)
    assert cond["status"] == "False"
    assert cond["message"] == ("the run cannot start: spec.agentRef.name: Agent ghost not found in the run's "
                               "namespace"), cond
    cond = _wait("no-topic held", lambda: (c := progressing(env, "no-topic")).get("reason") == "InvalidParameters"
                 and c, timeout=120)
    assert cond["message"] == "the run cannot start: spec.parameters.topic: required by Agent strict and not set", cond
    assert env.status("no-topic")["phase"] == "Pending" and not env.jobs("no-topic")
    time.sleep(6)  # a resync (5 s) later: still ONE Event each, no hot loop
    assert len(warnings(env, "no-agent", "AgentNotFound")) == 1
    assert len(warnings(env, "no-topic", "InvalidParameters")) == 1

    # nothing is lost: the Agent created, the held run starts and finishes
    env.apply(agent_doc("ghost", "v1", "Pinned", env.tool_url, script=[{"content": "done"}]))
    assert env.wait_phase("no-agent", "Succeeded", "Failed", timeout=180)["phase"] == "Succeeded"

    # both spec.agent and spec.agentRef: refused at apply, naming the fields
    both = run_doc("both", "strict", {"topic": "x"}, task="t",
                   agent={"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]}})
    r = env.apply(both, check=False)
    assert r.returncode != 0
    assert "spec.agent, spec.agentRef: exactly one must be set (the agent inline, or the name of an Agent)" in r.stderr
