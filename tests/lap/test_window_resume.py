"""A resumed run rebuilds, at every lap, exactly the window the uninterrupted run sent."""

from __future__ import annotations

from typing import Any

import pytest
from lap_helpers import RUN, Crash, MemoryJournal, RecordingToolServer, lap_env, spec_doc, spec_of, tool

from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.schema import Message, RunState
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.lap.config import parse_env
from agentrun.lap.interfaces import ModelRequest, ModelResponse
from agentrun.lap.logs import LapLogger
from agentrun.lap.models.scripted import ScriptedModel
from agentrun.lap.runner import execute_lap
from agentrun.lap.step import Effects, LapContext, run_lap
from agentrun.lap.tools.http import HTTPToolRunner
from agentrun.lap.window import messages_tokens

pytestmark = pytest.mark.s3
LAPS = 24


class Capturing:
    def __init__(self, inner: ScriptedModel) -> None:
        self.inner, self.windows = inner, {}

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.windows[request.lap] = list(request.messages)
        return self.inner.complete(request)


def _spec(url: str) -> dict[str, Any]:
    script = [{"content": f"lap {i} done" + ("\nPIN: customer prefers email" if i == 2 else ""),
               "toolCalls": [{"name": "extract_invoice", "arguments": {"doc": f"doc_{i}" + "x" * 200}}]} for i in range(1, LAPS)]
    doc = spec_doc([tool("extract_invoice", url)], script, window={"maxTokens": 600, "systemPrompt": "Be brief."})
    doc["checkpoint"] = {"snapshotEvery": 5}
    return doc


def test_window_after_resume_equals_the_uninterrupted_window(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        doc = _spec(srv.url)
        spec = spec_of(doc)
        # uninterrupted: one process, state folded in memory
        straight = Capturing(ScriptedModel.from_spec(spec.agent.model))
        state, tools = RunState(run=RUN), HTTPToolRunner()
        for lap in range(1, LAPS + 1):
            ctx = LapContext(spec=spec, run=RUN, lap=lap, attempt=1, agent_version="v1")
            state = fold(state, run_lap(ctx, state, Effects(model=straight, tools=tools, journal=MemoryJournal())))
        # resumed: every lap loads from the store (snapshots every 5 laps), lap 13 crashes once
        resumed = Capturing(ScriptedModel.from_spec(spec.agent.model))
        store = CheckpointStore(StoreConfig.from_env(s3_env, snapshot_every=5))
        for lap in range(1, LAPS + 1):
            env = lap_env(s3_env, doc, lap)
            cfg = parse_env(env)
            log = LapLogger({"lap": lap})
            if lap == 13:
                def boom(point: str) -> None:
                    if point == "after-tool-journal-1":
                        raise Crash(point)
                with pytest.raises(Crash):
                    execute_lap(cfg, store, env, log, crash=boom, model=resumed)
            assert execute_lap(cfg, store, env, log, model=resumed).code == 0
    for lap in range(1, LAPS + 1):
        assert resumed.windows[lap] == straight.windows[lap], f"window of lap {lap} differs"
    sizes = [messages_tokens(straight.windows[lap]) for lap in range(1, LAPS + 1)]
    assert max(sizes) <= 600 and state.compacted_through_lap > 0
    assert "customer prefers email" in state.pinned_facts
    assert any(isinstance(m, Message) and m.lap == 0 and m.role == "user" for m in resumed.windows[LAPS])
