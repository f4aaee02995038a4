"""The collector's scraping, caching, smoothing and reporting against real HTTP servers on
loopback (PodMetrics through the API server are covered in tests/e2e/test_metrics.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from lightkube import AsyncClient, KubeConfig

from apportion.api.common import MetricsSpec
from apportion.api.placement_table import TableStats
from apportion.api.pods import WorkerPod
from apportion.api.resource_metrics import PodResources
from apportion.api.unitset import MetricsSource
from apportion.api.worker_report import WorkerReport
from apportion.controllers.load_collector import LoadCollector, scrape_url
from tests.support.loopback import serve
from tests.support.present import present

# Fixtures run on the session loop (pyproject's asyncio_default_fixture_loop_scope): so do these.
pytestmark = pytest.mark.asyncio(loop_scope="session")


class Worker:
    """A worker's metrics endpoint: serves `page`, counts requests, can fail or hang."""

    def __init__(self) -> None:
        self.page = ""
        self.status = 200
        self.requests = 0
        self.hold: asyncio.Event | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.hold is not None:
            await self.hold.wait()
        return web.Response(text=self.page, status=self.status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self._runner, self.port = await serve(app)

    async def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def pod(self, name: str, **kwargs: Any) -> WorkerPod:
        return WorkerPod(
            name, f"uid-{name}", ip="127.0.0.1", ports={"metrics": self.port}, **kwargs
        )


@pytest.fixture
async def workers() -> AsyncIterator[Callable[[], Worker]]:
    started: list[Worker] = []

    async def make() -> Worker:
        worker = Worker()
        await worker.start()
        started.append(worker)
        return worker

    yield make  # type: ignore[misc]
    for worker in started:
        await worker.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def collector(clock: Clock) -> AsyncIterator[LoadCollector]:
    async with collector_with(clock) as collector:
        yield collector


@contextlib.asynccontextmanager
async def collector_with(clock: Clock, **settings: object) -> AsyncIterator[LoadCollector]:
    # PodMetrics are off in these specs: the client is never used.
    config = KubeConfig.from_dict(
        {
            "current-context": "unused",
            "clusters": [{"name": "unused", "cluster": {"server": "https://127.0.0.1:9"}}],
            "users": [{"name": "unused", "user": {"token": "unused"}}],
            "contexts": [{"name": "unused", "context": {"cluster": "unused", "user": "unused"}}],
        }
    )
    client = AsyncClient(config=config)
    collector = LoadCollector(client, clock=clock, **settings)  # type: ignore[arg-type]
    try:
        yield collector
    finally:
        await collector.close()
        await client.close()


def spec(half_life: str = "10s", **scrape: object) -> MetricsSpec:
    return MetricsSpec.model_validate(
        {
            "podMetrics": False,
            "scrape": {"port": "metrics", "interval": "1s", "timeout": "1s", **scrape},
            "smoothing": {"halfLife": half_life},
        }
    )


def page(loads: dict[str, float], **kwargs: object) -> str:
    return WorkerReport(unit_loads={"orders": loads}, **kwargs).render()  # type: ignore[arg-type]


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def scraped(collector: LoadCollector, *workers: Worker, requests: int) -> None:
    """Until every worker has answered `requests` scrapes and the collector has read them."""
    await until(lambda: all(w.requests >= requests for w in workers))
    await until(lambda: all(t.task is None for t in collector._targets.values()))


async def test_unit_loads_are_summed_over_pods_and_smoothed(
    workers: Callable, collector: LoadCollector, clock: Clock
) -> None:
    a, b = await workers(), await workers()
    a.page = page({"0": 2.0, "1": 1.0})
    b.page = page({"1": 3.0, "2": 5.0})  # unit 1 mid hand-off: both report a share
    pods = [a.pod("w-0"), b.pod("w-1")]

    smoothed = spec(half_life="2s")
    first = await collector.unit_loads("ns", "orders", pods, smoothed)
    assert first.unit_loads == {"0": 2.0, "1": 4.0, "2": 5.0}
    assert first.source is MetricsSource.WORKER_LOAD
    assert first.message == "per-unit load from 2/2 pods (half-life 2s)"
    assert first.problems == {}

    a.page = page({"0": 10.0, "1": 1.0})
    clock.now += 1.0  # due: this call starts the scrape and answers from the last reading
    assert (await collector.unit_loads("ns", "orders", pods, smoothed)).unit_loads == {
        "0": 2.0,
        "1": 4.0,
        "2": 5.0,
    }
    await scraped(collector, a, b, requests=2)
    clock.now += 2.0  # one half-life with the new reading held
    loads = (await collector.unit_loads("ns", "orders", pods, smoothed)).unit_loads
    assert loads == {"0": pytest.approx(6.0), "1": pytest.approx(4.0), "2": pytest.approx(5.0)}


async def test_pods_shared_by_several_resources_are_scraped_once(
    workers: Callable, collector: LoadCollector
) -> None:
    w = await workers()
    w.page = WorkerReport(
        unit_loads={"orders": {"0": 1.0}, "billing": {"3": 2.0}}, activations={"Cart": 4}
    ).render()
    pods = [w.pod("w-0")]
    orders, billing, grains = await asyncio.gather(
        collector.unit_loads("ns", "orders", pods, spec()),
        collector.unit_loads("ns", "billing", pods, spec()),
        collector.member_stats("ns", pods, spec()),
    )
    assert orders.unit_loads == {"0": 1.0}
    assert billing.unit_loads == {"3": 2.0}
    assert grains.member_stats["w-0"].activation_count == 4
    assert w.requests == 1


async def test_a_hung_pod_holds_up_only_its_first_reading(
    workers: Callable, collector: LoadCollector, clock: Clock
) -> None:
    w = await workers()
    w.page = page({"0": 1.0})
    pods = [w.pod("w-0")]
    await collector.unit_loads("ns", "orders", pods, spec())
    w.hold = asyncio.Event()
    clock.now += 1.0
    # The handler is blocked until `hold` is set; the calls return regardless.
    report = await collector.unit_loads("ns", "orders", pods, spec())
    await until(lambda: w.requests == 2)
    again = await collector.unit_loads("ns", "orders", pods, spec())
    assert report.unit_loads == again.unit_loads == {"0": 1.0}
    assert not w.hold.is_set()
    w.hold.set()


async def test_figures_go_stale_after_three_intervals_plus_the_timeout(
    workers: Callable, collector: LoadCollector, clock: Clock
) -> None:
    w = await workers()
    w.page = page({"0": 1.0})
    pods = [w.pod("w-0")]
    await collector.unit_loads("ns", "orders", pods, spec())
    w.status = 503
    clock.now += 3.0
    await collector.unit_loads("ns", "orders", pods, spec())  # starts a scrape that fails
    await scraped(collector, w, requests=2)
    still = await collector.unit_loads("ns", "orders", pods, spec())
    assert still.unit_loads == {"0": 1.0}  # 3 s old: still counts
    clock.now += 1.5
    gone = await collector.unit_loads("ns", "orders", pods, spec())
    assert gone.unit_loads is None
    assert gone.source is MetricsSource.COUNTS
    scrape = present(spec().scrape, "the scrape spec")
    assert gone.problems == {"w-0": f"HTTP 503 from {scrape_url(pods[0], scrape)}"}
    assert gone.message == (
        f"no per-unit load from any of 1 pods (w-0: HTTP 503 from "
        f"http://127.0.0.1:{w.port}/metrics): balancing unit counts"
    )


async def test_every_failure_is_named(workers: Callable, clock: Clock) -> None:
    ok, missing, invalid, big, slow = [await workers() for _ in range(5)]
    ok.page = page({"0": 1.0})
    missing.status = 404
    invalid.page = 'apportion_unit_load{set="orders",unit="1"} -3\n'
    big.page = "# padding\n" * 1000
    slow.hold = asyncio.Event()
    closed = await workers()
    await closed.stop()
    pods = [
        ok.pod("ok"),
        missing.pod("missing"),
        invalid.pod("invalid"),
        big.pod("big"),
        slow.pod("slow"),
        closed.pod("closed"),
        WorkerPod("pending", "uid-pending"),
        WorkerPod("unnamed", "uid-unnamed", ip="127.0.0.1"),
    ]
    async with collector_with(clock, max_page_bytes=5000) as collector:
        report = await collector.unit_loads("ns", "orders", pods, spec(timeout="200ms"))
    assert report.unit_loads == {"0": 1.0}
    assert report.source is MetricsSource.WORKER_LOAD
    problems = dict(report.problems)
    assert problems.pop("missing") == f"HTTP 404 from http://127.0.0.1:{missing.port}/metrics"
    assert problems.pop("invalid").startswith(
        f"invalid metrics from http://127.0.0.1:{invalid.port}/metrics: "
        'apportion_unit_load{set="orders",unit="1"} is -3.0: must be a finite number >= 0'
    )
    assert problems.pop("big") == "metrics page larger than 5000 bytes"
    assert (
        problems.pop("slow") == f"no answer from http://127.0.0.1:{slow.port}/metrics within 0.2s"
    )
    assert problems.pop("closed").startswith(
        f"cannot scrape http://127.0.0.1:{closed.port}/metrics"
    )
    assert problems == {"pending": "no pod IP yet", "unnamed": "no container port named 'metrics'"}
    assert report.message.startswith("per-unit load from 1/8 pods (half-life 10s) (big: ")
    assert report.message.endswith("; and 4 more pods)")


async def test_pods_without_units_of_the_set_are_fine_but_a_set_nobody_reports_is_not(
    workers: Callable, collector: LoadCollector
) -> None:
    owner, newcomer = await workers(), await workers()
    owner.page = page({"0": 1.0})
    newcomer.page = WorkerReport(cpu_percent=5.0).render()
    pods = [owner.pod("w-0"), newcomer.pod("w-1")]
    report = await collector.unit_loads("ns", "orders", pods, spec())
    assert report.unit_loads == {"0": 1.0}
    assert report.message == "per-unit load from 2/2 pods (half-life 10s)"
    other = await collector.unit_loads("ns", "billing", pods, spec())
    assert other.unit_loads is None
    assert other.message == (
        'no per-unit load: none of the 2 scraped pods reports apportion_unit_load{set="billing"}'
        ": balancing unit counts"
    )


async def test_member_stats_from_what_workers_report(
    workers: Callable, collector: LoadCollector, clock: Clock
) -> None:
    w = await workers()
    w.page = WorkerReport(
        activations={"Cart": 30, "User": 12, "Other": 1},
        cpu_percent=40.0,
        cpu_count=4,
        memory_usage_bytes=256 << 20,
        overloaded=True,
    ).render()
    limited = w.pod("limited", resources=PodResources(2.0, 1.0, 1 << 30))
    report = await collector.member_stats(
        "ns", [limited, w.pod("free")], spec(), grain_types={"Cart", "User"}
    )
    assert report.source is MetricsSource.WORKER_LOAD
    assert report.message == "worker figures from 2/2 pods"
    assert report.unit_loads is None
    assert report.member_stats["limited"] == TableStats(
        cpu_usage=40.0,
        memory_usage=25.0,
        available_memory=768 << 20,
        max_available_memory=1 << 30,
        activation_count=42,
        cpu_count=4,
        overloaded=True,
    )
    # Without a memory limit or a reported maximum, memory is unknown (max 0).
    assert report.member_stats["free"].max_available_memory == 0
    assert report.member_stats["free"].memory_usage == 0.0
    everything = await collector.member_stats("ns", [limited], spec())
    assert everything.member_stats["limited"].activation_count == 43


async def test_without_scrape_settings_nothing_is_read(collector: LoadCollector) -> None:
    report = await collector.unit_loads(
        "ns",
        "orders",
        [WorkerPod("w-0", "uid-w-0", ip="127.0.0.1")],
        MetricsSpec(pod_metrics=False),
    )
    assert report.unit_loads is None
    assert report.member_stats == {}
    assert report.source is MetricsSource.COUNTS
    assert report.message == (
        "no per-unit load: spec.metrics.scrape is not set: balancing unit counts"
    )
