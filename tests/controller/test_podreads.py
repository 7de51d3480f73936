"""Pod reads gathered into one LIST per namespace and window (``agentrun.controller.podreads``)."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.controller.podreads import PodReads, by_job, selector


def _pod(name: str, job: str, legacy: bool = False) -> dict:
    label = "job-name" if legacy else "batch.kubernetes.io/job-name"
    return {"metadata": {"name": name, "labels": {label: job}}}


class Lister:
    """The pods of a namespace, listed by a set-based ``job-name`` selector (as the API server does)."""

    def __init__(self, pods: dict[str, list[dict]], fail: bool = False) -> None:
        self.pods, self.fail = pods, fail
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, namespace: str, sel: str) -> list[dict]:
        self.calls.append((namespace, sel))
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("apiserver unavailable")
        wanted = sel.split("(", 1)[1].rstrip(")").split(",") if " in (" in sel else [sel.split("=", 1)[1]]
        return [p for p in self.pods.get(namespace, [])
                if (p["metadata"]["labels"].get("batch.kubernetes.io/job-name")
                    or p["metadata"]["labels"].get("job-name")) in wanted]


def test_the_selector_names_every_job_once():
    assert selector(["b", "a"]) == "job-name in (a,b)"
    assert selector(["a"]) == "job-name=a"


def test_pods_are_handed_out_per_job_and_a_job_without_pods_gets_none():
    pods = [_pod("a-1", "a"), _pod("b-1", "b", legacy=True), _pod("a-2", "a"), _pod("x-1", "x")]
    assert by_job(pods, ["a", "b", "c"]) == {"a": [pods[0], pods[2]], "b": [pods[1]], "c": []}


def test_reads_in_one_window_are_one_request_per_namespace():
    lister = Lister({"ns1": [_pod("a-1", "a"), _pod("b-1", "b"), _pod("z-1", "z")], "ns2": [_pod("c-1", "c")]})

    async def go() -> list[list[dict]]:
        reads = PodReads(lister, window=0.05)
        out = await asyncio.gather(reads.read("ns1", "a"), reads.read("ns1", "b"), reads.read("ns2", "c"),
                                   reads.read("ns1", "a"), reads.read("ns1", "gone"))
        assert reads.requests == 2
        return out

    a, b, c, a2, gone = asyncio.run(go())
    assert sorted(lister.calls) == [("ns1", "job-name in (a,b,gone)"), ("ns2", "job-name=c")]
    assert [p["metadata"]["name"] for p in a] == ["a-1"] and a2 == a
    assert [p["metadata"]["name"] for p in b] == ["b-1"] and [p["metadata"]["name"] for p in c] == ["c-1"]
    assert gone == []


def test_a_full_batch_goes_at_once_and_the_next_read_opens_another():
    lister = Lister({"ns": [_pod(f"j{i}-1", f"j{i}") for i in range(5)]})

    async def go() -> None:
        reads = PodReads(lister, window=30.0, max_jobs=3)  # the window never ends within the test
        first = await asyncio.wait_for(asyncio.gather(*(reads.read("ns", f"j{i}") for i in range(3))), 5)
        assert [len(p) for p in first] == [1, 1, 1]
        second = asyncio.ensure_future(reads.read("ns", "j3"))
        await asyncio.sleep(0.05)
        assert not second.done() and len(lister.calls) == 1  # waits for its own window
        second.cancel()

    asyncio.run(go())


def test_an_error_reaches_every_reader_of_the_batch_and_the_next_batch_tries_again():
    lister = Lister({"ns": [_pod("a-1", "a")]}, fail=True)

    async def go() -> None:
        reads = PodReads(lister, window=0.01)
        results = await asyncio.gather(reads.read("ns", "a"), reads.read("ns", "b"), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        lister.fail = False
        assert [p["metadata"]["name"] for p in await reads.read("ns", "a")] == ["a-1"]
        assert reads.requests == 2

    asyncio.run(go())


def test_a_cancelled_reader_leaves_the_others_their_answer():
    lister = Lister({"ns": [_pod("a-1", "a"), _pod("b-1", "b")]})

    async def go() -> None:
        reads = PodReads(lister, window=0.02)
        ta = asyncio.ensure_future(reads.read("ns", "a"))
        tb = asyncio.ensure_future(reads.read("ns", "b"))
        await asyncio.sleep(0)
        ta.cancel()
        assert [p["metadata"]["name"] for p in await tb] == ["b-1"]
        with pytest.raises(asyncio.CancelledError):
            await ta

    asyncio.run(go())
