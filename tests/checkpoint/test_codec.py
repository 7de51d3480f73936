"""Schema 3's stored bytes: gzip with the encoding in the object, the compact lap record (each
tool result and each call's arguments stored once), decodable with the standard library alone."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from ckpt_builders import make_record
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.checkpoint.codec import encode_object, inflate, pack_lap, tool_message_text, unpack_lap
from agentrun.checkpoint.errors import CorruptCheckpoint
from agentrun.checkpoint.schema import LapRecord, Message, ToolCall, ToolCallRecord


def test_encoding_is_gzip_deterministic_and_plain_json_reads_as_is() -> None:
    doc = {"b": [1, 2], "a": "é"}
    data = encode_object(doc)
    assert data[:2] == b"\x1f\x8b" and data == encode_object(dict(reversed(doc.items())))
    assert json.loads(gzip.decompress(data)) == doc  # standard library only
    assert inflate(b'{"a":1}', "k") == b'{"a":1}'


@pytest.mark.parametrize("damage", ["truncated", "padded", "garbage"])
def test_damaged_gzip_is_corrupt_naming_the_key(damage: str) -> None:
    data = encode_object({"x": "y" * 100})
    bad = {"truncated": data[:-5], "padded": data + b"\x00junk", "garbage": b"\x1f\x8b" + b"nonsense"}[damage]
    with pytest.raises(CorruptCheckpoint, match="checkpoint laps/00000001.json"):
        inflate(bad, "laps/00000001.json")


def test_a_gzip_bomb_is_refused_without_inflating_it() -> None:
    bomb = gzip.compress(b"0" * (2 * 1024 * 1024), mtime=0)
    with pytest.raises(CorruptCheckpoint, match="inflates to more than 1048576 bytes"):
        inflate(bomb, "k", limit=1024 * 1024)


def test_a_lap_record_stores_each_result_and_arguments_once() -> None:
    record = make_record(3, pending=True)
    doc = record.to_api()
    packed = pack_lap(doc)
    text = json.dumps(packed)
    result = record.tool_calls[0].result
    assert text.count(json.dumps(result)[1:-1]) == 1  # once: in the call record
    assert packed["messages"][1] == {"contentFrom": "toolCall", "lap": 3, "role": "tool", "toolCallId": "call_3"}
    assert packed["toolCalls"][0]["argumentsFrom"] == "message" and "arguments" not in packed["toolCalls"][0]
    assert "argumentsFrom" not in packed["pendingApproval"]  # its call is not in this lap's message
    assert LapRecord.model_validate(unpack_lap(packed, "k")) == record


def test_a_reference_to_nothing_is_corrupt_naming_the_field() -> None:
    packed = pack_lap(make_record(2).to_api())
    packed["toolCalls"] = []
    with pytest.raises(CorruptCheckpoint, match=r"field messages\[1\]\.contentFrom: no tool call 'call_2'"):
        unpack_lap(packed, "k")


_ids = st.sampled_from(["c1", "c2", "call_1"])
_text = st.text(max_size=20)
_args = st.dictionaries(st.sampled_from(["doc", "n"]), st.one_of(_text, st.integers()), max_size=2)
_status = st.sampled_from(["ok", "error", "unknown-tool", "invalid-arguments", "rejected"])


@st.composite
def _records(draw: Any) -> LapRecord:
    base = make_record(5)
    calls = [ToolCall(id=draw(_ids), name="t", arguments=draw(_args)) for _ in range(draw(st.integers(0, 3)))]
    records = [
        ToolCallRecord(call_id=draw(_ids), tool="t", arguments=draw(_args), idempotency_key="k",
                       status=draw(_status), result=draw(st.one_of(st.none(), _text)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    messages = [Message(role="assistant", content=draw(st.one_of(st.none(), _text)), tool_calls=calls, lap=5)]
    for r in records:  # tool messages: the derived text, or something else (an [approval] answer)
        derived = tool_message_text(r.status, r.result)
        content = draw(st.one_of(st.just(derived), _text, st.none()))
        messages.append(Message(role="tool", content=content, tool_call_id=draw(st.one_of(st.just(r.call_id), _ids)), lap=5))
    return base.model_copy(update={"messages": messages, "tool_calls": records})


@settings(max_examples=300, deadline=None)
@given(_records())
def test_pack_then_unpack_gives_back_the_same_record(record: LapRecord) -> None:
    packed = pack_lap(record.to_api())
    assert LapRecord.model_validate(unpack_lap(packed, "k")) == record
    assert LapRecord.model_validate(unpack_lap(json.loads(json.dumps(packed)), "k")) == record
