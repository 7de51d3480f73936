"""A fork (spec.forkFrom) starts from the source's lap N: its snapshot first, then lap N+1."""

from __future__ import annotations

from agentrun.api.reasons import Reason
from agentrun.api.spec import ForkFromSpec
from agentrun.api.status import CheckpointRef
from agentrun.checkpoint.schema import Outcome

from .actions import Decision, ForkCheckpoint
from .context import Ctx
from .finish import apply_outcome, record_checkpoint
from .store import store_unavailable


def apply_fork(c: Ctx, ff: ForkFromSpec) -> Decision | None:
    """Apply the fork snapshot (asking the shell to write it first). Returns a Decision to stop, or
    None when the status now stands at the source's lap N (then the next step runs lap N+1)."""
    o = c.o
    fr = o.fork
    if fr is None or fr.lap != ff.lap:
        return Decision([ForkCheckpoint(ff.name, ff.uid, ff.lap)])
    source = f"lap {ff.lap} of agentrun {o.namespace}/{ff.name} (uid {ff.uid})"
    if fr.kind == "unavailable":
        return store_unavailable(c, "Pending", f"cannot read {source} yet (store unavailable, retrying): ", fr.error)
    state = fr.state
    if fr.kind != "ok" or state is None:
        why = "it was never checkpointed" if fr.kind == "missing" else "it cannot be read"
        return c.fail(Reason.FORK_SOURCE_UNAVAILABLE, f"cannot fork from {source}: {why} ({fr.error or 'no state'}). "
                      "The source was left untouched; delete this run and fork from a checkpointed lap")
    agent_version = state.agent_version or c.spec.agent.version
    usd = record_checkpoint(c, ff.lap, CheckpointRef(
        lap=ff.lap, key=fr.key or "", uri=fr.uri, sha256=fr.sha256 or "", written_at=fr.written_at,
        agent_version=agent_version, schema_version=state.schema_version,
        endpoint=fr.endpoint, region=fr.region, path_style=fr.path_style,
    ), state.totals)
    c.st.started_at = c.st.started_at or o.now
    c.event("Normal", Reason.FORKED, f"forked from {source}: the state through lap {ff.lap} was copied to {fr.key}; "
            f"the next lap is {ff.lap + 1}; cost so far ${usd}")
    apply_outcome(c, ff.lap, state.last_outcome or Outcome(type="continue"), state.pending_approval,
                  requested_at=o.now)
    return None
