"""Leader election with a coordination.k8s.io/v1 Lease, so two replicas never both act.

Every replica watches; only the holder of the Lease reconciles. The holder renews every
``duration/3``; a standby takes the Lease once ``renewTime + leaseDurationSeconds`` has passed
without a renewal (the holder died or is partitioned), then resyncs every run. A holder that
could not renew for ``0.8 * duration`` stops acting before anyone else may take over. Updates
use the Lease's resourceVersion, so two standbys cannot both take it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.api.types import parse_time

log = logging.getLogger("agentrun.lease")


def lease_action(spec: dict[str, Any] | None, identity: str, now: datetime, duration: float) -> str:
    """``create`` (no Lease), ``renew`` (ours), ``take`` (expired or released), or ``wait``."""
    if spec is None:
        return "create"
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    if not holder:
        return "take"
    renew = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    held_for = float(spec.get("leaseDurationSeconds") or duration)
    if renew is None or now >= renew + timedelta(seconds=held_for):
        return "take"
    return "wait"


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, name: str, namespace: str, identity: str, duration: float,
                 on_acquire: Callable[[], Awaitable[None]] | None = None,
                 on_lose: Callable[[], None] | None = None) -> None:
        self.name, self.namespace, self.identity, self.duration = name, namespace, identity, duration
        self.on_acquire = on_acquire
        self.on_lose = on_lose  # e.g. drop per-run metrics, so a standby never exports stale runs
        self._renewed_at = 0.0  # monotonic time of our last successful acquire/renew
        self._leader = False
        self.last_tick = time.monotonic()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lease")
        self.holder: str | None = None  # the other replica holding the Lease, when we wait
        self._standby_logged: str | None = None
        self._acquire_pending = False  # on_acquire failed: run it again while we hold the Lease

    @property
    def is_leader(self) -> bool:
        return self._leader and time.monotonic() - self._renewed_at < 0.8 * self.duration

    def _api(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api()

    def _try(self) -> bool:
        from kubernetes.client.rest import ApiException

        api = self._api()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace)
            spec = lease.spec.to_dict() if lease.spec else {}
            spec = {
                "holderIdentity": spec.get("holder_identity"),
                "renewTime": spec.get("renew_time"),
                "acquireTime": spec.get("acquire_time"),
                "leaseDurationSeconds": spec.get("lease_duration_seconds"),
                "leaseTransitions": spec.get("lease_transitions"),
            }
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease, spec = None, None
        action = lease_action(spec, self.identity, datetime.now(UTC), self.duration)
        if action == "wait":
            self.holder = (spec or {}).get("holderIdentity")
            return False
        body_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(max(1, round(self.duration))),
            "renewTime": _now_micro(),
        }
        if action == "create":
            body_spec.update(acquireTime=_now_micro(), leaseTransitions=0)
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": body_spec}
            try:
                api.create_namespaced_lease(self.namespace, body)
            except ApiException as exc:
                if exc.status == 409:
                    return False
                raise
            return True
        if action == "take":
            body_spec.update(acquireTime=_now_micro(), leaseTransitions=int((spec or {}).get("leaseTransitions") or 0) + 1)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version},
                "spec": {**(spec and {k: v for k, v in {
                    "acquireTime": spec.get("acquireTime"), "leaseTransitions": spec.get("leaseTransitions")}.items()
                    if v is not None} or {}), **body_spec}}
        for k in ("acquireTime", "renewTime"):
            if isinstance(body["spec"].get(k), datetime):
                body["spec"][k] = body["spec"][k].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # someone else won
                return False
            raise
        return True

    async def run(self) -> None:
        while True:
            self.last_tick = time.monotonic()
            was = self.is_leader
            try:
                # its own thread: a renewal never waits behind reconciles in the default executor
                ok = await asyncio.get_running_loop().run_in_executor(self._executor, self._try)
            except Exception as exc:  # API unavailable: keep trying; is_leader expires on its own
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                ok = False
            if ok:
                self._renewed_at = time.monotonic()
                self._leader = True
                if not was:
                    log.info("lease %s/%s acquired by %s: this replica is active", self.namespace, self.name, self.identity)
                if (not was or self._acquire_pending) and self.on_acquire is not None:
                    # a failing callback (the API went away right after the renewal) must not end
                    # this loop: the replica would never renew again and sit idle for good
                    try:
                        await self.on_acquire()
                        self._acquire_pending = False
                    except Exception as exc:  # noqa: BLE001
                        self._acquire_pending = True
                        log.warning("lease %s/%s: on-acquire failed (%s); retrying at the next renewal",
                                    self.namespace, self.name, exc)
            elif self._leader and not self.is_leader:
                self._leader = False
                log.warning("lease %s/%s lost: this replica stops acting", self.namespace, self.name)
                if self.on_lose is not None:
                    try:
                        self.on_lose()
                    except Exception as exc:  # noqa: BLE001
                        log.warning("lease %s/%s: on-lose failed: %s", self.namespace, self.name, exc)
            if not ok and not self._leader and self.holder and self.holder != self._standby_logged:
                self._standby_logged = self.holder
                log.info("lease %s/%s held by %s: this replica (%s) is standby", self.namespace, self.name,
                         self.holder, self.identity)
            if ok:
                self._standby_logged = None
            await asyncio.sleep(max(0.5, self.duration / 3))

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        if not self._leader:
            return
        from kubernetes.client.rest import ApiException

        def _release() -> None:
            api = self._api()
            try:
                lease = api.read_namespaced_lease(self.name, self.namespace)
                if lease.spec and lease.spec.holder_identity == self.identity:
                    api.patch_namespaced_lease(self.name, self.namespace, {"spec": {"holderIdentity": None}})
            except ApiException:
                pass

        self._leader = False
        await asyncio.to_thread(_release)
