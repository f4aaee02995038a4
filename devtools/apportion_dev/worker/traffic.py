"""The demo's load generator (`apportion demo-traffic`, docs/tutorial.md).

Sends increments (`POST /key/<id>`: the demo workers count per key, and hand the counters over
with their units) for Zipf-skewed keys to the workers of PartitionSets and ShardSets, routed as a
smart client routes them — the key scheme names the unit, the set's published table names its
pod, and a 421 from a pod that just gave the unit away names the new owner — and asks the silos
of GrainTypes for new activations. Keys get real per-unit load this way: the workers count the
requests they serve (`--load-profile requests`) and Balanced places by it.

Zipf: the key of rank k (1 the hottest) of `keys` is drawn with probability ∝ 1/k^s (Zipf's law,
the skew of web and key-value traffic: Breslau et al., "Web caching and Zipf-like
distributions", INFOCOM 1999). s = 0 is uniform.

A ConfigMap steers it while it runs (every data key optional; a bad value is reported and the
default used): `rate` requests per second over all unit sets (100), `skew` the exponent s (1.2),
`keys` distinct keys per set (1000), `grainRate` activations per second per GrainType (2),
`grainLifetime` seconds (30), `paused` ("true" stops all traffic).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import aiohttp
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Pod

from apportion import listwatch
from apportion.api.assignment import AssignmentTable, assignment_config_map
from apportion.engine.keys import KeyScheme, get_scheme
from apportion.worker._watch import AssignmentWatch

logger = logging.getLogger(__name__)

TICK = 0.05
"""Seconds between two batches of requests: smooth enough at demo rates, cheap on 2 cores."""
IN_FLIGHT = 64
"""Requests waiting for an answer at most; beyond, a batch is dropped (and counted), so a slow
worker slows its own keys only."""
POD_REFRESH = 3.0
REPORT_EVERY = 10.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=5)


@dataclass(frozen=True, slots=True)
class TrafficSettings:
    """What the user steers through the ConfigMap; the data keys are the camelCase names."""

    rate: float = 100.0
    skew: float = 1.2
    keys: int = 1000
    grain_rate: float = 2.0
    grain_lifetime: float = 30.0
    paused: bool = False

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> tuple[TrafficSettings, list[str]]:
        """Settings from ConfigMap data and, for each value that cannot be used, why."""
        settings, problems = cls(), []
        for f in fields(cls):
            key = _camel(f.name)
            if key not in data:
                continue
            text = str(data[key]).strip()
            try:
                value = _parse(f.name, text)
            except ValueError as error:
                problems.append(f"{key}={text!r}: {error}; using {getattr(settings, f.name)}")
                continue
            changes: dict[str, Any] = {f.name: value}  # the field's own type, by _parse
            settings = replace(settings, **changes)
        return settings, problems


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _parse(name: str, text: str) -> float | int | bool:
    if name == "paused":
        if text.lower() not in ("true", "false"):
            raise ValueError("expected true or false")
        return text.lower() == "true"
    value = int(text) if name == "keys" else float(text)
    if name == "keys" and not 1 <= value <= 1_000_000:
        raise ValueError("expected 1..1000000")
    if value < 0 or value != value or value == float("inf"):
        raise ValueError("expected a finite number >= 0")
    return value


class ZipfKeys:
    """Draws key ranks 0..n-1 with P(rank r) ∝ 1/(r+1)^s, by bisection on the cumulative
    weights (one O(n) table per (n, s), O(log n) per draw)."""

    def __init__(self, count: int, skew: float) -> None:
        self.count, self.skew = count, skew
        self._cumulative = list(itertools.accumulate(1.0 / (r + 1) ** skew for r in range(count)))

    def draw(self, rng: random.Random) -> int:
        point = rng.random() * self._cumulative[-1]
        return min(bisect.bisect_right(self._cumulative, point), self.count - 1)


@dataclass
class UnitSetRoute:
    """Where one set's keys go: its newest table, plus owners learnt from 421 answers until the
    next table (a unit in hand-off is served by its new owner before the table says so)."""

    kind: str
    name: str
    prefix: str
    table: AssignmentTable | None = None
    learnt: dict[str, str] = field(default_factory=dict)
    _scheme: KeyScheme | None = None

    def on_table(self, table: AssignmentTable) -> None:
        self.table = table
        self.learnt.clear()
        self._scheme = get_scheme(table.key_scheme)

    def route(self, key: str) -> tuple[str, str | None] | None:
        """The key's unit and the pod to ask, or None while no table is published."""
        if self.table is None or self._scheme is None:
            return None
        unit = str(self._scheme.unit(key, self.table.count))
        if unit in self.learnt:
            return unit, self.learnt[unit]
        state = self.table.units.get(unit)
        return unit, None if state is None else state.owner


@dataclass
class Tally:
    """What happened to the requests and activations since the last report."""

    counts: Counter[str] = field(default_factory=Counter)

    def line(self, settings: TrafficSettings) -> str:
        c = self.counts
        if settings.paused:
            head = "paused"
        else:
            head = f"rate {settings.rate:g}/s, skew {settings.skew:g} over {settings.keys} keys"
        return (
            f"traffic ({head}): {c['sent']} requests, {c['ok']} ok, {c['moved']} redirected, "
            f"{c['unavailable']} unavailable, {c['unrouted']} unrouted, "
            f"{c['unreachable']} unreachable, {c['failed']} failed, "
            f"{c['dropped']} dropped; {c['activations']} grain activations"
        )


class Traffic:
    """The whole generator; `run()` is the process."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        *,
        unit_sets: Sequence[tuple[str, str]],
        grain_types: Sequence[str] = (),
        grain_silos: str | None = None,
        config_map: str = "demo-traffic",
        seed: int | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.routes = [UnitSetRoute(kind, name, f"{name}-") for kind, name in unit_sets]
        self.grain_types = list(grain_types)
        self.grain_silos = grain_silos
        self.config_map = config_map
        self.settings = TrafficSettings()
        self.addresses: dict[str, str] = {}
        self.silos: list[str] = []
        self.tally = Tally()
        self.rng = random.Random(seed)
        self._zipf = ZipfKeys(self.settings.keys, self.settings.skew)
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        settings_watch = listwatch.ListWatch(
            self.client,
            ConfigMap,
            self.namespace,
            decode=dict,
            on_list=self._on_settings_list,
            on_event=self._on_settings_event,
            selection=listwatch.Selection(fields={"metadata.name": self.config_map}),
        )
        watches = [
            AssignmentWatch(
                self.client, self.namespace, assignment_config_map(r.kind, r.name), r.on_table
            )
            for r in self.routes
        ]
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http:
            loops = [
                settings_watch.run(),
                *(w.run() for w in watches),
                self._follow_pods(),
                self._requests(http),
                self._activations(http),
                self._report(),
            ]
            await asyncio.gather(*loops)

    # ------------------------------------------------------------------------------- inputs

    async def _on_settings_list(self, listed: AsyncIterator[dict[str, Any]]) -> None:
        found = [obj async for obj in listed]
        self._apply(found[0].get("data") or {} if found else {})

    async def _on_settings_event(self, event: listwatch.EventType, obj: dict[str, Any]) -> None:
        self._apply({} if event == "DELETED" else obj.get("data") or {})

    def _apply(self, data: Mapping[str, str]) -> None:
        settings, problems = TrafficSettings.from_data(data)
        for problem in problems:
            logger.warning("ConfigMap %s: %s", self.config_map, problem)
        if settings != self.settings:
            logger.info("settings now %s", settings)
        if (settings.keys, settings.skew) != (self._zipf.count, self._zipf.skew):
            self._zipf = ZipfKeys(settings.keys, settings.skew)
        self.settings = settings

    async def _follow_pods(self) -> None:
        while True:
            try:
                addresses, silos = {}, []
                async for pod in self.client.list(Pod, namespace=self.namespace):
                    address, meta = _address(pod), pod.metadata
                    if address is None or meta is None or meta.name is None:
                        continue
                    addresses[meta.name] = address
                    if (
                        self.grain_silos is not None
                        and _ready(pod)
                        and _matches(meta.labels or {}, self.grain_silos)
                    ):
                        silos.append(address)
                self.addresses, self.silos = addresses, silos
            except Exception as error:  # the API server may be restarting: next round
                logger.warning("cannot list pods: %s", error)
            await asyncio.sleep(POD_REFRESH)

    # ------------------------------------------------------------------------------ traffic

    async def _requests(self, http: aiohttp.ClientSession) -> None:
        owed = 0.0
        while True:
            await asyncio.sleep(TICK)
            if self.settings.paused or not self.routes:
                owed = 0.0
                continue
            owed += self.settings.rate * TICK
            batch, owed = int(owed), owed - int(owed)
            for _ in range(batch):
                if self._slots.locked():
                    self.tally.counts["dropped"] += 1
                    continue
                route = self.routes[self.rng.randrange(len(self.routes))]
                key = f"{route.prefix}{self._zipf.draw(self.rng)}"
                self._spawn(self._request(http, route, key))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, http: aiohttp.ClientSession, route: UnitSetRoute, key: str) -> None:
        counts = self.tally.counts
        async with self._slots:
            routed = route.route(key)
            counts["sent"] += 1
            unit, pod = routed or ("", None)
            if pod is None or pod not in self.addresses:
                counts["unrouted"] += 1
                return
            # One redirect: a unit in hand-off is named by its old owner's 421.
            for _ in range(2):
                try:
                    async with http.post(f"http://{self.addresses[pod]}/key/{key}") as answer:
                        status, owner = answer.status, answer.headers.get("Apportion-Owner")
                except (aiohttp.ClientError, TimeoutError):
                    # No answer (a pod that exited, say) is not an answer that refused: a
                    # client retries the one, and must look into the other.
                    counts["unreachable"] += 1
                    return
                if status == 421 and owner is not None and owner in self.addresses:
                    counts["moved"] += 1
                    route.learnt[unit] = pod = owner
                    continue
                break
            counts["ok" if status == 200 else "unavailable" if status == 503 else "failed"] += 1

    async def _activations(self, http: aiohttp.ClientSession) -> None:
        owed = 0.0
        while True:
            await asyncio.sleep(1.0)
            settings = self.settings
            if settings.paused or not self.silos or not self.grain_types:
                owed = 0.0
                continue
            owed += settings.grain_rate
            count, owed = int(owed), owed - int(owed)
            if not count:
                continue
            for grain_type in self.grain_types:
                # The silo asked places the activations: its filters see it as the caller.
                silo = self.silos[self.rng.randrange(len(self.silos))]
                body = {
                    "grainType": grain_type,
                    "count": count,
                    "lifetime": settings.grain_lifetime,
                    "prefix": f"{grain_type}-",
                }
                self._spawn(self._activate(http, silo, body))

    async def _activate(self, http: aiohttp.ClientSession, silo: str, body: dict[str, Any]) -> None:
        try:
            async with http.post(f"http://{silo}/grains/drive", json=body) as answer:
                placed = answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            placed = False
        if placed:
            self.tally.counts["activations"] += body["count"]
        else:
            self.tally.counts["failed"] += 1

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            logger.info("%s", self.tally.line(self.settings))
            self.tally = Tally()


def _address(pod: Pod) -> str | None:
    """host:port of the pod's first container port, when it has an IP."""
    ip = pod.status.podIP if pod.status else None
    if not ip or not pod.spec or not pod.spec.containers:
        return None
    ports = pod.spec.containers[0].ports or []
    return f"{ip}:{ports[0].containerPort if ports else 8080}"


def _ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    """`key=value,...` equality selectors, as `kubectl -l` takes them."""
    wanted = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k.strip()) == v.strip() for k, v in wanted)
