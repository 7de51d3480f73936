"""``agentrun run AGENT -p k=v``: its pure parts (the parameters, the body, the check against the
Agent) and the `runs` rows of a run of an Agent."""

from __future__ import annotations

from datetime import UTC, datetime

import click
import pytest

from agentrun.cli import runs as rn
from agentrun.cli.run import check_against, parse_params, run_body

AGENT = {"spec": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]},
                  "task": "Write about {{ topic }} in {{ words }} words",
                  "parameters": [{"name": "topic", "required": True}, {"name": "words", "type": "integer",
                                                                       "default": "100"}]}}


def test_parse_params() -> None:
    assert parse_params(("a=1", "b=x=y", "c=")) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(click.BadParameter, match="is not KEY=VALUE"):
        parse_params(("novalue",))
    with pytest.raises(click.BadParameter, match="given twice"):
        parse_params(("a=1", "a=2"))


def test_run_body() -> None:
    body = run_body("writer", {"topic": "etcd"}, None, None)
    assert body["metadata"] == {"generateName": "writer-"} and body["kind"] == "AgentRun"
    assert body["spec"] == {"agentRef": {"name": "writer"}, "parameters": {"topic": "etcd"}}
    named = run_body("writer", {}, "w1", "do {{ topic }}")
    assert named["metadata"] == {"name": "w1"} and named["spec"] == {"agentRef": {"name": "writer"},
                                                                       "task": "do {{ topic }}"}


@pytest.mark.parametrize(("params", "task", "words"), [
    ({}, None, "spec.parameters.topic: required"),
    ({"topic": "a", "words": "many"}, None, "is not an integer"),
    ({"topic": "a", "tone": "dry"}, None, "spec.parameters.tone: not declared"),
    ({"topic": "a"}, "{{ nope }}", "names no declared parameter"),
])
def test_check_against_the_agent(params: dict[str, str], task: str | None, words: str) -> None:
    with pytest.raises(click.BadParameter, match=words):
        check_against("writer", AGENT, params, task)
    check_against("writer", AGENT, {"topic": "a"}, None)


def test_runs_rows_name_the_agent() -> None:
    run = {"metadata": {"namespace": "ns", "name": "r"}, "spec": {"agentRef": {"name": "writer"}},
           "status": {"phase": "Pending", "agent": {"name": "writer", "version": "v1", "digest": "ab" * 32},
                      "conditions": [{"type": "Progressing", "status": "False", "reason": "AgentNotFound",
                                      "message": "the run cannot start: spec.agentRef.name: Agent writer not found"}]}}
    (row,) = rn.run_rows([run], datetime(2030, 1, 1, tzinfo=UTC))
    assert row["agent"] == "writer" and row["agentPinned"] == {"version": "v1", "digest": "ab" * 32}
    assert "spec.agentRef.name" in row["cause"]
    wide = rn.format_runs([row], wide=True).splitlines()
    assert "AGENT" in wide[0].split() and "writer" in wide[1].split()
