"""The unit mode of `apportion demo-worker`: a worker of one PartitionSet or ShardSet that serves
requests by key, logs every change of ownership in a greppable line, and reports a synthetic
per-unit load (docs/worker.md).

HTTP on the worker's address (beside /metrics and /healthz):

    GET /key/<id>   200 {"key", "unit", "pod", "token", "epoch"} when this pod serves the key's
                    unit; 421 {"key", "unit", "owner"} (header Apportion-Owner) when another pod
                    owns it; 503 (Retry-After: 1) while nobody serves it (unassigned, in hand-off)
    GET /units      {"pod", "uid", "epoch", "draining", "units": {unit: token}}: what it serves

Ownership lines on stdout, one per unit, time first (Unix seconds):

    1718000000.123456 acquire unit=3 epoch=7 token=7 pod=demo-workers-0 set=PartitionSet/demo
    1718000004.901234 release unit=3 epoch=9 token=7 pod=demo-workers-0 set=PartitionSet/demo
    1718000009.000000 stop unit=5 epoch=12 token=4 pod=demo-workers-0 set=PartitionSet/demo

`acquire` is logged when the unit starts being served, `release` when it has stopped being
served for a hand-off (before the ack is written), `stop` when it is dropped without one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from apportion.api.assignment import unit_order
from apportion.worker.burn import CpuBurner
from apportion.worker.worker import Worker

OWNERSHIP_LOGGER: Final = "apportion.demo.ownership"
ownership = logging.getLogger(OWNERSHIP_LOGGER)

RATE_WINDOW: Final = 10
"""Seconds over which the `requests` profile counts requests."""
FINISH_TIMEOUT: Final = 10.0
"""Longest a release waits for the unit's requests in flight."""
ZIPF_SCALE: Final = 100.0


@dataclass(frozen=True)
class LoadProfile:
    """The per-unit load a demo worker reports. Every worker of a set gets the same profile, so
    a unit's load follows it from pod to pod.

    `uniform[:V]` every unit V (default 1); `zipf[:S]` unit u gets 100/(u+1)^S (default S=1);
    `units:U=V,...[,*=D]` the listed units V, the others D (default 1); `requests` GET /key
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
                return ZIPF_SCALE / rank**self.value
            case "units":
                return self.units.get(unit, self.value)
            case "requests":
                return rates.rate(unit)
        return 0.0


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


class DemoWorker:
    """Callbacks and HTTP handlers of the demo; `run()` is the whole process."""

    def __init__(
        self,
        kind: str,
        set_name: str,
        *,
        port: int,
        host: str | None = None,
        namespace: str | None = None,
        profile: LoadProfile | None = None,
        release_delay: float = 0.0,
        work_time: float = 0.0,
        burn_millicores: float = 0.0,
    ) -> None:
        self.profile = profile or LoadProfile("uniform")
        # With --burn-cpu, a unit's load is the CPU it really costs, not the profile's figure.
        self.burner = (
            CpuBurner(burn_millicores, lambda unit: self.profile.load(unit, self.rates))
            if burn_millicores
            else None
        )
        self.release_delay = release_delay
        self.work_time = work_time
        self.rates = RequestRates()
        self.served: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self._idle = asyncio.Condition()
        self.tokens: dict[str, int] = {}
        routes = [web.get("/key/{key}", self.handle_key), web.get("/units", self.handle_units)]
        self.worker = Worker(
            kind,
            set_name,
            namespace=namespace,
            on_acquire=self.on_acquire,
            on_release=self.on_release,
            on_revoke=self.on_revoke,
            load=self.unit_load if self.profile.reports else None,
            port=port,
            host=host,
            routes=routes,
        )

    async def run(self) -> None:
        if self.burner is not None:
            self.burner.start()
        try:
            async with self.worker as worker:
                await worker.wait_drained()
        finally:
            if self.burner is not None:
                self.burner.stop()

    def unit_load(self, unit: str) -> float:
        if self.burner is not None:
            return self.burner.rate(unit)
        return self.profile.load(unit, self.rates)

    # ----------------------------------------------------------------------------- callbacks

    def _log(self, action: str, units: frozenset[str], epoch: int) -> None:
        w = self.worker
        for unit in unit_order(units):
            ownership.info(
                "%s unit=%s epoch=%d token=%s pod=%s set=%s/%s",
                action,
                unit,
                epoch,
                self.tokens.get(unit, "-"),
                w.pod_name,
                w.kind,
                w.set_name,
            )

    async def on_acquire(self, units: frozenset[str], epoch: int) -> None:
        for unit in units:
            token = self.worker.token(unit)
            if token is not None:
                self.tokens[unit] = token
        if self.burner is not None:
            self.burner.hold(units)
        self._log("acquire", units, epoch)

    async def on_release(self, units: frozenset[str], epoch: int) -> None:
        # No new requests reach these units (the worker stopped granting them); let the ones
        # in flight finish, then take whatever time handing over state takes.
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
        self._log("release", units, epoch)
        self._forget(units)

    async def on_revoke(self, units: frozenset[str], epoch: int) -> None:
        self._log("stop", units, epoch)
        self._forget(units)

    def _forget(self, units: frozenset[str]) -> None:
        if self.burner is not None:
            self.burner.drop(units)
        for unit in units:
            self.tokens.pop(unit, None)
            self.rates.forget(unit)

    # ---------------------------------------------------------------------------------- HTTP

    async def handle_key(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        w = self.worker
        try:
            unit = w.unit_of(key)
        except LookupError:
            return _unavailable({"key": key, "reason": "no assignment yet"})
        if not w.owns(unit):
            owner = w.owner_of(key)
            if owner is not None and owner != w.pod_name:
                body = {"key": key, "unit": unit, "owner": owner}
                return web.json_response(body, status=421, headers={"Apportion-Owner": owner})
            reason = "unassigned" if owner is None else "in hand-off"
            return _unavailable({"key": key, "unit": unit, "owner": owner, "reason": reason})
        token = w.token(unit)
        self.in_flight[unit] += 1
        try:
            self.rates.count(unit)
            if self.work_time:
                await asyncio.sleep(self.work_time)
            self.served[unit] += 1
        finally:
            self.in_flight[unit] -= 1
            async with self._idle:
                self._idle.notify_all()
        body = {"key": key, "unit": unit, "pod": w.pod_name, "token": token, "epoch": w.epoch}
        return web.json_response(body)

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


def _unavailable(body: dict[str, object]) -> web.Response:
    return web.json_response(body, status=503, headers={"Retry-After": "1"})
