"""``agentrun lap`` end to end: a real S3 API server (moto, tests/conftest.py), real local tool
and chat servers, the runner as a subprocess; crashes are SIGKILLs of that subprocess."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
from lap_helpers import (
    RUN,
    ChatServer,
    RecordingToolServer,
    chat_reply,
    comparable,
    lap_env,
    log_lines,
    run_lap_process,
    spec_doc,
    tool,
)

from agentrun.checkpoint.codec import inflate
from agentrun.checkpoint.schema import LapRecord
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, canonical_json, sha256_hex
from agentrun.lap.config import parse_env
from agentrun.lap.logs import LapLogger
from agentrun.lap.runner import execute_lap

pytestmark = pytest.mark.s3


def _store(env: dict[str, str]) -> CheckpointStore:
    return CheckpointStore(StoreConfig.from_env(env))


def _records(env: dict[str, str], n: int) -> list[LapRecord]:
    store = _store(env)
    return [store.get_lap(RUN, lap)[0] for lap in range(1, n + 1)]


def _keys(client: Any, bucket: str) -> dict[str, bytes]:
    """key -> the object's JSON bytes (gunzipped: schema 3 objects are gzip)."""
    objs = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: inflate(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read(), o["Key"]) for o in objs}


def _three_lap_spec(url: str) -> dict[str, Any]:
    tools = [tool("extract_invoice", url, sideEffects=False), tool("pay", url), tool("notify", url)]
    script = [
        {"content": "extracting", "toolCalls": [{"name": "extract_invoice", "arguments": {"doc": "doc_4410"}}]},
        {"content": "paying\nPIN: invoice doc_4410 is 120 EUR",
         "toolCalls": [{"name": "pay", "arguments": {"doc": "doc_4410"}}, {"name": "notify", "arguments": {"doc": "doc_4410"}}]},
        {"content": "all invoices paid"},
    ]
    return spec_doc(tools, script)


def _run_laps(store_env: dict[str, str], spec: dict[str, Any], laps: range, **extra: str) -> list[subprocess.CompletedProcess[str]]:
    out = []
    for lap in laps:
        p = run_lap_process(lap_env(store_env, spec, lap, **extra))
        assert p.returncode == 0, p.stderr
        out.append(p)
    return out


@pytest.fixture(scope="module")
def reference(s3_server: Any) -> list[dict[str, Any]]:
    """The three lap records of an uncrashed run (its own bucket and tool server)."""
    client = s3_server.client()
    bucket = f"ref-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    env = {"AGENTRUN_CHECKPOINT_URI": f"s3://{bucket}/c", "AGENTRUN_S3_ENDPOINT": s3_server.endpoint_url,
           "AGENTRUN_S3_REGION": s3_server.region, "AGENTRUN_S3_PATH_STYLE": "true"}
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        _run_laps(env, spec, range(1, 4))
        # tool results echo the arguments only, so records do not depend on the server's port
        return [comparable(r) for r in _records(env, 3)]


def test_a_three_lap_run_writes_checkpoints_and_logs(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        procs = _run_laps(s3_env, spec, range(1, 4))
        recs = _records(s3_env, 3)
    assert [r.outcome.type for r in recs] == ["continue", "continue", "done"]
    assert [c.idempotency_key for c in recs[1].tool_calls] == ["r_8f2a1c0d111122223333444455556666:2:pay:call_1", "r_8f2a1c0d111122223333444455556666:2:notify:call_2"]
    assert srv.executions == {"(no key) /extract_invoice": 1, "r_8f2a1c0d111122223333444455556666:2:pay:call_1": 1, "r_8f2a1c0d111122223333444455556666:2:notify:call_2": 1}
    assert recs[2].totals.laps == 3 and recs[2].prev_sha256 == _store(s3_env).get_lap(RUN, 2)[1].sha256
    for lap, p in enumerate(procs, start=1):
        lines = log_lines(p.stderr)
        assert lines and all(
            (line["namespace"], line["name"], line["lap"], line["attempt"]) == ("default", "invoices", lap, 1) for line in lines[1:]
        ), p.stderr
        assert lines[-1]["msg"] == "lap checkpointed"


CRASH_POINTS = ["after-model-journal", "after-tool-call-1", "after-tool-journal-1", "after-tool-call-2",
                "after-tool-journal-2", "before-checkpoint", "after-checkpoint"]


@pytest.mark.slow
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_every_point_of_a_lap_is_replayed_exactly_once(point: str, s3_env: dict[str, str], reference: list[dict[str, Any]]) -> None:
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        crashed = run_lap_process(lap_env(s3_env, spec, 2, AGENTRUN_TEST_CRASH_AT=point))
        assert crashed.returncode == -9, crashed.stderr
        replay = run_lap_process(lap_env(s3_env, spec, 2, attempt=2))
        assert replay.returncode == (3 if point == "after-checkpoint" else 0), replay.stderr
        _run_laps(s3_env, spec, range(3, 4))
        recs = _records(s3_env, 3)
    # every side effect landed exactly once at the tool, whatever the crash point
    assert {k: n for k, n in srv.executions.items() if not k.startswith("(no key)")} == {
        "r_8f2a1c0d111122223333444455556666:2:pay:call_1": 1, "r_8f2a1c0d111122223333444455556666:2:notify:call_2": 1}
    assert [comparable(r) for r in recs] == reference
    assert any(c.replayed for c in recs[1].tool_calls) == (point in ("after-tool-journal-1", "after-tool-call-2", "after-tool-journal-2", "before-checkpoint"))


def test_two_runners_racing_on_a_lap_one_checkpoint_wins(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        env = lap_env(s3_env, spec, 2)
        cfg, store = parse_env(env), _store(env)
        other: list[subprocess.CompletedProcess[str]] = []

        def at(point: str) -> None:  # runner A pauses before its put; runner B completes the lap
            if point == "before-checkpoint":
                other.append(run_lap_process(lap_env(s3_env, spec, 2, attempt=2)))

        log = LapLogger({"namespace": RUN.namespace, "name": RUN.name, "lap": 2, "attempt": 1})
        a = execute_lap(cfg, store, env, log, crash=at)
        assert other[0].returncode == 0, other[0].stderr
        assert a.code == 3 and "lap 2 already checkpointed" in a.message
        # the winner reused A's journal: each side effect executed once
        assert srv.executions["r_8f2a1c0d111122223333444455556666:2:pay:call_1"] == 1 and srv.executions["r_8f2a1c0d111122223333444455556666:2:notify:call_2"] == 1
        # and truly concurrent processes: one 0 and one 3, or both see the lap exists
        procs = [subprocess.Popen(["python", "-m", "agentrun.cli.main", "lap"], env=lap_env(s3_env, spec, 3, attempt=i),
                                  stderr=subprocess.PIPE, text=True) for i in (1, 2)]
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 3], results
    assert "lap 3 already checkpointed" in next(err for c, err in results if c == 3)
    assert store.latest_lap(RUN) == 3


def _approval_spec(url: str, **kw: Any) -> dict[str, Any]:
    tools = [tool("pay", url, requiresApproval=True), tool("notify", url)]
    script = [
        {"content": "pay?", "toolCalls": [{"name": "pay", "arguments": {"doc": "inv_7"}}, {"name": "notify", "arguments": {"doc": "asked"}}]},
        {"content": "ok, done"},
    ]
    return spec_doc(tools, script, **kw)


def test_approval_pauses_then_approved_runs_once_with_the_recorded_key(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        spec = _approval_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        first = _records(s3_env, 1)[0]
        assert first.outcome.type == "awaiting-approval" and first.pending_approval is not None
        assert "r_8f2a1c0d111122223333444455556666:1:pay:call_1" not in srv.executions and srv.executions["r_8f2a1c0d111122223333444455556666:1:notify:call_2"] == 1
        missing = run_lap_process(lap_env(s3_env, spec, 2))
        assert missing.returncode == 2 and "lap 2 started without a decision for pending approval of tool pay" in missing.stderr
        decided = dict(AGENTRUN_APPROVAL_DECISION="approved", AGENTRUN_APPROVAL_BY="alice", AGENTRUN_APPROVAL_REASON="budgeted",
                       AGENTRUN_APPROVAL_CALL_ID="call_1")
        crashed = run_lap_process(lap_env(s3_env, spec, 2, attempt=2, AGENTRUN_TEST_CRASH_AT="after-tool-call-1", **decided))
        assert crashed.returncode == -9
        _run_laps(s3_env, spec, range(2, 3), AGENTRUN_ATTEMPT="3", **decided)
        second = _records(s3_env, 2)[1]
    assert srv.executions["r_8f2a1c0d111122223333444455556666:1:pay:call_1"] == 1
    assert [r["key"] for r in srv.requests if r["path"] == "/pay"] == ["r_8f2a1c0d111122223333444455556666:1:pay:call_1"] * 2
    assert second.approval_decision is not None and second.approval_decision.decided_by == "alice"
    assert second.tool_calls[0].status == "ok" and second.tool_calls[0].idempotency_key == "r_8f2a1c0d111122223333444455556666:1:pay:call_1"
    assert second.outcome.type == "done"
    report = _store(s3_env).get_attempt_failure(RUN, 2, 1)
    assert report is not None and report["exitCode"] == 2 and "without a decision" in report["message"]


@pytest.mark.parametrize("decision", ["rejected", "timed-out"])
def test_rejected_and_timed_out_are_not_executed_and_recorded_distinctly(decision: str, s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        spec = _approval_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 3), AGENTRUN_APPROVAL_DECISION=decision)
        second = _records(s3_env, 2)[1]
    assert not any(r["path"] == "/pay" for r in srv.requests)
    assert second.tool_calls[0].status == decision and second.approval_decision.decision == decision  # type: ignore[union-attr]


def test_a_spec_that_removed_the_pending_tool_fails_permanently_naming_it(s3_env: dict[str, str], s3_client: Any, s3_bucket: Any) -> None:
    with RecordingToolServer() as srv:
        spec = _approval_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        v2 = spec_doc([tool("notify", srv.url)], [], version="v2")
        before = _keys(s3_client, s3_bucket.name)
        p = run_lap_process(lap_env(s3_env, v2, 2, AGENTRUN_APPROVAL_DECISION="approved"))
    assert p.returncode == 2
    assert "tool 'pay' of the pending approval is not declared by agent version v2" in p.stderr
    after = _keys(s3_client, s3_bucket.name)
    assert {k: v for k, v in after.items() if "/attempts/" not in k} == before
    assert _store(s3_env).get_attempt_failure(RUN, 2, 1)["message"].startswith("tool 'pay'")  # type: ignore[index]
    assert "reason" not in _store(s3_env).get_attempt_failure(RUN, 2, 1)  # type: ignore[operator]


@pytest.mark.parametrize("damage", ["garbage", "unknown-version"])
def test_a_corrupt_or_unknown_version_checkpoint_fails_permanently_and_is_left_intact(
    damage: str, s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        store = _store(s3_env)
        key = store.lap_key(RUN, 1)
        if damage == "garbage":
            data = b'{"kind": "LapRecord", "schemaVers'
            s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=data, Metadata={"sha256": "0" * 64})
        else:
            doc = json.loads(inflate(s3_client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read(), key))
            doc["schemaVersion"] = 99
            data = canonical_json(doc)
            s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=data, Metadata={"sha256": sha256_hex(data)})
        before = _keys(s3_client, s3_bucket.name)
        p = run_lap_process(lap_env(s3_env, spec, 2))
    assert p.returncode == 2, p.stderr
    assert ("schemaVersion 99" if damage == "unknown-version" else key) in p.stderr
    after = _keys(s3_client, s3_bucket.name)
    assert {k: v for k, v in after.items() if "/attempts/" not in k} == before
    report = _store(s3_env).get_attempt_failure(RUN, 2, 1)
    assert report is not None and report["reason"] == "CheckpointUnreadable", report  # the operator's condition


def test_bad_configuration_exits_2_naming_the_variable(s3_env: dict[str, str]) -> None:
    spec = _three_lap_spec("http://127.0.0.1:9")
    spec["agent"]["model"]["provider"] = "claude"
    p = run_lap_process(lap_env(s3_env, spec, 1))
    assert p.returncode == 2 and "AGENTRUN_SPEC: spec.agent.model.provider" in p.stderr
    p = run_lap_process(lap_env(s3_env, _three_lap_spec("http://127.0.0.1:9"), 1, AGENTRUN_LAP="zero"))
    assert p.returncode == 2 and "AGENTRUN_LAP must be a positive integer" in p.stderr


def test_tool_outage_is_retryable_and_the_replay_uses_the_same_key(s3_env: dict[str, str]) -> None:
    with RecordingToolServer() as srv:
        spec = _three_lap_spec(srv.url)
        _run_laps(s3_env, spec, range(1, 2))
        srv.fail_next["/pay"] = [503] * 3
        p = run_lap_process(lap_env(s3_env, spec, 2))
        assert p.returncode == 75 and "tool 'pay' returned HTTP 503" in p.stderr
        _run_laps(s3_env, spec, range(2, 3), AGENTRUN_ATTEMPT="2")
    assert {r["key"] for r in srv.requests if r["path"] == "/pay"} == {"r_8f2a1c0d111122223333444455556666:2:pay:call_1"}
    assert srv.executions["r_8f2a1c0d111122223333444455556666:2:pay:call_1"] == 1


def test_openai_lap_never_leaks_the_api_key_or_tool_headers(s3_env: dict[str, str], s3_client: Any, s3_bucket: Any) -> None:
    key, header = "sk-live-TOPSECRET-987654321", "Bearer tool-TOPSECRET-123"
    with ChatServer() as chat, RecordingToolServer() as srv:
        chat.replies += [
            (200, chat_reply("paying", [("call_x1", "pay", '{"doc": "inv_1"}'), ("call_x2", "pay", '{"doc": ')], prompt=2000, completion=50)),
            (401, {"error": {"message": f"Incorrect API key provided: {key}"}}),
        ]
        spec = spec_doc([tool("pay", srv.url)], [], model={"provider": "openai", "name": "gpt-x", "baseURL": chat.base_url})
        extra = {"AGENTRUN_MODEL_API_KEY": key, "AGENTRUN_TOOL_HEADERS_PAY": json.dumps({"Authorization": header})}
        ok = run_lap_process(lap_env(s3_env, spec, 1, **extra))
        bad = run_lap_process(lap_env(s3_env, spec, 2, **extra))
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr and "check the API key" in bad.stderr
    rec = _records(s3_env, 1)[0]
    assert [c.status for c in rec.tool_calls] == ["ok", "invalid-arguments"]
    assert rec.cost_usd == "0.0055" and rec.usage.input_tokens == 2000
    assert srv.requests[0]["headers"]["Authorization"] == header and chat.requests[0][0]["Authorization"] == f"Bearer {key}"
    stored = b"".join(_keys(s3_client, s3_bucket.name).values()).decode()
    for secret in (key, header, "TOPSECRET"):
        assert secret not in ok.stderr and secret not in bad.stderr and secret not in stored
