"""Leader election with a coordination.k8s.io/v1 Lease, so two replicas never both act.

Every replica watches; only the holder of the Lease reconciles. The holder renews every
``duration/3``. Expiry is measured the way client-go's leaderelection does it: each replica keeps
the Lease record it last read and its OWN clock's time of the last *change* of that record (the
"observed time"). A standby takes the Lease once ``leaseDurationSeconds`` have passed on its own
clock since it last saw the record change (the holder died or is partitioned). The holder's
``renewTime`` is never compared with the local clock, so clock skew between the replicas (or
between a replica and the apiserver) cannot make a standby take a Lease that is still renewed.
A holder that could not renew for ``0.8 * duration`` (on its own clock, counted from the start of
its last successful renewal) stops acting before anyone else may take over. Updates use the
Lease's resourceVersion, so two standbys cannot both take it.

Requests: a holder renews with one update of the Lease it wrote last (client-go's fast path: no
read first); only when that update conflicts (someone else wrote the Lease) does it read the Lease
and decide again. A standby reads once per period. Raw JSON, no model classes, on the event loop
through the client (:class:`KubeLeaseAPI`). As client-go's goroutine, the elector runs only while
the loop does: a loop blocked for ``0.8 * duration`` stops the replica acting, as a replica that
cannot renew does.

The time source is injectable (``Clock``): ``wall()`` for the timestamps written into the Lease
(informational only), ``monotonic()`` for every expiry decision, and ``sleep()`` for the renewal
period. Unit tests drive the elector with a fake clock (no sleeps); the chaos suite runs a replica
with a skewed clock (``e2e/chaos/skewed_operator.py``) through :func:`set_default_clock`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from .client import LEASES, Client, path

log = logging.getLogger("agentrun.lease")

RECORD_FIELDS = ("holderIdentity", "renewTime", "acquireTime", "leaseDurationSeconds", "leaseTransitions")


class Clock(Protocol):
    """The elector's time source."""

    def wall(self) -> datetime: ...  # timestamps written into the Lease (never used to decide)

    def monotonic(self) -> float: ...  # every expiry decision

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def wall(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


_default_clock: Clock = SystemClock()


def set_default_clock(clock: Clock) -> None:
    """The clock of electors created without one (the operator's). For tests and the chaos suite."""
    global _default_clock
    _default_clock = clock


def default_clock() -> Clock:
    return _default_clock


@dataclass(frozen=True)
class Observation:
    """The Lease record a replica last read, and when (on its own monotonic clock) it last changed."""

    record: tuple[Any, ...] | None
    at: float


def observe(prev: Observation | None, spec: dict[str, Any] | None, now: float,
            version: str | None = None) -> Observation:
    """Keep the observed time when the record (its fields and resourceVersion: every write changes
    it, even one with the same timestamps) is unchanged; restart it when anything changed."""
    record = None if spec is None else (version, *(str(spec.get(k)) for k in RECORD_FIELDS))
    if prev is not None and prev.record == record:
        return prev
    return Observation(record, now)


def lease_action(spec: dict[str, Any] | None, identity: str, observed_at: float, now: float, duration: float) -> str:
    """``create`` (no Lease), ``renew`` (ours), ``take`` (expired or released), or ``wait``.

    Expired means: ``leaseDurationSeconds`` (else ``duration``) have passed on THIS replica's
    monotonic clock (``now``) since it observed the record's last change (``observed_at``). The
    holder's renewTime is not looked at."""
    if spec is None:
        return "create"
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    if not holder:
        return "take"
    held_for = float(spec.get("leaseDurationSeconds") or duration)
    if now >= observed_at + held_for:
        return "take"
    return "wait"


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseAPI(Protocol):
    """The coordination.k8s.io/v1 Lease calls of the elector, on plain JSON documents. Errors other
    than the ones named raise (the API unreachable, 5xx, 403)."""

    async def read(self, name: str, namespace: str, timeout: float) -> dict[str, Any] | None:
        """The Lease, or None when there is none (404)."""

    async def create(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The Lease created, or None when one exists already (409)."""

    async def replace(self, name: str, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The Lease written, or None when its resourceVersion is not ``body``'s any more (409)."""

    async def patch(self, name: str, namespace: str, body: dict[str, Any], timeout: float) -> None: ...


class KubeLeaseAPI:
    """:class:`LeaseAPI` over the API-server client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def _call(self, method: str, path_: str, absent: int, **kw: Any) -> dict[str, Any] | None:
        try:
            doc = await self.client.request(method, path_, **kw)
        except Exception as exc:
            if getattr(exc, "status", None) == absent:  # the client's ApiException
                return None
            raise
        return doc if isinstance(doc, dict) else None

    async def read(self, name: str, namespace: str, timeout: float) -> dict[str, Any] | None:
        return await self._call("GET", path(LEASES, namespace, name), 404, timeout=timeout)

    async def create(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        return await self._call("POST", path(LEASES, namespace), 409, body=body, timeout=timeout)

    async def replace(self, name: str, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        return await self._call("PUT", path(LEASES, namespace, name), 409, body=body, timeout=timeout)

    async def patch(self, name: str, namespace: str, body: dict[str, Any], timeout: float) -> None:
        await self.client.request("PATCH", path(LEASES, namespace, name), body=body, timeout=timeout,
                                  content_type="application/merge-patch+json")


class LeaseElector:
    def __init__(self, name: str, namespace: str, identity: str, duration: float,
                 on_acquire: Callable[[], Awaitable[None]] | None = None,
                 on_lose: Callable[[], None] | None = None, *, clock: Clock | None = None,
                 api: LeaseAPI, eligible: Callable[[], str | None] | None = None) -> None:
        self.name, self.namespace, self.identity, self.duration = name, namespace, identity, duration
        #: Why this replica must not lead now (None: it may): asked every round; a holder steps down.
        self.eligible = eligible
        self._ineligible_logged: str | None = None
        self.on_acquire = on_acquire
        self.on_lose = on_lose  # e.g. drop per-run metrics, so a standby never exports stale runs
        self.clock = clock or default_clock()
        self.api = api
        self._renewed_at = float("-inf")  # clock.monotonic() at the start of our last successful acquire/renew
        self._leader = False
        self.last_tick = time.monotonic()  # liveness heartbeat (real time: read by the liveness probe, controller/process.py)
        self.holder: str | None = None  # the other replica holding the Lease, when we wait
        self._standby_logged: str | None = None
        self._acquire_pending = False  # on_acquire failed: run it again while we hold the Lease
        self._acquire_task: asyncio.Task[None] | None = None
        self._observed: Observation | None = None
        self._written: dict[str, Any] | None = None  # the Lease as our last write left it (the fast path)

    @property
    def is_leader(self) -> bool:
        return self._leader and self.clock.monotonic() - self._renewed_at < 0.8 * self.duration

    @property
    def holds(self) -> bool:
        """True while this replica took the Lease and has not seen it lost, even when a late renewal
        has made :attr:`is_leader` false for a moment."""
        return self._leader

    def _body(self, spec: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _wrote(self, lease: dict[str, Any] | None, started: float) -> bool:
        self._written = lease if lease and self._leader_spec(lease) else None
        self._renewed_at = started
        return True

    def _leader_spec(self, lease: dict[str, Any]) -> bool:
        return bool((lease.get("spec") or {}).get("holderIdentity") == self.identity
                    and (lease.get("metadata") or {}).get("resourceVersion"))

    async def _try(self) -> bool:
        """One acquire/renew round; True if this replica holds the Lease afterwards."""
        started = self.clock.monotonic()
        api = self.api
        # bounded: a hung call must not hold the renewal loop past the Lease's life
        timeout = max(1.0, self.duration / 2)
        stamp = _micro(self.clock.wall())
        ours: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(max(1, round(self.duration))),
            "renewTime": stamp,
        }
        written = self._written
        if self._leader and written is not None:
            # the fast path (client-go's): update the Lease as we last wrote it; a conflict means
            # someone else wrote it since, and the read below decides. An error or a cancelled round
            # keeps it: the resourceVersion guards the next try (a stale one is a conflict)
            body = self._body({**(written.get("spec") or {}), **ours}, written["metadata"]["resourceVersion"])
            renewed = await api.replace(self.name, self.namespace, body, timeout)
            if renewed is not None:
                return self._wrote(renewed, started)
            self._written = None
        lease = await api.read(self.name, self.namespace, timeout)
        spec = None if lease is None else {k: (lease.get("spec") or {}).get(k) for k in RECORD_FIELDS}
        version = None if lease is None else (lease.get("metadata") or {}).get("resourceVersion")
        now = self.clock.monotonic()
        self._observed = observe(self._observed, spec, now, version)
        action = lease_action(spec, self.identity, self._observed.at, now, self.duration)
        if action == "wait":
            self.holder = (spec or {}).get("holderIdentity")
            return False
        if action == "create" or lease is None:
            created = await api.create(self.namespace, self._body({**ours, "acquireTime": stamp, "leaseTransitions": 0},
                                                            None), timeout)
            return created is not None and self._wrote(created, started)
        if action == "take":
            ours.update(acquireTime=stamp, leaseTransitions=int((spec or {}).get("leaseTransitions") or 0) + 1)
        kept = {k: v for k, v in (spec or {}).items() if k in ("acquireTime", "leaseTransitions") and v is not None}
        replaced = await api.replace(self.name, self.namespace, self._body({**kept, **ours}, version), timeout)
        return replaced is not None and self._wrote(replaced, started)

    async def _on_acquire(self) -> None:
        # a failing callback (the API went away right after the renewal) is run again at the next
        # renewal: the replica must not sit idle for good
        assert self.on_acquire is not None
        try:
            await self.on_acquire()
        except Exception as exc:  # noqa: BLE001
            self._acquire_pending = True
            log.warning("lease %s/%s: on-acquire failed (%s); retrying at the next renewal",
                        self.namespace, self.name, exc)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self._acquire_task is not None:
                self._acquire_task.cancel()

    async def _step_aside(self, why: str) -> None:
        """This replica must not lead (its watch cache lost its access): a holder releases the Lease
        (a standby takes it at its next round) and stops acting; none campaigns until it may again."""
        if self._leader:
            log.warning("lease %s/%s: stepping down: %s", self.namespace, self.name, why)
            await self.release()
            self._lost()
        elif why != self._ineligible_logged:
            log.warning("lease %s/%s: not campaigning: %s", self.namespace, self.name, why)
        self._ineligible_logged = why

    def _lost(self) -> None:
        self._leader = False
        if self.on_lose is not None:
            try:
                self.on_lose()
            except Exception as exc:  # noqa: BLE001
                log.warning("lease %s/%s: on-lose failed: %s", self.namespace, self.name, exc)

    async def _run(self) -> None:
        while True:
            self.last_tick = time.monotonic()
            why = self.eligible() if self.eligible is not None else None
            if why is not None:
                await self._step_aside(why)
                await self.clock.sleep(max(0.5, self.duration / 3))
                continue
            self._ineligible_logged = None
            was = self.is_leader
            try:
                ok = await self._try()
            except Exception as exc:  # API unavailable: keep trying; is_leader expires on its own
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                ok = False
            if ok:
                self._leader = True
                if not was:
                    log.info("lease %s/%s acquired by %s: this replica is active", self.namespace, self.name, self.identity)
                if (not was or self._acquire_pending) and self.on_acquire is not None \
                        and (self._acquire_task is None or self._acquire_task.done()):
                    # in its own task: a long resync (every run) must never hold up the renewals,
                    # or a loaded replica loses the Lease it just took (found by the chaos suite)
                    self._acquire_pending = False
                    self._acquire_task = asyncio.create_task(self._on_acquire())
            elif self._leader and not self.is_leader:
                log.warning("lease %s/%s lost: this replica stops acting", self.namespace, self.name)
                self._lost()
            if not ok and not self._leader and self.holder and self.holder != self._standby_logged:
                self._standby_logged = self.holder
                log.info("lease %s/%s held by %s: this replica (%s) is standby", self.namespace, self.name,
                         self.holder, self.identity)
            if ok:
                self._standby_logged = None
            await self.clock.sleep(max(0.5, self.duration / 3))

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        if not self._leader:
            return

        self._written = None
        self._leader = False
        api = self.api
        try:
            lease = await api.read(self.name, self.namespace, 5.0)
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                await api.patch(self.name, self.namespace, {"spec": {"holderIdentity": None}}, 5.0)
        except Exception as exc:  # noqa: BLE001 - best effort: a standby takes over after the duration
            log.info("lease %s/%s: not released: %s", self.namespace, self.name, exc)
