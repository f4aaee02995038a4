"""Kafka partitions placed by a PartitionSet against Kafka's own consumer-group rebalancing, on
the same broker and workload, every side's consumers run the same way (figures, not asserts).

Workload: a topic of 12 partitions, one message per partition every 50 ms; each record takes
2 ms to handle. Every side's consumers are process pods of a StatefulSet `kc` on one dev-cluster
(pod simulator), with a readiness probe on /healthz (1 s period) and a 30 s grace period. Steps:
3 consumers (`kubectl apply`), then 4 and 2 (`kubectl scale`), then a rolling restart of the 2
(a template change: the StatefulSet replaces one pod at a time, the next once the new one is
Ready). A step ends 3 s after the side settled. Per step:

- moved: partitions whose consumer (pod name) changed (Kafka's eager protocol also stops every
  other partition during a rebalance: that shows in the wait, not in this count);
- wait: the longest time a record produced during the step waited until it was handled: the
  worst partition's, and the mean over partitions of each one's longest;
- again: records handled a second time in the step (resumed from an older commit);
- last: seconds from the step's start to the last partition's acquire by its new consumer;
  started: to the last process the step started (pod simulator's log). Where the moves' time
  goes: up to `started` the StatefulSet controller and the pod simulator (and on a restart the
  old pod's termination), after it the interpreter or JVM, the readiness probe and the group's
  join or the operator's next table.

Sides (`--side`, repeatable; `kafka` = every group side):
- apportion: `python -m apportion.kafka` on a PartitionSet (rebalance interval 1 s), the
  operator as a process; apportion-java: the Java consumer (integrations/kafka-java's
  PrintingConsumer) on the same; apportion-held, apportion-java-held: the same with
  `rebalance.restartGrace: 30s` (docs/handoff.md "Restarts in place": a rolling update's pod
  releases its partitions to nobody and gets them back as its next incarnation);
- bench/kafka_group_consumer.py in each of its protocols, one group per run: eager-roundrobin,
  eager-sticky (aiokafka, classic eager), cooperative-sticky (confluent-kafka), kip848 (the
  `consumer` protocol of Kafka 4, its heartbeat interval set to 1 s on the broker), static
  (cooperative-sticky with `group.instance.id` = the pod's name, KIP-345).
Every consumer logs the same lines (docs/kafka.md), read by one analysis for all sides.

`--runs N` (default 5, `--quick` 1) runs every side N times, the sides taking turns so that a
busy moment of the machine does not fall on one side only; each cell then reads median (range).

Run: .venv/bin/python -m bench.bench_kafka [--quick] [--runs N]
[--side SIDE]... (`make kafka-jars` first: the broker runs from the cached jars.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from integrations.kafka.kafka_broker import KafkaBroker
from tests.support.kafka import Produced, Producer, create_topic, processed
from tests.support.unitset import (
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

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 12
PERIOD = 0.05
WORK_TIME = 0.002
SETTLE_MARGIN = 3.0
QUIET = 2.0
STEPS = ("3 consumers", "3 -> 4", "4 -> 2", "rolling restart")
PODS = [f"kc-{i}" for i in range(4)]
GROUP_PROTOCOLS = ("eager-roundrobin", "eager-sticky", "cooperative-sticky", "kip848", "static")
# bench/KafkaGroupConsumer.java: the plain Java KafkaConsumer, beside apportion-java.
JAVA_PROTOCOLS = ("cooperative-sticky", "kip848", "static")
GROUP_SIDES = (*GROUP_PROTOCOLS, *(f"{p}-java" for p in JAVA_PROTOCOLS))
# -held: the same consumers with rebalance.restartGrace, so a restarting pod keeps its partitions.
APPORTION_SIDES = ("apportion", "apportion-held", "apportion-java", "apportion-java-held")
SIDES = (*APPORTION_SIDES, *GROUP_SIDES)
RESTART_GRACE = "30s"


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Figures:
    moved: int
    wait_max: float
    wait_mean: float
    again: int
    last: float
    started: float
    length: float


def kafka_figures(**saved: Any) -> Figures:
    """Figures saved by `--out`; runs saved before `started` was measured read 0 there."""
    return Figures(**{"started": 0.0, **saved})


F = TypeVar("F")
Handled = dict[int, list[tuple[float, int]]]
"""partition -> (time, offset) of every record handled, in time order."""

Assigned = list[tuple[float, int, str]]
"""(time, partition, pod) of every acquire."""


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


def moves(assigned: Assigned, step: Step) -> tuple[int, float]:
    """Partitions given to another consumer than their previous one within the step, and the
    seconds from the step's start to the last such acquire (0 when none moved)."""
    holder: dict[int, str] = {}
    moved, last = 0, step.start
    for t, partition, consumer in sorted(assigned):
        previous = holder.get(partition)
        if step.start < t <= step.end and previous is not None and previous != consumer:
            moved += 1
            last = t
        holder[partition] = consumer
    return moved, last - step.start


# The pod simulator's line when it starts a pod's process: "2026-11-26 08:01:25,066 INFO
# apportion_dev.devcluster.podsim.simulator: <namespace>/<pod>: started java (pid 14003)".
_STARTED = re.compile(r"^(?P<when>\S+ \S+),(?P<ms>\d{3}) .*: (?P<ns>[^/\s]+)/\S+: started ")


def process_starts(podsim_log: Path, namespace: str) -> list[float]:
    """When the pod simulator started a process of a pod of `namespace` (Unix time)."""
    found = []
    for line in podsim_log.read_text(errors="replace").splitlines():
        if (m := _STARTED.match(line)) and m["ns"] == namespace:
            when = time.mktime(time.strptime(m["when"], "%Y-%m-%d %H:%M:%S"))
            found.append(when + int(m["ms"]) / 1000)
    return found


def figures(
    steps: list[Step],
    handled: Handled,
    assigned: Assigned,
    produced: list[Produced],
    starts: list[float],
) -> dict[str, Figures]:
    found = {}
    for step in steps[1:]:
        waits = longest_waits(handled, produced, step)
        moved, last = moves(assigned, step)
        started = [t - step.start for t in starts if step.start < t <= step.end]
        found[step.name] = Figures(
            moved,
            max(waits),
            statistics.fmean(waits),
            handled_again(handled, step),
            last,
            max(started, default=0.0),
            step.end - step.start,
        )
    return found


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_kafka: {what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)


# ------------------------------------------------------------------------------------ sides


def worker_namespace(kubectl: Callable[..., Any], namespace: str) -> None:
    """A namespace whose pods may run apportion workers, once its default ServiceAccount exists
    (pods created before it are refused)."""
    kubectl("create", "namespace", namespace)
    grant_worker_role(kubectl, namespace)
    wait_until(
        lambda: (
            kubectl("get", "-n", namespace, "serviceaccount", "default", check=False).returncode
            == 0
        ),
        30,
        "the default ServiceAccount",
    )


def consumer_command(side: str, java_classpath: Callable[[], str]) -> list[str]:
    """How a pod of `side` starts, up to the flags every side shares (--topic, --bootstrap,
    --group, --work-time, --port)."""
    side = side.removesuffix("-held")
    if side == "apportion":
        return [sys.executable, "-m", "apportion.kafka", "--set", "orders"]
    if side == "apportion-java":
        main = "dev.apportion.kafka.sample.PrintingConsumer"
        return ["java", "-cp", java_classpath(), main, "--set", "orders"]
    if side.endswith("-java"):
        return ["java", "-cp", java_classpath(), "KafkaGroupConsumer", "--protocol", side[:-5]]
    script = str(REPO / "bench" / "kafka_group_consumer.py")
    return [sys.executable, script, "--protocol", side]


def ownership(log: list[Any]) -> tuple[dict[str, set[int]], float]:
    """pod -> partitions it holds by its own lines, and the time of the newest line."""
    held: dict[str, set[int]] = defaultdict(set)
    newest = 0.0
    for entry in log:
        if entry.action == "acquire":
            held[entry.pod].add(int(entry.unit))
        else:
            held[entry.pod].discard(int(entry.unit))
        newest = max(newest, entry.time)
    return held, newest


def run_side(
    cluster: Any, bootstrap: str, side: str, run: int, command: list[str]
) -> dict[str, Figures]:
    """One run of one side in its own namespace, topic and group: the step figures."""
    kubectl = cluster.kubectl
    namespace = f"bk-{side}-{run}"
    topic = group = f"bench-{side}-{run}"
    apportion = side.startswith("apportion")
    set_name = "PartitionSet/orders" if apportion else f"Group/{group}"
    worker_namespace(kubectl, namespace)
    create_topic(bootstrap, topic, PARTITIONS)
    command = [
        *command, "--topic", topic, "--bootstrap", bootstrap, "--group", group,
        "--work-time", str(WORK_TIME), "--port", "8080",
    ]  # fmt: skip
    consumers = workers("kc", 3, command=command, grace=30)
    # Ready once the consumer serves /healthz: the operator gives partitions to pods that can
    # take them, and a rolling update goes on to the next pod only then.
    (container,) = consumers["spec"]["template"]["spec"]["containers"]
    container["readinessProbe"] = {
        "httpGet": {"path": "/healthz", "port": "metrics"},
        "periodSeconds": 1,
    }
    state = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    operator = Operator(cluster, namespace, state / "operator.log") if apportion else None
    producer = Producer(bootstrap, topic, keys=PARTITIONS, partitions=PARTITIONS, period=PERIOD)
    producer.start()
    steps: list[Step] = []
    try:

        def rolled_out(replicas: int) -> bool:
            sts = get(kubectl, namespace, "statefulset", "kc")
            status = sts["status"]
            pods = get(kubectl, namespace, "pods")["items"]
            return (
                status.get("observedGeneration") == sts["metadata"]["generation"]
                and status.get("readyReplicas") == replicas
                and status.get("updatedReplicas") == replicas
                and status.get("currentRevision") == status.get("updateRevision")
                and len(pods) == replicas
            )

        def settled(replicas: int, old_uids: dict[str, str] | None = None) -> Callable[[], bool]:
            def placed() -> bool:
                obj = get(kubectl, namespace, "pset", "orders")
                table = read_table(kubectl, namespace, "PartitionSet", "orders")
                if table is None or table.releasing() or not is_true(obj, "Balanced"):
                    return False
                fresh = old_uids is None or all(
                    table.member_uids.get(p) not in (None, uid) for p, uid in old_uids.items()
                )
                return obj["status"].get("members") == replicas and fresh

            def grouped() -> bool:
                """Every partition held once, evenly over the pods (as the PartitionSet's
                Balanced): a member still joining holds none, and a quiet moment before it
                has joined is not the end of the step."""
                held, newest = ownership(ownership_log(cluster, namespace, PODS, set_name))
                owned = sorted(p for ps in held.values() for p in ps)
                counts = [len(held.get(f"kc-{i}", ())) for i in range(replicas)]
                return (
                    owned == list(range(PARTITIONS))
                    and max(counts) - min(counts) <= 1
                    and time.time() - newest > QUIET
                )

            return lambda: rolled_out(replicas) and (placed() if apportion else grouped())

        def step(name: str, action: Callable[[], Any], check: Callable[[], bool]) -> None:
            start = time.time()
            action()
            wait_until(check, 240, f"{side} settled after {name}")
            time.sleep(SETTLE_MARGIN)
            steps.append(Step(name, start, time.time()))

        def begin() -> None:
            apply(kubectl, namespace, consumers)
            if apportion:
                rebalance = {"interval": "1s", "handoffTimeout": "60s"}
                if side.endswith("-held"):
                    rebalance["restartGrace"] = RESTART_GRACE
                spec = {
                    "partitions": PARTITIONS,
                    "workloadRef": {"kind": "StatefulSet", "name": "kc"},
                    "rebalance": rebalance,
                }
                apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))

        def scale(n: int) -> Callable[[], Any]:
            return lambda: kubectl("scale", "-n", namespace, "statefulset", "kc", f"--replicas={n}")

        def restart() -> None:
            patch = {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
            kubectl(
                "patch", "-n", namespace, "statefulset", "kc", "--type=merge",
                "-p", json.dumps(patch),
            )  # fmt: skip

        step(STEPS[0], begin, settled(3))
        step(STEPS[1], scale(4), settled(4))
        step(STEPS[2], scale(2), settled(2))
        old = None
        if apportion:
            table = read_table(kubectl, namespace, "PartitionSet", "orders")
            old = dict(table.member_uids) if table is not None else None
        step(STEPS[3], restart, settled(2, old))
    finally:
        produced = producer.stop()
        # The next side must not share the cores with this one's pods.
        kubectl("scale", "-n", namespace, "statefulset", "kc", "--replicas=0", check=False)
        wait_until(lambda: not get(kubectl, namespace, "pods")["items"], 120, f"{side}'s pods gone")
        if operator is not None:
            operator.stop()
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    handled: Handled = defaultdict(list)
    for record in processed(cluster, namespace, PODS):
        handled[record.partition].append((record.time, record.offset))
    assigned = [
        (o.time, int(o.unit), o.pod)
        for o in ownership_log(cluster, namespace, PODS, set_name)
        if o.action == "acquire"
    ]
    starts = process_starts(cluster.log_path("podsim"), namespace)
    return figures(steps, handled, assigned, produced, starts)


# ---------------------------------------------------------------------------------- figures


def spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """median (range), or the value alone when every run gave it."""
    median = f"{statistics.median(values):.{digits}f}{unit}"
    low, high = min(values), max(values)
    if len(values) == 1 or f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return median
    return f"{median} ({low:.{digits}f}-{high:.{digits}f})"


def summary(results: dict[str, list[dict[str, Figures]]]) -> list[str]:
    """A Markdown table: per side and step, moved; wait max; wait mean; last process started /
    last move."""
    rows = ["| side | runs | " + " | ".join(STEPS[1:]) + " |", "| --- | --- |" + " --- |" * 3]
    for side, runs in results.items():
        if not runs:
            continue
        cells = []
        for name in STEPS[1:]:
            of = [r[name] for r in runs]
            moved = spread([float(f.moved) for f in of], digits=0)
            again = sum(f.again for f in of)
            cells.append(
                f"{moved}; {spread([f.wait_max for f in of], ' s')}; "
                f"{spread([f.wait_mean for f in of], ' s')}; "
                f"{spread([f.started for f in of])} / {spread([f.last for f in of])}"
                + (f"; again {again}" if again else "")
            )
        rows.append(f"| {side} | {len(runs)} | " + " | ".join(cells) + " |")
    return rows


def take_turns(
    runs: int,
    sides: Sequence[str],
    run_side: Callable[[str, int], dict[str, F]],
    out: Path | None,
    line: Callable[[F], str],
) -> dict[str, list[dict[str, F]]]:
    """Every side `runs` times, the sides taking turns so that a busy moment of the machine does
    not fall on one side only; each run's figures printed (`line`) and, with `out`, all so far
    saved after it (`to_json`)."""
    results: dict[str, list[dict[str, F]]] = {side: [] for side in sides}
    for run in range(runs):
        for side in sides:
            try:
                found = run_side(side, run)
            except (Exception, SystemExit) as error:
                # One side that does not settle must not lose the others' runs.
                print(f"  run {run} {side}: no figures: {error!r}", flush=True)
                continue
            results[side].append(found)
            if out:
                out.write_text(json.dumps(to_json(results), indent=1))
            for name, f in found.items():
                print(f"  run {run} {side:<18} {name:<16} {line(f)}", flush=True)
    return results


def to_json(results: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A bench's results (side → runs → step → a dataclass of figures) as JSON (`--out`)."""
    return {
        side: [{name: dataclasses.asdict(f) for name, f in run.items()} for run in runs]
        for side, runs in results.items()
    }


def from_json(saved: dict[str, Any], figures: Callable[..., F]) -> dict[str, list[dict[str, F]]]:
    """`to_json`'s results read back (`--report`), each step's figures made by `figures`."""
    return {
        side: [{name: figures(**f) for name, f in run.items()} for run in runs]
        for side, runs in saved.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run per side")
    parser.add_argument("--runs", type=int, help="runs per side (default 5, --quick 1)")
    parser.add_argument("--side", choices=(*SIDES, "kafka"), action="append")
    parser.add_argument("--out", type=Path, help="the figures so far, as JSON, after every run")
    parser.add_argument("--report", type=Path, help="only the table of a JSON file of --out")
    args = parser.parse_args()
    if args.report:
        print("\n".join(summary(from_json(json.loads(args.report.read_text()), kafka_figures))))
        return 0
    runs = args.runs or (1 if args.quick else 5)
    # The producer's retries while a new topic's leader is elected are not a figure.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    chosen = args.side or list(SIDES)
    sides = [s for s in SIDES if s in chosen or (s in GROUP_SIDES and "kafka" in chosen)]
    java: list[str] = []

    def java_classpath() -> str:
        """integrations/kafka-java's classes and dependencies (kafka-clients among them), and
        bench/KafkaGroupConsumer.java compiled against them, once."""
        if not java:
            from tests.support.java import classpath

            built = tempfile.mkdtemp(prefix="bench-kafka-java-")
            path = f"{built}:{classpath('integrations/kafka-java')}"
            source = str(REPO / "bench" / "KafkaGroupConsumer.java")
            subprocess.run(["javac", "-d", built, "-cp", path, source], check=True)
            java.append(path)
        return java[0]

    from apportion_dev.devcluster import DevCluster

    commands = {side: consumer_command(side, java_classpath) for side in sides}
    # The KIP-848 protocol's heartbeat interval is the broker's: 1 s, as the classic clients'.
    heartbeat = {
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "1000",
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-broker-"))
    cluster = DevCluster.start()
    try:
        cluster.kubectl("apply", "-f", str(REPO / "crds"))
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/partitionsets.apportion.dev",
        )
        with KafkaBroker(workdir, overrides=heartbeat) as broker:
            results = take_turns(
                runs,
                sides,
                lambda side, run: run_side(cluster, broker.bootstrap, side, run, commands[side]),
                args.out,
                lambda f: (
                    f"moved {f.moved:>3}  wait max {f.wait_max:5.2f} s  "
                    f"mean {f.wait_mean:5.2f} s  again {f.again:>4}  "
                    f"started {f.started:5.2f} s  last {f.last:5.2f} s  "
                    f"(step {f.length:5.1f} s)"
                ),
            )
    finally:
        cluster.stop()
    print(f"\nbench_kafka: {PARTITIONS} partitions, a record per partition every {PERIOD}s;")
    print(
        "each cell: moved; wait max; wait mean; last process started / last move (s after the"
        " step's start), median (range) over the runs"
    )
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
