"""The informer (``agentrun.kube.informer``): list, watch, resume from the last version seen, list
again after a 410; an optional informer refused by RBAC; a refusal after it listed. Against an API
client scripted per call (``_FakeKube``), feeding the run cache or the tenancy store."""

from __future__ import annotations

import asyncio
from typing import Any

from cache_objects import run_obj

from agentrun.controller.cache import Cache


class _FakeKube:
    """Lists and watch streams scripted per call (an exception in either is raised); records the
    queries. The client's calls, on the loop."""

    def __init__(self, lists: list[Any], streams: list[Any]) -> None:
        self.lists, self.streams, self.queries = lists, streams, []

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        self.queries.append(("list", kw.get("query", {}).get("resourceVersion")))
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def stream(self, path_: str, query: dict[str, Any], timeout: Any) -> Any:
        self.queries.append(("watch", query.get("resourceVersion")))
        item = self.streams.pop(0) if self.streams else None
        if item is None:
            await asyncio.Event().wait()  # the last watch: idle until the informer's task is cancelled
        if isinstance(item, Exception):
            raise item
        for ev in item:
            yield ev


_ScriptedKube = _FakeKube


def test_the_informer_lists_watches_resumes_and_relists_after_410():
    from agentrun.controller.cache import RUNS
    from agentrun.kube.informer import Informer

    def listed(rv: int, *objs: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": str(rv)}, "items": list(objs)}

    other = run_obj(3)
    other["metadata"].update(name="other", uid="u2")
    kube = _FakeKube(
        lists=[listed(5, run_obj(4), other), listed(20, run_obj(12, phase="Running"))],
        streams=[
            [{"type": "MODIFIED", "object": run_obj(6)}, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
            OSError("connection reset"),  # resumes from the last version seen (the bookmark's)
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],  # expired: list again
        ],
    )

    async def main() -> tuple[Cache, list[tuple[str, str]], list[tuple[str, str]]]:
        changed: list[tuple[str, str]] = []
        deleted: list[tuple[str, str]] = []
        c = Cache(on_change=changed.append, on_deleted=deleted.append)
        inf = Informer(kube, "runs", "ns", None, c, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=RUNS)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        # wait for the conditions asserted below (the second list applied, and the watch after it
        # begun: CI once stopped the informer in between), not for a time
        for _ in range(3000):
            if deleted and len(kube.queries) >= 6:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        await inf.stopped()
        return c, changed, deleted

    c, changed, deleted = asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("watch", "9"), ("watch", "9"), ("list", None),
                            ("watch", "20")]
    assert deleted == [("ns", "other")]  # gone while the watch was expired
    assert c.run(("ns", "r"))["status"] == {"phase": "Running"}
    assert changed.count(("ns", "r")) == 3  # listed, modified, listed again with a change


def test_an_optional_informer_refused_by_rbac_tells_its_sink_and_counts_as_synced():
    from kubernetes.client.rest import ApiException

    from agentrun.controller.tenancy import BINDINGS, PolicyStore
    from agentrun.kube.informer import Informer

    class Refusing(_FakeKube):
        async def request(self, method: str, path_: str, **kw: Any) -> Any:
            self.queries.append(("list", path_))
            raise ApiException(status=403, reason="Forbidden")

    kube = Refusing([], [])

    async def main() -> PolicyStore:
        store = PolicyStore()
        inf = Informer(kube, "bindings", None, None, store, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=BINDINGS, optional=True)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # the refusal is delivered with (not after) the synced flag: wait for it
            if store.refusals:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        return store

    store = asyncio.run(main())
    assert store.refusals == {"bindings": 403}
    assert kube.queries == [("list", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings")]
    assert store.check("ns", {}) is None


def test_an_optional_informer_that_listed_keeps_its_state_when_a_later_watch_is_refused():
    from kubernetes.client.rest import ApiException

    from agentrun.controller.tenancy import POLICIES, PolicyStore
    from agentrun.kube.informer import Informer

    pol = {"metadata": {"name": "p", "resourceVersion": "4"}, "spec": {}}
    kube = _ScriptedKube(lists=[{"metadata": {"resourceVersion": "5"}, "items": [pol]},
                                ApiException(status=403, reason="Forbidden")],
                         streams=[ApiException(status=403, reason="Forbidden")])

    async def main() -> PolicyStore:
        store = PolicyStore()
        inf = Informer(kube, "policies", None, None, store, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=POLICIES, optional=True)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # until it tried to list again after the refused watch (backoff 1 s)
            if len(kube.queries) >= 3:
                break
            await asyncio.sleep(0.01)
        inf.stop()
        return store

    store = asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("list", None)]  # refused after it listed: list again
    assert store.refusals == {} and list(store.policies) == ["p"]


def test_an_informer_refused_after_it_listed_says_since_when_and_lists_again():
    """RBAC taken away after the cache listed: a 403 on the watch marks the informer refused (the
    controller steps down after REFUSED_STEP_DOWN_SECONDS) and it lists again, and only a list
    that goes through clears the mark (a watch could resume on a stale version)."""
    from kubernetes.client.rest import ApiException

    from agentrun.controller.cache import RUNS
    from agentrun.kube.informer import Informer

    listed = {"metadata": {"resourceVersion": "5"}, "items": [run_obj(4)]}
    relisted = {**listed, "metadata": {"resourceVersion": "7"}}
    kube = _ScriptedKube(lists=[listed, ApiException(status=403, reason="Forbidden"), relisted],
                         streams=[ApiException(status=403, reason="Forbidden")])
    marks: list[float | None] = []

    async def main() -> None:
        c = Cache(on_change=lambda k: None)
        inf = Informer(kube, "runs", "ns", None, c, asyncio.get_running_loop(),  # type: ignore[arg-type]
                       resource=RUNS)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 30)
        for _ in range(3000):  # until the refused watch marked it
            if inf.refused_since is not None:
                break
            await asyncio.sleep(0.01)
        marks.append(inf.refused_since)
        for _ in range(3000):  # until it listed again and watches from the new version
            if ("watch", "7") in kube.queries:
                break
            await asyncio.sleep(0.01)
        marks.append(inf.refused_since)
        inf.stop()
        await inf.stopped()

    asyncio.run(main())
    assert kube.queries == [("list", None), ("watch", "5"), ("list", None), ("list", None), ("watch", "7")]
    assert marks[0] is not None and marks[1] is None
