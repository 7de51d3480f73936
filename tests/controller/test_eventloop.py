"""The operator's event loop (controller/eventloop.py): uvloop by default, asyncio on request, and
what runs on it is what ``kopf.run(loop=...)`` runs (a coroutine to its end, the loop closed after)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrun.controller import eventloop
from agentrun.controller.config import OperatorConfig


def test_uvloop_is_the_default_and_asyncio_a_choice():
    assert OperatorConfig.from_env({}).event_loop == "uvloop"
    assert OperatorConfig.from_env({"AGENTRUN_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
    with pytest.raises(ValueError, match="AGENTRUN_EVENT_LOOP"):
        OperatorConfig.from_env({"AGENTRUN_EVENT_LOOP": "trio"})


def test_the_uvloop_loop_runs_the_operator_s_kind_of_work_and_is_closed_after():
    """A uvloop loop, run as Kopf runs a given loop (run_until_complete): a task, a worker thread's
    result (asyncio.to_thread), a cross-thread wake-up (call_soon_threadsafe), a TCP round trip
    and an async generator; closed (with the default executor) when the block ends."""
    import uvloop

    async def work() -> list[object]:
        loop = asyncio.get_running_loop()
        got: list[object] = [type(loop).__module__.split(".")[0]]
        got.append(await asyncio.to_thread(lambda: threading.current_thread() is not threading.main_thread()))
        fut = loop.create_future()
        threading.Thread(target=lambda: loop.call_soon_threadsafe(fut.set_result, "woken")).start()
        got.append(await fut)

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping\n")
        got.append(await reader.readline())
        writer.close()
        server.close()
        await server.wait_closed()

        async def gen():  # noqa: ANN202
            yield 1
            yield 2
        got.append([x async for x in gen()])
        return got

    with eventloop.operator_loop("uvloop") as (loop, what):
        assert isinstance(loop, uvloop.Loop)
        assert what == f"uvloop {uvloop.__version__}"
        assert loop.run_until_complete(work()) == ["uvloop", True, "woken", b"ping\n", [1, 2]]
    assert loop.is_closed()


def test_asyncio_leaves_the_loop_to_kopf():
    with eventloop.operator_loop("asyncio") as (loop, what):
        assert loop is None and what == "asyncio"


def test_an_unknown_loop_is_refused():
    with pytest.raises(ValueError, match="uvloop, asyncio"), eventloop.operator_loop("trio"):
        pass
