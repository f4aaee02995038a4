"""Kafka consumers on a PartitionSet, the Python one (apportion.kafka) and the Java one
(integrations/kafka-java, on the Java client): a real broker (KRaft, from the jars
`integrations/kafka/fetch-jars.sh` caches), consumers as process pods scaled 2 -> 4 -> 3 while
numbered messages flow, then one consumer SIGKILLed. Every message is processed; no partition is
processed by two consumers at the same time; duplicates come only after the SIGKILL, only from
the killed consumer's uncommitted tail."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
from java_support import classpath
from kafka_broker import KafkaBroker
from kafka_support import Producer, commits, consumer_pid, create_topic, processed
from unitset_support import (
    Ownership,
    apply,
    get,
    is_true,
    overlaps,
    ownership_log,
    read_table,
    ready_pods,
    unit_set,
    workers,
)

TOPIC = "orders"
PARTITIONS = 8
KEYS = 16
SET = "PartitionSet/orders"
PODS = [f"kc-{i}" for i in range(4)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as running:
        yield running


@pytest.fixture(scope="module", params=["python", "java"])
def consumer_command(request: pytest.FixtureRequest) -> list[str]:
    """How a consumer pod starts: `python -m apportion.kafka` or the Java sample, which take the
    same flags and log the same lines."""
    if request.param == "python":
        return [sys.executable, "-m", "apportion.kafka"]
    java = classpath("integrations/kafka-java")
    return ["java", "-cp", java, "dev.apportion.kafka.sample.PrintingConsumer"]


def consumers(command: list[str], bootstrap: str, replicas: int, topic: str) -> dict:
    command = [
        *command, "--topic", topic, "--set", "orders",
        "--bootstrap", bootstrap, "--group", "orders-apportion",
        "--work-time", "0.005", "--commit-interval", "3",
    ]  # fmt: skip
    return workers("kc", replicas, command=command, grace=30)


def settled(kubectl, namespace: str, members: int):
    """The set Balanced over `members` pods with no hand-off under way."""

    def check():
        obj = get(kubectl, namespace, "pset", "orders")
        table = read_table(kubectl, namespace, "PartitionSet", "orders")
        done = obj.get("status", {}).get("members") == members and is_true(obj, "Balanced")
        return table if done and table is not None and not table.releasing() else None

    return check


def intervals(log) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(pod, unit) -> when that pod served the unit."""
    open_at: dict[tuple[str, str], float] = {}
    found: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for entry in log:
        key = (entry.pod, entry.unit)
        if entry.action == "acquire":
            open_at[key] = entry.time
        elif key in open_at:
            found[key].append((open_at.pop(key), entry.time))
    for key, start in open_at.items():
        found[key].append((start, float("inf")))
    return found


def test_consumers_follow_the_partitionset_through_scaling_and_a_sigkill(
    broker, consumer_command, operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    # One topic per consumer language: the broker is the module's, offsets are per topic.
    topic = f"{TOPIC}-{namespace}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    apply(kubectl, namespace, consumers(consumer_command, broker.bootstrap, 2, topic))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=kc")) == 2, 60, "2 consumers")
    spec = {
        "partitions": PARTITIONS,
        "workloadRef": {"kind": "StatefulSet", "name": "kc"},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))
    wait_for(settled(kubectl, namespace, 2), 60, "Balanced over 2 consumers")

    producer = Producer(broker.bootstrap, topic, keys=KEYS, partitions=PARTITIONS)
    producer.start()
    try:
        wait_for(lambda: len(producer.produced) >= 100, 30, "messages flowing")
        for replicas in (4, 3):
            kubectl("scale", "-n", namespace, "statefulset", "kc", f"--replicas={replicas}")
            wait_for(settled(kubectl, namespace, replicas), 120, f"Balanced over {replicas}")
            # Messages flow on the settled layout too: every consumer handles some (a JVM's
            # first fetches can take seconds on a busy machine) before the next step.
            since = time.time()
            wait_for(
                lambda n=replicas, t=since: (
                    {d.pod for d in processed(dev_cluster, namespace, PODS) if d.time > t}
                    >= set(PODS[:n])
                ),
                60,
                f"every one of {replicas} consumers handling messages",
            )

        # SIGKILL one consumer that holds partitions: no release, no commit of its tail.
        table = read_table(kubectl, namespace, "PartitionSet", "orders")
        victim = sorted(table.by_member())[0]
        victim_units = set(table.by_member()[victim])
        pid = wait_for(lambda: consumer_pid(namespace, victim), 10, f"{victim}'s process")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)

        def victim_units_back():
            log = ownership_log(dev_cluster, namespace, PODS, SET)
            again = {o.unit for o in log if o.action == "acquire" and o.time > killed_at}
            return victim_units <= again

        wait_for(victim_units_back, 90, f"{victim}'s partitions consumed again after the kill")
        time.sleep(2)
    finally:
        produced = producer.stop()

    expected = {(p.partition, p.offset): f"{p.key}:{p.seq}" for p in produced}
    assert len(expected) == len(produced) > 0

    def all_processed():
        done = processed(dev_cluster, namespace, PODS)
        return done if {(d.partition, d.offset) for d in done} >= expected.keys() else None

    done = wait_for(all_processed, 60, "every produced message processed")

    # Every message processed, with the value it was produced with.
    for d in done:
        assert expected[(d.partition, d.offset)] == d.value, d
    assert all(d.key == expected[(d.partition, d.offset)].split(":")[0] for d in done)

    # No partition processed by two consumers at the same time: ownership intervals of
    # different pods never overlap, and every record is processed inside its pod's interval.
    # The killed process logged no end of its intervals: they ended at the SIGKILL.
    log = ownership_log(dev_cluster, namespace, PODS, SET)
    held = {o.unit: o for o in log if o.time < killed_at and o.pod == victim}
    ended = [
        Ownership(killed_at, victim, "stop", unit, o.epoch, o.token)
        for unit, o in held.items()
        if o.action == "acquire"
    ]
    log = sorted([*log, *ended], key=lambda o: o.time)
    assert overlaps(log) == []
    served = intervals(log)
    for d in done:
        spans = served[(d.pod, str(d.partition))]
        assert any(a <= d.time <= b for a, b in spans), f"{d} outside {d.pod}'s ownership"
    # Every consumer took part.
    assert {d.pod for d in done} == set(PODS)

    # Duplicates: only records the victim processed before the kill at or past its last
    # commit of the partition, processed again only after the kill.
    times = Counter((d.partition, d.offset) for d in done)
    duplicates = {key for key, n in times.items() if n > 1}
    last_commit = {}
    for c in commits(dev_cluster, namespace, [victim]):
        if c.time < killed_at:
            last_commit[c.partition] = c.offset
    for partition, offset in duplicates:
        copies = [d for d in done if (d.partition, d.offset) == (partition, offset)]
        first, *again = copies
        assert first.pod == victim and first.time < killed_at, copies
        assert str(partition) in victim_units, copies
        assert offset >= last_commit.get(partition, 0), (copies, last_commit)
        assert all(d.time > killed_at for d in again), copies
    print(
        f"\nkafka e2e: {len(expected)} messages, {len(done)} processed, "
        f"{len(duplicates)} duplicates (all from {victim}'s uncommitted tail)"
    )
