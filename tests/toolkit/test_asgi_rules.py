"""The ASGI middleware's rules that the example server does not exercise, in process (httpx's ASGI
transport): retryable statuses are not stored, an in-progress key answers 409 with Retry-After,
request bodies are bounded, stored bodies are bounded, GET query order does not matter."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from agentrun.toolkit import IdempotencyMiddleware, MemoryStore


def _app(status: list[int], runs: list[str], gate: anyio.Event | None = None, size: int = 10) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        runs.append(scope["path"] + "?" + scope["query_string"].decode())
        if gate is not None:
            await gate.wait()
        await send({"type": "http.response.start", "status": status[0], "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"x" * size})

    return app


async def _client(mw: IdempotencyMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t")


def test_retryable_statuses_are_not_stored_and_a_final_answer_is() -> None:
    async def main() -> None:
        status, runs = [503], []
        async with await _client(IdempotencyMiddleware(_app(status, runs), MemoryStore())) as c:
            h = {"Idempotency-Key": "k"}
            assert (await c.post("/p", json={}, headers=h)).status_code == 503
            status[0] = 429
            assert (await c.post("/p", json={}, headers=h)).status_code == 429
            status[0] = 201
            first = await c.post("/p", json={}, headers=h)
            status[0] = 500
            again = await c.post("/p", json={}, headers=h)
        assert len(runs) == 3 and first.status_code == again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true" and again.headers["content-type"] == "text/plain"

    anyio.run(main)


def test_a_key_still_executing_answers_409_in_progress_with_retry_after() -> None:
    async def main() -> None:
        gate, runs = anyio.Event(), []
        mw = IdempotencyMiddleware(_app([200], runs, gate), MemoryStore(), wait_seconds=0.2)
        async with await _client(mw) as c:
            out: list[httpx.Response] = []

            async def first() -> None:
                out.append(await c.post("/p", json={"a": 1}, headers={"Idempotency-Key": "k"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await anyio.sleep(0.05)
                busy = await c.post("/p", json={"a": 1}, headers={"Idempotency-Key": "k"})
                gate.set()
        assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"] == {"code": "idempotency-key-in-progress", "idempotencyKey": "k",
                                        "message": busy.json()["error"]["message"]}
        assert "'k' is still being executed" in busy.json()["error"]["message"]
        assert out[0].status_code == 200 and runs == ["/p?"]

    anyio.run(main)


def test_bounds_on_request_and_stored_bodies_and_query_order() -> None:
    async def main() -> None:
        runs: list[str] = []
        mw = IdempotencyMiddleware(_app([200], runs, size=5000), MemoryStore(), max_body_bytes=1024,
                                   max_request_bytes=100)
        async with await _client(mw) as c:
            big = await c.post("/p", content=b"y" * 101, headers={"Idempotency-Key": "k1"})
            first = await c.get("/g?a=1&b=2", headers={"Idempotency-Key": "k2"})
            again = await c.get("/g?b=2&a=1", headers={"Idempotency-Key": "k2"})
            other = await c.get("/g?a=1&b=3", headers={"Idempotency-Key": "k2"})
            plain = await c.post("/p", content=b"y" * 101)  # no key: not the middleware's business
        assert big.status_code == 413 and "max_request_bytes" in big.text
        assert len(first.content) == 5000 and len(again.content) == 1024
        assert again.headers["idempotent-stored-truncated"] == "kept 1024 of 5000 bytes"
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency-key-reused"
        assert plain.status_code == 200 and runs == ["/g?a=1&b=2", "/p?"]

    anyio.run(main)
