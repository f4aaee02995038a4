"""The metrics collector against the real API server and real worker processes: PodMetrics read
through metrics.k8s.io (served by the test CRD), the API's absence noticed and its arrival
discovered, and worker pages scraped from process pods on their own pod IPs and smoothed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.core_v1 import PodStatus
from lightkube.resources.core_v1 import Pod

from apportion.api.common import MetricsSpec
from apportion.api.placement_table import TableStats
from apportion.api.pods import WorkerPod
from apportion.api.unitset import MetricsSource
from apportion.api.worker_report import WorkerReport
from apportion.controllers.load_collector import LoadCollector
from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.net import free_port
from tests.support.metrics import (
    install_pod_metrics_api,
    metrics_server_pod,
    pod_metrics_api,  # noqa: F401 (fixture)
    publish_pod_metrics,
    remove_pod_metrics_api,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

MiB = 1 << 20


@pytest.fixture
async def client(dev_cluster: DevCluster) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(config=KubeConfig.from_file(dev_cluster.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


async def eventually(check: Callable[[], Any], timeout: float, message: str) -> Any:
    """Await `check()` (sync or async) every 0.2 s until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout:.0f}s: {message}")
        await asyncio.sleep(0.2)


async def ready_pods(client: AsyncClient, namespace: str, *names: str) -> list[WorkerPod]:
    """WorkerPods of `names` once every one is Ready with an IP, read as a controller would."""

    async def check() -> list[WorkerPod] | None:
        pods = [await client.get(Pod, name, namespace=namespace) for name in names]
        for pod in pods:
            status = pod.status or PodStatus()
            ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
            if not (ready and status.podIP):
                return None
        return [WorkerPod.from_body(pod.to_dict()) for pod in pods]

    return await eventually(check, 60, f"pods {names} never became Ready")


def simulated_pod(name: str, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "worker:1"}
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "w"}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def apply(kubectl: Callable[..., Any], namespace: str, *objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))


LIMITED = {"limits": {"cpu": "500m", "memory": "256Mi"}}
POD_METRICS_ONLY = MetricsSpec()  # podMetrics defaults to true; no scrape


async def test_pod_metrics_are_read_through_the_api_and_smoothed(
    pod_metrics_api: None,  # noqa: F811
    kubectl: Callable[..., Any],
    namespace: str,
    client: AsyncClient,
) -> None:
    apply(kubectl, namespace, simulated_pod("w-0", LIMITED), simulated_pod("w-1"))
    pods = await ready_pods(client, namespace, "w-0", "w-1")
    # metrics-server's forms: nanocores and kibibytes.
    publish_pod_metrics(kubectl, namespace, "w-0", cpu="250000000n", memory=f"{128 * 1024}Ki")
    publish_pod_metrics(
        kubectl, namespace, "w-1", containers={"app": ("100m", "64Mi"), "sidecar": ("5m", "1Mi")}
    )
    collector = LoadCollector(client, resource_interval=0.2)
    try:
        report = await collector.member_stats(namespace, pods, POD_METRICS_ONLY)
        assert report.source is MetricsSource.POD_METRICS
        assert report.message == (
            "no activation counts: spec.metrics.scrape is not set; "
            "CPU and memory from PodMetrics for 2/2 pods"
        )
        assert report.member_stats["w-0"] == TableStats(
            cpu_usage=50.0,  # 250m of a 500m limit
            memory_usage=50.0,
            available_memory=128 * MiB,
            max_available_memory=256 * MiB,
            cpu_count=1,
        )
        # No limits: CPU has nothing to be a percentage of, memory no maximum.
        assert report.member_stats["w-1"] == TableStats(cpu_usage=0.0, memory_usage=0.0)

        async def cpu_of_w0(accept: Callable[[float], bool]) -> float | None:
            report = await collector.member_stats(namespace, pods, POD_METRICS_ONLY)
            cpu = report.member_stats["w-0"].cpu_usage
            return cpu if accept(cpu) else None

        publish_pod_metrics(kubectl, namespace, "w-0", cpu="100m", memory="128Mi")
        declined = await eventually(
            lambda: cpu_of_w0(lambda cpu: cpu < 50.0), 10, "the new sample was never read"
        )
        assert 20.0 < declined < 50.0  # a decline is trusted gradually
        publish_pod_metrics(kubectl, namespace, "w-0", cpu="400m", memory="128Mi")
        await eventually(
            lambda: cpu_of_w0(lambda cpu: cpu == pytest.approx(80.0)),
            10,
            "a rise to 80% was not followed at once",
        )
    finally:
        await collector.close()


async def test_the_collector_notices_metrics_k8s_io_going_and_coming(
    dev_cluster: DevCluster,
    kubectl: Callable[..., Any],
    namespace: str,
    client: AsyncClient,
    wait_for: Callable[..., Any],
) -> None:
    apply(kubectl, namespace, simulated_pod("w-0", LIMITED))
    pods = await ready_pods(client, namespace, "w-0")
    remove_pod_metrics_api(dev_cluster, wait_for)
    collector = LoadCollector(client, resource_interval=0.2, discovery_interval=1.0)
    try:
        report = await collector.member_stats(namespace, pods, POD_METRICS_ONLY)
        assert report.source is MetricsSource.COUNTS
        assert report.member_stats == {}
        assert report.message == (
            "no activation counts: spec.metrics.scrape is not set; "
            "metrics.k8s.io PodMetrics is not served: no member has statistics"
        )
        install_pod_metrics_api(dev_cluster, wait_for)  # as if metrics-server were installed
        publish_pod_metrics(kubectl, namespace, "w-0", cpu="50m", memory="64Mi")

        async def discovered() -> TableStats | None:
            report = await collector.member_stats(namespace, pods, POD_METRICS_ONLY)
            return report.member_stats.get("w-0")

        stats = await eventually(discovered, 15, "PodMetrics were not discovered")
        assert (stats.cpu_usage, stats.memory_usage) == (10.0, 25.0)
    finally:
        await collector.close()
        install_pod_metrics_api(dev_cluster, wait_for)


def scrapes(dev_cluster: DevCluster, namespace: str, pod: str) -> int:
    log = dev_cluster.pod_log_path(namespace, pod)
    return log.read_text().count('"GET /metrics ') if log.exists() else 0


async def test_worker_pages_are_scraped_on_pod_ips_shared_and_smoothed(
    dev_cluster: DevCluster,
    kubectl: Callable[..., Any],
    namespace: str,
    client: AsyncClient,
    tmp_path: Path,
) -> None:
    port = free_port()  # every pod has its own IP: all of them can use the same port
    pages = {name: tmp_path / name for name in ("m-0", "m-1")}
    for directory in pages.values():
        directory.mkdir()
    (pages["m-0"] / "metrics").write_text(
        WorkerReport(
            unit_loads={"orders": {"0": 2.0, "1": 1.0}, "billing": {"7": 3.0}},
            activations={"Cart": 5, "User": 1},
            cpu_percent=10.0,
            memory_usage_bytes=64 * MiB,
            memory_max_available_bytes=512 * MiB,
        ).render()
    )
    (pages["m-1"] / "metrics").write_text(
        WorkerReport(unit_loads={"orders": {"2": 4.0}}, activations={"Cart": 7}).render()
    )
    silent = simulated_pod("m-2")  # declares the port, but nothing listens there
    silent["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port}]
    apply(
        kubectl,
        namespace,
        metrics_server_pod("m-0", pages["m-0"], port),
        metrics_server_pod("m-1", pages["m-1"], port),
        silent,
    )
    pods = await ready_pods(client, namespace, "m-0", "m-1", "m-2")
    spec = MetricsSpec.model_validate(
        {
            "podMetrics": False,
            "scrape": {"port": "metrics", "interval": "1s", "timeout": "1s"},
            "smoothing": {"halfLife": "2s"},
        }
    )
    collector = LoadCollector(client)
    try:
        orders = await collector.unit_loads(namespace, "orders", pods, spec)
        assert orders.unit_loads == {"0": 2.0, "1": 1.0, "2": 4.0}
        assert orders.source is MetricsSource.WORKER_LOAD
        silent_url = f"http://{pods[2].ip}:{port}/metrics"
        assert orders.problems["m-2"].startswith(f"cannot scrape {silent_url}: ")
        assert orders.message.startswith(
            f"per-unit load from 2/3 pods (half-life 2s) (m-2: cannot scrape {silent_url}: "
        )
        grains = await collector.member_stats(namespace, pods, spec, grain_types=["Cart"])
        assert grains.member_stats["m-0"] == TableStats(
            cpu_usage=10.0,
            memory_usage=12.5,
            available_memory=448 * MiB,
            max_available_memory=512 * MiB,
            activation_count=5,
        )
        assert grains.member_stats["m-1"].activation_count == 7
        assert "m-2" not in grains.member_stats

        # Unit 0 gets hot; three consumers ask four times a second while it is smoothed in.
        (pages["m-0"] / "metrics").write_text(
            WorkerReport(unit_loads={"orders": {"0": 10.0, "1": 1.0}}).render()
        )
        before = scrapes(dev_cluster, namespace, "m-0")
        seen: list[float] = []
        while not seen or seen[-1] < 9.5:
            assert len(seen) < 600, f"unit 0 never reached 9.5: {seen}"
            report, *_ = await asyncio.gather(
                collector.unit_loads(namespace, "orders", pods, spec),
                collector.unit_loads(namespace, "billing", pods, spec),
                collector.member_stats(namespace, pods, spec),
            )
            assert report.unit_loads is not None, report.message
            seen.append(report.unit_loads["0"])
            await asyncio.sleep(0.25)
        assert seen == sorted(seen), f"the average went back: {seen}"
        assert any(2.5 < load < 9.0 for load in seen), f"no smoothing visible: {seen}"
        served = scrapes(dev_cluster, namespace, "m-0") - before
        # One scrape per interval for all three consumers: each round of three requests makes
        # at most one (each consumer alone would make one per round), and the value rose, so
        # there were at least two.
        assert 2 <= served <= len(seen), f"{served} scrapes for {len(seen)} rounds"
    finally:
        await collector.close()


async def test_a_forbidden_pod_metrics_list_is_explained(
    pod_metrics_api: None,  # noqa: F811
    dev_cluster: DevCluster,
    kubectl: Callable[..., Any],
    namespace: str,
    client: AsyncClient,
) -> None:
    """An operator whose role lacks pods.metrics.k8s.io is told so, not left guessing."""
    apply(kubectl, namespace, simulated_pod("w-0", LIMITED))
    pods = await ready_pods(client, namespace, "w-0")
    publish_pod_metrics(kubectl, namespace, "w-0", cpu="50m", memory="64Mi")
    kubectl("create", "serviceaccount", "no-metrics", "-n", namespace)
    token = kubectl("create", "token", "no-metrics", "-n", namespace).stdout.strip()
    config = KubeConfig.from_dict(
        {
            "current-context": "sa",
            "clusters": [
                {
                    "name": "dev",
                    "cluster": {
                        "server": dev_cluster.server,
                        "certificate-authority": str(dev_cluster.ca_file),
                    },
                }
            ],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "sa"}}],
        }
    )
    unprivileged = AsyncClient(config=config)
    collector = LoadCollector(unprivileged)
    try:
        report = await collector.member_stats(namespace, pods, POD_METRICS_ONLY)
    finally:
        await collector.close()
        await unprivileged.close()
    assert report.source is MetricsSource.COUNTS
    assert report.message == (
        "no activation counts: spec.metrics.scrape is not set; listing metrics.k8s.io "
        "PodMetrics is forbidden: the operator's role needs list on pods.metrics.k8s.io: "
        "no member has statistics"
    )
