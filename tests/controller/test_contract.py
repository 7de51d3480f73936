"""The operator <-> lap contract is one module both sides use (agentrun.api.contract): the Job the
operator builds is read by the lap's own parser, every variable is a contract name, and the doc
points at every member instead of repeating the literals."""

from __future__ import annotations

from pathlib import Path

from controller_world import UID, make_spec
from test_decide_jobs import CFG, RUN

from agentrun.api import contract
from agentrun.api.contract import AttemptReason, Env, ExitCode
from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.controller.decide.jobs import ApprovalEnv, build_env
from agentrun.lap.config import parse_env
from agentrun.lap.runner import EXIT_ALREADY, EXIT_PERMANENT, EXIT_RETRYABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def test_the_job_environment_is_what_the_lap_parses_and_only_contract_names():
    spec = make_spec(agent={"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}],
                                                       "apiKeySecretRef": {"name": "k", "key": "key"}},
                            "tools": [{"name": "pay-out", "http": {"url": "http://t/x",
                                                                   "headersSecretRef": {"name": "h", "key": "j"}}}]})
    env = build_env(RUN, spec, 4, 2, "v9", CFG, ApprovalEnv("approved", "c1", "ok", "alice"))
    names = {e["name"] for e in env}
    assert names <= {str(e) for e in Env} | {contract.tool_headers_env("pay-out")}
    assert contract.tool_headers_env("pay-out") == "AGENTRUN_TOOL_HEADERS_PAY_OUT"
    values = {e["name"]: e["value"] for e in env if "value" in e}
    cfg = parse_env(values)
    assert (cfg.run.uid, cfg.lap, cfg.attempt, cfg.agent_version) == (RUN.uid, 4, 2, "v9")
    assert cfg.decision is not None and (cfg.decision.decision, cfg.decision.decided_by) == ("approved", "alice")
    assert StoreConfig.from_env(values).uri == CFG.checkpoint_uri


def test_exit_codes_and_keys_come_from_the_contract():
    assert (EXIT_PERMANENT, EXIT_ALREADY, EXIT_RETRYABLE) == (2, 3, 75)
    assert EXIT_RETRYABLE is ExitCode.RETRYABLE
    store = CheckpointStore(StoreConfig(uri="s3://bkt/pre/fix"), client=object())
    run = RunRef(namespace="ns", name="run", uid=UID)
    base = f"pre/fix/ns/run/{UID}/"
    assert store.run_prefix(run) == base == contract.run_prefix("pre/fix", "ns", "run", UID)
    assert store.lap_key(run, 7) == base + contract.lap_object(7) == base + "laps/00000007.json"
    assert store.snapshot_key(run, 7) == base + "snapshots/00000007.json"
    assert store.journal_key(run, 7, "model") == base + "journal/00000007/model.json"
    assert store.attempt_key(run, 7, 2) == base + contract.attempt_object(7, 2) == base + "attempts/00000007-002.json"


def test_the_doc_points_at_every_member_of_the_contract():
    doc = DOC.read_text()
    assert "agentrun.api.contract" in doc
    for member in [*(f"Env.{e.name}" for e in Env if e.name not in ("NAMESPACE", "NAME", "UID", "AWS_SECRET_ACCESS_KEY",
                                                                       "APPROVAL_CALL_ID", "APPROVAL_BY")),
                   *(f"ExitCode.{c.name}" for c in ExitCode), *(r.name for r in AttemptReason)]:
        assert member in doc, member
    for grouped in ("`Env.NAMESPACE`, `Env.NAME`, `Env.UID`", "`Env.AWS_SECRET_ACCESS_KEY`", "`Env.APPROVAL_BY`",
                    "`Env.APPROVAL_CALL_ID`"):
        assert grouped in doc
    # the literals live in the module only
    assert "AGENTRUN_CHECKPOINT_URI" not in doc and "| 75 |" not in doc
    assert "Env.CHECKPOINT_URI" in contract.describe()
