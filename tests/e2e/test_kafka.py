"""Kafka consumers on a PartitionSet, the Python one (apportion.kafka) and the Java one
(integrations/kafka-java, on the Java client): a real broker (KRaft, from the jars
`integrations/kafka/fetch-jars.sh` caches), consumers as process pods scaled 2 -> 4 -> 3 while
numbered messages flow, then one consumer SIGKILLed. Every message is processed; no partition is
processed by two consumers at the same time; duplicates come only after the SIGKILL, only from
the killed consumer's uncommitted tail.

Then one consumer cut off from the API server (its route held by the pod simulator's relay,
docs/dev-cluster.md) while it keeps the broker, and its partitions moved by a scale-out: the
hand-off times out, and the consumers' own lines show it stopped handling and committing them
when its serving lease ran out, before their new owners started (docs/handoff.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from integrations.kafka.kafka_broker import KafkaBroker

from apportion.api.pods import DRAIN_ANNOTATION
from apportion_dev.devcluster.podsim.relay import RELAY_ANNOTATION
from tests.support.java import classpath
from tests.support.kafka import (
    Producer,
    commits,
    committed_offsets,
    consumer_pid,
    create_topic,
    processed,
)
from tests.support.unitset import (
    Ownership,
    apply,
    cut_api_route,
    get,
    is_true,
    overlaps,
    ownership_log,
    published,
    read_table,
    ready_pods,
    unit_set,
    workers,
)

pytestmark = pytest.mark.shares_operator

TOPIC = "orders"
PARTITIONS = 8
KEYS = 16
SET = "PartitionSet/orders"
PODS = [f"kc-{i}" for i in range(4)]
GROUP = "orders-apportion"


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


def every_message_processed(
    dev_cluster: Any, namespace: str, produced: list, wait_for: Any
) -> list:
    """What the consumers processed, once it covers every produced message (no loss), each with
    the value it was produced with."""
    expected = {(p.partition, p.offset): f"{p.key}:{p.seq}" for p in produced}

    def all_processed() -> list | None:
        done = processed(dev_cluster, namespace, PODS)
        return done if {(d.partition, d.offset) for d in done} >= expected.keys() else None

    done = wait_for(all_processed, 60, "every produced message processed")
    for d in done:
        assert expected[(d.partition, d.offset)] == d.value, d
    return done


def consumers(
    command: list[str], bootstrap: str, replicas: int, topic: str, *, api_relay: bool = False
) -> dict:
    """The consumers' StatefulSet; `api_relay`: each pod reaches the API server through a route
    a test can cut (CUT_ANNOTATION on the pod) without touching its route to the broker."""
    command = [
        *command, "--topic", topic, "--set", "orders",
        "--bootstrap", bootstrap, "--group", GROUP,
        "--work-time", "0.005", "--commit-interval", "3",
    ]  # fmt: skip
    statefulset = workers("kc", replicas, command=command, grace=30)
    if api_relay:
        statefulset["spec"]["template"]["metadata"]["annotations"][RELAY_ANNOTATION] = "true"
    return statefulset


def settled(kubectl, namespace: str, members: int):
    """The set Balanced over `members` pods with no hand-off under way."""

    def check():
        obj = get(kubectl, namespace, "pset", "orders")
        table = read_table(kubectl, namespace, "PartitionSet", "orders")
        done = obj.get("status", {}).get("members") == members and is_true(obj, "Balanced")
        return table if done and table is not None and not table.releasing() else None

    return check


def spread(kubectl, namespace: str, members: int, holders: int):
    """Settled over `members` pods, `holders` of them holding partitions, evenly."""

    def check():
        table = settled(kubectl, namespace, members)()
        if table is None:
            return None
        held = [len(units) for units in table.by_member().values() if units]
        return table if held == [PARTITIONS // holders] * holders else None

    return check


def intervals(log) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(pod, unit) -> when that pod served the unit (a suspended lease ends an interval, its
    resume starts one)."""
    open_at: dict[tuple[str, str], float] = {}
    found: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for entry in log:
        key = (entry.pod, entry.unit)
        if entry.action in ("acquire", "resume"):
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
        table = published(kubectl, namespace, "PartitionSet", "orders")
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
    done = every_message_processed(dev_cluster, namespace, produced, wait_for)
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
        assert first.pod == victim, copies
        assert first.time < killed_at, copies
        assert str(partition) in victim_units, copies
        assert offset >= last_commit.get(partition, 0), (copies, last_commit)
        assert all(d.time > killed_at for d in again), copies
    print(
        f"\nkafka e2e: {len(expected)} messages, {len(done)} processed, "
        f"{len(duplicates)} duplicates (all from {victim}'s uncommitted tail)"
    )


def test_a_consumer_cut_off_from_the_api_server_stops_before_its_partitions_move(
    broker, consumer_command, operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    topic = f"{TOPIC}-{namespace}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    relayed = consumers(consumer_command, broker.bootstrap, 4, topic, api_relay=True)
    apply(kubectl, namespace, relayed)
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=kc")) == 4, 60, "4 consumers")
    # kc-2 and kc-3 wait, drained, so that the move comes from running consumers (no JVM or
    # interpreter starting in the middle of what is measured).
    spare = ["kc-2", "kc-3"]
    kubectl("annotate", "pod", *spare, "-n", namespace, f"{DRAIN_ANNOTATION}=true")
    # handoffTimeout 6 s: a serving lease of 2 s, so the victim's lease runs out long before the
    # operator may give its partitions away.
    spec = {
        "partitions": PARTITIONS,
        "workloadRef": {"kind": "StatefulSet", "name": "kc"},
        "rebalance": {"interval": "1s", "handoffTimeout": "6s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))
    wait_for(spread(kubectl, namespace, 4, 2), 60, "Balanced over kc-0 and kc-1")
    victim = "kc-0"

    producer = Producer(broker.bootstrap, topic, keys=KEYS, partitions=PARTITIONS)
    producer.start()
    try:
        since = time.time()
        wait_for(
            lambda: (
                {d.pod for d in processed(dev_cluster, namespace, PODS) if d.time > since}
                >= {"kc-0", "kc-1"}
            ),
            60,
            "both consumers handling messages",
        )
        # Cut just after one of the victim's commits: its lease (2 s) runs out before its next
        # (3 s), so it leaves an uncommitted tail that the new owners handle again.
        since = time.time()
        wait_for(
            lambda: any(c.time > since for c in commits(dev_cluster, namespace, [victim])),
            30,
            "a commit of the victim's",
        )
        cut_at = time.time()  # asked for: from here on it may hold
        cut_api_route(kubectl, namespace, victim)
        # The spares join: half of the victim's partitions must go, and it cannot hear of it.
        kubectl("annotate", "pod", *spare, "-n", namespace, f"{DRAIN_ANNOTATION}-")
        wait_for(spread(kubectl, namespace, 4, 4), 120, "Balanced over 4, the victim cut off")

        def moved_and_committed() -> set[str] | None:
            """The victim's partitions taken by others, once each new owner handled and
            committed them, so that a late commit of the victim's would come after theirs."""
            log = ownership_log(dev_cluster, namespace, PODS, SET)
            moved = _moved(log, victim, cut_at)
            done = commits(dev_cluster, namespace, PODS)
            fresh = {str(c.partition) for c in done if c.pod != victim and c.time > cut_at}
            return moved if moved and moved <= fresh else None

        wait_for(moved_and_committed, 60, "the victim's moved partitions committed by others")
        lifted_at = time.time()  # asked for: from here on it may flow again
        cut_api_route(kubectl, namespace, victim, cut=False)

        def victim_serving_again() -> bool:
            log = ownership_log(dev_cluster, namespace, PODS, SET)
            resumed = [o for o in log if o.pod == victim and o.action == "resume"]
            done = processed(dev_cluster, namespace, [victim])
            return any(o.time > lifted_at for o in resumed) and any(
                d.time > lifted_at for d in done
            )

        wait_for(victim_serving_again, 60, "the victim resuming after the cut")
        time.sleep(4)  # more than a commit interval: a stale commit of the victim's would show
    finally:
        produced = producer.stop()

    expected = {(p.partition, p.offset): f"{p.key}:{p.seq}" for p in produced}
    done = every_message_processed(dev_cluster, namespace, produced, wait_for)

    log = ownership_log(dev_cluster, namespace, PODS, SET)
    held = _held(log, victim, cut_at)
    moved = _moved(log, victim, cut_at)
    assert moved, (held, log)
    mine = [o for o in log if o.pod == victim and cut_at < o.time < lifted_at]
    # Taken by the hand-off timeout: the victim, cut off, released none of them itself.
    assert [o for o in mine if o.unit in moved and o.action in ("release", "stop")] == []
    suspended: dict[str, float] = {}
    for o in mine:
        if o.action == "suspend":
            suspended.setdefault(o.unit, o.time)
    assert held <= suspended.keys(), (held, mine)

    victim_commits = commits(dev_cluster, namespace, [victim])
    others_commits = [c for c in commits(dev_cluster, namespace, PODS) if c.pod != victim]
    firsts = []
    for unit in sorted(moved, key=int):
        partition, stopped = int(unit), suspended[unit]
        theirs = [d for d in done if d.partition == partition and d.pod != victim]
        first = min(d.time for d in theirs if d.time > cut_at)
        firsts.append(first)
        # The victim stopped before the new owner started, and handled nothing of it after.
        assert stopped < first, (unit, stopped, first)
        late = [
            d for d in done if d.pod == victim and d.partition == partition and d.time > stopped
        ]
        assert late == [], late
        # Nor committed: not past its lease, so never after the new owner's first commit.
        first_commit = min(
            c.time for c in others_commits if c.partition == partition and c.time > cut_at
        )
        assert [c for c in victim_commits if c.partition == partition and c.time > stopped] == []
        assert [
            c for c in victim_commits if c.partition == partition and c.time >= first_commit
        ] == []

    # The broker keeps the new owners' commits: each moved partition's offset is one its new
    # owner logged, with the token it acquired the partition under.
    on_broker = committed_offsets(broker.bootstrap, GROUP, topic)
    # Read after the broker: the new owners go on committing, so logs read before it may lack
    # the offset it holds.
    others_commits = [c for c in commits(dev_cluster, namespace, PODS) if c.pod != victim]
    for unit in moved:
        partition = int(unit)
        owner = max(
            (o for o in log if o.unit == unit and o.action == "acquire" and o.time > cut_at),
            key=lambda o: o.time,
        )
        offset, metadata = on_broker[partition]
        assert metadata == f"apportion token={owner.token}", (unit, metadata, owner)
        assert offset in {c.offset for c in others_commits if c.partition == partition}, unit

    # Duplicates only from the victim's uncommitted tail of a moved partition: records it
    # handled after its last commit and before it suspended, handled again by the new owner.
    last_commit = {c.partition: c.offset for c in victim_commits if c.time < cut_at}
    times = Counter((d.partition, d.offset) for d in done)
    for (partition, offset), n in times.items():
        if n == 1:
            continue
        first_copy, *again = [d for d in done if (d.partition, d.offset) == (partition, offset)]
        assert str(partition) in moved, (first_copy, again)
        assert first_copy.pod == victim
        assert first_copy.time < suspended[str(partition)]
        assert offset >= last_commit.get(partition, 0), (first_copy, last_commit)
        assert all(d.pod != victim for d in again), again

    # After the cut: the victim says it serves again, and only what it resumed or acquired.
    after = [o for o in log if o.pod == victim and o.time > lifted_at]
    resumed = {o.unit for o in after if o.action == "resume"}
    assert resumed, after
    assert resumed.isdisjoint(moved), (resumed, moved)
    granted = resumed | {o.unit for o in after if o.action == "acquire"}
    handled = {str(d.partition) for d in done if d.pod == victim and d.time > lifted_at}
    assert handled <= granted, (handled, granted)
    assert overlaps(log) == []
    print(
        f"\nkafka cut: kc-0 suspended {min(suspended.values()) - cut_at:.2f}s after the cut; "
        f"its moved partitions {sorted(moved, key=int)} were first handled by their new owners "
        f"{min(firsts) - cut_at:.2f}s after the cut; {len(expected)} messages, "
        f"{sum(n - 1 for n in times.values())} duplicates"
    )


def _held(log: list[Ownership], pod: str, before: float) -> set[str]:
    """The units `pod` served just before `before`, from its own lines."""
    last: dict[str, str] = {}
    for o in log:
        if o.pod == pod and o.time < before:
            last[o.unit] = o.action
    return {unit for unit, action in last.items() if action in ("acquire", "resume")}


def _moved(log: list[Ownership], pod: str, since: float) -> set[str]:
    """Of the units `pod` served at `since`, those another pod acquired after it."""
    taken = {o.unit for o in log if o.action == "acquire" and o.pod != pod and o.time > since}
    return _held(log, pod, since) & taken


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_broker_script_run_in_the_background_says_where_it_is_and_stops_its_jvm(
    stop: signal.Signals, tmp_path: Any, wait_for: Any
) -> None:
    """As a user starts it from docs/kafka.md: `python kafka_broker.py DIR > log &` — the shell
    starts a background job with SIGINT ignored, and the output goes to a file."""
    script = sys.modules[KafkaBroker.__module__].__file__
    out = tmp_path / "broker.out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with out.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "kafka")],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            start_new_session=True,  # its own process group: nothing outlives the test
        )
    try:
        wait_for(lambda: "127.0.0.1:" in out.read_text(), 120, "the script printing its address")
        (jvm,) = (
            int(p)
            for p in subprocess.run(
                ["pgrep", "-P", str(process.pid)], capture_output=True, text=True
            ).stdout.split()
        )
        process.send_signal(stop)
        assert process.wait(timeout=60) == 128 + stop
        wait_for(lambda: not os.path.exists(f"/proc/{jvm}"), 30, "the Kafka JVM to exit")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
