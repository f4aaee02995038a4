"""Kafka partitions placed by a PartitionSet against Kafka's own consumer-group rebalancing, on
the same broker and workload (figures, not asserts).

Workload: a topic of 12 partitions, one message per partition every 50 ms; each record takes
2 ms to handle. Steps: 3 consumers, then 4, then 2, then a rolling restart of the 2 (one after
the other: stop, start a new one, wait until settled). Per step:

- moved: partitions whose consumer changed (Kafka's eager protocol also stops every other
  partition during a rebalance: that shows in the gap, not in this count);
- wait: the longest time a record produced during the step waited until it was handled (from
  the step's start until 3 s after it settled; steady, a poll's worth): the worst partition's,
  and the mean over partitions of each one's longest;
- again: records handled a second time in the step (resumed from an older commit).

Sides:
- apportion: `python -m apportion.kafka` consumers as process pods of a StatefulSet on a
  dev-cluster, a PartitionSet over them (rebalance interval 1 s), the operator as a process;
  steps are `kubectl scale` and a template change (StatefulSet rolling update).
- apportion-java: the same with the Java consumer (integrations/kafka-java's PrintingConsumer).
- Kafka's group rebalancing: consumers subscribed to one group, each a thread of this process;
  steps start and stop (commit, leave the group) consumers; offsets auto-committed every 1 s,
  heartbeats every 1 s (session timeout 10 s):
  - eager-roundrobin, eager-sticky: aiokafka, classic protocol (eager: at each rebalance every
    member gives up every partition), aiokafka's default assignor and its sticky one;
  - cooperative-sticky: confluent-kafka (librdkafka), classic protocol, incremental;
  - kip848-consumer: confluent-kafka, the `consumer` group protocol of Kafka 4 (KIP-848:
    the broker assigns, incrementally; its heartbeat interval set to 1 s on the broker).

Run: .venv/bin/python bench/bench_kafka.py [--quick] [--side apportion|apportion-java|kafka]
(`make kafka-jars` first: the broker runs from the cached jars.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "integrations/kafka"), str(REPO / "tests/e2e")]

from kafka_broker import KafkaBroker  # noqa: E402
from kafka_support import Produced, Producer, create_topic, processed  # noqa: E402

PARTITIONS = 12
PERIOD = 0.05
WORK_TIME = 0.002
SETTLE_MARGIN = 3.0
STEPS = ("3 consumers", "3 -> 4", "4 -> 2", "rolling restart")


@dataclass(frozen=True)
class Step:
    name: str
    start: float
    end: float


Handled = dict[int, list[tuple[float, int]]]
"""partition -> (time, offset) of every record handled, in time order."""


def longest_waits(handled: Handled, produced: list[Produced], step: Step) -> list[float]:
    """Per partition, the longest a record produced within the step waited to be handled."""
    first: dict[tuple[int, int], float] = {}
    for partition, records in handled.items():
        for t, offset in records:
            first[(partition, offset)] = min(t, first.get((partition, offset), t))
    waits = [0.0] * PARTITIONS
    for record in produced:
        if step.start <= record.time < step.end:
            done = first.get((record.partition, record.offset), step.end)
            waits[record.partition] = max(waits[record.partition], done - record.time)
    return waits


def handled_again(handled: Handled, step: Step) -> int:
    again = 0
    for records in handled.values():
        seen: set[int] = set()
        for t, offset in sorted(records):
            if offset in seen and step.start < t <= step.end:
                again += 1
            seen.add(offset)
    return again


def moves(assigned: list[tuple[float, int, str]], step: Step) -> int:
    """Partitions given to another consumer than their previous one, within the step."""
    holder: dict[int, str] = {}
    moved = 0
    for t, partition, consumer in sorted(assigned):
        previous = holder.get(partition)
        if step.start < t <= step.end and previous is not None and previous != consumer:
            moved += 1
        holder[partition] = consumer
    return moved


def report(
    side: str, steps: list[Step], handled: Handled, assigned, produced: list[Produced]
) -> list[str]:
    rows = []
    for step in steps[1:]:
        waits = longest_waits(handled, produced, step)
        rows.append(
            f"  {side:<18} {step.name:<16} moved {moves(assigned, step):>3}  "
            f"wait max {max(waits):5.2f} s  mean {statistics.fmean(waits):5.2f} s  "
            f"again {handled_again(handled, step):>4}  (step {step.end - step.start:5.1f} s)"
        )
    return rows


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_kafka: {what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)


# ------------------------------------------------------------------------ Kafka's own group


class GroupSide:
    """Consumers of one group, each in its own thread: `client` "aiokafka" (classic protocol,
    eager: every member gives up every partition at each rebalance) or "librdkafka"
    (confluent-kafka: cooperative-sticky, or the KIP-848 `consumer` protocol), configured by
    `config`."""

    def __init__(self, bootstrap: str, topic: str, client: str, config: dict[str, Any]) -> None:
        self.bootstrap, self.topic, self.client, self.config = bootstrap, topic, client, config
        self.group = f"bench-{topic}"
        self.handled: Handled = defaultdict(list)
        self.assigned: list[tuple[float, int, str]] = []
        self.current: dict[str, set[int]] = {}
        self.last_change = time.time()
        self.threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self.lock = threading.Lock()
        self.count = 0

    def add(self) -> str:
        name = f"c{self.count}"
        self.count += 1
        stop = threading.Event()
        consume = self._aiokafka if self.client == "aiokafka" else self._librdkafka
        thread = threading.Thread(target=consume, args=(name, stop), daemon=True)
        self.threads[name] = (thread, stop)
        thread.start()
        return name

    def remove(self, name: str) -> None:
        thread, stop = self.threads.pop(name)
        stop.set()
        thread.join(60)

    def _assign(self, name: str, partitions: list[int]) -> None:
        now = time.time()
        with self.lock:
            self.current.setdefault(name, set()).update(partitions)
            self.assigned += [(now, p, name) for p in partitions]
            self.last_change = now

    def _revoke(self, name: str, partitions: list[int]) -> None:
        with self.lock:
            self.current.setdefault(name, set()).difference_update(partitions)
            self.last_change = time.time()

    def _gone(self, name: str) -> None:
        with self.lock:
            self.current.pop(name, None)
            self.last_change = time.time()

    def _aiokafka(self, name: str, stop: threading.Event) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

        side = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                side._revoke(name, [tp.partition for tp in revoked])

            async def on_partitions_assigned(self, assigned: Any) -> None:
                side._assign(name, [tp.partition for tp in assigned])

        async def consume() -> None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                auto_offset_reset="earliest",
                auto_commit_interval_ms=1000,
                heartbeat_interval_ms=1000,
                session_timeout_ms=10000,
                **self.config,
            )
            await consumer.start()
            consumer.subscribe([self.topic], listener=Listener())
            try:
                while not stop.is_set():
                    batch = await consumer.getmany(timeout_ms=100)
                    for tp, records in batch.items():
                        for record in records:
                            await asyncio.sleep(WORK_TIME)
                            self.handled[tp.partition].append((time.time(), record.offset))
            finally:
                await consumer.stop()  # commits and leaves the group
                self._gone(name)

        asyncio.run(consume())

    def _librdkafka(self, name: str, stop: threading.Event) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 1000,
                **self.config,
            }
        )
        consumer.subscribe(
            [self.topic],
            on_assign=lambda c, parts: self._assign(name, [p.partition for p in parts]),
            on_revoke=lambda c, parts: self._revoke(name, [p.partition for p in parts]),
            on_lost=lambda c, parts: self._revoke(name, [p.partition for p in parts]),
        )
        try:
            while not stop.is_set():
                message = consumer.poll(0.1)
                if message is not None and message.error() is None:
                    time.sleep(WORK_TIME)
                    self.handled[message.partition()].append((time.time(), message.offset()))
        finally:
            consumer.close()  # commits and leaves the group
            self._gone(name)

    def settled(self) -> bool:
        with self.lock:
            owned = sorted(p for ps in self.current.values() for p in ps)
            members = len(self.current)
            quiet = time.time() - self.last_change > 2.0
        return owned == list(range(PARTITIONS)) and members == len(self.threads) and quiet

    def stop(self) -> None:
        for name in list(self.threads):
            self.remove(name)


def group_side(
    bootstrap: str, topic: str, client: str, config: dict[str, Any]
) -> tuple[list[Step], Any, Any]:
    side = GroupSide(bootstrap, topic, client, config)
    steps = []

    def step(name: str, action: Callable[[], None]) -> None:
        start = time.time()
        action()
        wait_until(side.settled, 120, f"group settled after {name}")
        time.sleep(SETTLE_MARGIN)
        steps.append(Step(name, start, time.time()))

    step(STEPS[0], lambda: [side.add() for _ in range(3)])
    step(STEPS[1], side.add)
    step(STEPS[2], lambda: [side.remove(n) for n in sorted(side.threads)[:2]])

    def rolling() -> None:
        for name in sorted(side.threads):
            side.remove(name)
            side.add()
            wait_until(side.settled, 120, "group settled in the rolling restart")

    step(STEPS[3], rolling)
    side.stop()
    return steps, side.handled, side.assigned


# -------------------------------------------------------------------------------- apportion


def apportion_side(bootstrap: str, topic: str, consumer: list[str]) -> tuple[list[Step], Any, Any]:
    """`consumer`: how a consumer pod starts (Python or Java; the same flags follow)."""
    from unitset_support import (
        Operator,
        apply,
        get,
        grant_worker_role,
        is_true,
        ownership_log,
        read_table,
        unit_set,
        workers,
    )

    from apportion_dev.devcluster import DevCluster

    cluster = DevCluster.start()
    namespace = "bench-kafka"
    state = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    operator = None
    try:
        cluster.kubectl("create", "namespace", namespace)
        grant_worker_role(cluster.kubectl, namespace)
        wait_until(
            lambda: (
                cluster.kubectl(
                    "get", "-n", namespace, "serviceaccount", "default", check=False
                ).returncode
                == 0
            ),
            30,
            "the default ServiceAccount",
        )
        cluster.kubectl("apply", "-f", str(REPO / "crds"))
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/partitionsets.apportion.dev",
        )
        operator = Operator(cluster, namespace, state / "operator.log")
        kubectl = cluster.kubectl
        command = [
            *consumer, "--topic", topic, "--set", "orders",
            "--bootstrap", bootstrap, "--group", "bench-apportion",
            "--work-time", str(WORK_TIME), "--port", "8080",
        ]  # fmt: skip
        consumers = workers("kc", 3, command=command, grace=30)
        # Ready once the consumer serves /healthz: the operator gives partitions to pods that
        # can take them, not to processes still importing.
        (container,) = consumers["spec"]["template"]["spec"]["containers"]
        container["readinessProbe"] = {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 1,
        }
        pods: set[str] = set()

        def settled(members: int, old_uids: dict[str, str] | None = None) -> Callable[[], bool]:
            def check() -> bool:
                obj = get(kubectl, namespace, "pset", "orders")
                table = read_table(kubectl, namespace, "PartitionSet", "orders")
                if table is None or table.releasing() or not is_true(obj, "Balanced"):
                    return False
                pods.update(table.member_uids)
                fresh = old_uids is None or all(
                    table.member_uids.get(p) not in (None, uid) for p, uid in old_uids.items()
                )
                return obj["status"].get("members") == members and fresh

            return check

        steps = []

        def step(name: str, action: Callable[[], Any], check: Callable[[], bool]) -> None:
            start = time.time()
            action()
            wait_until(check, 240, f"Balanced after {name}")
            time.sleep(SETTLE_MARGIN)
            steps.append(Step(name, start, time.time()))

        spec = {
            "partitions": PARTITIONS,
            "workloadRef": {"kind": "StatefulSet", "name": "kc"},
            "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
        }

        def begin() -> None:
            apply(kubectl, namespace, consumers)
            apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))

        def scale(n: int) -> Callable[[], Any]:
            return lambda: kubectl("scale", "-n", namespace, "statefulset", "kc", f"--replicas={n}")

        step(STEPS[0], begin, settled(3))
        step(STEPS[1], scale(4), settled(4))
        step(STEPS[2], scale(2), settled(2))
        old = dict(read_table(kubectl, namespace, "PartitionSet", "orders").member_uids)
        patch = {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
        step(
            STEPS[3],
            lambda: kubectl(
                "patch",
                "-n",
                namespace,
                "statefulset",
                "kc",
                "--type=merge",
                "-p",
                json.dumps(patch),
            ),
            settled(2, old),
        )
        names = sorted(pods)
        handled: Handled = defaultdict(list)
        for record in processed(cluster, namespace, names):
            handled[record.partition].append((record.time, record.offset))
        assigned = [
            (o.time, int(o.unit), o.pod)
            for o in ownership_log(cluster, namespace, names, "PartitionSet/orders")
            if o.action == "acquire"
        ]
        return steps, handled, assigned
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same run (it is short)")
    parser.add_argument("--side", choices=("apportion", "apportion-java", "kafka"), action="append")
    args = parser.parse_args()
    sides = args.side or ["apportion", "apportion-java", "kafka"]
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

    groups = {
        "eager-roundrobin": (
            "aiokafka",
            {"partition_assignment_strategy": (RoundRobinPartitionAssignor,)},
        ),
        "eager-sticky": ("aiokafka", {"partition_assignment_strategy": (StickyPartitionAssignor,)}),
        "cooperative-sticky": (
            "librdkafka",
            {
                "partition.assignment.strategy": "cooperative-sticky",
                "heartbeat.interval.ms": 1000,
                "session.timeout.ms": 10000,
            },
        ),
        "kip848-consumer": ("librdkafka", {"group.protocol": "consumer"}),
    }
    rows = []
    # The KIP-848 protocol's heartbeat interval is the broker's: 1 s, as the classic clients'.
    heartbeat = {
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "1000",
    }
    with KafkaBroker(
        Path(tempfile.mkdtemp(prefix="bench-kafka-broker-")), overrides=heartbeat
    ) as broker:
        runs: list[tuple[str, Callable[[str], tuple[list[Step], Any, Any]]]] = []
        if "apportion" in sides:
            python = [sys.executable, "-m", "apportion.kafka"]
            runs.append(("apportion", lambda t: apportion_side(broker.bootstrap, t, python)))
        if "apportion-java" in sides:
            from java_support import classpath

            java = [
                "java",
                "-cp",
                classpath("integrations/kafka-java"),
                "dev.apportion.kafka.sample.PrintingConsumer",
            ]
            runs.append(("apportion-java", lambda t: apportion_side(broker.bootstrap, t, java)))
        if "kafka" in sides:
            for label, (client, config) in groups.items():
                runs.append(
                    (label, lambda t, c=client, k=config: group_side(broker.bootstrap, t, c, k))
                )
        for label, run in runs:
            topic = f"bench-{label}"
            create_topic(broker.bootstrap, topic, PARTITIONS)
            producer = Producer(
                broker.bootstrap, topic, keys=PARTITIONS, partitions=PARTITIONS, period=PERIOD
            )
            producer.start()
            try:
                steps, handled, assigned = run(topic)
            finally:
                produced = producer.stop()
            rows += report(label, steps, handled, assigned, produced)
            print("\n".join(rows[-3:]), flush=True)
    print(f"\nbench_kafka: {PARTITIONS} partitions, a record per partition every {PERIOD}s")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
