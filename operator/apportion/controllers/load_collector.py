"""Load figures for placement, read from the cluster: CPU and memory from `metrics.k8s.io`
PodMetrics when that API is served, and what worker pods report on their Prometheus endpoint
(per-unit load, activation counts, their own CPU and memory; see docs/metrics.md), smoothed.

One `LoadCollector` per operator, shared by the PartitionSet, ShardSet and GrainType
controllers: a pod selected by several resources is scraped once per interval, a namespace's
PodMetrics are listed once per `resource_interval`.

    collector = LoadCollector(client)             # a lightkube AsyncClient; close() at shutdown
    pods = [WorkerPod.from_body(pod) for pod in members]  # kopf bodies or plain dicts

    report = await collector.unit_loads(namespace, set_name, pods, spec.metrics)
    report.unit_loads    # {"17": 3.2, ...} smoothed per-unit load, or None: balance unit counts
    report.member_stats  # {"worker-0": TableStats(...)} for pods with any figure
    report.source        # MetricsSource, for status.metricsSource
    report.message       # one sentence for a condition: what was used, what is missing and why

    report = await collector.member_stats(namespace, pods, spec.metrics, grain_types=["Cart"])
    report.member_stats  # smoothed CPU, memory, available memory; activations of those types

    collector.forget(namespace, set_name)            # the set is gone: drop its smoothing state

A call waits only for a pod's (or namespace's) very first reading, bounded by scrape.timeout
(PodMetrics: `request_timeout`); later readings run in the background on their interval and
calls use the latest, so a slow or hung pod never holds up a placement pass. A pod's figures
count while its last good reading is younger than 3 scrape intervals plus the timeout.

Smoothing: per-unit loads through a half-life EWMA per set (spec.metrics.smoothing.halfLife);
CPU, memory usage and available memory per pod and source through the dual-mode Kalman filter,
fed once per new sample (a new PodMetrics timestamp, a new scrape).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import aiohttp
import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource

from apportion import __version__
from apportion.api.common import MetricsSpec, ScrapeSpec, format_duration
from apportion.api.placement_table import TableStats
from apportion.api.pods import WorkerPod
from apportion.api.resource_metrics import (
    PodResources,
    ResourceUsage,
    pod_usage,
)
from apportion.api.unitset import MetricsSource
from apportion.api.worker_report import ExpositionError, WorkerReport
from apportion.engine.smoothing import ResourceSmoother, UnitLoadSmoother

PodMetrics = create_namespaced_resource("metrics.k8s.io", "v1beta1", "PodMetrics", "pods")

_ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
_STALE_INTERVALS = 3
_MAX_LISTED_PROBLEMS = 3


@dataclass(frozen=True, slots=True)
class LoadReport:
    """Figures for one placement pass, and how they were obtained."""

    unit_loads: Mapping[str, float] | None
    """Unit → smoothed load summed over the pods reporting it; None when no pod reported any
    (the planner balances counts). Units no pod reports are absent."""
    member_stats: Mapping[str, TableStats]
    """Pod name → smoothed statistics, for pods with at least one figure."""
    source: MetricsSource
    message: str
    """What the figures came from and, when some are missing, which pods and why."""
    problems: Mapping[str, str] = field(default_factory=dict)
    """Pod name → why it contributed no worker figures (scrape failure, no such port...)."""


class _Target:
    """One scrape endpoint of one pod."""

    __slots__ = (
        "attempted",
        "error",
        "finished",
        "report",
        "sample",
        "succeeded",
        "task",
        "url",
        "used",
    )

    def __init__(self, url: str, now: float) -> None:
        self.url = url
        self.report: WorkerReport | None = None
        self.sample = 0
        self.error: str | None = None
        self.finished = False
        """At least one scrape has ended (well or not)."""
        self.attempted = -math.inf
        self.succeeded = -math.inf
        self.task: asyncio.Task[None] | None = None
        self.used = now


class _NamespacePodMetrics:
    """The PodMetrics of one namespace, as last listed."""

    __slots__ = ("attempted", "error", "invalid", "listed", "task", "usages", "used")

    def __init__(self, now: float) -> None:
        self.usages: dict[str, ResourceUsage] = {}
        self.invalid: dict[str, str] = {}
        self.error: str | None = None
        self.attempted = -math.inf
        self.listed = False
        self.task: asyncio.Task[None] | None = None
        self.used = now


class _PodSmoothers:
    """Kalman state of one pod, per source, and the samples already folded into it."""

    __slots__ = ("pod", "pod_sample", "used", "worker", "worker_sample")

    def __init__(self, now: float) -> None:
        self.pod = ResourceSmoother()
        self.worker = ResourceSmoother()
        self.pod_sample: tuple[str, float, int] | None = None
        self.worker_sample = 0
        self.used = now


@dataclass(slots=True)
class _Readings:
    """What one call found for its pods."""

    workers: dict[str, tuple[WorkerReport, int]] = field(default_factory=dict)
    usages: dict[str, ResourceUsage] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    pod_metrics_note: str | None = None
    """Why PodMetrics gave nothing at all (API not served, forbidden...), if so."""


class LoadCollector:
    """Reads, caches and smooths load figures for every controller of one operator."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        max_concurrency: int = 32,
        resource_interval: float = 10.0,
        discovery_interval: float = 60.0,
        request_timeout: float = 5.0,
        max_page_bytes: int = 8 << 20,
        idle_ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`resource_interval`: how often a namespace's PodMetrics are listed (metrics-server
        resolves 15 s by default). `discovery_interval`: how long an absent metrics.k8s.io is
        believed absent. `idle_ttl`: state of pods and sets no call asked for is dropped."""
        self._client = client
        self._limit = asyncio.Semaphore(max_concurrency)
        self._resource_interval = resource_interval
        self._discovery_interval = discovery_interval
        self._request_timeout = request_timeout
        self._max_page_bytes = max_page_bytes
        self._idle_ttl = idle_ttl
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._targets: dict[tuple[str, str, str, str], _Target] = {}
        self._namespaces: dict[str, _NamespacePodMetrics] = {}
        self._smoothers: dict[tuple[str, str, str], _PodSmoothers] = {}
        self._sets: dict[tuple[str, str], tuple[UnitLoadSmoother, float]] = {}
        self._api_absent_since: float | None = None
        self._pruned = clock()

    # --- the API ---------------------------------------------------------------------------------

    async def unit_loads(
        self, namespace: str, set_name: str, pods: Sequence[WorkerPod], spec: MetricsSpec
    ) -> LoadReport:
        """Per-unit load of PartitionSet/ShardSet `set_name` (the `set` label workers put on
        `apportion_unit_load`), smoothed with the spec's half-life, plus each pod's stats."""
        now = self._clock()
        readings = await self._read(namespace, pods, spec, now)
        stats, from_pod_metrics = self._member_stats(namespace, pods, spec, readings, None, now)
        raw: dict[str, float] = {}
        scraped = reporting = 0
        for pod in pods:
            if pod.name not in readings.workers:
                continue
            scraped += 1
            # A pod that owns no unit of the set yet has none to report.
            loads = readings.workers[pod.name][0].unit_loads.get(set_name)
            if loads is not None:
                reporting += 1
                for unit, load in loads.items():
                    raw[unit] = raw.get(unit, 0.0) + load
        key = (namespace, set_name)
        half_life = spec.smoothing.half_life.total_seconds()
        unit_loads: Mapping[str, float] | None = None
        if reporting:
            entry = self._sets.get(key)
            smoother = entry[0] if entry else UnitLoadSmoother(half_life)
            smoother.half_life = half_life
            unit_loads = dict(smoother.update(raw, now))
            self._sets[key] = (smoother, now)
        else:
            self._sets.pop(key, None)
        parts = []
        if spec.scrape is None:
            parts.append("no per-unit load: spec.metrics.scrape is not set")
        elif reporting:
            parts.append(
                f"per-unit load from {scraped}/{len(pods)} pods "
                f"(half-life {format_duration(spec.smoothing.half_life)})"
            )
        elif scraped:
            parts.append(
                f"no per-unit load: none of the {scraped} scraped pods reports "
                f'apportion_unit_load{{set="{set_name}"}}'
            )
        else:
            parts.append(f"no per-unit load from any of {len(pods)} pods")
        parts.append(self._pod_metrics_part(spec, readings, from_pod_metrics, len(pods)))
        source = _source(worker=unit_loads is not None, pod_metrics=from_pod_metrics > 0)
        message = "; ".join(p for p in parts if p) + _problems_part(readings.problems)
        if unit_loads is None:
            message += ": balancing unit counts"
        return LoadReport(unit_loads, stats, source, message, dict(readings.problems))

    async def member_stats(
        self,
        namespace: str,
        pods: Sequence[WorkerPod],
        spec: MetricsSpec,
        *,
        grain_types: Collection[str] | None = None,
    ) -> LoadReport:
        """Smoothed CPU, memory and available memory of each pod, and its activations of
        `grain_types` (None: all types, the member-wide count Orleans uses)."""
        now = self._clock()
        readings = await self._read(namespace, pods, spec, now)
        stats, from_pod_metrics = self._member_stats(
            namespace, pods, spec, readings, grain_types, now
        )
        reporting = sum(1 for pod in pods if pod.name in readings.workers)
        parts = []
        if spec.scrape is None:
            parts.append("no activation counts: spec.metrics.scrape is not set")
        else:
            parts.append(f"worker figures from {reporting}/{len(pods)} pods")
        parts.append(self._pod_metrics_part(spec, readings, from_pod_metrics, len(pods)))
        source = _source(worker=reporting > 0, pod_metrics=from_pod_metrics > 0)
        message = "; ".join(p for p in parts if p) + _problems_part(readings.problems)
        if not stats:
            message += ": no member has statistics"
        return LoadReport(None, stats, source, message, dict(readings.problems))

    def forget(self, namespace: str, set_name: str) -> None:
        """Drop the smoothing state of a deleted set (idle state also expires by itself)."""
        self._sets.pop((namespace, set_name), None)

    async def close(self) -> None:
        tasks = [t.task for t in self._targets.values() if t.task]
        tasks += [n.task for n in self._namespaces.values() if n.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- reading ---------------------------------------------------------------------------------

    async def _read(
        self, namespace: str, pods: Sequence[WorkerPod], spec: MetricsSpec, now: float
    ) -> _Readings:
        self._prune(now)
        readings = _Readings()
        targets: dict[str, _Target] = {}
        if spec.scrape is not None:
            targets = self._start_scrapes(namespace, pods, spec.scrape, now, readings)
        first_readings = [t.task for t in targets.values() if t.task is not None and not t.finished]
        listing = self._namespace(namespace, now) if spec.pod_metrics else None
        if listing is not None and listing.task is not None and not listing.listed:
            first_readings.append(listing.task)
        if first_readings:
            await asyncio.wait(first_readings)
        if spec.scrape is not None:
            stale_after = (
                _STALE_INTERVALS * spec.scrape.interval.total_seconds()
                + spec.scrape.timeout.total_seconds()
            )
            for name, target in targets.items():
                if target.report is not None and now - target.succeeded <= stale_after:
                    readings.workers[name] = (target.report, target.sample)
                else:
                    readings.problems[name] = target.error or "not scraped yet"
        if spec.pod_metrics:
            readings.pod_metrics_note = self._pod_metrics_note(listing)
            if listing is not None:
                for pod in pods:
                    if pod.name in listing.usages:
                        readings.usages[pod.name] = listing.usages[pod.name]
                    elif pod.name in listing.invalid:
                        readings.problems.setdefault(pod.name, listing.invalid[pod.name])
        return readings

    def _start_scrapes(
        self,
        namespace: str,
        pods: Sequence[WorkerPod],
        scrape: ScrapeSpec,
        now: float,
        readings: _Readings,
    ) -> dict[str, _Target]:
        """Each pod's scrape target, by pod name, its scrape started when one is due; a pod
        without a scrape URL gets a problem in `readings` instead."""
        interval = scrape.interval.total_seconds()
        timeout = scrape.timeout.total_seconds()
        targets: dict[str, _Target] = {}
        for pod in pods:
            try:
                url = scrape_url(pod, scrape)
            except ValueError as error:
                readings.problems[pod.name] = str(error)
                continue
            key = (namespace, pod.name, pod.uid, url)
            target = self._targets.get(key)
            if target is None:
                target = self._targets[key] = _Target(url, now)
            target.used = now
            targets[pod.name] = target
            if target.task is None and now - target.attempted >= interval:
                target.task = asyncio.create_task(self._scrape(target, timeout))
        return targets

    async def _scrape(self, target: _Target, timeout: float) -> None:
        target.attempted = self._clock()
        try:
            async with self._limit:
                session = self._http()
                async with session.get(
                    target.url, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as response:
                    if response.status != 200:
                        raise _ScrapeError(f"HTTP {response.status} from {target.url}")
                    page = bytearray()
                    async for chunk in response.content.iter_chunked(1 << 16):
                        page += chunk
                        if len(page) > self._max_page_bytes:
                            raise _ScrapeError(
                                f"metrics page larger than {self._max_page_bytes} bytes"
                            )
            report = WorkerReport.parse(page.decode("utf-8", errors="replace"))
        except TimeoutError:
            target.error = f"no answer from {target.url} within {timeout:g}s"
        except aiohttp.ClientError as error:
            target.error = f"cannot scrape {target.url}: {error or type(error).__name__}"
        except ExpositionError as error:
            target.error = f"invalid metrics from {target.url}: {error}"
        except _ScrapeError as error:
            target.error = str(error)
        else:
            target.report = report
            target.sample += 1
            target.succeeded = self._clock()
            target.error = None
        finally:
            target.finished = True
            target.task = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"Accept": _ACCEPT, "User-Agent": f"apportion-operator/{__version__}"},
                # Pod IPs are reached directly, never through an HTTP(S)_PROXY.
                trust_env=False,
            )
        return self._session

    def _namespace(self, namespace: str, now: float) -> _NamespacePodMetrics:
        listing = self._namespaces.get(namespace)
        if listing is None:
            listing = self._namespaces[namespace] = _NamespacePodMetrics(now)
        listing.used = now
        api_believed_absent = (
            self._api_absent_since is not None
            and now - self._api_absent_since < self._discovery_interval
        )
        if (
            listing.task is None
            and not api_believed_absent
            and now - listing.attempted >= self._resource_interval
        ):
            listing.task = asyncio.create_task(self._list_pod_metrics(namespace, listing))
        return listing

    async def _list_pod_metrics(self, namespace: str, listing: _NamespacePodMetrics) -> None:
        listing.attempted = self._clock()
        try:
            async with asyncio.timeout(self._request_timeout):
                objects = [obj async for obj in self._client.list(PodMetrics, namespace=namespace)]
        except TimeoutError:
            listing.error = f"listing PodMetrics took over {self._request_timeout:g}s"
        except httpx2.HTTPStatusError as error:
            code = error.response.status_code
            if code == 404:
                # The list is the discovery: 404 means no metrics.k8s.io (no metrics-server).
                self._api_absent_since = self._clock()
                listing.usages, listing.invalid = {}, {}
                listing.error = None
            elif code == 403:
                listing.error = (
                    "listing metrics.k8s.io PodMetrics is forbidden: the operator's role needs "
                    "list on pods.metrics.k8s.io"
                )
            else:
                message = error.status.message if isinstance(error, ApiError) else str(error)
                listing.error = f"listing PodMetrics failed (HTTP {code}): {message}"
        except httpx2.HTTPError as error:
            listing.error = f"cannot list PodMetrics: {error or type(error).__name__}"
        else:
            self._api_absent_since = None
            listing.usages, listing.invalid = {}, {}
            for obj in objects:
                name = obj["metadata"]["name"]
                try:
                    listing.usages[name] = pod_usage(obj)
                except ValueError as error:
                    listing.invalid[name] = str(error)
            listing.error = None
        finally:
            listing.listed = True
            listing.task = None

    def _pod_metrics_note(self, listing: _NamespacePodMetrics | None) -> str | None:
        if self._api_absent_since is not None:
            return "metrics.k8s.io PodMetrics is not served"
        return None if listing is None else listing.error

    # --- assembling ------------------------------------------------------------------------------

    def _member_stats(
        self,
        namespace: str,
        pods: Sequence[WorkerPod],
        spec: MetricsSpec,
        readings: _Readings,
        grain_types: Collection[str] | None,
        now: float,
    ) -> tuple[dict[str, TableStats], int]:
        """Fold new samples into each pod's Kalman state, then pick per figure the source this
        spec allows (PodMetrics first); returns the stats and how many used PodMetrics."""
        stats: dict[str, TableStats] = {}
        from_pod_metrics = 0
        for pod in pods:
            key = (namespace, pod.name, pod.uid)
            smoothers = self._smoothers.get(key)
            if smoothers is None:
                smoothers = self._smoothers[key] = _PodSmoothers(now)
            smoothers.used = now
            usage = readings.usages.get(pod.name)
            worker, sample = readings.workers.get(pod.name, (None, 0))
            if usage is not None:
                _fold_pod_metrics(smoothers, pod.resources, usage)
            if worker is not None and sample != smoothers.worker_sample:
                smoothers.worker_sample = sample
                smoothers.worker.update(
                    cpu_percent=worker.cpu_percent,
                    memory_bytes=worker.memory_usage_bytes,
                    available_bytes=worker.memory_available_bytes,
                )
            member_stats, used_pod_metrics = _combine(pod, smoothers, usage, worker, grain_types)
            if member_stats is not None:
                stats[pod.name] = member_stats
                from_pod_metrics += used_pod_metrics
        return stats, from_pod_metrics

    def _pod_metrics_part(
        self, spec: MetricsSpec, readings: _Readings, used: int, total: int
    ) -> str:
        if not spec.pod_metrics:
            return ""
        if readings.pod_metrics_note:
            return readings.pod_metrics_note
        return f"CPU and memory from PodMetrics for {used}/{total} pods"

    def _prune(self, now: float) -> None:
        if now - self._pruned < min(self._idle_ttl, 60.0):
            return
        self._pruned = now
        _evict_idle(self._targets, now, self._idle_ttl)
        _evict_idle(self._namespaces, now, self._idle_ttl)
        _evict_idle(self._smoothers, now, self._idle_ttl)
        for key in [k for k, (_, used) in self._sets.items() if now - used > self._idle_ttl]:
            del self._sets[key]


class _Entry(Protocol):
    used: float


_Key = TypeVar("_Key")
_E = TypeVar("_E", bound=_Entry)


def _evict_idle(table: dict[_Key, _E], now: float, ttl: float) -> None:
    """Drop the entries unused for longer than `ttl`, cancelling their scrape or listing."""
    for key in [k for k, v in table.items() if now - v.used > ttl]:
        task = getattr(table.pop(key), "task", None)
        if task is not None:
            task.cancel()


class _ScrapeError(Exception):
    pass


def scrape_url(pod: WorkerPod, scrape: ScrapeSpec) -> str:
    """`http://<pod IP>:<port><path>`; ValueError says why a pod cannot be scraped."""
    if not pod.ip:
        raise ValueError("no pod IP yet")
    port = scrape.port
    if isinstance(port, str):
        if port not in pod.ports:
            raise ValueError(f"no container port named {port!r}")
        port = pod.ports[port]
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"http://{host}:{port}{scrape.path}"


def _fold_pod_metrics(
    smoothers: _PodSmoothers, resources: PodResources, usage: ResourceUsage
) -> None:
    sample = (usage.timestamp, usage.cpu_cores, usage.memory_bytes)
    if sample == smoothers.pod_sample:
        return
    smoothers.pod_sample = sample
    capacity = resources.cpu_capacity_cores
    limit = resources.memory_limit_bytes
    smoothers.pod.update(
        cpu_percent=None if not capacity else 100.0 * usage.cpu_cores / capacity,
        memory_bytes=usage.memory_bytes,
        available_bytes=None if limit is None else max(limit - usage.memory_bytes, 0),
    )


def _combine(
    pod: WorkerPod,
    smoothers: _PodSmoothers,
    usage: ResourceUsage | None,
    worker: WorkerReport | None,
    grain_types: Collection[str] | None,
) -> tuple[TableStats | None, bool]:
    """One pod's TableStats from its smoothed figures; PodMetrics (measured by the platform)
    wins over what the worker says about itself, figure by figure."""
    pod_source = smoothers.pod if usage is not None else None
    worker_source = smoothers.worker if worker is not None else None

    def pick(figure: str) -> tuple[float | None, bool]:
        for source, is_pod in ((pod_source, True), (worker_source, False)):
            value = None if source is None else getattr(source, figure)
            if value is not None:
                return value, is_pod
        return None, False

    cpu, cpu_from_pod = pick("cpu_percent")
    memory, memory_from_pod = pick("memory_bytes")
    if cpu is None and memory is None and worker is None:
        return None, False
    limit = pod.resources.memory_limit_bytes
    if limit is None and worker is not None:
        limit = worker.memory_max_available_bytes
    available, _ = pick("available_bytes")
    if available is None and limit is not None and memory is not None:
        available = max(limit - memory, 0.0)
    activations = 0
    if worker is not None:
        activations = sum(
            count
            for grain_type, count in worker.activations.items()
            if grain_types is None or grain_type in grain_types
        )
    cpu_limit = pod.resources.cpu_limit_cores
    cpu_count = (worker.cpu_count if worker else None) or (math.ceil(cpu_limit) if cpu_limit else 1)
    stats = TableStats(
        cpu_usage=max(cpu or 0.0, 0.0),
        memory_usage=100.0 * memory / limit if memory is not None and limit else 0.0,
        available_memory=round(available or 0),
        max_available_memory=limit or 0,
        activation_count=activations,
        cpu_count=max(cpu_count, 1),
        overloaded=bool(worker and worker.overloaded),
    )
    return stats, cpu_from_pod or memory_from_pod


def _source(*, worker: bool, pod_metrics: bool) -> MetricsSource:
    if worker and pod_metrics:
        return MetricsSource.POD_METRICS_AND_WORKER_LOAD
    if worker:
        return MetricsSource.WORKER_LOAD
    return MetricsSource.POD_METRICS if pod_metrics else MetricsSource.COUNTS


def _problems_part(problems: Mapping[str, str]) -> str:
    if not problems:
        return ""
    listed = sorted(problems.items())[:_MAX_LISTED_PROBLEMS]
    text = "; ".join(f"{pod}: {why}" for pod, why in listed)
    more = len(problems) - len(listed)
    return f" ({text}{f'; and {more} more pods' if more else ''})"


__all__ = ["LoadCollector", "LoadReport", "PodMetrics", "scrape_url"]
