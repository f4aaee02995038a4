"""The operator's runtime: what every controller of one process shares (`Runtime`), the one
loop every kind runs (`run_loop`), with controller-runtime's work-queue rate limiting, and the
supervision of one loop per object while this replica leads.

One `Runtime` per operator process owns the API client, the objects of our kinds as the watch
last delivered them, the caches of selected pods and workloads, the wake-ups, the Event recorder,
the deletion-cost writer, the load collector and the watch on the sets' own tables.
`apportion operator` creates it and hands it to every kopf handler as `memo.runtime` (kopf's
public per-operator memo), so nothing lives in module globals and a test builds a runtime of its
own.

kopf is used through its public API only: `@kopf.on.event` handlers feed `observe` and
`deleted`, and the runtime runs the loops itself — not as kopf daemons, which kopf gives a
finalizer each (by design: nolar/kopf#896), and a finalizer leaves sets, and the namespaces
holding them, stuck in deletion whenever the operator is stopped or uninstalled. Which replica
runs the loops is decided by a Lease (`leadership.LeaderElection`) instead of kopf's peering,
which pauses only kopf's own handlers.

`run_loop` is level-triggered: a pass, then a wait until something the object reads changes, the
pass's own wake-up time comes, or the resync period ends. Failed passes are retried with a
per-object exponential back-off (2 s doubling to 5 min, reset by a success: client-go's
`ItemExponentialFailureRateLimiter`); a write conflict is retried at once the first time (another
writer was first: decide again), then backs off too. Those retries of all objects together are
also held to a token bucket (`PassLimiter`: client-go's `BucketRateLimiter`, 10 per second, bursts
of 100, taken with the back-off as its `MaxOfRateLimiter` does), so a failing API server is not
hammered. As in client-go, the bucket is for rate-limited requeues only: the first reaction to an
event and a pass whose own time has come never queue behind other objects' passes, or one set's
pod deletion would wait for the timer passes of a thousand others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf
from lightkube import AsyncClient

from apportion.api.pods import WorkerPod
from apportion.api.resource import Resource
from apportion.controllers import own_tables, telemetry
from apportion.controllers.caches import SelectedCache
from apportion.controllers.load_collector import LoadCollector
from apportion.controllers.pods import pod_cache
from apportion.controllers.wakeups import Wakeups, loop_key
from apportion.controllers.workloads import WorkloadCaches, workload_caches
from apportion.publishing.client import ObjectGone, operator_client
from apportion.publishing.configmaps import PublishConflict
from apportion.publishing.deletion_costs import DeletionCosts
from apportion.publishing.events import EventRecorder

RESYNC_SECONDS = 300.0
"""A full pass at least this often, whatever the wake-ups say."""
RETRY_SECONDS = 2.0
"""First pause after a failed pass or a second write conflict in a row."""
RETRY_MAX_SECONDS = 300.0
PASSES_PER_SECOND = 10.0
PASS_BURST = 100


def backoff(failures: int) -> float:
    """Seconds to wait after the `failures`-th failure in a row: doubling from RETRY_SECONDS
    to RETRY_MAX_SECONDS."""
    return min(RETRY_MAX_SECONDS, RETRY_SECONDS * 2.0 ** max(0, failures - 1))


class PassLimiter:
    """A token bucket over every object's retries (client-go's `BucketRateLimiter`)."""

    def __init__(
        self,
        rate: float = PASSES_PER_SECOND,
        burst: int = PASS_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.updated = clock()

    def delay(self) -> float:
        """Take a token; the seconds to wait before using it (0 while the bucket holds any)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    async def acquire(self) -> None:
        wait = self.delay()
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class Runtime:
    """What every controller of one operator process shares."""

    client: AsyncClient
    wakeups: Wakeups
    pods: SelectedCache[WorkerPod]
    workloads: WorkloadCaches
    events: EventRecorder
    costs: DeletionCosts
    loads: LoadCollector
    limiter: PassLimiter
    tables: own_tables.OwnTables
    scope: tuple[str, ...] = ()
    """The namespaces the operator serves (patterns allowed; none for every one)."""
    objects: dict[str, tuple[ReconcilerFactory, dict[str, Any]]] = field(default_factory=dict)
    """Object key → (how to build its reconciler, the object as the watch last delivered it)."""
    loops: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(default_factory=dict)
    leading: bool = False

    @classmethod
    def create(cls, scope: Sequence[str] = (), client: AsyncClient | None = None) -> Runtime:
        """`scope`: the namespaces the operator serves (patterns allowed; none for every one)."""
        client = client or operator_client()
        wakeups = Wakeups()
        return cls(
            client=client,
            wakeups=wakeups,
            pods=pod_cache(client, wakeups.notify, scope),
            workloads=workload_caches(client, wakeups.notify, scope),
            events=EventRecorder(client),
            costs=DeletionCosts(client),
            loads=LoadCollector(client),
            limiter=PassLimiter(),
            tables=own_tables.OwnTables(wakeups.notify),
            scope=tuple(scope),
        )

    def caches(self) -> tuple[SelectedCache[Any], ...]:
        return (self.pods, *self.workloads.values())

    # ------------------------------------------------------------------------ loops and objects

    def body(self, key: str) -> dict[str, Any] | None:
        """The object of `key` as last seen; None once deleted."""
        found = self.objects.get(key)
        return None if found is None else found[1]

    def bodies(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        """Every known object of `kind` in `namespace`."""
        return [
            body
            for key, (_, body) in self.objects.items()
            if key.startswith(f"{kind}/{namespace}/")
        ]

    def observe(self, key: str, body: Mapping[str, Any], factory: ReconcilerFactory) -> None:
        """The watch delivered (a new version of) an object: its loop wakes, or starts."""
        self.objects[key] = (factory, dict(body))
        self.wakeups.notify(key)
        if self.leading and key not in self.loops:
            self._start(key)

    def deleted(self, key: str) -> None:
        """The object is gone: its loop ends at its next wake-up."""
        self.objects.pop(key, None)
        self.wakeups.gone(key)

    def _start(self, key: str) -> None:
        factory, body = self.objects[key]
        stop = asyncio.Event()
        reconciler = factory(body, self)
        task = asyncio.ensure_future(run_loop(self, reconciler, stop))
        self.loops[key] = (task, stop)
        task.add_done_callback(lambda _: self._ended(key, task))

    def _ended(self, key: str, task: asyncio.Task[None]) -> None:
        if self.loops.get(key, (None,))[0] is task:
            del self.loops[key]
        if not task.cancelled() and task.exception() is not None:
            logging.getLogger(__name__).error(
                "The loop of %s ended", key, exc_info=task.exception()
            )

    async def lead(self) -> None:
        """Run a loop per known object (and per new one) until cancelled: leadership lost, or
        the operator stopping. A pass in flight may be cut short, which is safe: every write is
        conditional and the next leader reads everything back."""
        self.leading = True
        telemetry.LEADER.set(1)
        tables = asyncio.ensure_future(
            own_tables.run(own_tables.follow(self.tables, self.client, self.scope))
        )
        try:
            for key in list(self.objects):
                if key not in self.loops:
                    self._start(key)
            await asyncio.Event().wait()
        finally:
            self.leading = False
            telemetry.LEADER.set(0)
            tables.cancel()
            await asyncio.gather(tables, return_exceptions=True)
            await self.stop_loops()

    async def stop_loops(self, grace: float = 10.0) -> None:
        loops = list(self.loops.values())
        for _, stop in loops:
            stop.set()
        tasks = [task for task, _ in loops]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.stop_loops()
        for cache in self.caches():
            await cache.stop()
        await self.events.flush()
        await self.events.close()
        await self.loads.close()
        await self.costs.close()
        await self.client.close()


class Reconciler(Protocol):
    """One object's controller, as `run_loop` drives it."""

    key: str
    """The object's wake-up key (`wakeups.loop_key`)."""
    labels: tuple[str, str, str]
    """kind, namespace, name: the labels of its series in the operator's metrics."""
    outcome: str
    """What the last pass did ("unchanged", "published"), for the passes counter."""
    logger: logging.Logger | logging.LoggerAdapter[Any]

    async def reconcile(self) -> float | None:
        """One pass; returns when (Unix seconds) the next is due although nothing changes."""

    def forget(self) -> None:
        """Forget what was read (a conditional write lost, or the resync period ended): the next
        pass reads the published state again."""

    async def failed(self, error: BaseException, retry_in: float) -> None:
        """A pass failed: say so where users look (status, Event), best effort."""

    def finish(self, deleted: bool) -> None:
        """The loop ends; `deleted`: because its object is gone."""


ReconcilerFactory = Callable[[dict[str, Any], "Runtime"], Reconciler]
"""Builds the reconciler of one object from its body."""


async def run_loop(runtime: Runtime, reconciler: Reconciler, stopped: asyncio.Event) -> None:
    """Pass after pass until `stopped` is set or the object is deleted."""
    wakeups, key = runtime.wakeups, reconciler.key
    failures = conflicts = 0
    resync_at = 0.0
    caught_up = False
    halt = asyncio.ensure_future(stopped.wait())
    try:
        while not stopped.is_set() and not wakeups.is_gone(key):
            seen = wakeups.tick(key)
            reconciler.outcome = "unchanged"
            started = time.perf_counter()
            wake_at: float | None
            try:
                if time.time() >= resync_at:
                    resync_at = time.time() + RESYNC_SECONDS
                    reconciler.forget()
                wake_at = await reconciler.reconcile()
                failures = conflicts = 0
                _count(reconciler, reconciler.outcome, started)
                if not caught_up:
                    # Says when a restarted operator has caught up with what is published.
                    caught_up = True
                    kind, _, name = reconciler.labels
                    reconciler.logger.info("First pass over %s %s done", kind, name)
            except ObjectGone as gone:
                # Deleted while the pass ran: its deletion event ends the loop; until then
                # there is nothing to do and nothing failed.
                reconciler.logger.info("%s; waiting for its deletion", gone)
                wake_at = None
            except PublishConflict as conflict:
                _count(reconciler, "conflict", started, "Conflict")
                reconciler.logger.info("%s; reading the published state again", conflict)
                reconciler.forget()
                conflicts += 1
                if conflicts == 1:
                    await runtime.limiter.acquire()
                    continue
                wake_at = time.time() + max(backoff(conflicts - 1), runtime.limiter.delay())
            except Exception as error:
                _count(reconciler, "failed", started, telemetry.error_reason(error))
                reconciler.logger.exception("Pass failed; retrying")
                failures += 1
                delay = max(backoff(failures), runtime.limiter.delay())
                wake_at = time.time() + delay
                await reconciler.failed(error, delay)
            timeout = min(resync_at, wake_at if wake_at is not None else math.inf) - time.time()
            if timeout > 0:
                wake = asyncio.ensure_future(wakeups.wait(key, seen, timeout))
                await asyncio.wait({wake, halt}, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
    finally:
        halt.cancel()
        deleted = wakeups.is_gone(key)
        with contextlib.suppress(Exception):
            reconciler.finish(deleted)
        for cache in runtime.caches():
            cache.forget(key, reconciler.labels[1])
        wakeups.forget(key)
        # Stopped, paused or deleted: this replica no longer speaks for the object.
        telemetry.forget_set(reconciler.labels)


def _count(
    reconciler: Reconciler, result: str, started: float, api_error: str | None = None
) -> None:
    telemetry.PASSES.labels(*reconciler.labels, result).inc()
    telemetry.PASS_DURATION.labels(*reconciler.labels).observe(time.perf_counter() - started)
    if api_error is not None:
        telemetry.API_ERRORS.labels(*reconciler.labels, api_error).inc()


def watch(kind: type[Resource], factory: ReconcilerFactory) -> None:
    """Run a loop built by `factory` for every object of `kind` while this replica leads, woken
    by every change of it (kopf's public `on.event`, which starts with the initial listing)."""

    async def changed(*, event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        meta = body["metadata"]
        key = loop_key(kind.__name__, meta["namespace"], meta["name"])
        if event.get("type") == "DELETED":
            runtime.deleted(key)
        else:
            runtime.observe(key, body, factory)

    kopf.on.event(kind.group, kind.version, kind.crd.plural, id="wake")(changed)
