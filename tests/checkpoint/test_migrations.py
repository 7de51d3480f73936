"""Schema versions: the frozen v1 fixtures migrate field by field; unknown versions are refused."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentrun.checkpoint.errors import CorruptCheckpoint, UnsupportedSchemaVersion
from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.migrations import (
    MIGRATIONS,
    MIN_SCHEMA_VERSION,
    migrate,
    migrate_v1_to_v2,
    migrate_v2_to_v3,
)
from agentrun.checkpoint.schema import SCHEMA_VERSION, LapRecord, RunState

FIXTURES = Path(__file__).parent.parent / "fixtures" / "checkpoints" / "v1"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def test_registry_covers_every_step_to_the_current_version() -> None:
    assert MIN_SCHEMA_VERSION == 1 and SCHEMA_VERSION == 3
    assert set(MIGRATIONS) == set(range(MIN_SCHEMA_VERSION, SCHEMA_VERSION))
    assert MIGRATIONS[1] is migrate_v1_to_v2 and MIGRATIONS[2] is migrate_v2_to_v3


def test_v1_lap_fixture_migrates_field_by_field() -> None:
    raw = load("lap-00000007.json")
    pristine = copy.deepcopy(raw)
    record = LapRecord.model_validate(migrate(raw, "laps/00000007.json"))
    assert raw == pristine, "migrations must not mutate their input"
    assert record.kind == "LapRecord" and record.schema_version == 3 and record.key_scheme == "uid8"
    assert record.agent_version == "invoice-agent:0.9.2"
    assert (record.run.namespace, record.run.name) == ("billing", "invoices-nov")
    assert record.run.uid == "8f2a1c0d-4b7e-4f10-9a51-2c3d4e5f6a7b"
    assert (record.lap, record.attempt, record.prev_sha256) == (7, 2, None)
    assert record.outcome.type == "awaiting-approval"
    assert record.outcome.message == "post_ledger needs approval"
    assistant, tool = record.messages
    assert assistant.role == "assistant" and assistant.lap == 7
    assert assistant.content == "Extracting doc_4406, then posting."
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("call_7a", "extract_invoice", {"doc": "doc_4406", "pages": [1, 2]}),
        ("call_7b", "post_ledger", {"amount": "310.50", "currency": "EUR"}),
    ]
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_7a", '{"total": "310.50", "currency": "EUR"}')
    ok, waiting = record.tool_calls
    assert (ok.call_id, ok.tool, ok.status, ok.http_status, ok.replayed) == ("call_7a", "extract_invoice", "ok", 200, True)
    assert ok.arguments == {"doc": "doc_4406", "pages": [1, 2]}
    assert ok.idempotency_key == "r_8f2a1c0d:7:extract_invoice:call_7a"
    assert ok.started_at == datetime(2025, 11, 3, 10, 15, 2, tzinfo=UTC)
    assert ok.finished_at == datetime(2025, 11, 3, 10, 15, 4, 250000, tzinfo=UTC)
    assert (waiting.status, waiting.result, waiting.started_at) == ("awaiting-approval", None, None)
    assert record.plan == ["post doc_4406 to the ledger (approval)", "extract doc_4407..doc_4412"]
    p = record.pending_approval
    assert p is not None
    assert (p.call_id, p.tool, p.lap, p.arguments) == ("call_7b", "post_ledger", 7, {"amount": "310.50", "currency": "EUR"})
    assert p.idempotency_key == "r_8f2a1c0d:7:post_ledger:call_7b"
    assert p.requested_at == datetime(2025, 11, 3, 10, 15, 4, 500000, tzinfo=UTC)
    assert record.approval_decision is None and record.compaction is None
    assert (record.usage.input_tokens, record.usage.output_tokens) == (3400, 410)
    assert record.cost_usd == "0.01655"
    assert (record.totals.laps, record.totals.input_tokens, record.totals.output_tokens) == (7, 21600, 2510)
    assert record.totals.cost_usd == "0.10405"
    assert record.timings.started_at == datetime(2025, 11, 3, 10, 14, 58, tzinfo=UTC)
    assert (record.timings.model_seconds, record.timings.tools_seconds) == (3.9, 2.25)


def test_v1_snapshot_fixture_migrates_field_by_field_and_folds_with_the_v1_lap() -> None:
    state = RunState.model_validate(migrate(load("snapshot-00000006.json"), "snapshots/00000006.json"))
    assert state.kind == "Snapshot" and state.schema_version == 3 and state.key_scheme == "uid8"
    assert (state.lap, state.agent_version, state.last_sha256) == (6, "invoice-agent:0.9.2", None)
    assert state.summary is not None and state.summary.startswith("Laps 1-4")
    assert state.pinned_facts == ["vendor ACME uses EUR", "doc_4402 is a duplicate of doc_4401"]
    assert state.compacted_through_lap == 4
    assert [(m.role, m.lap) for m in state.messages] == [("system", 0), ("user", 0), ("assistant", 5), ("tool", 5), ("assistant", 6)]
    assert state.messages[2].content is None
    assert state.messages[2].tool_calls[0].arguments == {"doc": "doc_4405"}
    assert state.messages[3].tool_call_id == "call_5a"
    assert state.plan == ["extract doc_4406..doc_4412", "post totals to the ledger"]
    assert state.pending_approval is None
    assert state.last_outcome is not None and state.last_outcome.type == "continue"
    assert state.totals.cost_usd == "0.0875" and state.totals.input_tokens == 18200

    record = LapRecord.model_validate(migrate(load("lap-00000007.json"), "laps/00000007.json"))
    after = fold(state, record, "sha-of-lap-7")
    assert after.lap == 7 and len(after.messages) == 7
    assert after.pending_approval == record.pending_approval
    assert after.totals.cost_usd == "0.10405"


def test_current_version_documents_pass_through_unchanged() -> None:
    doc = {"schemaVersion": 3, "kind": "LapRecord", "anything": 1}
    assert migrate(doc, "k") is doc


@pytest.mark.parametrize("version", [9, 4, 0, -1])
def test_unknown_schema_version_names_both_versions(version: int) -> None:
    doc = load("lap-00000007.json")
    doc.pop("schema_version")
    doc["schemaVersion"] = version
    with pytest.raises(UnsupportedSchemaVersion) as info:
        migrate(doc, "ns/run/uid/laps/00000007.json")
    assert str(info.value) == (
        f"checkpoint ns/run/uid/laps/00000007.json has schemaVersion {version}; this agentrun reads "
        "schema versions 1..3 — upgrade the operator/runner image"
    )
    assert info.value.permanent and info.value.found == version


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("schema_version"), "schemaVersion is missing"),
        (lambda d: d.update(schema_version="2"), "schemaVersion must be an integer"),
        (lambda d: d.update(outcome="paused"), "field outcome: unknown value 'paused'"),
        (lambda d: d["messages"][0]["tool_calls"][1]["function"].update(arguments="{not json"),
         "field messages[0].tool_calls[1].function.arguments: not valid JSON"),
        (lambda d: d["tool_results"][0].pop("idempotency_key"), "field tool_results[0].idempotency_key: required"),
        (lambda d: d.update(cost="cheap"), "field cost: expected a number"),
        (lambda d: d.update(colour="blue"), "field colour: not a field of schema version 1"),
        (lambda d: d.update(kind="journal"), "field kind: expected 'lap' or 'snapshot'"),
    ],
)
def test_a_malformed_v1_document_is_corrupt_naming_key_and_field(mutate: Any, field: str) -> None:
    doc = load("lap-00000007.json")
    mutate(doc)
    with pytest.raises(CorruptCheckpoint) as info:
        migrate(doc, "p/laps/00000007.json")
    assert "checkpoint p/laps/00000007.json" in str(info.value)
    assert field in str(info.value)
    assert info.value.permanent


V2 = Path(__file__).parent.parent / "fixtures" / "checkpoints" / "v2-run"


def test_v2_fixture_objects_migrate_to_v3_with_the_old_key_scheme() -> None:
    manifest = json.loads((V2 / "manifest.json").read_text())
    for obj in manifest["objects"]:
        raw = json.loads((V2 / "objects" / obj["key"]).read_bytes())
        assert raw["schemaVersion"] == 2
        doc = migrate(raw, obj["key"])
        assert doc["schemaVersion"] == 3 and raw["schemaVersion"] == 2  # input not mutated
        if raw["kind"] in ("LapRecord", "Snapshot"):
            assert doc["keyScheme"] == "uid8"
            if raw["kind"] == "LapRecord":
                assert LapRecord.model_validate(doc).storage is None  # not counted before v3
            else:
                assert RunState.model_validate(doc).key_scheme == "uid8"
        else:
            assert "keyScheme" not in doc
    lap3 = LapRecord.model_validate(migrate(json.loads((V2 / "objects/laps/00000003.json").read_bytes()), "k"))
    assert lap3.pending_approval is not None
    assert lap3.pending_approval.idempotency_key == "r_5e1d9a3b:3:post_ledger:call_1"


def test_v2_to_v3_refuses_an_unknown_kind() -> None:
    with pytest.raises(CorruptCheckpoint, match=r"field kind: expected one of"):
        migrate({"schemaVersion": 2, "kind": "Mystery"}, "k")
    assert migrate_v2_to_v3({"schemaVersion": 2, "kind": "JournalEntry"})["schemaVersion"] == 3
