"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it
(and controller-runtime, kube-scheduler and kube-controller-manager with it): one replica of the
operator places units, the others keep their caches warm and wait.

A replica leads while it holds the Lease: it takes a free or expired Lease with a conditional
write (the resourceVersion it read), renews it every `retry_period`, and stops leading — its
loops cancelled — when it could not renew for `renew_deadline`, which is shorter than the Lease's
duration, so it has stopped before anyone else may take over. Expiry is judged on this replica's
own monotonic clock, from when it last saw the Lease record change, never from the timestamps
another replica's clock wrote. On a clean shutdown it gives the Lease up, so a standby takes over
at once rather than after the Lease runs out.

Leadership is an optimisation, not the safety: every write of the operator is conditional on the
resourceVersion it read and every table carries epochs, so two replicas that both believe they
lead (a paused process) cannot both win a write (docs/handoff.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Final

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

logger = logging.getLogger(__name__)

LEASE_SECONDS: Final = 15.0
RENEW_DEADLINE: Final = 10.0
RETRY_PERIOD: Final = 2.0
"""client-go's defaults, as kube-controller-manager and kube-scheduler use them."""


class LeaderElection:
    """Who leads, among the replicas sharing the Lease `namespace/name`."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        namespace: str,
        identity: str,
        *,
        lease_seconds: float = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_seconds:
            raise ValueError("leader election needs retry_period < renew_deadline < lease")
        self.client, self.name, self.namespace, self.identity = client, name, namespace, identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.leading = False
        self._seen: tuple[str | None, str | None] | None = None
        self._seen_at = 0.0

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Forever: wait to lead, run `lead()` while leading, cancel it when leadership is lost.
        Cancelled (shutdown), it cancels `lead()` and gives the Lease up."""
        try:
            while True:
                told = False
                while not await self._attempt():
                    if not told:
                        told = True
                        holder = self._seen[0] if self._seen else None
                        logger.info("Standing by: the Lease %s is held by %s", self.name, holder)
                    await asyncio.sleep(self.retry_period)
                logger.info(
                    "Leading (Lease %s/%s, as %s)", self.namespace, self.name, self.identity
                )
                self.leading = True
                task = asyncio.ensure_future(lead())
                try:
                    await self._renew_until_lost(task)
                finally:
                    self.leading = False
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                logger.warning(
                    "Lost the lead (Lease %s/%s); standing by", self.namespace, self.name
                )
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release())

    async def _renew_until_lost(self, task: asyncio.Future[None]) -> None:
        renewed = self.clock()
        while not task.done():
            await asyncio.sleep(self.retry_period)
            if await self._attempt():
                renewed = self.clock()
            elif self.clock() - renewed >= self.renew_deadline:
                return

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except Exception as error:  # the API server may be out of reach: keep trying
            logger.warning("Could not take or renew the Lease: %s", error)
            return False

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        now = datetime.now(UTC)
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            return await self._write(self._created(now), create=True)
        spec = lease.spec or LeaseSpec()
        record = (spec.holderIdentity, lease.metadata.resourceVersion if lease.metadata else None)
        if record != self._seen:
            self._seen, self._seen_at = record, self.clock()
        holder = spec.holderIdentity
        held_by_other = bool(holder) and holder != self.identity
        if held_by_other and self.clock() < self._seen_at + self.lease_seconds:
            return False
        if holder != self.identity:
            spec.acquireTime = now
            spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
        spec.holderIdentity = self.identity
        spec.leaseDurationSeconds = int(self.lease_seconds)
        spec.renewTime = now
        lease.spec = spec
        return await self._write(lease, create=False)

    async def release(self) -> None:
        """Give the Lease up, if held: a standby takes it at its next attempt."""
        lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        if lease.spec is None or lease.spec.holderIdentity != self.identity:
            return
        lease.spec.holderIdentity = None
        lease.spec.leaseDurationSeconds = 1
        lease.spec.renewTime = datetime.now(UTC)
        await self.client.replace(lease)
        logger.info("Gave up the Lease %s/%s", self.namespace, self.name)

    def _created(self, now: datetime) -> Lease:
        return Lease(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace),
            spec=LeaseSpec(
                holderIdentity=self.identity,
                leaseDurationSeconds=int(self.lease_seconds),
                acquireTime=now,
                renewTime=now,
                leaseTransitions=0,
            ),
        )

    async def _write(self, lease: Lease, *, create: bool) -> bool:
        """A conditional write: another replica's write in between makes it fail (409)."""
        try:
            if create:
                await self.client.create(lease)
            else:
                await self.client.replace(lease)
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        self._seen, self._seen_at = None, self.clock()
        return True
