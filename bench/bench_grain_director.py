"""Worker-library grain placement benchmarks (figures, not asserts).

1. Placements per second through `apportion.grains.PlacementDirector.place` per strategy, one
   core, 100 members: the whole worker-side call (table lookup by grain type, lock, engine
   strategy, per-member counter). Goal: >= 200k/s for the hash and count strategies.
2. API writes per minute per grain type at steady load, simulated: the pure steps of the
   operator's publishing pass (collector smoothing, table, gate, status) fed with member loads
   that wander within the hysteresis, beyond it, drift, and with a member leaving and coming
   back. A minute takes milliseconds. Goal: <= 6 writes/min when nothing changes beyond the
   hysteresis.
3. The same on a real control plane (`--cluster`, and without `--quick`): a dev-cluster, the
   operator as a process, eight demo workers as processes, one ActivationCountBased GrainType
   with the default publish policy; the ConfigMap and GrainType modifications are counted from
   watches over each phase: idle, a fixed population of activations, then activations churning
   (5/s per worker, 20 s lifetime: ~100 per worker, Poisson noise ~10 %).

Run: .venv/bin/python -m bench.bench_grain_director [--quick] [--cluster]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.present import present
from tests.support.unitset import WORKER_ACCOUNT, grant_worker_role

from apportion.api.graintype import GrainStrategySpec, LoadShedding, PlacementFilter
from apportion.api.placement_table import (
    GrainTypeRef,
    PlacementTableDocument,
    TableMember,
    TableStats,
)
from apportion.grains import PlacementDirector

STRATEGIES: dict[str, dict[str, Any]] = {
    "Random": {"name": "Random"},
    "PreferLocal": {"name": "PreferLocal"},
    "HashBased": {"name": "HashBased"},
    "ConsistentHashBased": {"name": "ConsistentHashBased"},
    "ActivationCountBased": {"name": "ActivationCountBased"},
    "ActivationCountBased+RequiredMatch": {"name": "ActivationCountBased"},
    "StatelessWorker": {"name": "StatelessWorker", "statelessWorker": {"maxLocal": 100000}},
    "SiloRoleBased": {"name": "SiloRoleBased", "siloRoleBased": {"role": "web"}},
    "ResourceOptimized": {"name": "ResourceOptimized"},
}


def table(strategy: dict, *, members: int = 100, filters=()) -> PlacementTableDocument:
    rng = random.Random(1)
    return PlacementTableDocument(
        grain_type=GrainTypeRef(namespace="bench", name="g", uid="uid"),
        grain_types=["Bench.Grain"],
        version=1,
        published_at=datetime.now(UTC),
        strategy=GrainStrategySpec.model_validate(strategy),
        filters=[PlacementFilter.model_validate(f) for f in filters],
        load_shedding=LoadShedding(),
        members=sorted(
            (
                TableMember(
                    name=f"w-{i:03d}",
                    labels={"zone": f"z{i % 3}", "apportion.dev/role": "web" if i % 2 else "job"},
                    stats=TableStats(
                        cpu_usage=rng.uniform(10, 80),
                        memory_usage=rng.uniform(10, 80),
                        available_memory=rng.randrange(1 << 30, 3 << 30),
                        max_available_memory=4 << 30,
                        activation_count=rng.randrange(50, 150),
                        cpu_count=4,
                    ),
                )
                for i in range(members)
            ),
            key=lambda m: m.name,
        ),
    )


def placements_per_second(seconds: float) -> None:
    print("1. placements/s through PlacementDirector.place, one core, 100 members")
    print(f"   {'strategy':<36} {'placements/s':>14} {'ns/placement':>13}")
    ids = [f"grain/{i}" for i in range(100_000)]
    for label, strategy in STRATEGIES.items():
        filters = [{"type": "RequiredMatch", "keys": ["zone"]}] if "RequiredMatch" in label else []
        director = PlacementDirector.from_documents(
            [table(strategy, filters=filters)], "w-001", rng=random.Random(2)
        )
        place = director.place
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for grain_id in ids[:10_000]:
                place("Bench.Grain", grain_id)
            n += 10_000
        rate = n / (time.perf_counter() - start)
        print(f"   {label:<36} {rate:>14,.0f} {1e9 / rate:>13,.0f}")


# --- writes per minute -------------------------------------------------------------------


def _graintype():
    from apportion.api.graintype import GrainType

    return GrainType.from_raw(
        {
            "apiVersion": "apportion.dev/v1alpha1",
            "kind": "GrainType",
            "metadata": {"name": "g", "namespace": "bench", "uid": "uid", "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"app": "silo"}},
                "strategy": {"name": "ActivationCountBased"},
                "publish": {"interval": "1s", "minInterval": "2s", "hysteresisPercent": 5},
            },
        }
    )


SCENARIOS = {
    # name: (description, cpu noise sd, activation noise sd as a fraction, cpu drift per s,
    #        seconds between a member leaving and coming back)
    "steady": ("CPU 40 % sd 1, 200 activations sd 1 %", 1.0, 0.01, 0.0, None),
    "busy steady": ("CPU 40 % sd 3, 200 activations sd 2 %", 3.0, 0.02, 0.0, None),
    "drifting CPU": ("CPU +0.2 points/s, 200 activations sd 1 %", 1.0, 0.01, 0.2, None),
    "churning activations": ("200 activations sd 7 % (Poisson)", 1.0, 0.07, 0.0, None),
    "membership churn": ("steady, a member leaves/returns every 20 s", 1.0, 0.01, 0.0, 20.0),
}


def simulate_publishing(scenario: str, *, minutes: float, seed: int) -> tuple[float, float]:
    """Table and status writes per minute of one GrainType's publishing passes (the pure steps
    `GrainTypeLoop.reconcile` runs: collector smoothing, table, gate, status), one pass per
    publish interval, 8 members scraped every second."""
    from apportion.api.placement_table import TableStats
    from apportion.api.pods import WorkerPod
    from apportion.engine.grains.document import build_document
    from apportion.engine.grains.gate import PublishGate
    from apportion.engine.grains.status import build_status, problems
    from apportion.engine.smoothing import ResourceSmoother

    _, cpu_sd, count_sd, drift, churn = SCENARIOS[scenario]
    rng = random.Random(seed)
    graintype = _graintype()
    publish = graintype.spec.publish
    pods = [
        WorkerPod(name=f"w-{i}", uid=f"u-{i}", labels={"app": "silo"}, ip=f"10.0.0.{i}")
        for i in range(8)
    ]
    smoothers = {p.name: ResourceSmoother() for p in pods}
    gate = PublishGate()
    status: dict | None = None
    table_writes = status_writes = 0
    seconds = int(minutes * 60)
    for t in range(seconds):
        away = churn is not None and (t // churn) % 2 == 1
        members = pods[:-1] if away else pods
        stats = {}
        for pod in members:
            smoother = smoothers[pod.name]
            smoother.update(
                cpu_percent=40 + drift * t + rng.gauss(0, cpu_sd),
                memory_bytes=(1 << 30) * (1 + rng.gauss(0, 0.005)),
            )
            stats[pod.name] = TableStats(
                cpu_usage=present(smoother.cpu_percent, "cpu"),
                memory_usage=100 * present(smoother.memory_bytes, "memory") / (4 << 30),
                available_memory=round((4 << 30) - present(smoother.memory_bytes, "memory")),
                max_available_memory=4 << 30,
                activation_count=max(0, round(rng.gauss(200, 200 * count_sd))),
                cpu_count=4,
            )
        candidate = build_document(
            graintype, members, stats, version=gate.next_version, now=datetime.now(UTC)
        )
        decision = gate.consider(
            candidate,
            float(t),
            min_interval=publish.min_interval.total_seconds(),
            hysteresis_percent=publish.hysteresis_percent,
        )
        if decision.write:
            gate.written(candidate, float(t))
            table_writes += 1
        found = problems(graintype, members, gate.published)
        new_status = build_status(
            graintype,
            members,
            gate.published,
            found,
            conditions=(status or {}).get("conditions", []),
            now=datetime.now(UTC),
            last_publish_time=f"t={gate.last_write}",
        )
        if new_status != status:
            status = new_status
            status_writes += 1
    # The first minute includes the first table and the Kalman filters settling.
    return table_writes / minutes, status_writes / minutes


def writes_per_minute(minutes: float) -> None:
    print()
    print("2. placement-table writes per minute per grain type: publish interval 1s,")
    print("   minInterval 2s, hysteresis 5 %; 8 members; simulated time, first table included")
    print(f"   {'scenario':<22} {'load':<44} {'table/min':>9} {'status/min':>10}")
    for name, (description, *_) in SCENARIOS.items():
        table, status = simulate_publishing(name, minutes=minutes, seed=3)
        print(f"   {name:<22} {description:<44} {table:>9.1f} {status:>10.1f}")


# --- writes per minute on a real control plane ------------------------------------------------


def _worker_pod(name: str, port: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "grains"},
            "annotations": {"apportion.dev/simulate": "process"},
        },
        "spec": {
            "serviceAccountName": WORKER_ACCOUNT,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "worker",
                    "image": "apportion:dev",
                    "command": [
                        sys.executable,
                        "-m",
                        "apportion",
                        "demo-worker",
                        "--grains",
                        "--port",
                        str(port),
                    ],
                    "ports": [{"name": "http", "containerPort": port}],
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


class _Modifications:
    """Counts MODIFIED events of one object from a watch running in a thread."""

    def __init__(self, client, resource, name: str, namespace: str) -> None:
        import threading

        self.count = 0
        version = client.get(resource, name, namespace=namespace).metadata.resourceVersion
        events = client.watch(
            resource, namespace=namespace, fields={"metadata.name": name}, resource_version=version
        )

        def run() -> None:
            try:
                for event, _ in events:
                    if event == "MODIFIED":
                        self.count += 1
            except Exception:  # the dev-cluster stopped under the watch: the count is taken
                return

        threading.Thread(target=run, daemon=True).start()

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def cluster_writes(minutes: float) -> None:
    import json
    import subprocess
    import tempfile
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import yaml
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import ConfigMap

    from apportion.api.placement_table import configmap_name, from_configmap
    from apportion_dev.devcluster import DevCluster
    from apportion_dev.devcluster.net import free_port

    print()
    print("3. writes per minute on a real control plane: 8 worker processes, one")
    print("   ActivationCountBased GrainType, publish interval 1s, minInterval 2s, hysteresis 5 %")
    workers = [f"w-{i}" for i in range(8)]
    port = free_port()
    namespace = "bench"
    with DevCluster.start() as cluster, tempfile.TemporaryDirectory() as tmp:
        root = Path(__file__).resolve().parents[1]
        cluster.kubectl("apply", "-f", str(root / "crds"))
        cluster.kubectl(
            "wait", "--for=condition=Established", "crd/graintypes.apportion.dev", "--timeout=60s"
        )
        cluster.kubectl("create", "namespace", namespace)
        grant_worker_role(cluster.kubectl, namespace)
        log = open(Path(tmp) / "operator.log", "w")  # noqa: SIM115 - closed below
        operator = subprocess.Popen(
            [sys.executable, "-m", "apportion", "operator", "--namespace", namespace],
            env=cluster.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            for worker in workers:
                cluster.kubectl(
                    "apply",
                    "-n",
                    namespace,
                    "-f",
                    "-",
                    input=yaml.safe_dump(_worker_pod(worker, port)),
                )
            cluster.kubectl(
                "wait",
                "-n",
                namespace,
                "--for=condition=Ready",
                "--timeout=120s",
                *(f"pod/{w}" for w in workers),
            )
            pods = json.loads(cluster.kubectl("get", "-n", namespace, "pods", "-o", "json").stdout)
            ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods["items"]}
            graintype = {
                "apiVersion": "apportion.dev/v1alpha1",
                "kind": "GrainType",
                "metadata": {"name": "steady"},
                "spec": {
                    "selector": {"matchLabels": {"app": "grains"}},
                    "strategy": {"name": "ActivationCountBased"},
                    "metrics": {"podMetrics": False, "scrape": {"port": "http", "interval": "1s"}},
                },
            }
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(graintype))
            client = Client(config=KubeConfig.from_file(cluster.kubeconfig))
            name = configmap_name("steady")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                found = cluster.kubectl(
                    "get", "-n", namespace, "configmap", name, "-o", "json", check=False
                )
                if found.returncode == 0 and all(
                    m.stats is not None for m in from_configmap(json.loads(found.stdout)).members
                ):
                    break
                time.sleep(0.5)
            GrainTypes = create_namespaced_resource(
                "apportion.dev", "v1alpha1", "GrainType", "graintypes"
            )
            tables = _Modifications(client, ConfigMap, name, namespace)
            statuses = _Modifications(client, GrainTypes, "steady", namespace)

            def drive(body: dict) -> None:
                def post(worker: str) -> None:
                    request = urllib.request.Request(
                        f"http://{ips[worker]}:{port}/grains/drive",
                        data=json.dumps({"grainType": "steady", **body}).encode(),
                        headers={"Content-Type": "application/json"},
                    )
                    urllib.request.urlopen(request, timeout=600).read()

                with ThreadPoolExecutor(len(workers)) as pool:
                    list(pool.map(post, workers))

            def phase(label: str, action) -> None:
                time.sleep(5)  # let the previous phase's last changes out
                tables.take(), statuses.take()
                start = time.monotonic()
                action()
                elapsed = (time.monotonic() - start) / 60
                print(
                    f"   {label:<58} {tables.take() / elapsed:>6.1f} table/min "
                    f"{statuses.take() / elapsed:>6.1f} status/min"
                )

            seconds = minutes * 60
            phase("idle (no activations)", lambda: time.sleep(seconds))
            drive({"count": 100})
            phase("100 activations per worker, none ending", lambda: time.sleep(seconds))
            phase(
                "churning: 5/s per worker, 20 s lifetime",
                lambda: drive({"count": int(5 * seconds), "rate": 5.0, "lifetime": 20.0}),
            )
        finally:
            operator.terminate()
            operator.wait(20)
            log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="measure writes on a dev-cluster (on without --quick)",
    )
    args = parser.parse_args()
    placements_per_second(0.3 if args.quick else 1.5)
    writes_per_minute(5 if args.quick else 30)
    if args.cluster or not args.quick:
        cluster_writes(0.5 if args.quick else 1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
