"""Operator benchmarks on a dev-cluster (figures, not asserts).

1. Pod gone → new assignment published: a PartitionSet of 96 partitions over bare simulated
   pods; one owning pod at a time is deleted with grace period 0 and the time until the
   ConfigMap shows its units on other pods is measured from a watch (goal: p50 <= 1 s).
2. Live move → acknowledged and re-owned: demo workers (real processes) and an External
   strategy; each round pins one partition to another pod; measured from the spec patch to the
   table where the new owner holds it, and from the release being published to that table
   (the worker's acknowledgement round trip; goal: p50 <= 2 s).
3. Operator RSS and CPU with 200 pods x 20 sets (10 PartitionSets of 256, 10 ShardSets of 1000
   with LeastShards, all over the same 200 simulated pods): time and CPU until every set is
   Balanced, RSS then, idle CPU, and the cost of replacing 10 pods (goal: RSS <= 200 MB).

4. Bounded watches (`--selection`, run alone): operator RSS, CPU and pod-deleted → table latency
   against the number of sets (5 bare simulated pods each, 16 partitions), then with pods no set
   selects added to the same namespace (left unscheduled, so the simulator does not run them;
   the operator, watching every namespace, still sees each). Goals: RSS <= 300 MB and p99 <= 100 ms
   with 1000 sets over 5000 pods; RSS with 20 000 unrelated pods within 10 % of RSS without.
   It prints the curve, so the limit on a given machine can be read off.

Run: .venv/bin/python -m bench.bench_operator [--quick]
     .venv/bin/python -m bench.bench_operator --selection [--sets 100,250,500,1000]
         [--unrelated 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.generic_resource import create_namespaced_resource
from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap, Pod
from tests.support.present import name_of, present
from tests.support.unitset import grant_worker_role, unit_set, workers

from apportion.api.assignment import (
    AssignmentTable,
    ConfigMapPayload,
    assignment_config_map,
    decode_assignment,
)
from apportion_dev.devcluster import DevCluster

REPO = Path(__file__).resolve().parents[1]


class TableWatch(threading.Thread):
    """Every version of one set's (single-ConfigMap) assignment, with the time it arrived."""

    def __init__(self, client: Client, namespace: str, kind: str, name: str) -> None:
        super().__init__(daemon=True)
        self.client, self.namespace = client, namespace
        self.name = assignment_config_map(kind, name)
        self.seen: list[tuple[float, AssignmentTable]] = []
        self.changed = threading.Condition()
        self.closing = False

    def run(self) -> None:
        fields: FieldSelector = {"metadata.name": self.name}
        while not self.closing:
            try:
                for _, cm in self.client.watch(ConfigMap, namespace=self.namespace, fields=fields):
                    self._add(time.time(), cm.to_dict())
            except Exception:
                # The API server ends long watches; a new one starts with the current version,
                # which `_add` skips when it was seen already.
                time.sleep(0.05)

    def _add(self, arrived: float, cm: dict[str, Any]) -> None:
        payload = ConfigMapPayload.from_configmap(cm, self.name)
        table = decode_assignment([payload])
        with self.changed:
            if any(seen.epoch == table.epoch for _, seen in self.seen[-8:]):
                return  # the same version again, from a new watch
            self.seen.append((arrived, table))
            self.changed.notify_all()

    def wait(
        self, accept: Callable[[AssignmentTable], bool], after: float, timeout: float = 120
    ) -> tuple[float, AssignmentTable]:
        """The first version that arrived after `after` and satisfies `accept`."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for arrived, table in self.seen:
                    if arrived >= after and accept(table):
                        return arrived, table
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching table for {self.name}")
                self.changed.wait(left)

    def latest(self) -> AssignmentTable:
        self.wait(lambda t: True, 0.0)
        with self.changed:
            return self.seen[-1][1]


class OperatorProcess:
    def __init__(self, cluster: DevCluster, namespaces: list[str], log: Path) -> None:
        args = [sys.executable, "-m", "apportion", "operator"]
        for ns in namespaces:
            args += ["--namespace", ns]
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen(
            args, env=cluster.env, stdout=self._out, stderr=subprocess.STDOUT
        )

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status if "kB" in line}
        return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._out.close()


def kubectl_apply(cluster: DevCluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {p50 * 1000:7.0f} ms   p99 {p99 * 1000:7.0f} ms   (n={len(ordered)})"


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "w", "image": "bench"}]},
    }


def status_of(cluster: DevCluster, namespace: str, what: str) -> list[dict[str, Any]]:
    found = cluster.kubectl("get", "-n", namespace, what, "-o", "json")
    return json.loads(found.stdout)["items"]


def all_balanced(cluster: DevCluster, namespace: str, expected: int, members: int) -> bool:
    sets = status_of(cluster, namespace, "psets") + status_of(cluster, namespace, "ssets")
    done = 0
    for obj in sets:
        status = obj.get("status") or {}
        balanced = any(
            c["type"] == "Balanced" and c["status"] == "True" for c in status.get("conditions", [])
        )
        done += balanced and status.get("members") == members
    return done == expected


# ------------------------------------------------------------------------------- scenarios


WATCHES: list[TableWatch] = []


def owned_by_others(victim: str) -> Callable[[AssignmentTable], bool]:
    """A table that gives `victim` no unit."""
    return lambda t: all(s.owner != victim for s in t.units.values())


def in_release(unit: str) -> Callable[[AssignmentTable], bool]:
    return lambda t: unit in t.releasing()


def handed_to(unit: str, member: str) -> Callable[[AssignmentTable], bool]:
    """A table in which `member` owns `unit` with no release of it under way."""
    return lambda t: t.units[unit].owner == member and unit not in t.releasing()


def pod_gone(cluster: DevCluster, client: Client, rounds: int) -> list[float]:
    ns = "bench-gone"
    cluster.kubectl("create", "namespace", ns)
    total = rounds + 4
    kubectl_apply(cluster, ns, *(pod(f"p-{i}", {"app": "gone"}) for i in range(total)))
    spec = {
        "partitions": 96,
        "selector": {"matchLabels": {"app": "gone"}},
        "rebalance": {"interval": "1s", "handoffTimeout": "10m"},
    }
    watch = TableWatch(client, ns, "PartitionSet", "gone")
    WATCHES.append(watch)
    watch.start()
    kubectl_apply(cluster, ns, unit_set("PartitionSet", "gone", spec))
    watch.wait(lambda t: len({s.owner for s in t.units.values()}) == total, 0)
    samples = []
    for i in range(rounds):
        victim = f"p-{i}"
        time.sleep(0.3)
        started = time.time()
        client.delete(Pod, victim, namespace=ns, grace_period=0)
        arrived, _ = watch.wait(owned_by_others(victim), started)
        samples.append(arrived - started)
    return samples


def live_moves(cluster: DevCluster, client: Client, rounds: int) -> tuple[list, list]:
    ns = "bench-move"
    cluster.kubectl("create", "namespace", ns)
    grant_worker_role(cluster.kubectl, ns)
    command = [
        "apportion",
        "demo-worker",
        "--kind",
        "PartitionSet",
        "--set",
        "move",
        "--port",
        "8080",
    ]
    kubectl_apply(cluster, ns, workers("mw", 3, command=command, grace=5))
    wait_until(
        lambda: (
            sum(
                1
                for p in client.list(Pod, namespace=ns, labels={"app": "mw"})
                if p.status and p.status.podIP
            )
            == 3
        ),
        120,
        "3 demo workers",
    )
    spec = {
        "partitions": 12,
        "workloadRef": {"kind": "StatefulSet", "name": "mw"},
        "strategy": {"name": "External", "external": {"pins": [{"unit": 0, "member": "mw-0"}]}},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    watch = TableWatch(client, ns, "PartitionSet", "move")
    WATCHES.append(watch)
    watch.start()
    kubectl_apply(cluster, ns, unit_set("PartitionSet", "move", spec))
    watch.wait(
        lambda t: (
            t.units["0"].owner == "mw-0"
            and not t.releasing()
            and all(s.owner for s in t.units.values())
        ),
        0,
    )
    whole, handoff = [], []
    for i in range(rounds):
        unit = str(i % 12)
        current = present(watch.latest().units[unit].owner, f"unit {unit}'s owner")
        target = f"mw-{(int(current[-1]) + 1) % 3}"
        time.sleep(1.2)  # one rebalance interval since the last round
        started = time.time()
        patch = {
            "spec": {"strategy": {"external": {"pins": [{"unit": int(unit), "member": target}]}}}
        }
        cluster.kubectl("patch", "-n", ns, "pset", "move", "--type=merge", "-p", json.dumps(patch))
        released, _ = watch.wait(in_release(unit), started)
        owned, _ = watch.wait(handed_to(unit, target), started)
        whole.append(owned - started)
        handoff.append(owned - released)
    return whole, handoff


def scale(cluster: DevCluster, state_dir: Path, quick: bool) -> dict[str, float]:
    ns = "bench-scale"
    cluster.kubectl("create", "namespace", ns)
    pods, per_kind = 200, 10
    kubectl_apply(cluster, ns, workers("s", pods, grace=1))
    wait_until(
        lambda: (
            sum(1 for p in status_of(cluster, ns, "pods") if p["status"].get("phase") == "Running")
            == pods
        ),
        600,
        "200 running pods",
    )
    sets = [
        unit_set(
            "PartitionSet",
            f"p{i}",
            {
                "partitions": 256,
                "selector": {"matchLabels": {"app": "s"}},
                "rebalance": {"interval": "1s", "handoffTimeout": "2s"},
            },
        )
        for i in range(per_kind)
    ]
    sets += [
        unit_set(
            "ShardSet",
            f"s{i}",
            {
                "shards": 1000,
                "selector": {"matchLabels": {"app": "s"}},
                "strategy": {"name": "LeastShards"},
                "rebalance": {"interval": "1s", "handoffTimeout": "2s"},
            },
        )
        for i in range(per_kind)
    ]
    kubectl_apply(cluster, ns, *sets)
    operator = OperatorProcess(cluster, [ns], state_dir / "operator-scale.log")
    figures: dict[str, float] = {}
    try:
        started = time.monotonic()
        wait_until(lambda: all_balanced(cluster, ns, 2 * per_kind, pods), 600, "every set Balanced")
        figures["settle_s"] = time.monotonic() - started
        figures["settle_cpu_s"] = operator.cpu_seconds()
        figures["rss_mb"], _ = operator.memory_mb()
        # Right after settling, the deletion costs of 200 pods are patched (and their pod
        # events wake every set once); then nothing changes.
        before = operator.cpu_seconds()
        time.sleep(10)
        figures["after_settle_cpu_s"] = operator.cpu_seconds() - before
        idle = 10 if quick else 30
        before = operator.cpu_seconds()
        time.sleep(idle)
        figures["idle_cpu_pct"] = 100 * (operator.cpu_seconds() - before) / idle
        before, started = operator.cpu_seconds(), time.monotonic()
        victims = [f"s-{i}" for i in range(0, pods, pods // 10)]
        cluster.kubectl("delete", "pod", "-n", ns, "--wait=false", *victims)
        time.sleep(3)
        wait_until(
            lambda: all_balanced(cluster, ns, 2 * per_kind, pods),
            600,
            "every set Balanced after replacing 10 pods",
        )
        figures["churn_s"] = time.monotonic() - started
        figures["churn_cpu_s"] = operator.cpu_seconds() - before
        figures["rss_after_churn_mb"], figures["peak_rss_mb"] = operator.memory_mb()
    finally:
        operator.stop()
    return figures


class NamespaceTables(threading.Thread):
    """The latest assignment table of every PartitionSet of a namespace, from one watch."""

    SUFFIX = "-partitionset-assignment"

    def __init__(self, client: Client, namespace: str) -> None:
        super().__init__(daemon=True)
        self.client, self.namespace = client, namespace
        self.tables: dict[str, tuple[float, AssignmentTable]] = {}
        self.changed = threading.Condition()

    def run(self) -> None:
        while True:
            try:
                for _, cm in self.client.watch(ConfigMap, namespace=self.namespace):
                    name = name_of(cm)
                    if not name.endswith(self.SUFFIX):
                        continue
                    table = decode_assignment([ConfigMapPayload.from_configmap(cm.to_dict(), name)])
                    with self.changed:
                        self.tables[name[: -len(self.SUFFIX)]] = (time.time(), table)
                        self.changed.notify_all()
            except Exception as error:
                print(f"table watch: {error!r}; watching again", file=sys.stderr)
                time.sleep(0.05)

    def wait(self, name: str, accept: Callable[[AssignmentTable], bool], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = self.tables.get(name)
                if found is not None and accept(found[1]):
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching table for {name}")
                self.changed.wait(left)


def create_all(client: Client, objects: list[Any], namespace: str, threads: int = 6) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda obj: client.create(obj, namespace=namespace), objects))


def settle_pods(client: Client, namespace: str, alive: dict[str, list[str]]) -> None:
    """Until every pod of `alive` runs; a pod the simulator gave up on (it does not retry a
    failed status update under load) is deleted and left out after a minute without progress."""
    wanted = {p for pods in alive.values() for p in pods}
    best, since = -1, time.monotonic()
    while True:
        running = {
            name_of(p)
            for p in client.list(Pod, namespace=namespace, labels={"bench-set": exists()})
            if p.status and p.status.phase == "Running"
        }
        if wanted <= running:
            return
        if len(running) > best:
            best, since = len(running), time.monotonic()
        elif time.monotonic() - since > 60:
            stuck = wanted - running
            print(f"  ({len(stuck)} pod(s) never ran; left out)", flush=True)
            for name in stuck:
                client.delete(Pod, name, namespace=namespace, grace_period=0)
            for name, pods in alive.items():
                alive[name] = [p for p in pods if p not in stuck]
            return
        time.sleep(2)


def selection(cluster: DevCluster, client: Client, levels: list[int], unrelated: int) -> list[str]:
    """The curve of item 4: RSS, CPU and latency as sets, then unrelated pods, are added."""
    ns, per_set, rounds = "bench-select", 5, 20
    cluster.kubectl("create", "namespace", ns)
    pset = create_namespaced_resource("apportion.dev", "v1alpha1", "PartitionSet", "partitionsets")
    tables = NamespaceTables(client, ns)
    tables.start()
    operator = OperatorProcess(cluster, [], cluster.state_dir / "operator-selection.log")
    alive: dict[str, list[str]] = {}
    rows = []

    def settled(count: int) -> bool:
        done = 0
        for obj in client.list(pset, namespace=ns):
            status = obj.get("status") or {}
            members = len(alive.get(name_of(obj), []))
            # A set whose every pod the simulator gave up on (settle_pods) has nothing to
            # balance: it is done once its status says how many members it has.
            done += status.get("members") == members and (
                members == 0
                or any(
                    c["type"] == "Balanced" and c["status"] == "True"
                    for c in status.get("conditions", [])
                )
            )
        return done == count

    def measure(label: str, sets: int, pods: int, noise: int, cpu_before: float, t0: float):
        wait_until(lambda: settled(sets), 3600, f"{sets} sets settled")
        settle_s, settle_cpu = time.monotonic() - t0, operator.cpu_seconds() - cpu_before
        time.sleep(10)
        before = operator.cpu_seconds()
        time.sleep(20)
        idle = 100 * (operator.cpu_seconds() - before) / 20
        samples = []
        candidates = sorted(name for name, pods in alive.items() if len(pods) > 1)
        for name in random.Random(sets + noise).sample(candidates, min(rounds, len(candidates))):
            victim = alive[name].pop()
            time.sleep(0.3)
            started = time.time()
            client.delete(Pod, victim, namespace=ns, grace_period=0)
            arrived = tables.wait(name, owned_by_others(victim), 120)
            samples.append(arrived - started)
        rss, peak = operator.memory_mb()
        rows.append(
            f"  {label:<22} {sets:6d} {pods:7d} {noise:7d} {rss:8.1f} {peak:8.1f} "
            f"{settle_s:8.1f} {settle_cpu:8.1f} {idle:6.1f}   {percentiles(samples)}"
        )
        print(rows[-1], flush=True)

    try:
        made = 0
        for level in levels:
            t0, cpu0 = time.monotonic(), operator.cpu_seconds()
            new = [f"s{i}" for i in range(made, level)]
            for name in new:
                alive[name] = [f"{name}-{j}" for j in range(per_set)]
            create_all(
                client,
                [Pod.from_dict(pod(p, {"bench-set": name})) for name in new for p in alive[name]],
                ns,
            )
            # Sets start over all their pods: one placed on fewer would hand units to the
            # late ones, which bare pods never acknowledge.
            settle_pods(client, ns, alive)
            create_all(
                client,
                [
                    pset.from_dict(
                        unit_set(
                            "PartitionSet",
                            name,
                            {
                                "partitions": 16,
                                "selector": {"matchLabels": {"bench-set": name}},
                                "rebalance": {"interval": "1s", "handoffTimeout": "2s"},
                            },
                        )
                    )
                    for name in new
                ],
                ns,
            )
            made = level
            pods = sum(len(p) for p in alive.values())
            measure("sets added", level, pods, 0, cpu0, t0)
        if unrelated:
            t0, cpu0 = time.monotonic(), operator.cpu_seconds()
            noise = []
            for i in range(unrelated):
                body = pod(f"noise-{i}", {"app": "noise"})
                body["spec"]["schedulerName"] = "nobody"  # left Pending: no simulator work
                noise.append(Pod.from_dict(body))
            create_all(client, noise, ns, threads=12)
            pods = sum(len(p) for p in alive.values())
            measure("unrelated pods added", made, pods, unrelated, cpu0, t0)
    except Exception:
        print(operator.log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        operator.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--selection", action="store_true", help="the bounded-watch curve only")
    parser.add_argument("--sets", default="100,250,500,1000", help="set counts of the curve")
    parser.add_argument("--unrelated", type=int, default=20_000, help="pods no set selects")
    args = parser.parse_args()
    if args.selection:
        levels = [int(n) for n in args.sets.split(",")]
        with DevCluster.start() as cluster:
            cluster.kubectl("apply", "-f", str(REPO / "crds"))
            cluster.kubectl(
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/partitionsets.apportion.dev",
            )
            os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
            rows = selection(cluster, Client(), levels, args.unrelated)
        print("apportion operator, bounded watches (5 simulated pods per set, 16 partitions):")
        print(
            "  step                     sets    pods  unrel.  RSS MB  peak MB  settle s"
            "  CPU s  idle %   pod deleted → table without it"
        )
        print("\n".join(rows))
        print("  goals: RSS <= 300 MB and p99 <= 100 ms at 1000 sets / 5000 pods; RSS with the")
        print("  unrelated pods within 10 % of RSS without them")
        return 0
    rounds = 10 if args.quick else 40
    with DevCluster.start() as cluster:
        cluster.kubectl("apply", "-f", str(REPO / "crds"))
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/partitionsets.apportion.dev",
            "crd/shardsets.apportion.dev",
        )
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        client = Client()
        state = cluster.state_dir
        operator = OperatorProcess(cluster, ["bench-gone", "bench-move"], state / "operator.log")
        try:
            gone = pod_gone(cluster, client, rounds)
            whole, handoff = live_moves(cluster, client, rounds)
        finally:
            operator.stop()
        figures = scale(cluster, state, args.quick)
        for watch in WATCHES:
            watch.closing = True

    print("apportion operator on a dev-cluster (2-core machine)")
    print(f"  pod gone → new assignment published   {percentiles(gone)}   goal p50 <= 1 s")
    print(f"  live move: spec change → re-owned      {percentiles(whole)}")
    print(f"  live move: release → acked, re-owned   {percentiles(handoff)}   goal p50 <= 2 s")
    print("  200 pods x 20 sets (10 PartitionSets x 256, 10 ShardSets x 1000, LeastShards):")
    print(
        f"    every set Balanced after          {figures['settle_s']:7.1f} s "
        f"({figures['settle_cpu_s']:.1f} CPU s since operator start)"
    )
    print(f"    operator RSS when settled         {figures['rss_mb']:7.1f} MB   goal <= 200 MB")
    print(f"    next 10 s (deletion costs)        {figures['after_settle_cpu_s']:7.1f} CPU s")
    print(f"    idle CPU                          {figures['idle_cpu_pct']:7.1f} %")
    print(
        f"    10 pods replaced → Balanced       {figures['churn_s']:7.1f} s "
        f"({figures['churn_cpu_s']:.1f} CPU s)"
    )
    print(
        f"    RSS after churn / peak            {figures['rss_after_churn_mb']:7.1f} MB / "
        f"{figures['peak_rss_mb']:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
