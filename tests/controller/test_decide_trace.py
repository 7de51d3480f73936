"""status.traceId (issue 35): a run records its OpenTelemetry trace id, derived from its uid, once the
operator's tracing is on; never without it, never claimed for a run that finished untraced."""

from __future__ import annotations

from controller_world import UID, World, make_spec

from agentrun.api.contract import run_trace_id
from agentrun.controller import decide as d


def test_a_run_records_its_trace_id_while_tracing_is_on() -> None:
    w = World(make_spec(), tracing=True)
    w.reconcile()
    assert w.status.trace_id == run_trace_id(UID) and len(w.status.trace_id) == 32
    again = w.reconcile()
    assert again.of(d.PatchStatus) == []  # written once, with the pass's other changes


def test_no_trace_id_without_tracing_nor_for_a_run_that_finished_untraced() -> None:
    w = World(make_spec())
    w.reconcile()
    assert w.status.trace_id is None
    w.finish_job("done")
    w.reconcile()
    assert w.status.phase == "Succeeded"
    w.tracing = True  # turned on after the run finished: its laps were not traced
    w.reconcile()
    assert w.status.trace_id is None
