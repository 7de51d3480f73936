"""decide for runs of an Agent (decide/agents.py): refuse with ONE Event, store then record the pin
(write-ahead), run the pinned copy, follow a FollowLatest Agent at a lap boundary only."""

from __future__ import annotations

import dataclasses
from typing import Any

from controller_world import PROBE_OK, STORE, T0, UID
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.agent import AgentDefinitionSpec, AgentProblem, ResolvedAgent, resolve
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunManifestSpec, CancelSpec
from agentrun.api.status import ActiveJob, AgentRunStatus
from agentrun.controller import decide as d
from agentrun.controller.decide.agents import REFUSED_RETRY_SECONDS

REQUEST = AgentRunManifestSpec.model_validate(
    {"task": "Summarise {{ topic }}", "agentRef": {"name": "writer"}, "parameters": {"topic": "etcd"},
     "budget": {"maxLaps": 5}})


def agent(version: str = "v1", rollout: str = "Pinned", uid: str | None = "agent-uid-1") -> ResolvedAgent:
    definition = AgentDefinitionSpec.model_validate({
        "version": version, "rollout": rollout,
        "model": {"provider": "scripted", "script": [{"content": "done"}]},
        "parameters": [{"name": "topic", "required": True}], "budget": {"maxLaps": 50},
    })
    return resolve("writer", definition, REQUEST, uid=uid)


@dataclasses.dataclass
class AgentWorld:
    """One run of an Agent, the shell's facts, and a store of Agent copies by digest."""

    current: ResolvedAgent | AgentProblem | None
    status: AgentRunStatus = dataclasses.field(default_factory=lambda: AgentRunStatus(store=STORE))
    copies: dict[str, ResolvedAgent] = dataclasses.field(default_factory=dict)
    events: list[d.Event] = dataclasses.field(default_factory=list)
    stored: int = 0
    request: AgentRunManifestSpec = dataclasses.field(default_factory=lambda: REQUEST)

    def observed(self, pinned: d.PinnedAgentRead | None = None) -> d.Observed:
        if pinned is None and self.status.agent is not None and self.status.agent.digest in self.copies:
            pinned = d.PinnedAgentRead(self.status.agent.digest, "ok", self.copies[self.status.agent.digest])
        return d.Observed(namespace="ns", name="run", uid=UID, generation=1, spec=None, request=self.request,
                          status=self.status, now=T0, resolved_store=STORE, store_probe=PROBE_OK,
                          agent_current=self.current, agent_pinned=pinned)

    def once(self) -> d.Decision:
        dec = d.decide(self.observed())
        if dec.needs_read:
            if not dec.of(d.StoreAgent):
                return dec  # another read (the checkpoint of a lap in flight): not this test's concern
            (store,) = dec.of(d.StoreAgent)
            self.copies[store.digest] = store.resolved
            self.stored += 1
            dec = d.decide(self.observed(d.PinnedAgentRead(store.digest, "ok", store.resolved)))
            assert not dec.needs_read
        if dec.status is not None:
            self.status = dec.status
        self.events += dec.of(d.Event)
        return dec


def test_a_missing_agent_holds_the_run_with_one_event_and_a_backoff() -> None:
    w = AgentWorld(current=AgentProblem(Reason.AGENT_NOT_FOUND, "spec.agentRef.name: Agent writer not found"))
    for _ in range(3):
        dec = w.once()
        assert not dec.of(d.CreateJob) and dec.requeue_after == REFUSED_RETRY_SECONDS
    assert [e.reason for e in w.events] == [Reason.AGENT_NOT_FOUND]
    cond = next(c for c in w.status.conditions if c.type == "Progressing")
    assert cond.status == "False" and cond.reason == Reason.AGENT_NOT_FOUND and "spec.agentRef.name" in cond.message
    assert w.status.phase == "Pending" and w.status.agent is None
    # fixing it (the Agent created) starts the run: nothing was lost
    w.current = agent()
    dec = w.once()
    assert w.status.agent is not None and w.status.agent.version == "v1" and not dec.of(d.CreateJob)
    assert d.RequeueAfter(0.0) in dec.actions  # write-ahead: the pin is stored before a Job runs it
    dec = w.once()
    (job,) = dec.of(d.CreateJob)
    assert job.agent_version == "v1" and dec.spec is not None
    assert dec.spec.task == "Summarise etcd" and dec.spec.budget.max_laps == 5  # the run's field wins


def test_a_run_held_on_its_agent_can_be_cancelled() -> None:
    w = AgentWorld(current=AgentProblem(Reason.AGENT_NOT_FOUND, "spec.agentRef.name: Agent writer not found"))
    w.once()
    w.request = REQUEST.model_copy(update={"cancel": CancelSpec(reason="wrong agent")})
    dec = w.once()
    assert w.status.phase == "Cancelled" and not dec.of(d.CreateJob)
    assert w.status.lifecycle is not None and w.status.lifecycle.cancel_reason == "wrong agent"
    assert d.decide(w.observed()).status is None  # terminal: nothing more
    # a retry of it is refused with ONE Event naming why (no lap ran: nothing to continue)
    obs = dataclasses.replace(w.observed(), annotations={"agentrun.dev/retry": "1"})
    dec = d.decide(obs)
    (event,) = dec.of(d.Event)
    assert event.reason == Reason.RETRY_REFUSED and "before its Agent was resolved" in event.message
    assert dec.of(d.RemoveAnnotations) and w.status.phase == "Cancelled"


def test_invalid_parameters_are_refused_once() -> None:
    w = AgentWorld(current=AgentProblem(Reason.INVALID_PARAMETERS, "spec.parameters.topic: required"))
    w.once()
    w.once()
    assert [e.reason for e in w.events] == [Reason.INVALID_PARAMETERS]
    assert "spec.parameters.topic" in (w.status.message or "")


def pinned_world(rollout: str) -> AgentWorld:
    w = AgentWorld(current=agent("v1", rollout))
    w.once()
    w.once()
    assert w.status.agent is not None and w.status.active_job is not None
    return w


def test_a_pinned_run_keeps_its_definition_when_the_agent_changes() -> None:
    w = pinned_world("Pinned")
    w.current = agent("v2", "Pinned")
    w.status = w.status.model_copy(update={"active_job": None})
    dec = d.decide(w.observed())
    assert dec.spec is not None and dec.spec.agent.version == "v1" and not dec.of(d.StoreAgent)
    w.current = AgentProblem(Reason.AGENT_NOT_FOUND, "gone")  # even deleted: the pinned copy runs
    dec = d.decide(w.observed())
    assert dec.spec is not None and dec.spec.agent.version == "v1"


def test_follow_latest_moves_only_at_a_lap_boundary() -> None:
    w = pinned_world("FollowLatest")
    first = w.status.agent
    w.current = agent("v2", "FollowLatest")
    dec = d.decide(w.observed())  # a lap in flight: not now
    assert not dec.of(d.StoreAgent) and dec.spec is not None and dec.spec.agent.version == "v1"
    w.status = w.status.model_copy(update={"active_job": None, "lap": 1})
    w.once()
    assert w.status.agent is not None and w.status.agent.version == "v2" and w.status.agent.digest != first.digest
    assert [e.reason for e in w.events][-1] == Reason.AGENT_ROLLED_OUT
    dec = w.once()
    (job,) = dec.of(d.CreateJob)
    assert job.agent_version == "v2"


def test_follow_latest_does_not_follow_an_agent_created_again_under_the_same_name() -> None:
    """Deleting a FollowLatest Agent and creating another of the same name (a new uid) is not an edit
    the admission policy sees: the run keeps its pinned copy. A pin without a uid (recorded before
    uids were) follows as before."""
    w = pinned_world("FollowLatest")
    assert w.status.agent is not None and w.status.agent.uid == "agent-uid-1"
    w.status = w.status.model_copy(update={"active_job": None, "lap": 1})
    w.current = agent("v2", "FollowLatest", uid="agent-uid-2")
    dec = d.decide(w.observed())
    assert not dec.of(d.StoreAgent) and dec.spec is not None and dec.spec.agent.version == "v1"
    legacy = w.status.agent.model_copy(update={"uid": None})
    w.status = w.status.model_copy(update={"agent": legacy})
    w.once()
    assert w.status.agent is not None and w.status.agent.version == "v2" and w.status.agent.uid == "agent-uid-2"


def test_follow_latest_moves_when_the_lap_in_flight_is_seen_finished() -> None:
    """The decision that records a lap's end creates the next Job: the pin moves first (the status
    alone), then the next Job runs the new definition."""
    w = pinned_world("FollowLatest")
    aj = w.status.active_job
    assert aj is not None
    w.current = agent("v2", "FollowLatest")
    finished = d.ObservedJob(aj.name, aj.lap, aj.attempt, "succeeded", exit_code=0, agent_version="v1")
    o = dataclasses.replace(w.observed(), jobs=(finished,))
    dec = d.decide(o)
    (store,) = dec.of(d.StoreAgent)
    dec = d.decide(dataclasses.replace(o, agent_pinned=d.PinnedAgentRead(store.digest, "ok", store.resolved)))
    assert dec.status is not None and dec.status.agent is not None and dec.status.agent.version == "v2"
    assert not dec.of(d.CreateJob) and dec.status.active_job == aj  # the lap's end is the next pass's


def test_an_unreadable_pinned_copy_holds_the_run() -> None:
    w = pinned_world("Pinned")
    w.status = w.status.model_copy(update={"active_job": None})
    digest = w.status.agent.digest
    read = d.PinnedAgentRead(digest, "unavailable", error="connection refused")
    dec = d.decide(w.observed(read))
    assert not dec.of(d.CreateJob) and dec.of(d.Event)[0].reason == Reason.PINNED_AGENT_UNREADABLE


def test_inline_runs_are_untouched() -> None:
    from controller_world import make_spec

    o = d.Observed(namespace="ns", name="run", uid=UID, generation=1, spec=make_spec(),
                   status=AgentRunStatus(store=STORE), now=T0, resolved_store=STORE, store_probe=PROBE_OK)
    dec = d.decide(o)
    assert dec.spec is None and dec.of(d.CreateJob)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.sampled_from(["v1", "v2", "v3"]), min_size=1, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6))
def test_pin_or_follow_property(versions: list[str], in_flight: list[bool]) -> None:
    """Whatever the Agent's edits: a Pinned run always runs its first version; a FollowLatest run
    runs the current version from the next boundary on, and never switches under a lap in flight."""
    for rollout in ("Pinned", "FollowLatest"):
        w = AgentWorld(current=agent("v0", rollout))
        w.once()
        w.once()
        for version, busy in zip(versions, in_flight, strict=False):
            w.current = agent(version, rollout)
            aj: Any = w.status.active_job if busy else None
            if busy and aj is None:
                aj = ActiveJob(name="x", lap=1, attempt=1, agent_version="v0")
            w.status = w.status.model_copy(update={"active_job": aj})
            before = w.status.agent
            dec = w.once()
            assert w.status.agent is not None and before is not None
            if rollout == "Pinned" or busy:
                assert w.status.agent.digest == before.digest
            else:
                assert w.status.agent.version == version
            if dec.spec is not None:
                assert dec.spec.agent.version == w.status.agent.version


# -- the shell's parts: the cache queues the runs of a changed Agent; the current resolution -------


def test_the_cache_queues_the_runs_naming_a_changed_agent() -> None:
    from agentrun.controller.cache import Cache

    queued: list[tuple[str, str]] = []
    cache = Cache(on_change=queued.append)
    run = {"metadata": {"namespace": "ns", "name": "r1", "uid": "u1", "resourceVersion": "1"},
           "spec": {"agentRef": {"name": "writer"}}}
    cache.event("runs", "ADDED", run)
    cache.event("runs", "ADDED", {"metadata": {"namespace": "ns", "name": "inline", "uid": "u2",
                                               "resourceVersion": "2"}, "spec": {"agent": {}}})
    queued.clear()
    agent_doc = {"metadata": {"namespace": "ns", "name": "writer", "resourceVersion": "3", "generation": 1}}
    cache.event("agents", "ADDED", agent_doc)
    assert queued == [("ns", "r1")] and cache.agent("ns", "writer") is not None
    cache.event("agents", "MODIFIED", {**agent_doc, "metadata": {**agent_doc["metadata"], "resourceVersion": "4"}})
    assert queued == [("ns", "r1")]  # a status-only change (same generation) queues nothing
    cache.event("agents", "MODIFIED", {"metadata": {**agent_doc["metadata"], "resourceVersion": "5", "generation": 2}})
    cache.event("agents", "DELETED", {"metadata": {**agent_doc["metadata"], "resourceVersion": "6", "generation": 2}})
    assert queued == [("ns", "r1")] * 3
    cache.event("runs", "DELETED", {**run, "metadata": {**run["metadata"], "resourceVersion": "7"}})
    cache.event("agents", "ADDED", agent_doc)
    assert len(queued) == 3  # the run is gone: nothing names the Agent


def test_resolve_current_says_why() -> None:
    from agentrun.controller.reconciler import resolve_current

    missing = resolve_current(None, "writer", REQUEST)
    assert isinstance(missing, AgentProblem) and missing.reason == Reason.AGENT_NOT_FOUND
    unreadable = resolve_current(None, "writer", REQUEST, 403)
    assert isinstance(unreadable, AgentProblem) and "HTTP 403" in unreadable.message
    invalid = resolve_current({"spec": {"version": "v1"}}, "writer", REQUEST)
    assert isinstance(invalid, AgentProblem) and invalid.reason == Reason.AGENT_INVALID
    assert "spec.model" in invalid.message
    ok = resolve_current({"metadata": {"generation": 3}, "spec": {
        "version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]},
        "parameters": [{"name": "topic"}]}}, "writer", REQUEST)
    assert isinstance(ok, ResolvedAgent) and ok.generation == 3 and ok.task == "Summarise etcd"
