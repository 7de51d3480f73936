"""The toolkit's ASGI middleware over real HTTP: examples/kit_tool_server.py (Starlette + the
middleware + a SQLite ledger) run by uvicorn in its own process; the ledger's own record counts
executions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from toolkit_servers import example_server, record  # noqa: E402

KEY = "r_8f2a1c0d4b7e4f109a512c3d4e5f6a7b:3:book:call_1"


def _post(url: str, body: dict, key: str | None) -> httpx.Response:  # type: ignore[type-arg]
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(url + "/book", json=body, headers=headers, timeout=30)


def test_twenty_concurrent_duplicates_execute_once_and_get_one_answer(tmp_path: Path) -> None:
    with example_server("kit_tool_server.py", tmp_path / "ledger.sqlite3", "--delay", "0.5") as url:
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: _post(url, {"invoice": "INV-7", "amountCents": 1250}, KEY), range(20)))
        rec = record(url)
    assert rec["executions"] == {KEY: 1}, rec
    assert rec["bookings"] == 1
    assert {(a.status_code, a.content, a.headers["content-type"]) for a in answers} == {
        (200, answers[0].content, "application/json")}
    assert json.loads(answers[0].content)["booking"] == 1
    replayed = [a.headers.get("Idempotent-Replayed") for a in answers]
    assert replayed.count("true") == 19 and replayed.count(None) == 1


def test_same_key_other_arguments_is_refused_with_409_naming_the_key(tmp_path: Path) -> None:
    with example_server("kit_tool_server.py", tmp_path / "ledger.sqlite3") as url:
        first = _post(url, {"invoice": "INV-7", "amountCents": 1250}, KEY)
        # the same arguments in another key order are the same call
        same = httpx.post(url + "/book", content=b'{"amountCents": 1250, "invoice": "INV-7"}',
                          headers={"Idempotency-Key": KEY, "Content-Type": "application/json"})
        other = _post(url, {"invoice": "INV-7", "amountCents": 9999}, KEY)
        rec = record(url)
    assert first.status_code == 200 and same.status_code == 200 and same.content == first.content
    assert other.status_code == 409
    err = other.json()["error"]
    assert err["code"] == "idempotency-key-reused" and err["idempotencyKey"] == KEY
    assert KEY in err["message"] and "different arguments" in err["message"]
    assert rec["executions"] == {KEY: 1}


def test_a_restarted_server_answers_a_known_key_from_its_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    with example_server("kit_tool_server.py", db) as url:
        first = _post(url, {"invoice": "INV-8", "amountCents": 300}, KEY)
    with example_server("kit_tool_server.py", db) as url:
        again = _post(url, {"invoice": "INV-8", "amountCents": 300}, KEY)
        rec = record(url)
    assert first.status_code == 200 and "Idempotent-Replayed" not in first.headers
    assert again.status_code == 200 and again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert rec["executions"] == {KEY: 1} and rec["bookings"] == 1


def test_requests_without_the_header_pass_through_and_errors_are_stored_too(tmp_path: Path) -> None:
    with example_server("kit_tool_server.py", tmp_path / "ledger.sqlite3") as url:
        plain = [_post(url, {"invoice": "INV-9", "amountCents": 1}, None) for _ in range(3)]
        bad1 = _post(url, {"invoice": 5}, "k-bad")
        bad2 = _post(url, {"invoice": 5}, "k-bad")
        too_long = _post(url, {"invoice": "INV-9", "amountCents": 1}, "x" * 300)
        rec = record(url)
    assert [p.status_code for p in plain] == [200, 200, 200] and rec["withoutKey"] == 3
    assert all("Idempotent-Replayed" not in p.headers for p in plain)
    # a 400 is a final answer: stored, and the repeat gets it back without running the handler
    assert bad1.status_code == bad2.status_code == 400 and bad1.content == bad2.content
    assert bad2.headers["Idempotent-Replayed"] == "true"
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "idempotency-key-invalid"
    assert rec["bookings"] == 3


def test_the_lap_runner_against_a_kit_server_executes_once_per_key(tmp_path: Path) -> None:
    """The lap's real HTTP tool runner (what sends the key) against the kit: a replayed call with the
    same key gets the first result, and the result the model sees is the same."""
    from agentrun.api.spec import ToolSpec
    from agentrun.lap.tools.http import HTTPToolRunner

    with example_server("kit_tool_server.py", tmp_path / "ledger.sqlite3") as url:
        tool = ToolSpec.model_validate({"name": "book", "http": {"url": url + "/book", "method": "POST"},
                                        "parameters": {"type": "object"}})
        runner = HTTPToolRunner()
        a = runner.call(tool, {"invoice": "INV-10", "amountCents": 42}, KEY)
        b = runner.call(tool, {"invoice": "INV-10", "amountCents": 42}, KEY)
        rec = record(url)
    assert a.status == b.status == "ok" and a.result == b.result and a.http_status == 200
    assert rec["executions"] == {KEY: 1}
