"""The unit mode of `apportion demo-worker`: a worker of one PartitionSet or ShardSet that serves
requests by key, logs every change of ownership in a greppable line, and reports a synthetic
per-unit load (docs/worker.md).

HTTP on the worker's address (beside /metrics and /healthz):

    GET /key/<id>   200 {"key", "unit", "pod", "token", "epoch", "count", "time"} when this pod
                    serves the key's unit; 421 {"key", "unit", "owner"} (header Apportion-Owner)
                    when another pod owns it; 503 (Retry-After: 1) while nobody serves it
                    (unassigned, in hand-off, being split or merged); with PostgreSQL (below),
                    409 {"key", "unit", "pod", "token", "current"} when the fence refused the
                    request's write: a higher token wrote the unit, this pod lost it
    POST /key/<id>?n=N  count one increment of the key (numbered: once), answered as GET
    GET /units      {"pod", "uid", "epoch", "draining", "units": {unit: token}}: what it serves
    GET /counters   {"pod", "epoch", "count", "units": {unit: {key: counter}}}

Ownership lines on stdout, one per unit, time first (Unix seconds):

    1718000000.123456 acquire unit=3 epoch=7 token=7 pod=w-0 set=PartitionSet/demo count=32
    1718000004.901234 release unit=3 epoch=9 token=7 pod=w-0 set=PartitionSet/demo count=32
    1718000009.000000 stop unit=5 epoch=12 token=4 pod=w-0 set=PartitionSet/demo count=32

`acquire` is logged when the unit starts being served, `release` when it has stopped being
served for a hand-off (state stored, before the ack is written), `stop` when it is dropped
without one, `split`/`merge` when its counters went into the units of the new count.

With `postgres` (a libpq conninfo; `apportion demo-worker --postgres`, or
$APPORTION_DEMO_POSTGRES), every request served by key is first written to the table
`apportion_demo_requests` through `apportion.fencing` under the unit's token: storage that
refuses a pod which lost the unit without seeing it (docs/fencing.md). A refused write answers
409 and logs `refused unit=… key=… token=… current=… pod=…`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from apportion.api.assignment import AssignmentTable, unit_order
from apportion.engine.keys import get_scheme
from apportion.worker._state_transfer import UnitSnapshot, UnitStateStore
from apportion.worker._worker import Hooks, Worker, WorkerOptions
from apportion.worker._worker_state import UnitRange
from apportion_dev.worker import counters
from apportion_dev.worker.burn import CpuBurner

if TYPE_CHECKING:
    import psycopg

    from apportion.fencing import StaleToken

OWNERSHIP_LOGGER: Final = "apportion.demo.ownership"
ownership = logging.getLogger(OWNERSHIP_LOGGER)
logger = logging.getLogger(__name__)

RATE_WINDOW: Final = 10
"""Seconds over which the `requests` profile counts requests."""
FINISH_TIMEOUT: Final = 10.0
"""Longest a release waits for the unit's requests in flight."""
ZIPF_SCALE: Final = 100.0

UnitKey = tuple[int, str]
"""(count, unit): a unit number names another key range under another count."""


@dataclass(frozen=True)
class LoadProfile:
    """The per-unit load a demo worker reports. Every worker of a set gets the same profile, so
    a unit's load follows it from pod to pod.

    `uniform[:V]` every unit V (default 1); `zipf[:S]` unit u gets 100/(u+1)^S (default S=1);
    `units:U=V,...[,*=D]` the listed units V, the others D (default 1); `requests` GET/POST /key
    requests per second over the last 10 s; `none` no per-unit load (the operator counts units).
    """

    kind: str
    value: float = 1.0
    units: Mapping[str, float] = field(default_factory=dict)

    KINDS = ("uniform", "zipf", "units", "requests", "none")

    @classmethod
    def parse(cls, text: str) -> LoadProfile:
        kind, _, arg = text.partition(":")
        if kind not in cls.KINDS:
            raise ValueError(f"unknown load profile {kind!r} (one of {', '.join(cls.KINDS)})")
        if kind in ("requests", "none"):
            if arg:
                raise ValueError(f"load profile {kind!r} takes no argument")
            return cls(kind)
        if kind == "units":
            default, units = 1.0, {}
            for item in filter(None, arg.split(",")):
                unit, eq, value = item.partition("=")
                if not eq or not unit:
                    raise ValueError(f"units load profile: expected UNIT=VALUE, got {item!r}")
                if unit == "*":
                    default = _load_value(value)
                else:
                    units[unit] = _load_value(value)
            if not units:
                raise ValueError("units load profile: give at least one UNIT=VALUE")
            return cls(kind, default, units)
        return cls(kind, _load_value(arg) if arg else 1.0)

    @property
    def reports(self) -> bool:
        return self.kind != "none"

    def load(self, unit: str, rates: RequestRates) -> float:
        match self.kind:
            case "uniform":
                return self.value
            case "zipf":
                rank = int(unit) + 1 if unit.isdecimal() else 1
                return ZIPF_SCALE / math.pow(rank, self.value)
            case "units":
                return self.units.get(unit, self.value)
            case "requests":
                return rates.rate(unit)
        return 0.0


@dataclass(frozen=True)
class Behaviour:
    """How a demo worker acts beyond serving its keys: the load it reports, the time it takes."""

    profile: LoadProfile = field(default_factory=lambda: LoadProfile("uniform"))
    release_delay: float = 0.0
    """Seconds every release waits before it returns."""
    work_time: float = 0.0
    """Seconds every request to a key takes."""
    burn_millicores: float = 0.0
    """CPU each unit burns (its load is then the CPU measured)."""


def _load_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"load value {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"load value {text!r} must be a finite number >= 0")
    return value


class RequestRates:
    """Requests per unit in one-second buckets over the last `window` seconds."""

    def __init__(self, window: int = RATE_WINDOW) -> None:
        self.window = window
        self._buckets: dict[str, deque[tuple[int, int]]] = defaultdict(deque)

    def count(self, unit: str, now: float | None = None) -> None:
        second = int(time.monotonic() if now is None else now)
        buckets = self._buckets[unit]
        if buckets and buckets[-1][0] == second:
            buckets[-1] = (second, buckets[-1][1] + 1)
        else:
            buckets.append((second, 1))
        self._trim(buckets, second)

    def rate(self, unit: str, now: float | None = None) -> float:
        buckets = self._buckets.get(unit)
        if not buckets:
            return 0.0
        self._trim(buckets, int(time.monotonic() if now is None else now))
        return sum(n for _, n in buckets) / self.window

    def forget(self, unit: str) -> None:
        self._buckets.pop(unit, None)

    def _trim(self, buckets: deque[tuple[int, int]], second: int) -> None:
        while buckets and buckets[0][0] <= second - self.window:
            buckets.popleft()


REQUESTS_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS apportion_demo_requests (scope text NOT NULL, key text NOT NULL,"
    " unit text NOT NULL, pod text NOT NULL, token bigint NOT NULL, requests bigint NOT NULL,"
    " PRIMARY KEY (scope, key))"
)
RECORD: Final = (
    "INSERT INTO apportion_demo_requests (scope, key, unit, pod, token, requests)"
    " VALUES (%s, %s, %s, %s, %s, 1) ON CONFLICT (scope, key) DO UPDATE SET unit = EXCLUDED.unit,"
    " pod = EXCLUDED.pod, token = EXCLUDED.token,"
    " requests = apportion_demo_requests.requests + 1"
)
CONNECT_TIMEOUT: Final = 5


class StorageUnavailable(Exception):
    """PostgreSQL could not be reached or failed the write (not a refusal: nothing is known)."""


class RequestLog:
    """The requests a demo worker serves, written to PostgreSQL by fenced writes: per key, the
    pod, the token and the number of requests of the last writer. One connection (autocommit,
    as a fenced write needs an idle one), one write at a time, opened on first use and again
    after a failure."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def record(
        self, scope: str, unit: str, key: str, token: int, pod: str
    ) -> StaleToken | None:
        """Write one request of `key` under `token`: None when the fence accepted it, the
        refusal when a higher token had written `unit`; StorageUnavailable otherwise."""
        import psycopg

        from apportion.fencing import AsyncFence, StaleToken

        async with self._lock:
            try:
                conn = await self._connect()
                async with AsyncFence(conn, scope).write(unit, token) as cur:
                    await cur.execute(RECORD, (scope, key, unit, pod, token))
            except StaleToken as refused:
                return refused
            except psycopg.Error as error:
                await self.close()
                raise StorageUnavailable(str(error)) from error
        return None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        from apportion.fencing import SCHEMA, SCHEMA_LOCK

        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        )
        try:
            # Every worker of the set may do this at once: under the fence's schema lock, as
            # concurrent CREATE TABLE IF NOT EXISTS of one table fail (docs/fencing.md).
            async with conn.transaction():
                await conn.execute(SCHEMA_LOCK)
                await conn.execute(SCHEMA)
                await conn.execute(REQUESTS_SCHEMA)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class DemoWorker:
    """Callbacks and HTTP handlers of the demo; `run()` is the whole process.

    Unit state: per-key counters (`apportion_dev.worker.counters`), keyed by (count, unit) because
    a unit number names another key range under another count. They are handed over through
    `apportion.worker._state_transfer` on release, loaded on acquire, and cut or joined in place
    when the unit count changes."""

    def __init__(
        self,
        kind: str,
        set_name: str,
        *,
        port: int,
        host: str | None = None,
        namespace: str | None = None,
        behaviour: Behaviour | None = None,
        postgres: str | None = None,
    ) -> None:
        behaviour = behaviour or Behaviour()
        self.requests = RequestLog(postgres) if postgres else None
        self.profile = behaviour.profile
        # With --burn-cpu, a unit's load is the CPU it really costs, not the profile's figure.
        self.burner = (
            CpuBurner(behaviour.burn_millicores, lambda unit: self.profile.load(unit, self.rates))
            if behaviour.burn_millicores
            else None
        )
        self.release_delay = behaviour.release_delay
        self.work_time = behaviour.work_time
        self.rates = RequestRates()
        self.counters: dict[UnitKey, counters.Counts] = {}
        self.in_flight: Counter[str] = Counter()
        self._idle = asyncio.Condition()
        self.tokens: dict[UnitKey, int] = {}
        self._store: UnitStateStore | None = None
        routes = [
            web.get("/key/{key}", self.handle_key),
            web.post("/key/{key}", self.handle_increment),
            web.get("/units", self.handle_units),
            web.get("/counters", self.handle_counters),
        ]
        hooks = Hooks(
            on_acquire=self.on_acquire,
            on_release=self.on_release,
            on_revoke=self.on_revoke,
            on_split=self.on_split,
            on_merge=self.on_merge,
            on_suspend=self.on_suspend,
            on_resume=self.on_resume,
            load=self.unit_load if self.profile.reports else None,
        )
        options = WorkerOptions(port=port, host=host, routes=routes)
        self.worker = Worker(kind, set_name, hooks, options=options, namespace=namespace)

    async def run(self) -> None:
        if self.burner is not None:
            self.burner.start()
        try:
            async with self.worker as worker:
                await worker.wait_drained()
        finally:
            if self.burner is not None:
                self.burner.stop()
            if self.requests is not None:
                await self.requests.close()

    def unit_load(self, unit: str) -> float:
        if self.burner is not None:
            return self.burner.rate(unit)
        return self.profile.load(unit, self.rates)

    @property
    def store(self) -> UnitStateStore:
        if self._store is None:
            w = self.worker
            self._store = UnitStateStore(w.client, w.namespace, w.kind, w.set_name)
        return self._store

    def _table(self) -> AssignmentTable:
        table = self.worker.table
        assert table is not None, "callbacks run only after a table"
        return table

    def _held_count(self) -> int:
        """The count the units of a running callback are named in (a newer table may already
        have another: the worker reshapes only between callbacks)."""
        count = self.worker.state.held_count
        return self._table().count if count is None else count

    def _count_held(self, unit: str) -> int:
        """The count this pod holds `unit` under: units revoked at a resharding (served under a
        stale token, or after a failed split or merge) are named in the previous count."""
        counts = {count for count, u in self.counters if u == unit}
        return counts.pop() if len(counts) == 1 else self._held_count()

    # ----------------------------------------------------------------------------- callbacks

    def _log(self, action: str, units: Iterable[str], epoch: int, count: int) -> None:
        w = self.worker
        for unit in unit_order(units):
            ownership.info(
                "%s unit=%s epoch=%d token=%s pod=%s set=%s/%s count=%d",
                action,
                unit,
                epoch,
                self.tokens.get((count, unit), "-"),
                w.pod_name,
                w.kind,
                w.set_name,
                count,
            )

    def _took(self, unit: UnitRange, counts: counters.Counts) -> None:
        """`unit` is served from now on (once the callback returns) with `counts`."""
        key = (unit.count, unit.unit)
        self.counters[key] = counts
        token = self.worker.token(unit.unit)
        if token is not None:
            self.tokens[key] = token
        if self.burner is not None:
            self.burner.hold(frozenset({unit.unit}))

    async def _load(self, unit: UnitRange) -> counters.Counts:
        state = await self.store.load(self._table(), unit.count, unit.unit)
        return {} if state is None else counters.from_json(state.data)

    async def on_acquire(self, units: frozenset[str], epoch: int) -> None:
        count = self._held_count()
        ranges = [UnitRange.of(unit, count) for unit in units]
        loaded = await asyncio.gather(*(self._load(r) for r in ranges))
        for unit, counts in zip(ranges, loaded, strict=True):
            self._took(unit, counts)
        self._log("acquire", units, epoch, count)

    async def on_suspend(self, units: frozenset[str], epoch: int) -> None:
        # The serving lease ran out: requests are refused from now on (owns() says no); the
        # log line marks the end of serving for the tests that judge overlaps from the logs.
        self._log("suspend", units, epoch, self._held_count())

    async def on_resume(self, units: frozenset[str], epoch: int) -> None:
        self._log("resume", units, epoch, self._held_count())

    async def on_release(self, units: frozenset[str], epoch: int) -> None:
        # No new requests reach these units (the worker stopped granting them); let the ones
        # in flight finish, then hand the counters over before the worker acknowledges.
        async with self._idle:
            try:
                await asyncio.wait_for(
                    self._idle.wait_for(lambda: not any(self.in_flight[u] for u in units)),
                    FINISH_TIMEOUT,
                )
            except TimeoutError:
                logging.getLogger(__name__).warning("requests still in flight at release")
        if self.release_delay:
            await asyncio.sleep(self.release_delay)
        count, table, w = self._held_count(), self._table(), self.worker
        await asyncio.gather(
            *(
                self.store.save(
                    UnitSnapshot(
                        table.set_ref.uid,
                        count,
                        unit,
                        self.tokens.get((count, unit), 0),
                        w.pod_name,
                        counters.to_json(self.counters.get((count, unit), {})),
                    )
                )
                for unit in units
            )
        )
        self._log("release", units, epoch, count)
        self._forget(units, count)

    async def on_revoke(self, units: frozenset[str], epoch: int) -> None:
        # Taken away without a hand-off: whoever serves the unit next starts from the state
        # its last release left (an in-memory demo loses what this pod counted since).
        for unit in units:
            count = self._count_held(unit)
            self._log("stop", [unit], epoch, count)
            self._forget([unit], count)

    async def on_split(
        self, parent: UnitRange, children: tuple[UnitRange, ...], epoch: int
    ) -> None:
        counts = self.counters.pop((parent.count, parent.unit), {})
        parts = counters.split(counts, children, self._unit_of)
        self._log("split", [parent.unit], epoch, parent.count)
        self._forget([parent.unit], parent.count)
        for child in children:
            self._took(child, parts[child.unit])
        self._log("acquire", [c.unit for c in children], epoch, children[0].count)

    async def on_merge(
        self,
        merged: UnitRange,
        held: tuple[UnitRange, ...],
        missing: tuple[UnitRange, ...],
        epoch: int,
    ) -> None:
        parts = [self.counters.pop((s.count, s.unit), {}) for s in held]
        parts += await asyncio.gather(*(self._load(s) for s in missing))
        for sibling in held:
            self._log("merge", [sibling.unit], epoch, sibling.count)
            self._forget([sibling.unit], sibling.count)
        self._took(merged, counters.merge(parts))
        self._log("acquire", [merged.unit], epoch, merged.count)

    def _unit_of(self, key: str, count: int) -> int:
        return get_scheme(self._table().key_scheme).unit(key, count)

    def _forget(self, units: Iterable[str], count: int) -> None:
        for unit in units:
            self.tokens.pop((count, unit), None)
            self.counters.pop((count, unit), None)
            if any(u == unit for _, u in self.counters):
                continue  # a split or merge already made a unit of that number of the new count
            self.rates.forget(unit)
            if self.burner is not None:
                self.burner.drop(frozenset({unit}))

    # ---------------------------------------------------------------------------------- HTTP

    async def handle_key(self, request: web.Request) -> web.Response:
        return await self._serve(request.match_info["key"], increment=False, number=None)

    async def handle_increment(self, request: web.Request) -> web.Response:
        """POST /key/<id>[?n=N]: count one increment of the key (numbered: applied once)."""
        text = request.query.get("n")
        number = int(text) if text is not None and text.isdecimal() else None
        if text is not None and (number is None or number < 1):
            body = {"error": f"n must be an integer >= 1, not {text!r}"}
            return web.json_response(body, status=400)
        return await self._serve(request.match_info["key"], increment=True, number=number)

    async def _serve(self, key: str, *, increment: bool, number: int | None) -> web.Response:
        w = self.worker
        try:
            unit = w.unit_of(key)
        except LookupError:
            return _unavailable({"key": key, "reason": "no assignment yet"})
        if not w.serving:
            return _unavailable({"key": key, "unit": unit, "reason": "serving lease ran out"})
        if not w.owns(unit):
            owner = w.owner_of(key)
            if owner is not None and owner != w.pod_name:
                body = {"key": key, "unit": unit, "owner": owner}
                return web.json_response(body, status=421, headers={"Apportion-Owner": owner})
            reason = "unassigned" if owner is None else "in hand-off"
            return _unavailable({"key": key, "unit": unit, "owner": owner, "reason": reason})
        # Owned: the count is the table's and the counters of (count, unit) are in memory.
        # Counted in flight before anything awaits, so that a release waits for the request
        # (its write included) before it hands the counters over.
        counts = self.counters.setdefault((self._table().count, unit), {})
        served_at = time.time()
        token, epoch = w.token(unit), w.epoch
        self.in_flight[unit] += 1
        try:
            if self.requests is not None and token is not None:
                ref = self._table().set_ref
                scope = f"{ref.kind}/{ref.namespace}/{ref.name}/{ref.uid}"
                try:
                    refused = await self.requests.record(scope, unit, key, token, w.pod_name)
                except StorageUnavailable as error:
                    return _unavailable({"key": key, "unit": unit, "reason": f"storage: {error}"})
                if refused is not None:
                    # Served without knowing it lost the unit (cut off, paused, KeepServing):
                    # the store knows better, and nothing of the request counted.
                    logger.warning(
                        "refused unit=%s key=%s token=%d current=%s pod=%s",
                        unit,
                        key,
                        token,
                        refused.current,
                        w.pod_name,
                    )
                    refusal: dict[str, object] = {
                        "key": key,
                        "unit": unit,
                        "pod": w.pod_name,
                        "token": token,
                        "current": refused.current,
                    }
                    return web.json_response(refusal, status=409)
            if increment:
                value = counters.increment(counts, key, number).count
            else:
                value = counts[key].count if key in counts else 0
            self.rates.count(unit)
            if self.work_time:
                await asyncio.sleep(self.work_time)
        finally:
            self.in_flight[unit] -= 1
            async with self._idle:
                self._idle.notify_all()
        return web.json_response(
            {
                "key": key,
                "unit": unit,
                "pod": w.pod_name,
                "token": token,
                "epoch": epoch,
                "count": value,
                "time": served_at,
            }
        )

    async def handle_units(self, request: web.Request) -> web.Response:
        w = self.worker
        mine = {unit: w.token(unit) for unit in unit_order(w.my_units())}
        body = {
            "pod": w.pod_name,
            "uid": w.uid,
            "epoch": w.epoch,
            "draining": w.draining,
            "units": mine,
        }
        return web.json_response(body)

    async def handle_counters(self, request: web.Request) -> web.Response:
        """GET /counters: {"pod", "epoch", "count", "units": {unit: {key: count}}}, the
        counters of the units served now."""
        w = self.worker
        table = w.table
        count = 0 if table is None else table.count
        units = {
            unit: {k: e.count for k, e in sorted(self.counters.get((count, unit), {}).items())}
            for unit in unit_order(w.my_units())
        }
        body = {"pod": w.pod_name, "epoch": w.epoch, "count": count, "units": units}
        return web.json_response(body)


def _unavailable(body: dict[str, object]) -> web.Response:
    return web.json_response(body, status=503, headers={"Retry-After": "1"})
