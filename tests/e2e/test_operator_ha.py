"""Two operator replicas, one active (kopf peering, distinct priorities): the active one is
killed with SIGKILL in the middle of a hand-off; the standby takes over, continues from the
published table and finishes the hand-off under higher epochs, without a second owner.

The workers here are simulated pods that never acknowledge by themselves: the test writes the
acknowledgements (as the worker library would, `make_ack` on the pod's own annotation) while no
operator is active, so the hand-off is provably in flight across the failover and can only be
finished by the standby."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unitset_support import (
    Operator,
    apply,
    counts,
    events,
    get,
    is_true,
    read_table,
    ready_pods,
    unit_set,
    workers,
)

from apportion.api.assignment import Member
from apportion.engine.handoff import make_ack, owned_units, releasing_units

PEERING = "apportion-ha"
REPO = Path(__file__).parents[2]


@pytest.fixture
def peering_crds(dev_cluster) -> None:
    dev_cluster.kubectl("apply", "-f", str(REPO / "manifests" / "kopf-peering.yaml"))
    dev_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/kopfpeerings.kopf.dev",
        "crd/clusterkopfpeerings.kopf.dev",
    )


def test_standby_finishes_a_hand_off_after_the_active_operator_is_killed(
    dev_cluster, crds, peering_crds, namespace, kubectl, wait_for, tmp_path
) -> None:
    apply(kubectl, namespace, workers("w", 3, grace=1))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 3, 60, "3 worker pods")
    spec = {
        "partitions": 12,
        "workloadRef": {"kind": "StatefulSet", "name": "w"},
        "rebalance": {"interval": "1s", "handoffTimeout": "10m"},
    }
    active = Operator(
        dev_cluster,
        namespace,
        tmp_path / "active.log",
        peering=PEERING,
        priority=100,
        identity="operator-active",
    )
    standby = None
    try:
        apply(kubectl, namespace, unit_set("PartitionSet", "ha", spec))
        wait_for(
            lambda: is_true(get(kubectl, namespace, "pset", "ha"), "Balanced"),
            60,
            "Balanced under the active operator",
        )
        standby = Operator(
            dev_cluster,
            namespace,
            tmp_path / "standby.log",
            peering=PEERING,
            priority=50,
            identity="operator-standby",
        )

        def peers() -> dict:
            found = kubectl("get", "-n", namespace, "kopfpeering", PEERING, "-o", "json")
            return json.loads(found.stdout).get("status") or {}

        wait_for(lambda: "operator-standby" in peers(), 60, "the standby joining the peering")
        assert peers()["operator-standby"]["priority"] < peers()["operator-active"]["priority"]

        kubectl("scale", "-n", namespace, "statefulset", "w", "--replicas=4")

        def releasing():
            table = read_table(kubectl, namespace, "PartitionSet", "ha")
            return table if table is not None and table.releasing() else None

        in_flight = wait_for(releasing, 60, "a hand-off to the new pod")
        active.kill()
        assert len(in_flight.releasing()) == 3
        assert {r.to for r in in_flight.releasing().values()} == {"w-3"}

        # The owners acknowledge while no operator runs.
        pods = {p["metadata"]["name"]: p for p in get(kubectl, namespace, "pods")["items"]}
        annotation = in_flight.set_ref.ack_annotation
        for owner in {in_flight.units[u].owner for u in in_flight.releasing()}:
            me = Member(owner, pods[owner]["metadata"]["uid"])
            assert releasing_units(in_flight, me)
            ack = make_ack(in_flight, me).to_annotation()
            patch = {"metadata": {"annotations": {annotation: ack}}}
            kubectl("patch", "-n", namespace, "pod", owner, "--type=merge", "-p", json.dumps(patch))
        still = read_table(kubectl, namespace, "PartitionSet", "ha")
        assert still.epoch == in_flight.epoch, "nobody may act while no operator is active"

        def finished():
            table = read_table(kubectl, namespace, "PartitionSet", "ha")
            return table if table.epoch > in_flight.epoch and not table.releasing() else None

        done = wait_for(finished, 90, "the standby finishing the hand-off")
        assert counts(done) == {"w-0": 3, "w-1": 3, "w-2": 3, "w-3": 3}
        for unit, release in in_flight.releasing().items():
            state = done.units[unit]
            assert state.owner == release.to and state.epoch > in_flight.epoch
        for name, units in done.by_member().items():
            me = Member(name, done.member_uids[name])
            assert owned_units(done, me) == frozenset(units), "one owner per unit"

        wait_for(
            lambda: is_true(get(kubectl, namespace, "pset", "ha"), "Balanced"),
            60,
            "Balanced under the standby",
        )
        status = get(kubectl, namespace, "pset", "ha")["status"]
        assert status["epoch"] >= done.epoch and status["movesInProgress"] == 0
        completed = [
            e for e in events(kubectl, namespace, "ha") if e["reason"] == "HandoffCompleted"
        ]
        assert completed and {e["reportingInstance"] for e in completed} == {"operator-standby"}
        assert not [e for e in events(kubectl, namespace, "ha") if e["reason"] == "HandoffTimedOut"]
        before, resumed, after = standby.text().partition("Resuming operations")
        assert resumed and "Published epoch" not in before, "the standby waited its turn"
        assert "Published epoch" in after
    finally:
        active.stop()
        if standby is not None:
            standby.stop()
