"""Pekko Cluster Sharding placed by its own allocation strategy against Pekko following a
ShardSet, on the same app and steps (figures, not asserts; docs/pekko.md shows them).

Workload: the sample Counter app (integrations/pekko, tests/support/pekko.py) with 12
shards, in process pods of a StatefulSet `pk` on one dev-cluster (pod simulator), each Ready once
it is an Up member, 30 s grace period; four senders send numbered messages to 24 entities (two
per shard) through pk-0 and pk-1, one at a time per entity, and send a message again when it got
no answer (the sample's ask times out after 5 s). Steps: 3 nodes (`kubectl apply`), then 5 and 2
(`kubectl scale`), a rolling restart of the 2 (`kubectl rollout restart`), then the JVM of one of
them SIGKILLed (the pod simulator restarts it in the same pod: same address, new incarnation; the
one whose address is not the lowest, so the Split Brain Resolver keeps the other). A step ends 3 s
after its distribution was final. Per step, from the step's command:

- final: seconds until the distribution is final: the step's pods (new ones after a restart,
  a new JVM after the kill) Ready and alone, Pekko's view (GetClusterShardingStats) holding all
  12 shards over exactly those pods, at most one apart, and every entity answered since the
  step began; following a ShardSet also the view equal to the settled table (no release). Held
  for 2 s (the time it was first seen counts);
- moved: shard moves between pods, from the entities' start lines (a shard whose entities start
  on pk-0, then pk-1, then pk-0 moved twice; a restart on the same pod is no move);
- rounds: Pekko's coordinator rebalance rounds (its `Starting rebalance for shards` lines), the
  way both sides move shards between live regions (a node leaving hands its shards off without);
- retried: messages sent again (once or more) after no answer; lost: messages never counted
  (0 while the senders retry);
- wait: the longest a message answered within the step waited from its first send to its answer;
- started / ready / table / round: the breakdown of `final`: the step's last process started
  (pod simulator's log: the StatefulSet controller, a terminating pod's drain), its pods all
  Ready (JVM start, cluster join), the ShardSet's table settled on them (the operator), the first
  rebalance round (Pekko's rebalance-interval); final - ready: what is left once the pods are
  Ready (Pekko's own strategy starts moving shards to a new region before its pod is Ready).
Each step's messages, moves and rounds are those from its command to the next step's.

Sides (`--side`, repeatable):
- pekko: Pekko's LeastShardAllocationStrategy with its defaults (rebalance-interval 10 s, the
  pre-2.6.10 algorithm: rebalance-threshold 1, max-simultaneous-rebalance 3);
- pekko-tuned: the same as Pekko's docs tune it: rebalance-interval 1 s, the 2.6.10+ algorithm
  (rebalance-absolute-limit 20, as the docs' example) with rebalance-relative-limit 1.0 (the
  default 0.1 lets a round move one of 12 shards);
- apportion: the ShardSet's placement (integrations/pekko, rebalance-interval 1 s), the
  operator as a process, ShardSet rebalance interval 1 s, handoffTimeout 60 s, restartGrace 60 s.

`--runs N` (default 5, `--quick` 1) runs every side N times, the sides taking turns so that a
busy moment of the machine does not fall on one side only; each cell then reads median (range).

Run: .venv/bin/python -m bench.bench_pekko [--quick] [--runs N]
[--side SIDE]... [--out FILE.json] (`make java` first, or it builds the Java trees).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.pekko import (
    SET,
    SHARDS,
    STS,
    Traffic,
    counter_app,
    entities,
    entity_log,
    fetch,
)
from tests.support.unitset import (
    Operator,
    apply,
    get,
    read_table,
    unit_set,
    worker_pid,
)

from apportion.engine.locate import locate
from bench.bench_kafka import (
    from_json,
    process_starts,
    spread,
    take_turns,
    wait_until,
    worker_namespace,
)

REPO = Path(__file__).resolve().parents[1]
STEPS = ("first placement", "3 -> 5", "5 -> 2", "rolling restart", "SIGKILL")
SIDES = ("pekko", "pekko-tuned", "apportion")
PODS = [f"{STS}-{i}" for i in range(5)]
SETTLE_MARGIN = 3.0
CONFIRM = 2.0
STRATEGY = "pekko.cluster.sharding.least-shard-allocation-strategy"
JAVA_OPTIONS = {
    "pekko": (),
    "pekko-tuned": (
        "-Dpekko.cluster.sharding.rebalance-interval=1s",
        f"-D{STRATEGY}.rebalance-absolute-limit=20",
        f"-D{STRATEGY}.rebalance-relative-limit=1.0",
    ),
    "apportion": (),
}


@dataclasses.dataclass(frozen=True)
class Figures:
    final: float
    moved: int
    rounds: int
    retried: int
    lost: int
    wait: float
    started: float
    ready: float
    table: float
    round: float


@dataclasses.dataclass
class Step:
    name: str
    start: float
    end: float = 0.0
    ready: float = -1.0
    table: float = -1.0


# Pekko's lines carry HH:mm:ss.SSS (the sample's simple logger, in the machine's zone, UTC
# here); the coordinator logs a round as "<type>: Starting rebalance for shards [1,5]. ...",
# and "... shards []. Current shards rebalancing: [5]" at every tick a rebalance is still on.
_ROUND = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) .*Starting rebalance for shards \[\d")


def rounds(texts: list[str], day: float) -> list[float]:
    """Unix times of the coordinator's rebalance rounds in the pods' logs, `day` being the
    Unix time of the run's midnight (UTC)."""
    found = []
    for text in texts:
        for line in text.splitlines():
            if m := _ROUND.match(line):
                h, mi, s, ms = (int(g) for g in m.groups())
                found.append(day + h * 3600 + mi * 60 + s + ms / 1000)
    return sorted(found)


def shard_moves(log: list[tuple], shard_of: dict[str, str]) -> list[tuple[float, str]]:
    """(time, shard) of every move between pods: a shard's entities starting on another pod than
    the one they last started on."""
    where: dict[str, str] = {}
    found = []
    for t, action, entity, pod, _ in log:
        if action != "start" or entity not in shard_of:
            continue
        shard = shard_of[entity]
        if where.get(shard, pod) != pod:
            found.append((t, shard))
        where[shard] = pod
    return found


def figures(
    steps: list[Step],
    traffic: Traffic,
    log: list[tuple],
    shard_of: dict[str, str],
    round_times: list[float],
    starts: list[float],
    stopped: float,
) -> dict[str, Figures]:
    counted = {(e, seq) for _, a, e, _, seq in log if a == "msg"}
    moves = shard_moves(log, shard_of)
    found = {}
    for i, step in enumerate(steps):
        until = steps[i + 1].start if i + 1 < len(steps) else stopped

        def within(t: float, s: Step = step, u: float = until) -> bool:
            return s.start <= t < u

        # By when they were answered: a message sent just before the next step's command (a
        # SIGKILL) waits for that step, not this one.
        replies = [r for r in traffic.replies if within(r["answered"])]
        lost = {(r["entity"], r["seq"]) for r in traffic.replies if within(r["first_sent"])}
        lost -= counted
        step_rounds = [t for t in round_times if within(t)]
        found[step.name] = Figures(
            final=step.end - step.start,
            moved=sum(within(t) for t, _ in moves),
            rounds=len(step_rounds),
            retried=len({(e, seq) for e, seq, _, t in traffic.retried if within(t)}),
            lost=len(lost),
            wait=max((r["answered"] - r["first_sent"] for r in replies), default=0.0),
            started=max((t - step.start for t in starts if within(t)), default=0.0),
            ready=step.ready - step.start if step.ready >= 0 else -1.0,
            table=step.table - step.start if step.table >= 0 else -1.0,
            round=step_rounds[0] - step.start if step_rounds else -1.0,
        )
    return found


# ------------------------------------------------------------------------------------ a run


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return "deletionTimestamp" not in pod["metadata"] and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def _fronts_of(pods: dict[str, dict[str, Any]]) -> list[str]:
    """pk-0 and pk-1 while Ready and not terminating (messages enter the cluster there)."""
    return [
        f"http://{pods[p]['status']['podIP']}:8080"
        for p in (f"{STS}-0", f"{STS}-1")
        if p in pods and _ready(pods[p])
    ]


class _SideRun:
    """One run of one side in its namespace: the steps taken so far and the traffic."""

    def __init__(self, kubectl: Any, side: str, run: int) -> None:
        self.kubectl = kubectl
        self.side, self.run = side, run
        self.namespace = f"bp-{side}-{run}"
        self.apportion = side == "apportion"
        self.names = entities()
        self.steps: list[Step] = []
        self.begun: list[float] = []  # every step's start, the one that never became final too
        self.traffic: Traffic | None = None

    def read_pods(self) -> dict[str, dict[str, Any]]:
        """pod → its object (a new dict each time: the senders' threads read them too)."""
        return {
            p["metadata"]["name"]: p for p in get(self.kubectl, self.namespace, "pods")["items"]
        }

    def fronts(self) -> list[str]:
        return _fronts_of(self.read_pods())

    def final(
        self,
        step: Step,
        members: set[str],
        old_uids: dict[str, str],
        killed: tuple[str, int] | None,
    ) -> bool:
        pods = self.read_pods()
        now = time.time()
        if set(pods) != members or not all(_ready(p) for p in pods.values()):
            return False
        if any(pods[p]["metadata"]["uid"] == uid for p, uid in old_uids.items()):
            return False
        if killed is not None:
            try:
                if worker_pid(self.namespace, killed[0], b"CounterApp") == killed[1]:
                    return False
            except LookupError:
                return False
        if step.ready < 0:
            step.ready = now
        wanted = None
        if self.apportion:
            table = read_table(self.kubectl, self.namespace, "ShardSet", SET)
            if table is None or table.releasing():
                return False
            wanted = {m: set(u) for m, u in table.by_member().items() if u}
            if set(wanted) != members:
                return False
            if step.table < 0:
                step.table = now
        urls = _fronts_of(pods)
        status, body = fetch(f"{urls[0]}/view", timeout=10) if urls else (0, "")
        if status != 200:
            return False
        view = {p: set(s) for p, s in json.loads(body).items() if s}
        sizes = [len(s) for s in view.values()]
        if set(view) != members or sum(sizes) != SHARDS or max(sizes) - min(sizes) > 1:
            return False
        if len(set().union(*view.values())) != SHARDS or (wanted and view != wanted):
            return False
        assert self.traffic is not None
        answered = {r["entity"] for r in list(self.traffic.replies) if r["first_sent"] > step.start}
        return answered == set(self.names)

    def step(
        self,
        name: str,
        action: Callable[[], Any],
        members: set[str],
        old_uids: dict[str, str] | None = None,
        killed: tuple[str, int] | None = None,
    ) -> None:
        current = Step(name, time.time())
        self.begun.append(current.start)
        action()
        first = None
        deadline = time.monotonic() + 300
        while True:
            ok = self.final(current, members, old_uids or {}, killed)
            now = time.time()
            if ok and first is None:
                first = now
            elif not ok:
                first = None
            if first is not None and now - first >= CONFIRM:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_pekko: {self.side} not final after {name}")
            time.sleep(0.3)
        current.end = first
        self.steps.append(current)
        print(
            f"  run {self.run} {self.side:<12} {name:<16} "
            f"final after {first - current.start:6.1f} s",
            flush=True,
        )
        time.sleep(SETTLE_MARGIN)

    def begin(self, sts: Any) -> None:
        kubectl, namespace = self.kubectl, self.namespace
        apply(kubectl, namespace, sts)
        if self.apportion:
            spec = {
                "shards": SHARDS,
                "workloadRef": {"kind": "StatefulSet", "name": STS},
                "rebalance": {
                    "interval": "1s",
                    "handoffTimeout": "60s",
                    "restartGrace": "60s",
                },
            }
            apply(kubectl, namespace, unit_set("ShardSet", SET, spec))
        # The senders need a front: pk-0 and pk-1 Ready (Up members).
        wait_until(lambda: len(self.fronts()) == 2, 180, f"{self.side}: pk-0 and pk-1 Ready")
        self.traffic = Traffic(self.fronts, self.names)
        self.traffic.start()

    def scale(self, n: int) -> Callable[[], Any]:
        return lambda: self.kubectl(
            "scale", "-n", self.namespace, "statefulset", STS, f"--replicas={n}"
        )

    def all_steps(self, sts: Any) -> None:
        kubectl, namespace = self.kubectl, self.namespace
        two = {f"{STS}-0", f"{STS}-1"}
        self.step(STEPS[0], lambda: self.begin(sts), {f"{STS}-{i}" for i in range(3)})
        self.step(STEPS[1], self.scale(5), set(PODS))
        self.step(STEPS[2], self.scale(2), two)
        uids = {p: obj["metadata"]["uid"] for p, obj in self.read_pods().items()}
        self.step(
            STEPS[3],
            lambda: kubectl("rollout", "restart", "-n", namespace, "statefulset", STS),
            two,
            uids,
        )
        # The survivor must hold the lowest address: with two members and one unreachable,
        # the Split Brain Resolver's keep-majority keeps the side of the lowest address
        # (host as a string, as Pekko's Member ordering compares them).
        victim = max(two, key=lambda p: self.read_pods()[p]["status"]["podIP"])
        pid = worker_pid(namespace, victim, b"CounterApp")
        self.step(STEPS[4], lambda: os.kill(pid, signal.SIGKILL), two, killed=(victim, pid))


def run_side(cluster: Any, side: str, run: int, classpath: str) -> dict[str, Figures]:
    """One run of one side in its own namespace: the step figures."""
    kubectl = cluster.kubectl
    this = _SideRun(kubectl, side, run)
    namespace, steps = this.namespace, this.steps
    worker_namespace(kubectl, namespace)
    shard_of = {e: str(locate([e], scheme="akka", count=SHARDS)[0].unit) for e in this.names}
    sts = counter_app(classpath, java_options=JAVA_OPTIONS[side], own=not this.apportion)
    state = Path(tempfile.mkdtemp(prefix="bench-pekko-"))
    operator = Operator(cluster, namespace, state / "operator.log") if this.apportion else None
    try:
        this.all_steps(sts)
    except SystemExit as error:
        # A step that never became final: the steps before it keep their figures (a run of
        # pekko-tuned lost four steps' figures to its SIGKILL step this way).
        print(f"  run {run} {side}: {error}", flush=True)
    finally:
        # The last step's window ends here, or where the step that never became final began.
        begun = this.begun
        stopped = begun[len(steps)] if len(begun) > len(steps) else time.time()
        if this.traffic is not None:
            try:
                this.traffic.stop()
            except AssertionError as error:
                print(f"  run {run} {side}: {error}", flush=True)
        # The next side must not share the cores with this one's JVMs.
        kubectl("scale", "-n", namespace, "statefulset", STS, "--replicas=0", check=False)
        wait_until(lambda: not get(kubectl, namespace, "pods")["items"], 120, f"{side}'s pods gone")
        if operator is not None:
            operator.stop()
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    if this.traffic is None:
        raise SystemExit(f"bench_pekko: {side} never sent a message")
    texts = [
        Path(cluster.pod_log_path(namespace, p)).read_text(errors="replace")
        for p in PODS
        if Path(cluster.pod_log_path(namespace, p)).exists()
    ]
    day = steps[0].start - steps[0].start % 86400
    return figures(
        steps,
        this.traffic,
        entity_log(cluster, namespace, PODS),
        shard_of,
        rounds(texts, day),
        process_starts(cluster.log_path("podsim"), namespace),
        stopped,
    )


# ---------------------------------------------------------------------------------- figures


def summary(results: dict[str, list[dict[str, Figures]]]) -> list[str]:
    """A Markdown table: a row per step and side, median (range) over the runs."""
    rows = [
        "| step | side | runs | final (s) | moved | rounds | retried / lost | wait (s) "
        "| started / ready / table / round (s) | final - ready (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in STEPS:
        for side, runs in results.items():
            of = [r[name] for r in runs if name in r]
            if not of:
                continue

            def cell(field: str, digits: int = 1, of: list[Figures] = of) -> str:
                values = [float(getattr(f, field)) for f in of]
                if all(v < 0 for v in values):
                    return "-"
                return spread([v for v in values if v >= 0], digits=digits)

            rows.append(
                f"| {name} | {side} | {len(of)} | {cell('final')} | {cell('moved', 0)} | "
                f"{cell('rounds', 0)} | {cell('retried', 0)} / {cell('lost', 0)} | "
                f"{cell('wait')} | {cell('started')} / {cell('ready')} / {cell('table')} / "
                f"{cell('round')} | {spread([f.final - f.ready for f in of], digits=1)} |"
            )
    return rows


def goal(results: dict[str, list[dict[str, Figures]]]) -> list[str]:
    """Per scaling step: Pekko's own strategy's median `final` over apportion's, and moves."""
    lines = []
    mine = results.get("apportion") or []
    for name in STEPS:
        if not mine:
            break
        mine_step = [r[name] for r in mine if name in r]
        if not mine_step:
            continue
        a_final = statistics.median(f.final for f in mine_step)
        a_moved = statistics.median(f.moved for f in mine_step)
        for side in ("pekko", "pekko-tuned"):
            runs = [r[name] for r in results.get(side) or [] if name in r]
            if not runs:
                continue
            p_final = statistics.median(f.final for f in runs)
            p_moved = statistics.median(f.moved for f in runs)
            met = p_final >= 2 * a_final and a_moved <= p_moved
            lines.append(
                f"{name}: {side} {p_final:.1f} s / apportion {a_final:.1f} s = "
                f"{p_final / a_final:.2f}x; moves {p_moved:g} vs {a_moved:g}: "
                f"{'met' if met else 'missed'}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run per side")
    parser.add_argument("--runs", type=int, help="runs per side (default 5, --quick 1)")
    parser.add_argument("--side", choices=SIDES, action="append")
    parser.add_argument("--out", type=Path, help="the figures so far, as JSON, after every run")
    parser.add_argument("--report", type=Path, help="only the tables of a JSON file of --out")
    args = parser.parse_args()
    if args.report:
        results = from_json(json.loads(args.report.read_text()), Figures)
        print("\n".join([*summary(results), "", *goal(results)]))
        return 0
    runs = args.runs or (1 if args.quick else 5)
    # SIGTERM as Ctrl-C: the finally blocks stop the pods and the dev-cluster (a background
    # job's SIGINT is ignored).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sides = [s for s in SIDES if s in (args.side or SIDES)]
    from tests.support.java import classpath

    from apportion_dev.devcluster import DevCluster

    java = classpath("integrations/pekko")
    cluster = DevCluster.start()
    try:
        cluster.kubectl("apply", "-f", str(REPO / "crds"))
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/shardsets.apportion.dev",
        )  # fmt: skip
        results = take_turns(
            runs, sides, lambda side, run: run_side(cluster, side, run, java), args.out, str
        )
    finally:
        cluster.stop()
    print(f"\nbench_pekko: {SHARDS} shards, {runs} run(s) per side; median (range)")
    print("\n".join([*summary(results), "", *goal(results)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
