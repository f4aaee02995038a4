"""The serving lease's figures on a dev-cluster (docs/handoff.md, "Cut off or paused"; figures,
not asserts).

1. Cost of the confirmations: N workers' confirmation loops (the real
   `AssignmentWatch.confirm`, a GET of the root ConfigMap of a 1000-shard table) every quarter
   of a 20 s lease, in one process against the API server: requests per second achieved, GET
   latency p50/p99, and the API server's CPU per 100 confirmations per second, extrapolated to
   1000 workers.
2. Cut to stop, and back: a real `Worker` with a 2 s lease; the API server is SIGSTOPped (its
   connections hang, as behind a dropped route) at a random moment; time from the cut until the
   worker stops serving (the lease's bound: at most the lease, at least 3/4 of it), and from
   SIGCONT until it serves again. Repeated; median and max.

Run: .venv/bin/python -m bench.bench_serving_lease [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import time
from pathlib import Path

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod

from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    ResourceRef,
    UnitState,
    assignment_config_map,
    encode_assignment,
)
from apportion.publishing.client import decode
from apportion.worker._lease import RENEWALS_PER_LEASE, boot_clock
from apportion.worker._watch import AssignmentWatch
from apportion.worker._worker import Worker, WorkerOptions
from apportion_dev.devcluster import DevCluster

NAMESPACE = "lease-bench"
SET = "bench"
DEFAULT_LEASE = 20.0  # handoffTimeout 60 s / 3


def table(lease: float, members: int = 10, units: int = 1000) -> AssignmentTable:
    ref = ResourceRef("ShardSet", NAMESPACE, SET, "bench-uid")
    pods = tuple(Incarnation(f"w-{i}", f"uid-{i}") for i in range(members))
    owned = {str(u): UnitState(pods[u % members].name, 1) for u in range(units)}
    return AssignmentTable(ref, 1, "akka", units, 1, pods, owned, serving_lease=lease)


async def publish(client: AsyncClient, t: AssignmentTable) -> None:
    name = assignment_config_map("ShardSet", SET)
    for part in encode_assignment(t):
        body = decode(
            ConfigMap,
            {"metadata": {"name": name + part.suffix, "namespace": NAMESPACE}, **part.body()},
        )
        await client.apply(body, field_manager="bench", force=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def confirmations(client: AsyncClient, workers: int, seconds: float, api: int) -> float:
    interval = DEFAULT_LEASE / RENEWALS_PER_LEASE
    latencies: list[float] = []
    name = assignment_config_map("ShardSet", SET)

    async def one() -> None:
        watch = AssignmentWatch(client, NAMESPACE, name, lambda t: None)
        await asyncio.sleep(random.uniform(0, interval))  # workers are not in step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent = time.monotonic()
            assert await watch.confirm()
            latencies.append(time.monotonic() - sent)
            await asyncio.sleep(max(0.0, sent + interval - time.monotonic()))

    cpu = cpu_seconds(api)
    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(workers)))
    elapsed = time.monotonic() - started
    used = cpu_seconds(api) - cpu
    rate = len(latencies) / elapsed
    latencies.sort()
    per_100 = used / elapsed / rate * 100
    print(
        f"{workers:>5} workers | {rate:7.1f} GET/s"
        f" | p50 {latencies[len(latencies) // 2] * 1000:6.1f} ms"
        f" | p99 {latencies[int(len(latencies) * 0.99)] * 1000:6.1f} ms"
        f" | API server {used / elapsed:5.2f} CPU | {per_100:5.2f} CPU per 100 GET/s"
    )
    return per_100


async def cut_and_back(client: AsyncClient, api: int, rounds: int) -> None:
    lease = 2.0
    await publish(client, table(lease, members=1, units=8))
    pod = decode(
        Pod,
        {
            "metadata": {"name": "w-0", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "w", "image": "none"}], "nodeName": "nowhere"},
        },
    )
    await client.apply(pod, field_manager="bench", force=True)
    stops: list[float] = []
    backs: list[float] = []
    worker = Worker(
        "ShardSet",
        SET,
        options=WorkerOptions(handle_signals=False),
        namespace=NAMESPACE,
        pod_name="w-0",
        client=client,
    )
    await worker.start()
    try:
        for _ in range(rounds):
            while not worker.serving:
                await asyncio.sleep(0.01)
            await asyncio.sleep(random.uniform(lease, 2 * lease))
            os.kill(api, signal.SIGSTOP)
            cut = boot_clock()
            try:
                while worker.serving:
                    await asyncio.sleep(0.005)
                stops.append(boot_clock() - cut)
                await asyncio.sleep(0.5)
            finally:
                os.kill(api, signal.SIGCONT)
            back = boot_clock()
            while not worker.serving:
                await asyncio.sleep(0.005)
            backs.append(boot_clock() - back)
    finally:
        await worker.close()
    print(
        f"lease {lease:.0f} s, {rounds} cuts"
        f" | cut → stopped: median {statistics.median(stops):.2f} s,"
        f" min {min(stops):.2f} s, max {max(stops):.2f} s"
        f" (bound: {lease * 0.75:.1f} to {lease:.1f} s)"
        f" | API back → serving: median {statistics.median(backs):.2f} s, max {max(backs):.2f} s"
    )


async def main(quick: bool) -> None:
    cluster = DevCluster.start()
    try:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        api = cluster.pid("kube-apiserver")
        client = AsyncClient()
        await client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        await publish(client, table(DEFAULT_LEASE))
        print(
            f"confirmations: one GET per {DEFAULT_LEASE / RENEWALS_PER_LEASE:.0f} s per worker "
            f"({RENEWALS_PER_LEASE / DEFAULT_LEASE:.2f} GET/s; 1000 workers: "
            f"{1000 * RENEWALS_PER_LEASE / DEFAULT_LEASE:.0f} GET/s)"
        )
        sizes = [50, 200] if quick else [50, 200, 500]
        figures = [await confirmations(client, n, 15 if quick else 30, api) for n in sizes]
        rate_1000 = 1000 * RENEWALS_PER_LEASE / DEFAULT_LEASE
        print(
            f"extrapolated: 1000 workers cost the API server about "
            f"{max(figures) * rate_1000 / 100:.2f} CPU cores"
        )
        await cut_and_back(client, api, 5 if quick else 20)
        await client.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
