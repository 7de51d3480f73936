"""The notifier: a background thread that announces approvals and run outcomes to a webhook (see ``plan``).

It never runs in the reconcile path: it has its own thread and its own HTTP client with a timeout,
and looks at the runs every ``interval`` seconds, or sooner when woken (:meth:`Notifier.wake`).
Where the runs come from is a port (``runs``, ``patch_status``): inside the operator, the runs
waiting on an approval from the operator's watch cache, written through the cache; standalone
(``python -m agentrun.notify``), :class:`WatchedRuns`, the same list/watch (``agentrun.kube``)
on an event loop of its own. Either makes no request but the status writes; the operator's cache
also wakes it when a run starts waiting on a new approval. A delivery that fails (no answer, or any
status but 2xx) is retried with exponential backoff (``backoff`` seconds doubling up to
``max_backoff``) per message; the rest of the messages go on meanwhile. A delivered message is
recorded in ``status.approval.notified`` (a merge patch of the status subresource, as the operator)
so that a restarted notifier does not announce it again; it is also remembered in memory, so a
failing status patch is retried without sending the message again. The one window left is a crash
between the webhook's 2xx and the status patch: that message is sent again after the restart,
with the same ``Idempotency-Key`` header, so a receiver that dedupes sees it once. (Outcomes are
recorded the same way, in ``status.lifecycle.notified``.)

Which outcomes a run without spec.notify announces is its namespace's AgentRunPolicies' choice
(the ``outcomes`` port; inside the operator, from the tenancy re-check's watched policies), else
AGENTRUN_NOTIFY_OUTCOMES. The standalone notifier reads no policies: spec.notify and
AGENTRUN_NOTIFY_OUTCOMES only.

The webhook URL (a secret: a Slack or Teams URL carries its token) is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.kube.client import Client, path
from agentrun.kube.informer import Informer, is_newer
from agentrun.notify import plan

log = logging.getLogger("agentrun.notify")


@dataclass
class _Retry:
    attempts: int = 0
    next_at: float = 0.0


@dataclass
class Notifier:
    """Announce approvals of the runs ``runs()`` returns to ``url``; record each in the run's
    status with ``patch_status(namespace, name, merge patch)``."""

    runs: Callable[[], Iterable[dict[str, Any]]]
    patch_status: Callable[[str, str, dict[str, Any]], Any]
    url: str
    fmt: plan.Format = "generic"
    settings: plan.Settings = field(default_factory=plan.Settings)
    namespaces: tuple[str, ...] = ()  # for its log line: where ``runs`` looks
    interval: float = 10.0
    backoff: float = 1.0
    max_backoff: float = 300.0
    timeout: float = 10.0
    clock: Callable[[], float] | None = None
    active: Callable[[], bool] | None = None  # e.g. the Lease elector's is_leader: only the leader announces
    #: The outcomes announced in a namespace for its runs without spec.notify (``plan.namespace_outcomes``:
    #: its AgentRunPolicies' choice, else ``settings.outcomes``); asked once per namespace per scan.
    #: None: ``settings.outcomes`` everywhere (no policies read).
    outcomes: Callable[[str], tuple[str, ...]] | None = None
    ticks: int = 0  # loop turns (scanning or not)
    scans: int = 0
    delivered: int = 0

    def __post_init__(self) -> None:
        import time

        self._now: Callable[[], float] = self.clock or time.monotonic
        self._retry: dict[str, _Retry] = {}
        self._sent: dict[str, plan.AnyNotice] = {}  # delivered, status not yet recorded
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=self.timeout)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> Notifier:
        self._thread = threading.Thread(target=self._loop, name="agentrun-notify", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._http.close()

    def _loop(self) -> None:
        log.info("notifier started: %s messages to the webhook, deadline near %ss, every %ss, %s; outcomes of runs "
                 "without spec.notify: %s%s", self.fmt, self.settings.deadline_near_seconds, self.interval,
                 "namespaces " + ",".join(self.namespaces) if self.namespaces else "all namespaces",
                 ",".join(self.settings.outcomes) or "none",
                 " unless their AgentRunPolicies choose" if self.outcomes is not None
                 else " (AgentRunPolicies' notifications.outcomes not read)")
        while not self._stop.is_set():
            try:
                if self.active is None or self.active():
                    self.scan()
            except Exception as e:  # the API server away, ...: next time
                log.warning("notifier scan failed: %s: %s", type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            self.ticks += 1
            self._wake.wait(self.interval)
            self._wake.clear()

    def wake(self) -> None:
        """Scan now (thread-safe): e.g. a run started waiting on an approval."""
        self._wake.set()

    # --- one pass ---------------------------------------------------------------------------

    def scan(self, now: datetime | None = None) -> None:
        """Look at the runs once; deliver and record what is due (respecting each message's backoff)."""
        now = now or datetime.now(UTC)
        due: set[str] = set()
        chosen: dict[str, tuple[str, ...] | None] = {}  # namespace -> its outcomes, this scan
        for run in list(self.runs()):
            ns = str((run.get("metadata") or {}).get("namespace") or "")
            if ns not in chosen:
                chosen[ns] = self.outcomes(ns) if self.outcomes is not None else None
            for notice in plan.announcements(run, now, self.settings, chosen[ns]):
                key = notice.idempotency_key
                due.add(key)
                if key not in self._sent:
                    r = self._retry.get(key)
                    if r is not None and self._now() < r.next_at:
                        continue
                    if not self._deliver(notice):
                        continue
                self._record(run, notice)
        # forget the messages no longer due (approved, timed out, run deleted): memory stays bounded
        for key in [k for k in self._retry if k not in due]:
            del self._retry[key]
        for key in [k for k in self._sent if k not in due]:
            del self._sent[key]
        self.scans += 1

    def _deliver(self, notice: plan.AnyNotice) -> bool:
        key = notice.idempotency_key
        r = self._retry.setdefault(key, _Retry())
        r.attempts += 1
        try:
            resp = self._http.post(self.url, json=plan.body(notice, self.fmt),
                                   headers={"Idempotency-Key": key, "User-Agent": "agentrun-notify"})
            ok, why = 200 <= resp.status_code < 300, f"HTTP {resp.status_code}"
        except httpx.HTTPError as e:
            ok, why = False, type(e).__name__
        if not ok:
            delay = min(self.max_backoff, self.backoff * 2 ** (r.attempts - 1))
            r.next_at = self._now() + delay
            log.warning("notification %s of %s/%s not delivered (%s, attempt %d): retry in %.0fs",
                        notice.about, notice.namespace, notice.name, why, r.attempts, delay)
            return False
        self._retry.pop(key, None)
        self._sent[key] = notice
        self.delivered += 1
        log.info("notification %s of %s/%s delivered (attempt %d)", notice.about, notice.namespace,
                 notice.name, r.attempts)
        return True

    def _record(self, run: dict[str, Any], notice: plan.AnyNotice) -> None:
        patch = plan.notified_patch(run, notice, datetime.now(UTC))
        try:
            self.patch_status(notice.namespace, notice.name, patch)
        except Exception as e:  # kept in _sent: recorded on the next scan, not sent again
            log.warning("notification %s of %s/%s delivered but not recorded in status (%s): retried next scan",
                        notice.kind, notice.namespace, notice.name, type(e).__name__)
            return
        self._sent.pop(notice.idempotency_key, None)


RUNS = (f"/apis/{GROUP}/{VERSION}", PLURAL)


def namespaces_from_env(env: dict[str, str]) -> tuple[str, ...]:
    """AGENTRUN_NAMESPACES (the operator's; empty: all) as a tuple."""
    return tuple(n.strip() for n in env.get("AGENTRUN_NAMESPACES", "").split(",") if n.strip())


class WatchedRuns:
    """The standalone notifier's runs: listed, then watched, per namespace (all: one cluster-wide
    informer) by ``agentrun.kube``'s informer on an event loop in a thread of its own, as the
    operator's watch cache keeps them. :meth:`runs` and :meth:`patch_status` are the
    :class:`Notifier`'s ports (called in its thread); a status write's answer is kept at once, so
    the next scan sees the record."""

    def __init__(self, api_client: Any, namespaces: tuple[str, ...]) -> None:
        self._runs: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.client = Client(api_client, 2 + len(namespaces))
        self.informers = [Informer(self.client, "runs", ns, None, self, self.loop, resource=RUNS)
                          for ns in (namespaces or (None,))]
        self._thread = threading.Thread(target=self.loop.run_forever, name="agentrun-notify-watch", daemon=True)

    def start(self) -> WatchedRuns:
        self._thread.start()
        for inf in self.informers:
            self.loop.call_soon_threadsafe(inf.start)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        async def end() -> None:
            for inf in self.informers:
                inf.stop()
            for inf in self.informers:
                await inf.stopped()
            await self.client.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(end(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    # --- the informers' sink (on the loop) ---------------------------------------------------

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    def _keep(self, obj: dict[str, Any]) -> None:
        """Keep ``obj`` unless the one kept is a later version (a status write's answer before
        an older watch event)."""
        key = self._key(obj)
        if is_newer(obj, self._runs.get(key)):
            self._runs[key] = obj

    def replace(self, kind: str, scope: str | None, items: list[dict[str, Any]]) -> None:
        with self._lock:
            listed = {self._key(o) for o in items}
            for key in [k for k in self._runs if (scope is None or k[0] == scope) and k not in listed]:
                del self._runs[key]
            for obj in items:
                self._keep(obj)

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if type_ == "DELETED":
                self._runs.pop(self._key(obj), None)
            else:
                self._keep(obj)

    # --- the notifier's ports (in its thread) ------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._runs.values())

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any], timeout: float = 30.0) -> None:
        done = asyncio.run_coroutine_threadsafe(self.client.request(
            "PATCH", path(RUNS, namespace, name, "status"), body=patch,
            content_type="application/merge-patch+json", timeout=timeout), self.loop)
        stored = done.result(timeout + 5)
        if isinstance(stored, dict):
            with self._lock:
                self._keep(stored)


def from_env(env: dict[str, str] | None = None, *, runs: Callable[[], Iterable[dict[str, Any]]],
             patch_status: Callable[[str, str, dict[str, Any]], Any],
             active: Callable[[], bool] | None = None,
             outcomes: Callable[[str], tuple[str, ...]] | None = None) -> Notifier | None:
    """A Notifier of the runs ``runs()`` returns, configured by the environment, or None when no
    webhook is set (see :class:`Notifier`; ``outcomes``: its port of the namespaces' choice):

    AGENTRUN_NOTIFY_WEBHOOK_URL (from a Secret), AGENTRUN_NOTIFY_FORMAT (generic, slack, teams),
    AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS (600), AGENTRUN_NOTIFY_INTERVAL_SECONDS (10),
    AGENTRUN_NOTIFY_BACKOFF_SECONDS (1), AGENTRUN_INBOX_URL (the link in messages),
    AGENTRUN_NOTIFY_OUTCOMES (the outcomes announced for runs without spec.notify whose namespace's
    AgentRunPolicies choose none, comma-separated: any of Succeeded, Failed, BudgetExceeded,
    Cancelled, DeadlineExceeded; empty: none),
    AGENTRUN_NAMESPACES (the operator's; empty: all)."""
    env = dict(os.environ if env is None else env)
    url = env.get("AGENTRUN_NOTIFY_WEBHOOK_URL", "").strip()
    if not url:
        return None
    if not url.startswith(("https://", "http://")):
        raise ValueError("AGENTRUN_NOTIFY_WEBHOOK_URL must be an http(s) URL")
    fmt = env.get("AGENTRUN_NOTIFY_FORMAT", "generic") or "generic"
    if fmt not in ("generic", "slack", "teams"):
        raise ValueError(f"AGENTRUN_NOTIFY_FORMAT must be generic, slack or teams, not {fmt[:40]!r}")

    def num(name: str, default: float) -> float:
        raw = env.get(name, "")
        try:
            value = float(raw) if raw else default
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, not {raw[:40]!r}") from None
        if value <= 0:
            raise ValueError(f"{name} must be positive")
        return value

    return Notifier(
        runs=runs, patch_status=patch_status, url=url, fmt=fmt,  # type: ignore[arg-type]
        settings=plan.Settings(deadline_near_seconds=int(num("AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS", 600)),
                               inbox_url=env.get("AGENTRUN_INBOX_URL", ""), outcomes=outcomes_from_env(env)),
        namespaces=namespaces_from_env(env),
        interval=num("AGENTRUN_NOTIFY_INTERVAL_SECONDS", 10), backoff=num("AGENTRUN_NOTIFY_BACKOFF_SECONDS", 1),
        active=active, outcomes=outcomes,
    )


OUTCOMES_ENV = "AGENTRUN_NOTIFY_OUTCOMES"


def outcomes_from_env(env: dict[str, str]) -> tuple[str, ...]:
    """AGENTRUN_NOTIFY_OUTCOMES as a tuple; ValueError naming the variable and the bad value."""
    from agentrun.api.lifecycle import OUTCOMES

    items = tuple(o.strip() for o in env.get(OUTCOMES_ENV, "").split(",") if o.strip())
    bad = [o for o in items if o not in OUTCOMES]
    if bad:
        raise ValueError(f"{OUTCOMES_ENV}: {bad[0][:40]!r} is not an outcome; use any of {', '.join(OUTCOMES)}")
    return items


def check_env(env: dict[str, str] | None = None) -> None:
    """Raise ValueError naming the variable when the notifier's environment (see :func:`from_env`)
    is wrong: the operator checks it before it starts, so a bad value exits at once."""
    notifier = from_env(env, runs=tuple, patch_status=lambda *_: None)
    if notifier is not None:
        notifier._http.close()
