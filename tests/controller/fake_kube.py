"""An in-memory API server for the executor (``FakeKube``) and the executor around it: the run
``BODY`` it answers for, ``executor(kube)``, and ``execute(ex, observed, decision)`` on a fresh copy of
the run. Shared by test_execute.py, test_events_budget.py and test_reconciler.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controller_world import UID
from kubernetes.client.exceptions import ApiException

from agentrun.checkpoint.schema import RunRef
from agentrun.controller import decide as d
from agentrun.controller.config import OperatorConfig
from agentrun.controller.execute import Executor

KEY = ("ns", "run")

BODY = {"metadata": {"namespace": "ns", "name": "run", "uid": UID, "resourceVersion": "5"}, "spec": {}}


class FakeKube:
    """Answers the Executor's requests: Job creates with ``job_error`` (None: created), status
    patches with the patched object; records every request."""

    def __init__(self, job_error: ApiException | None = None) -> None:
        self.job_error = job_error
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path_: str, **kw: Any) -> Any:
        self.requests.append((method, path_, kw.get("body")))
        if method == "POST" and path_.endswith("/jobs"):
            if self.job_error is not None:
                raise self.job_error
            return kw["body"]
        if method == "PATCH" and path_.endswith("/status"):
            return {"metadata": {**BODY["metadata"], "resourceVersion": "6"}, "status": kw["body"][1]["value"]}
        return {}

    def events(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if m == "POST" and p.endswith("/events")]

    def status_patches(self) -> list[Any]:
        return [b for m, p, b in self.requests if m == "PATCH" and p.endswith("/status")]


def executor(kube: FakeKube) -> Executor:
    from agentrun.controller.cache import Cache

    return Executor(OperatorConfig(), kube, Cache(on_change=lambda k: None))  # type: ignore[arg-type]


def execute(ex: Executor, o: d.Observed, decision: d.Decision) -> Any:
    run = RunRef(namespace="ns", name="run", uid=UID)
    return asyncio.run(ex.execute(json.loads(json.dumps(BODY)), o, decision, run, o.spec))
