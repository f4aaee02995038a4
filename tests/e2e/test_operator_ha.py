"""Two operator replicas, one active (leader election on a Lease): the active one is
killed with SIGKILL in the middle of a hand-off; the standby takes over, continues from the
published table and finishes the hand-off under higher epochs, without a second owner.

Two kinds of workers: simulated pods that never acknowledge by themselves, for which the test
writes the acknowledgements (as the worker library would, `make_ack` on the pod's own
annotation) while no operator is active, so the hand-off can only be finished by the standby;
and demo workers (real processes) whose releases take 20 s, longer than the failover."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from apportion.api.assignment import AssignmentTable, Incarnation
from apportion.engine.handoff import make_ack, owned_units, releasing_units
from apportion_dev.devcluster import DevCluster
from tests.support.unitset import (
    Operator,
    apply,
    counts,
    demo_worker,
    events,
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

LEASE = "apportion-ha"
SPEC = {
    "partitions": 12,
    "workloadRef": {"kind": "StatefulSet", "name": "w"},
    "rebalance": {"interval": "1s", "handoffTimeout": "10m"},
}


@dataclass
class Pair:
    active: Operator
    standby: Operator


@pytest.fixture
def pair(
    dev_cluster: DevCluster, crds, namespace: str, kubectl, wait_for, tmp_path: Path
) -> Iterator[Callable[[dict], Pair]]:
    """Returns a function: given the workers' StatefulSet, start it, an active operator, the
    set (Balanced) and a standby operator that waits for the Lease."""
    started: list[Operator] = []

    def start(statefulset: dict) -> Pair:
        apply(kubectl, namespace, statefulset)
        wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 3, 60, "3 workers")
        active = Operator(
            dev_cluster,
            namespace,
            tmp_path / "active.log",
            leader_election=LEASE,
            identity="operator-active",
        )
        started.append(active)
        apply(kubectl, namespace, unit_set("PartitionSet", "ha", SPEC))
        wait_for(
            lambda: is_true(get(kubectl, namespace, "pset", "ha"), "Balanced"),
            60,
            "Balanced under the active operator",
        )
        standby = Operator(
            dev_cluster,
            namespace,
            tmp_path / "standby.log",
            leader_election=LEASE,
            identity="operator-standby",
        )
        started.append(standby)

        lease = get(kubectl, namespace, "lease", LEASE)
        assert lease["spec"]["holderIdentity"] == "operator-active"
        wait_for(lambda: "Standing by" in standby.text(), 60, "the standby standing by")
        # /metrics: one leader, and only it reports the set
        wait_for(lambda: active.samples("apportion_operator_leader") == [1], 30, "active leads")
        assert standby.samples("apportion_operator_leader") == [0]
        assert active.samples("apportion_operator_table_epoch")
        assert not standby.samples("apportion_operator_table_epoch")
        return Pair(active, standby)

    yield start
    for operator in started:
        operator.stop()


def scale_out_and_kill(pair: Pair, namespace, kubectl, wait_for) -> AssignmentTable:
    """Scale 3 → 4 and kill the active operator as soon as the releases are published."""
    kubectl("scale", "-n", namespace, "statefulset", "w", "--replicas=4")

    def releasing():
        table = read_table(kubectl, namespace, "PartitionSet", "ha")
        return table if table is not None and table.releasing() else None

    in_flight = wait_for(releasing, 60, "a hand-off to the new pod")
    pair.active.kill()
    assert len(in_flight.releasing()) == 3
    assert {r.to for r in in_flight.releasing().values()} == {"w-3"}
    return in_flight


def finished_by_standby(pair: Pair, in_flight, namespace, kubectl, wait_for) -> AssignmentTable:
    def finished():
        table = read_table(kubectl, namespace, "PartitionSet", "ha")
        return table if table.epoch > in_flight.epoch and not table.releasing() else None

    done = wait_for(finished, 90, "the standby finishing the hand-off")
    assert counts(done) == {"w-0": 3, "w-1": 3, "w-2": 3, "w-3": 3}
    for unit, release in in_flight.releasing().items():
        state = done.units[unit]
        assert state.owner == release.to
        assert state.epoch > in_flight.epoch
    for name, units in done.by_member().items():
        me = Incarnation(name, done.member_uids[name])
        assert owned_units(done, me) == frozenset(units), "one owner per unit"

    wait_for(
        lambda: is_true(get(kubectl, namespace, "pset", "ha"), "Balanced"),
        60,
        "Balanced under the standby",
    )
    status = get(kubectl, namespace, "pset", "ha")["status"]
    assert status["epoch"] >= done.epoch
    assert status["movesInProgress"] == 0
    evs = events(kubectl, namespace, "ha")
    completed = [e for e in evs if e["reason"] == "HandoffCompleted"]
    assert completed
    assert {e["reportingInstance"] for e in completed} == {"operator-standby"}
    assert not [e for e in evs if e["reason"] == "HandoffTimedOut"]
    before, resumed, after = pair.standby.text().partition("Leading (Lease")
    assert resumed, "the standby waited its turn"
    assert "Published epoch" not in before, "the standby waited its turn"
    assert "Published epoch" in after
    assert pair.standby.samples("apportion_operator_leader") == [1]
    assert pair.standby.samples("apportion_operator_table_epoch") == [
        done_epoch(kubectl, namespace)
    ]
    return done


def done_epoch(kubectl, namespace: str) -> float:
    return float(get(kubectl, namespace, "pset", "ha")["status"]["epoch"])


def test_standby_finishes_a_hand_off_acknowledged_while_no_operator_runs(
    pair, namespace, kubectl, wait_for
) -> None:
    operators = pair(workers("w", 3, grace=1))
    in_flight = scale_out_and_kill(operators, namespace, kubectl, wait_for)

    pods = {p["metadata"]["name"]: p for p in get(kubectl, namespace, "pods")["items"]}
    annotation = in_flight.set_ref.ack_annotation
    for owner in {in_flight.units[u].owner for u in in_flight.releasing()}:
        assert owner is not None, "a unit in release has the owner releasing it"
        me = Incarnation(owner, pods[owner]["metadata"]["uid"])
        assert releasing_units(in_flight, me)
        ack = make_ack(in_flight, me).to_annotation()
        patch = {"metadata": {"annotations": {annotation: ack}}}
        kubectl("patch", "-n", namespace, "pod", owner, "--type=merge", "-p", json.dumps(patch))
    still = published(kubectl, namespace, "PartitionSet", "ha")
    assert still.epoch == in_flight.epoch, "nobody may act while no operator is active"

    finished_by_standby(operators, in_flight, namespace, kubectl, wait_for)


def test_standby_finishes_a_slow_release_of_demo_workers(
    pair, dev_cluster, namespace, kubectl, wait_for
) -> None:
    command = [*demo_worker("PartitionSet", "ha"), "--release-delay", "20"]
    operators = pair(workers("w", 3, command=command))
    in_flight = scale_out_and_kill(operators, namespace, kubectl, wait_for)
    done = finished_by_standby(operators, in_flight, namespace, kubectl, wait_for)

    pods = [f"w-{i}" for i in range(4)]
    log = wait_for(
        lambda: (
            (log := ownership_log(dev_cluster, namespace, pods, "PartitionSet/ha"))
            and sum(1 for o in log if o.pod == "w-3" and o.action == "acquire") == 3
            and log
        ),
        30,
        "w-3 logging its acquisitions",
    )
    assert overlaps(log) == []
    for unit in in_flight.releasing():
        release = next(o for o in log if o.unit == unit and o.action == "release")
        acquire = next(o for o in log if o.unit == unit and o.pod == "w-3")
        assert release.time < acquire.time
        assert acquire.token == done.units[unit].epoch
