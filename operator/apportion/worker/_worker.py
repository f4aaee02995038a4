"""`Worker`: one worker process's membership in one PartitionSet or ShardSet (docs/worker.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from apportion.api.assignment import (
    Ack,
    AssignmentFormatError,
    AssignmentTable,
    Incarnation,
    ack_annotation_key,
    assignment_config_map,
    unit_order,
)
from apportion.api.worker_report import CONTENT_TYPE, WorkerReport
from apportion.engine.handoff import releasing_units
from apportion.worker._lease import ServingLease
from apportion.worker._process import ProcessStats
from apportion.worker._worker_state import Resharding, Transition, UnitRange, WorkerState

if TYPE_CHECKING:
    from aiohttp import web
    from lightkube import AsyncClient

    from apportion.engine.keys import KeyScheme
    from apportion.worker._watch import AssignmentWatch

logger = logging.getLogger("apportion.worker")

UnitsCallback = Callable[[frozenset[str], int], Awaitable[None]]
"""`async def callback(units, epoch)`: the units concerned and the epoch of the table that
asked for it."""

SplitCallback = Callable[[UnitRange, tuple[UnitRange, ...], int], Awaitable[None]]
"""`async def on_split(parent, children, epoch)`: cut the parent's in-memory state into the
children this process now serves (hash ranges nest: a key goes to the child whose range holds
its xxh3-64 hash); state of keys outside them is not this process's any more."""
MergeCallback = Callable[
    [UnitRange, tuple[UnitRange, ...], tuple[UnitRange, ...], int], Awaitable[None]
]
"""`async def on_merge(merged, held, missing, epoch)`: join the state of the `held` siblings
into `merged`, loading the `missing` ones from where on_acquire loads state."""


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """What the application gives the worker to call as units come and go (each `None`: not
    called); `Worker` says when each runs."""

    on_acquire: UnitsCallback | None = None
    on_release: UnitsCallback | None = None
    on_revoke: UnitsCallback | None = None
    """Default: `on_release`."""
    on_split: SplitCallback | None = None
    on_merge: MergeCallback | None = None
    on_suspend: UnitsCallback | None = None
    on_resume: UnitsCallback | None = None
    load: Callable[[str], float] | None = None
    """The current load of an owned unit, read at each scrape of /metrics."""

    @property
    def revoke(self) -> UnitsCallback | None:
        """What runs when units are taken away without a hand-off."""
        return self.on_revoke or self.on_release


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How the worker runs inside its process: its HTTP server and its shutdown."""

    port: int | None = None
    """Serve /metrics, /healthz, /readyz and `routes` there; None: no server."""
    host: str | None = None
    """Default `$POD_IP`, else every address."""
    routes: Sequence[web.AbstractRouteDef] = ()
    handle_signals: bool = True
    """SIGTERM and SIGINT start `drain()`."""
    drain_margin: float = 2.0
    """Seconds of the grace period the drain leaves free."""


KINDS: Final = ("PartitionSet", "ShardSet")
FIELD_MANAGER: Final = "apportion-worker"
DEFAULT_GRACE: Final = 30.0
"""Kubernetes' default terminationGracePeriodSeconds."""
ACQUIRE_RETRY: Final = 1.0
RELEASE_RETRY: Final = 0.5
"""First pause before a failed release is tried again; it doubles up to RELEASE_RETRY_MAX."""
RELEASE_RETRY_MAX: Final = 10.0
CLOSE_WAIT: Final = 5.0
"""Seconds close() lets running callbacks finish before it cancels them."""
ACK_RETRY_MAX: Final = 5.0
START_TIMEOUT: Final = 30.0
POLICY_POLL: Final = 1.0
"""How often a worker without a serving lease (KeepServing) looks whether a table set one."""


class WorkerError(RuntimeError):
    """The worker cannot start: configuration missing, own Pod unreadable."""


class Worker:
    """Serves the units of one PartitionSet or ShardSet that the operator grants this pod.

        async with Worker("PartitionSet", "demo", Hooks(on_acquire=load, on_release=flush),
                          options=WorkerOptions(port=8080)) as worker:
            await worker.wait_drained()     # returns after SIGTERM, once the units moved away

    Configured from the environment a pod gets: `POD_NAME` and `POD_NAMESPACE` (downward API),
    the API server from in-cluster config or `KUBECONFIG`. The pod's uid and grace period are
    read from its Pod object once, at start.

    `on_acquire(units, epoch)`: start serving (load state). `on_release(units, epoch)`: the
    operator moves the units away; stop taking work for them, finish or hand over in-flight
    work, return; the worker acknowledges only then. When it raises, the release is not
    acknowledged: it is called again for the units still to release (0.5 s doubling to 10 s)
    until it returns or the operator takes them away (`handoffTimeout`: then `on_revoke`).
    `on_revoke(units, epoch)`: units taken away without a hand-off (the operator presumed this
    pod gone, or a hand-off timed out), or still held when the worker closes; drop them at once
    (default: `on_release`). Each unit's callbacks run one at a time, in order; callbacks of
    other units do not wait for them. `owns()` follows the newest table at once.
    `on_split(parent, children, epoch)`, `on_merge(merged, held, missing, epoch)`: the unit count
    changed (keyScheme apportion, docs/resharding.md); split or join local state in place. Units
    (`UnitRange`) carry their hash range. Without them (or when one raises) the new units are
    acquired afresh through `on_acquire`, the old ones revoked first.

    The serving lease (docs/handoff.md, "Cut off or paused"): while the table carries one
    (`whenCutOff: StopServing`), the worker confirms the table every quarter lease and serves
    only while the last confirmation is younger than the lease; `owns()`, `my_units()` and
    `lease_holds()` follow it. `on_suspend(units, epoch)`: the lease ran out (API server
    unreachable, watch dead, process paused); stop in-flight work on `units` now, they are not
    served until `on_resume(units, epoch)` after a fresh confirmation (nothing is released or
    revoked for it).
    `serving_deadline()` tells in advance when serving must end without a new confirmation.

    The callbacks above are the `hooks` (`Hooks`). `load(unit) -> float`, also a hook: the
    current load of an owned unit for /metrics; or push figures with `report_load`. Without
    either, no per-unit load is reported (the operator counts units).
    `options` (`WorkerOptions`): `port`: serve /metrics, /healthz, /readyz (503 while not
    serving) and `routes` (aiohttp route definitions) on `host` (default `$POD_IP`, else every
    address); None: no server (mount `metrics_handler` yourself).
    """

    def __init__(
        self,
        kind: str,
        set_name: str,
        hooks: Hooks | None = None,
        *,
        options: WorkerOptions | None = None,
        namespace: str | None = None,
        pod_name: str | None = None,
        client: AsyncClient | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        pod_name = pod_name or os.environ.get("POD_NAME")
        if not pod_name:
            raise WorkerError("POD_NAME is not set (give it through the downward API)")
        self.kind = kind
        self.set_name = set_name
        self.pod_name = pod_name
        self._namespace = namespace or os.environ.get("POD_NAMESPACE")
        self.hooks = hooks or Hooks()
        self.options = options or WorkerOptions()
        self.host = self.options.host or os.environ.get("POD_IP") or "0.0.0.0"
        self._client = client
        self._own_client = client is None
        self.ack_annotation = ack_annotation_key(kind, set_name)

        self.uid = ""
        self.grace_period = DEFAULT_GRACE
        self._state: WorkerState | None = None
        self._loads: dict[str, float] = {}
        self._reports_load = self.hooks.load is not None
        self._stats = ProcessStats()
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._ack_wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._callbacks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._drain: asyncio.Task[bool] | None = None
        self._drained = asyncio.Event()
        self._schemes: dict[str, KeyScheme] = {}
        self.acks_written = 0
        self.release_failures = 0
        """on_release calls that raised (each is retried)."""
        self._written_ack: Ack | None = None
        self._closing = False
        self._lease = ServingLease(None)
        self._suspended = False
        self._suspended_at = 0.0  # on the lease's clock: when the lease ran out
        self.lease_expiries = 0
        """Times the serving lease ran out (the worker stopped serving until re-confirmed)."""
        self._watch: AssignmentWatch | None = None

    # ------------------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Read the own Pod, serve /metrics, and return once the assignment has been listed
        (callbacks for the units it grants may still be running). Raises WorkerError when
        that does not happen within `timeout` seconds (everything started is stopped)."""
        try:
            await self._start(timeout)
        except BaseException:
            await self.close()
            raise

    async def _start(self, timeout: float) -> None:
        from apportion.worker._watch import AssignmentWatch

        if self._client is None:
            from lightkube import AsyncClient

            self._client = AsyncClient(field_manager=FIELD_MANAGER)
        self._namespace = self._namespace or self._client.namespace
        try:
            await asyncio.wait_for(self._read_pod(), timeout)
        except TimeoutError:
            raise WorkerError(
                f"own Pod {self.namespace}/{self.pod_name} not readable within {timeout:.0f}s"
            ) from None
        self._state = WorkerState(
            Incarnation(self.pod_name, self.uid), self.kind, self.namespace, self.set_name
        )
        self._state.written = self._written_ack
        if self.options.port is not None:
            await self._serve_http()
        name = assignment_config_map(self.kind, self.set_name)
        watch = self._watch = AssignmentWatch(
            self._client, self.namespace, name, self._on_table, on_rewound=self._on_rewound
        )
        self._spawn(watch.run(), "assignment-watch")
        self._spawn(self._lease_loop(), "serving-lease")
        self._spawn(self._plan_loop(), "plan")
        self._spawn(self._ack_loop(), "ack")
        self._ack_wake.set()  # an earlier process of this pod may have left a draining mark
        if self.options.handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            await asyncio.wait_for(watch.synced.wait(), timeout)
        except TimeoutError:
            raise WorkerError(f"ConfigMap {name} not listed within {timeout:.0f}s") from None
        logger.info(
            "worker %s (uid %s) of %s %s/%s started; grace period %.0fs",
            self.pod_name,
            self.uid,
            self.kind,
            self.namespace,
            self.set_name,
            self.grace_period,
        )

    async def close(self) -> None:
        """Stop watching and acknowledging; failing releases stop being retried, callbacks
        still running after CLOSE_WAIT seconds are cancelled; units still held are revoked
        (callbacks run), without an ack; stop serving."""
        if self.options.handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._notify()  # releases waiting to be retried give up now
        if self._callbacks:
            _, hung = await asyncio.wait(self._callbacks, timeout=CLOSE_WAIT)
            for task in hung:
                logger.warning("closing: cancelling the callback task still running")
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
        if self._state is not None:
            left = self._state.drop_all()
            if left:
                await self._call(self.hooks.revoke, left, self._state.epoch, "dropped anyway")
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
        self._drained.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._own_client and self._client is not None:
            await self._client.close()
            self._client = None

    async def _read_pod(self) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        assert self._client is not None
        delay = 0.2
        while True:
            try:
                pod = await self._client.get(Pod, self.pod_name, namespace=self.namespace)
                break
            except ApiError as error:
                if error.status.code in (401, 403, 404):
                    raise WorkerError(
                        f"cannot read own Pod {self.namespace}/{self.pod_name}: "
                        f"{error.status.message}"
                    ) from error
                logger.warning("reading own Pod failed (%s); retrying", error)
            except OSError as error:  # API server not reachable yet
                logger.warning("reading own Pod failed (%s); retrying", error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        assert pod.metadata is not None
        assert pod.metadata.uid is not None
        self.uid = pod.metadata.uid
        grace = pod.spec.terminationGracePeriodSeconds if pod.spec else None
        self.grace_period = DEFAULT_GRACE if grace is None else float(grace)
        text = (pod.metadata.annotations or {}).get(self.ack_annotation)
        if text:
            with contextlib.suppress(AssignmentFormatError):
                self._written_ack = Ack.from_annotation(text)

    # ----------------------------------------------------------------------- what apps ask

    @property
    def namespace(self) -> str:
        if not self._namespace:
            raise WorkerError("no namespace: set POD_NAMESPACE or pass namespace=")
        return self._namespace

    @property
    def state(self) -> WorkerState:
        if self._state is None:
            raise RuntimeError("the worker is not started")
        return self._state

    @property
    def client(self) -> AsyncClient:
        """The API client the worker uses (for the app's own objects, e.g. state to hand over)."""
        if self._client is None:
            raise RuntimeError("the worker is not started")
        return self._client

    @property
    def table(self) -> AssignmentTable | None:
        """The newest assignment table seen (None before the operator wrote one)."""
        return self.state.view

    @property
    def epoch(self) -> int:
        """Epoch of the newest table seen (0 before the first)."""
        return self.state.epoch

    @property
    def draining(self) -> bool:
        return self.state.draining

    def my_units(self) -> frozenset[str]:
        """Units to take new work for now (acquired, not being released, granted by the newest
        table to this pod incarnation), while the serving lease holds."""
        return self.state.my_units() if self._lease.valid() else frozenset()

    def owns(self, unit: str) -> bool:
        """Whether to serve `unit` now: held under the newest table, within the lease."""
        return self.state.owns(unit) and self._lease.valid(unit)

    def token(self, unit: str) -> int | None:
        """The fencing token of a unit this process holds (acquiring, serving or releasing it):
        the epoch at which it was granted. Pass it along with writes to storage that can reject
        older tokens (docs/fencing.md). None for other units. Whether to serve at all is
        `owns()` (new work) or `lease_holds()` (work on a unit being released)."""
        return self.state.token(unit)

    def lease_holds(self, unit: str | None = None) -> bool:
        """Whether the serving lease (of `unit`, if given: a releasing unit's ends earlier)
        still holds; always True without a lease (KeepServing)."""
        return self._lease.valid(unit)

    @property
    def serving(self) -> bool:
        """False while the serving lease has run out (nothing is served until re-confirmed)."""
        return self._lease.valid()

    def serving_deadline(self, unit: str | None = None) -> float | None:
        """When serving (`unit`, if given) must end without a new confirmation, on the clock of
        `apportion.worker._lease.boot_clock`; None: no lease (KeepServing). Bound in-flight work
        by it, so that it has ended when the lease runs out."""
        return self._lease.expires_at(unit)

    def unit_of(self, key: str) -> str:
        """The unit of `key` under the set's key scheme and unit count (from the table)."""
        table = self.table
        if table is None:
            raise LookupError("no assignment table yet")
        scheme = self._schemes.get(table.key_scheme)
        if scheme is None:
            from apportion.engine.keys import get_scheme

            scheme = self._schemes[table.key_scheme] = get_scheme(table.key_scheme)
        return str(scheme.unit(key, table.count))

    def owner_of(self, key: str) -> str | None:
        """The pod that owns `key`'s unit in the newest table (also while it releases it), or
        None: no table yet, or the unit is unassigned."""
        table = self.table
        if table is None:
            return None
        state = table.units.get(self.unit_of(key))
        return None if state is None else state.owner

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until `predicate()` holds; it is checked after every table, callback and ack."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    # ---------------------------------------------------------------------------- draining

    def _on_signal(self, signum: int) -> None:
        if self._drain is None:
            logger.info("%s received: draining", signal.Signals(signum).name)
            self._drain = asyncio.ensure_future(self.drain())
        else:
            logger.info("%s received again: exiting without waiting", signal.Signals(signum).name)
            self._drained.set()

    async def drain(self, timeout: float | None = None) -> bool:
        """Mark this pod draining (in its ack), so that the operator moves every unit away;
        release them as asked, and return once none is left — True — or after `timeout`
        (default: the pod's grace period minus `drain_margin`) — False."""
        if timeout is None:
            timeout = max(0.0, self.grace_period - self.options.drain_margin)
        self.state.start_draining()
        self._wake.set()
        self._ack_wake.set()
        await self._notify()
        try:
            await self.wait_for(self.state.drained, timeout)
            done = True
        except TimeoutError:
            done = False
            logger.warning(
                "drain timed out after %.1fs holding %s",
                timeout,
                ",".join(sorted(self.state.held)) or "nothing",
            )
        self._drained.set()
        return done

    async def wait_drained(self) -> None:
        """Wait until the worker has drained (after SIGTERM/SIGINT or `drain()`)."""
        await self._drained.wait()

    # ----------------------------------------------------------------------------- the loop

    def _on_table(self, table: AssignmentTable) -> None:
        try:
            accepted = self.state.receive(table)
        except ValueError as error:
            logger.error("ignoring assignment: %s", error)
            return
        if accepted:
            self._lease.duration = table.serving_lease
            self._lease.releasing(releasing_units(table, self.state.me))
            self._wake.set()
            self._ack_wake.set()
            self._spawn(self._notify(), "notify")
        elif self.state.rewound:
            logger.warning("the table went back to epoch %d: writing the ack again", table.epoch)
            self._ack_wake.set()

    def _on_rewound(self) -> None:
        logger.warning("the API server went back in time (restored?): writing the ack again")
        self.state.went_back()
        self._ack_wake.set()

    async def _plan_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            transition = self.state.next_transition()
            if transition is None:
                continue
            task = asyncio.create_task(self._run(transition))
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    async def _run(self, t: Transition) -> None:
        state = self.state
        if t.stop:
            await self._call(self.hooks.revoke, t.stop, t.epoch, "dropped anyway")
            state.stopped(t.stop)
        if t.resharding is not None:
            await self._reshard(t.resharding, t.epoch)
        # Each settles on its own: a release being retried must not hold back acquisitions.
        await asyncio.gather(self._release(t), self._acquire(t))

    async def _settled(self) -> None:
        """Callbacks returned: plan again, write the ack if one is due, wake the waiters."""
        self._wake.set()
        self._ack_wake.set()
        await self._notify()

    async def _reshard(self, change: Resharding, epoch: int) -> None:
        units = frozenset(change.carried)
        try:
            if change.split and self.hooks.on_split is not None:
                for parent, children in change.splits().items():
                    await self.hooks.on_split(parent, children, epoch)
            elif not change.split and self.hooks.on_merge is not None:
                for merged, (held, missing) in change.merges().items():
                    await self.hooks.on_merge(merged, held, missing, epoch)
            else:
                raise LookupError("no split or merge callback")
        except Exception as error:
            logger.warning(
                "resharding %d → %d: %s; acquiring afresh",
                change.from_count,
                change.to_count,
                error,
            )
            old = frozenset(u for parents in change.carried.values() for u in parents)
            await self._call(self.hooks.revoke, old, epoch, "dropped anyway")
            self.state.resharded(units, ok=False)
            return
        self.state.resharded(units)

    async def _release(self, t: Transition) -> None:
        """on_release until it returns, then the units count as released (the ack follows).
        While it raises, the units stay busy and pending, and are tried again after a pause,
        as long as the view still names this process their owner and the worker is open."""
        state, units, delay = self.state, t.release, RELEASE_RETRY
        while units:
            failed = await self._call(
                self.hooks.on_release, units, t.epoch, f"not acknowledged; retrying in {delay:g}s"
            )
            if failed is None:
                for unit in units:
                    self._loads.pop(unit, None)
                state.released(units)
                break
            self.release_failures += 1
            state.release_failed(units, f"{type(failed).__name__}: {failed}")
            await self._settled()  # the ack says which releases fail
            units = await self._retry_after(units, delay)
            delay = min(delay * 2, RELEASE_RETRY_MAX)
        await self._settled()

    async def _retry_after(self, units: frozenset[str], delay: float) -> frozenset[str]:
        """Waits `delay` seconds before failed releases are tried again; units taken away
        meanwhile (or all, when the worker closes) are given up at once, so that their revoke
        need not wait. Returns the units to try again."""
        deadline = asyncio.get_running_loop().time() + delay
        while True:
            wanted = frozenset() if self._closing else self.state.retry_wanted(units)
            if wanted != units:
                self.state.release_abandoned(units - wanted)
                await self._settled()
                units = wanted
            left = deadline - asyncio.get_running_loop().time()
            if not units or left <= 0:
                return units
            with contextlib.suppress(TimeoutError):
                await self.wait_for(functools.partial(self._retry_moot, units), left)

    def _retry_moot(self, units: frozenset[str]) -> bool:
        return self._closing or self.state.retry_wanted(units) != units

    async def _acquire(self, t: Transition) -> None:
        if t.acquire:
            failed = await self._call(
                self.hooks.on_acquire, t.acquire, t.epoch, f"trying again in {ACQUIRE_RETRY:g}s"
            )
            if failed is not None:
                await asyncio.sleep(ACQUIRE_RETRY)
            self.state.acquired(t.acquire, ok=failed is None)
        await self._settled()

    async def _call(
        self, callback: UnitsCallback | None, units: frozenset[str], epoch: int, then: str
    ) -> Exception | None:
        """Runs `callback`; the exception it raised (logged with `then`, what happens next),
        or None when it returned."""
        if callback is None:
            return None
        try:
            await callback(units, epoch)
        except Exception as error:
            logger.exception(
                "%s(%s, epoch %d) raised; %s", callback.__name__, _show(units), epoch, then
            )
            return error
        return None

    async def _lease_loop(self) -> None:
        """Confirm the table every quarter lease; say so when the lease runs out or holds again."""
        assert self._watch is not None
        while True:
            interval = self._lease.renew_interval()
            if interval is None:
                await asyncio.sleep(POLICY_POLL)
                continue
            await self._lease_changed()  # a paused process learns first that it ran out
            sent = self._lease.clock()
            try:
                confirmed = await asyncio.wait_for(self._watch.confirm(), interval)
            except Exception as error:  # unreachable, slow, refused: the lease runs on
                logger.debug("confirming the assignment failed: %r", error)
                confirmed = False
            if confirmed:
                first = self._lease.confirmed_at is None
                self._lease.confirm(sent)
                if first:  # serving starts: `my_units()` changes, waiters look again
                    await self._notify()
            await self._lease_changed()
            deadline = self._lease.expires_at()
            wake = sent + interval
            if deadline is not None and deadline > self._lease.clock():
                wake = min(wake, deadline)
            await asyncio.sleep(max(0.0, wake - self._lease.clock()))

    async def _lease_changed(self) -> None:
        if self._lease.confirmed_at is None:
            return  # never confirmed yet: starting, not cut off
        valid, epoch = self._lease.valid(), self.state.epoch
        if not valid and not self._suspended:
            self._suspended = True
            self._suspended_at = self._lease.expires_at() or self._lease.clock()
            self.lease_expiries += 1
            held = frozenset(self.state.held)
            logger.warning(
                "serving lease ran out: the assignment was last confirmed %.1fs ago; serving "
                "none of %d unit(s) until the API server confirms it again",
                self._lease.clock() - self._lease.confirmed_at,
                len(held),
            )
            await self._call(self.hooks.on_suspend, held, epoch, "serving nothing anyway")
            await self._notify()
        elif valid and self._suspended:
            self._suspended = False
            self.state.resumed(self._lease.clock() - self._suspended_at)
            self._ack_wake.set()  # tell the operator now what could not be written meanwhile
            units = self.my_units()
            logger.info(
                "assignment confirmed again at epoch %d: serving %d unit(s)", epoch, len(units)
            )
            await self._call(self.hooks.on_resume, units, epoch, "serving them anyway")
            await self._notify()

    async def _ack_loop(self) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        assert self._client is not None
        delay = 0.2
        while True:
            await self._ack_wake.wait()
            self._ack_wake.clear()
            ack = self.state.ack_due()
            if ack is None:
                continue
            # The uid makes the patch fail rather than land on a newer Pod of the same name.
            patch = {
                "metadata": {
                    "uid": self.uid,
                    "annotations": {self.ack_annotation: ack.to_annotation()},
                }
            }
            try:
                await self._client.patch(
                    Pod,
                    self.pod_name,
                    patch,
                    namespace=self.namespace,
                    patch_type=PatchType.MERGE,
                )
            except Exception as error:
                logger.warning("writing the ack failed (%s); retrying in %.1fs", error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, ACK_RETRY_MAX)
                self._ack_wake.set()
                continue
            delay = 0.2
            self.state.ack_written(ack)
            self.acks_written += 1
            logger.debug("ack written: %s", ack.to_annotation())
            self._ack_wake.set()  # something may have become due meanwhile
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"worker/{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("worker task %s failed", task.get_name(), exc_info=task.exception())

    # ----------------------------------------------------------------------------- metrics

    def report_load(self, unit: str, value: float) -> None:
        """The current load of `unit` (a rate, in the set's own measure; docs/metrics.md)."""
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"load must be a finite number >= 0, got {value!r}")
        self._reports_load = True
        self._loads[unit] = float(value)

    def unit_loads(self) -> Mapping[str, float]:
        """What /metrics reports per unit: every owned unit, zeros included, and only those."""
        if not self._reports_load:
            return {}
        units = unit_order(self.my_units())
        if (load := self.hooks.load) is not None:
            return {unit: float(load(unit)) for unit in units}
        return {unit: self._loads.get(unit, 0.0) for unit in units}

    def metrics(self) -> WorkerReport:
        stats = self._stats.read()
        loads = self.unit_loads()
        failing = len(self._state.failing) if self._state is not None else 0
        return WorkerReport(
            unit_loads={self.set_name: loads} if loads else {},
            release_failures={self.set_name: self.release_failures},
            releases_failing={self.set_name: failing},
            serving={self.set_name: int(self.serving)},
            lease_expiries={self.set_name: self.lease_expiries},
            cpu_percent=stats.cpu_percent,
            cpu_count=stats.cpu_count,
            memory_usage_bytes=stats.memory_usage_bytes,
            memory_available_bytes=stats.memory_available_bytes,
            memory_max_available_bytes=stats.memory_max_available_bytes,
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """aiohttp handler of the metrics page, for apps that serve HTTP themselves."""
        from aiohttp import web

        return web.Response(
            body=self.metrics().render().encode(), headers={"Content-Type": CONTENT_TYPE}
        )

    async def _serve_http(self) -> None:
        from aiohttp import web

        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(request: web.Request) -> web.Response:
            if self.serving:
                return web.Response(text="serving")
            return web.Response(status=503, text="not serving: the serving lease ran out")

        app = web.Application()
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_routes(self.options.routes)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.options.port).start()
        logger.info("serving /metrics on %s:%s", self.host, self.options.port)


def _show(units: Iterable[str], sample: int = 8) -> str:
    ordered = unit_order(units)
    return ",".join(ordered[:sample]) + (",…" if len(ordered) > sample else "")
