"""The grain mode of `apportion demo-worker`: activates grains at a configurable rate, places
each through the `PlacementDirector`, runs it here or hands it to the chosen member over HTTP,
and deactivates it after its lifetime, so load moves and the operator's tables follow.

HTTP (on the worker's server, beside `/metrics`):

    POST /grains/activate  {"grainType", "grainId", "lifetime"}   a peer hands over an activation
    POST /grains/drive     {"grainType", "count", "rate", "lifetime", "prefix", "ids"}
                           place `count` activations (or one per id of `ids`) at `rate` per
                           second (Poisson arrivals; 0 = at once); answers when all are placed
    GET  /grains           this worker's counters as JSON
    POST /grains/load      {"cpuPercent", "overloaded"}: report these in place of the process's
                           own figures from now on (null: the real one), to drive load shedding

Its `/metrics` samples are the director's (`apportion_activations` and friends) plus
`apportion_grain_placement_failures{grain_type, reason}` (placements that raised, or hand-offs a
peer did not take) and `apportion_grain_reused{grain_type}` (StatelessWorker at capacity: a
local activation is reused instead).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from apportion.api.worker_report import (
    CONTENT_TYPE,
    GRAIN_TYPE_LABEL,
    Sample,
    WorkerReport,
    render,
)
from apportion.engine.grains import PlacementError, StatelessWorkerAtCapacity
from apportion.grains._director import METRIC_HELP, PlacementDirector
from apportion.worker._process import ProcessStats

logger = logging.getLogger(__name__)

FAILURES = "apportion_grain_placement_failures"
REUSED = "apportion_grain_reused"
DEMO_METRIC_HELP = {
    **METRIC_HELP,
    FAILURES: "Activations this worker could not place or hand over, by grain type and reason.",
    REUSED: "StatelessWorker activations at capacity that reused a local activation instead.",
}
HANDOFF_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class DriveSpec:
    """One burst of activations placed from this worker."""

    grain_type: str
    count: int = 1
    rate: float = 0.0
    """Activations per second (Poisson arrivals); 0 places them all at once."""
    lifetime: float = 0.0
    """Seconds each activation lives; 0 keeps it until the worker stops."""
    prefix: str = ""
    ids: tuple[str, ...] = ()
    """Grain ids to activate, one each, in place of `count` random ids starting with
    `prefix`."""

    @property
    def total(self) -> int:
        return len(self.ids) if self.ids else self.count

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriveSpec:
        ids = tuple(str(i) for i in data.get("ids") or ())
        return cls(
            grain_type=str(data["grainType"]),
            count=int(data.get("count", 1)),
            rate=float(data.get("rate", 0.0)),
            lifetime=float(data.get("lifetime", 0.0)),
            prefix=str(data.get("prefix", "")),
            ids=ids,
        )


class GrainDemo:
    """Drives activations through a director and hosts the ones placed here."""

    def __init__(
        self,
        director: PlacementDirector,
        *,
        port: int,
        process: Callable[[], WorkerReport] = WorkerReport,
        rng: random.Random | None = None,
    ) -> None:
        """`process` reads the worker's own CPU and memory figures for /metrics
        (`apportion.worker._process.ProcessStats().read` in the demo worker)."""
        self.director = director
        self.port = port
        self.process = process
        self.rng = rng or random.Random()
        self.failures: Counter[tuple[str, str]] = Counter()
        self.reused: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self.overrides: dict[str, Any] = {}
        """Figures reported in place of the process's own (POST /grains/load)."""

    # ------------------------------------------------------------------------------ hosting

    def host(self, grain_type: str, grain_id: str, lifetime: float) -> None:
        """Run an activation here; it ends after `lifetime` seconds (0: never)."""
        self.director.activated(grain_type, grain_id)
        if lifetime > 0:
            loop = asyncio.get_running_loop()
            timer: asyncio.TimerHandle

            def end() -> None:
                self._timers.discard(timer)
                self.director.deactivated(grain_type, grain_id)

            timer = loop.call_later(lifetime, end)
            self._timers.add(timer)

    # ---------------------------------------------------------------------------- placing

    async def activate(self, grain_type: str, grain_id: str, lifetime: float) -> str | None:
        """Place one new activation and start it where it was placed; the member, or None."""
        try:
            member = self.director.place(grain_type, grain_id)
        except StatelessWorkerAtCapacity:
            self.reused[grain_type] += 1
            return self.director.local_member
        except PlacementError as error:
            self.failures[grain_type, type(error).__name__] += 1
            logger.warning("cannot place %s %r: %s", grain_type, grain_id, error)
            return None
        if member == self.director.local_member:
            self.host(grain_type, grain_id, lifetime)
            return member
        if not await self._hand_over(member, grain_type, grain_id, lifetime):
            self.failures[grain_type, "HandOverFailed"] += 1
        return member

    async def _hand_over(self, member: str, grain_type: str, grain_id: str, life: float) -> bool:
        doc = self.director.table_for(grain_type)
        address = next((m.address for m in doc.members if m.name == member), None) if doc else None
        if address is None:
            return False
        host = f"[{address}]" if ":" in address else address
        body = {"grainType": grain_type, "grainId": grain_id, "lifetime": life}
        try:
            async with self._http().post(
                f"http://{host}:{self.port}/grains/activate",
                json=body,
                timeout=aiohttp.ClientTimeout(total=HANDOFF_TIMEOUT),
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError) as error:
            logger.warning(
                "hand-over of %s %r to %s failed: %s", grain_type, grain_id, member, error
            )
            return False

    async def drive(self, spec: DriveSpec) -> Counter[str]:
        """Place a burst of activations; returns where they went (None: failed)."""
        placed: Counter[str] = Counter()
        pending: list[asyncio.Task[str | None]] = []
        for i in range(spec.total):
            if spec.rate > 0:
                await asyncio.sleep(self.rng.expovariate(spec.rate))
            grain_id = spec.ids[i] if spec.ids else f"{spec.prefix}{self.rng.getrandbits(64):016x}"
            pending.append(
                asyncio.create_task(self.activate(spec.grain_type, grain_id, spec.lifetime))
            )
        for member in await asyncio.gather(*pending):
            placed[str(member)] += 1
        return placed

    async def run(self, grain_types: Sequence[str], rate: float, lifetime: float) -> None:
        """The configured mode: activations of random grain types at `rate` per second until
        cancelled, each living `lifetime` seconds."""
        while True:
            await asyncio.sleep(self.rng.expovariate(rate))
            grain_type = self.rng.choice(list(grain_types))
            task = asyncio.create_task(
                self.activate(grain_type, f"{self.rng.getrandbits(64):016x}", lifetime)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------- HTTP

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/grains/activate", self._on_activate)
        app.router.add_post("/grains/drive", self._on_drive)
        app.router.add_post("/grains/load", self._on_load)
        app.router.add_get("/grains", self._on_get)

    async def _on_load(self, request: web.Request) -> web.Response:
        data = await request.json()
        cpu, overloaded = data.get("cpuPercent"), data.get("overloaded")
        self.overrides = {}
        if cpu is not None:
            self.overrides["cpu_percent"] = float(cpu)
        if overloaded is not None:
            self.overrides["overloaded"] = bool(overloaded)
        return web.json_response({"cpuPercent": cpu, "overloaded": overloaded})

    async def _on_activate(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.host(str(data["grainType"]), str(data["grainId"]), float(data.get("lifetime", 0)))
        return web.json_response({"member": self.director.local_member})

    async def _on_drive(self, request: web.Request) -> web.Response:
        try:
            spec = DriveSpec.from_json(await request.json())
        except (KeyError, ValueError, TypeError) as error:
            raise web.HTTPBadRequest(text=f"bad drive request: {error}") from error
        placed = await self.drive(spec)
        return web.json_response({"placed": dict(placed)})

    async def _on_get(self, request: web.Request) -> web.Response:
        counts = self.director.counts()
        return web.json_response(
            {
                "member": self.director.local_member,
                "hosted": counts["hosted"],
                "started": counts["started"],
                "placements": [
                    {"grainType": t, "member": m, "count": n}
                    for (t, m), n in sorted(counts["placements"].items())
                ],
                "tables": counts["tables"],
                "failures": [
                    {"grainType": t, "reason": r, "count": n}
                    for (t, r), n in sorted(self.failures.items())
                ],
                "reused": dict(self.reused),
            }
        )

    # ---------------------------------------------------------------------------- metrics

    def samples(self) -> list[Sample]:
        own = dataclasses.replace(self.process(), **self.overrides)
        out = self.director.samples() + own.samples()
        out += [
            Sample(FAILURES, n, {GRAIN_TYPE_LABEL: t, "reason": r})
            for (t, r), n in sorted(self.failures.items())
        ]
        out += [Sample(REUSED, n, {GRAIN_TYPE_LABEL: t}) for t, n in sorted(self.reused.items())]
        return out

    # ----------------------------------------------------------------------------- close

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Pod IPs are reached directly, never through an HTTP(S)_PROXY.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for timer in self._timers:
            timer.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None


# ------------------------------------------------------------------------------ the process


async def serve(
    *,
    member: str,
    host: str,
    port: int,
    namespace: str | None = None,
    grain_types: Sequence[str] = (),
    rate: float = 0.0,
    lifetime: float = 0.0,
) -> None:
    """Run the grain mode until cancelled: watch the placement tables, serve `/metrics`,
    `/healthz` and the `/grains` endpoints on `host:port`, and, with `grain_types` and a `rate`,
    activate grains continuously."""
    director = PlacementDirector(member)
    await director.start(namespace)
    demo = GrainDemo(director, port=port, process=ProcessStats().read)
    app = web.Application()
    demo.add_routes(app)

    async def metrics(request: web.Request) -> web.Response:
        text = render(demo.samples(), helps=DEMO_METRIC_HELP)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        logger.info("grain demo worker %s serving on %s:%d", member, host, port)
        if grain_types and rate > 0:
            await demo.run(grain_types, rate, lifetime)
        else:
            await asyncio.Event().wait()
    finally:
        await demo.close()
        await runner.cleanup()
        await director.stop()
