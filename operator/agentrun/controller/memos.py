"""The shell's memos over the pure observation (``decide/observe.py``): each cached Job's
observation while the cache holds the same object, and each run's parsed spec while its JSON is
unchanged. They hold only what can be made again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.api.spec import AgentRunManifestSpec, AgentRunSpec

from .decide.observe import observed_job, parse_spec
from .decide.observed import ObservedJob


def put_bounded(memo: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """``memo[key] = value``; a new key past ``limit`` entries empties the memo first (the memos of
    this module hold only what can be made again)."""
    if len(memo) >= limit and key not in memo:
        memo.clear()
    memo[key] = value


class JobMemo:
    """Each lap Job's :func:`observed_job` (observed without pods) while the cache holds the same
    object for it. The cache replaces a Job's dict on every watch event and never changes one, so an
    unchanged Job is observed once, not on every pass of every reconcile of its run: a run keeps its
    finished Jobs for the Jobs' TTL (an hour by default), hundreds of them for a run of short laps,
    and observing them all on every pass would make a pass grow with the run's laps
    (bench/bench_reconcile_growth.py measures it). It holds the cached dicts:
    :meth:`forget` drops a Job the cache dropped (``Cache(on_job_gone=...)``); past ``limit`` Jobs
    it starts again (observing again is only work)."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._memo: dict[tuple[Any, Any], tuple[dict[str, Any], ObservedJob | None]] = {}

    def observed(self, job: dict[str, Any]) -> ObservedJob | None:
        meta = job.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is job:
            return hit[1]
        oj = observed_job(job, None)
        put_bounded(self._memo, key, (job, oj), self.limit)  # the dict is held: its id is not reused while here
        return oj

    def forget(self, key: tuple[Any, Any]) -> None:
        """The Job ``(namespace, name)`` left the cache."""
        self._memo.pop(key, None)

    def __len__(self) -> int:
        return len(self._memo)


class SpecMemo:
    """Per run (by namespace and name): its last parsed spec, reused while its JSON is equal (a spec
    changes rarely, a reconcile parses it once or twice per lap; comparing the dicts costs a few
    microseconds, the parse a few hundred), and the lap's spec JSON made of that parsed spec
    (:meth:`text`: made once per parsed spec, not dumped again every lap). The parsed specs are shared:
    nothing changes a parsed spec."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        # run -> [spec JSON as listed, its parsed spec, why it cannot be used, (the spec, the lap's spec text)]
        self._memo: dict[tuple[str, str], list[Any]] = {}

    def _put(self, key: tuple[str, str], entry: list[Any]) -> None:
        put_bounded(self._memo, key, entry, self.limit)

    def parse(self, key: tuple[str, str], raw: Any) -> tuple[AgentRunSpec | AgentRunManifestSpec | None, str | None]:
        hit = self._memo.get(key)
        if hit is not None and hit[0] is not _UNLISTED and (hit[0] is raw or hit[0] == raw):
            return hit[1], hit[2]
        spec, spec_error = parse_spec(raw)
        self._put(key, [raw, spec, spec_error, None])
        return spec, spec_error

    def text(self, key: tuple[str, str], spec: AgentRunSpec, dump: Callable[[AgentRunSpec], str]) -> str:
        """``dump(spec)``, made again only when ``spec`` is not the spec it was made of (the parsed
        spec, or the effective spec of a run of an Agent: kept beside its parsed manifest)."""
        hit = self._memo.get(key)
        if hit is None:
            hit = [_UNLISTED, None, None, None]  # a spec not parsed here: kept for its text only
            self._put(key, hit)
        if hit[3] is None or hit[3][0] is not spec:
            hit[3] = (spec, dump(spec))
        return str(hit[3][1])

    def forget(self, key: tuple[str, str]) -> None:
        self._memo.pop(key, None)


#: The "spec JSON" of a memo entry made by :meth:`SpecMemo.text` alone (never equal to a listed one).
_UNLISTED = object()
