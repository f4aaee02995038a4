"""A PartitionSet over demo workers running as real processes: placed evenly, rebalanced with
the fewest moves through acknowledged hand-offs when the StatefulSet scales out, and moved at
once off a pod that is deleted — with no moment at which two workers served the same unit."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.unitset import (
    apply,
    condition,
    counts,
    demo_worker,
    events,
    get,
    is_true,
    note_number,
    overlaps,
    ownership_log,
    published,
    read_table,
    ready_pods,
    serving,
    table,
    unit_set,
    workers,
)

pytestmark = pytest.mark.shares_operator

SET = "PartitionSet/demo"


@pytest.fixture
def demo(operator, dev_cluster, namespace, kubectl, wait_for):
    """4 demo workers and a PartitionSet of 32 partitions over them, Balanced, each unit served
    by its owner (Balanced is the table's state: a worker may not have acquired yet)."""
    apply(kubectl, namespace, workers("dw", 4, command=demo_worker("PartitionSet", "demo")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=dw")) == 4, 60, "4 demo workers")
    spec = {
        "partitions": 32,
        "workloadRef": {"kind": "StatefulSet", "name": "dw"},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "demo", spec))
    waited = kubectl(
        "wait", "-n", namespace, "--for=condition=Balanced", "pset/demo", "--timeout=60s"
    )
    assert "condition met" in waited.stdout
    pods = [f"dw-{i}" for i in range(4)]

    def served() -> bool:
        owners = {
            u: s.owner
            for u, s in published(kubectl, namespace, "PartitionSet", "demo").units.items()
        }
        return serving(ownership_log(dev_cluster, namespace, pods, SET)) == owners

    wait_for(served, 30, "every unit served by its owner in the table")
    return spec


def acknowledged_units(evs: list[dict]) -> int:
    return sum(
        note_number(e, r"release of (\d+) unit") for e in evs if e["reason"] == "HandoffCompleted"
    )


def deletion_costs(kubectl, namespace: str) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: p["metadata"]
        .get("annotations", {})
        .get("controller.kubernetes.io/pod-deletion-cost")
        for p in get(kubectl, namespace, "pods", "-l", "app=dw")["items"]
    }


def test_placed_evenly_then_scaled_out_with_the_fewest_acknowledged_moves(
    demo, dev_cluster, namespace, kubectl, wait_for
) -> None:
    # (a) 32 partitions on 4 pods: 8 each, Balanced, visible at a glance.
    obj = get(kubectl, namespace, "pset", "demo")
    status = obj["status"]
    assert status["members"] == status["readyMembers"] == 4
    assert status["assignedUnits"] == 32
    assert status["movesInProgress"] == 0
    assert status["imbalance"] == "1.00"
    assert status["observedGeneration"] == 1
    assert [row["units"] for row in status["memberUnits"]] == [8, 8, 8, 8]
    assert condition(obj, "Ready")["reason"] == "Assigned"
    assert not is_true(obj, "Degraded")
    assert not is_true(obj, "Progressing")
    (cells,) = table(kubectl("get", "-n", namespace, "pset", "demo").stdout)
    assert cells | {"AGE": "", "EPOCH": ""} == {
        "NAME": "demo",
        "READY": "True",
        "BALANCED": "True",
        "MEMBERS": "4",
        "UNITS": "32",
        "IMBALANCE": "1.00",
        "MOVES": "0",
        "EPOCH": "",
        "AGE": "",
    }
    before = published(kubectl, namespace, "PartitionSet", "demo")
    assert counts(before) == {"dw-0": 8, "dw-1": 8, "dw-2": 8, "dw-3": 8}
    assert int(cells["EPOCH"]) == before.epoch == status["epoch"]
    configmap = get(kubectl, namespace, "configmap", status["assignmentConfigMap"])
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert owner | {"uid": obj["metadata"]["uid"]} == {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "PartitionSet",
        "name": "demo",
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    wait_for(
        lambda: set(deletion_costs(kubectl, namespace).values()) == {"8"},
        30,
        "pod-deletion-cost 8 on every worker",
    )

    # (b) scale to 5: 7/7/6/6/6 with 6 moves, each released and acknowledged before re-owned.
    kubectl("scale", "-n", namespace, "statefulset", "dw", "--replicas=5")

    def rebalanced():
        obj = get(kubectl, namespace, "pset", "demo")
        found = read_table(kubectl, namespace, "PartitionSet", "demo")
        settled = obj["status"].get("members") == 5 and is_true(obj, "Balanced")
        return found if settled and not found.releasing() else None

    after = wait_for(rebalanced, 90, "Balanced over 5 pods")
    assert sorted(counts(after).values()) == [6, 6, 6, 7, 7]
    moved = {u for u in after.units if after.units[u].owner != before.units[u].owner}
    assert len(moved) == 6
    assert {after.units[u].owner for u in moved} == {"dw-4"}
    evs = events(kubectl, namespace, "demo")
    assert acknowledged_units(evs) == 6
    assert not [e for e in evs if e["reason"] in ("HandoffTimedOut", "OwnerGone")]
    assert any(e["reason"] == "Rebalancing" and "rebalancing 6 unit(s)" in e["note"] for e in evs)

    pods = [f"dw-{i}" for i in range(5)]
    log = wait_for(
        lambda: (
            (log := ownership_log(dev_cluster, namespace, pods, SET))
            and sum(1 for o in log if o.pod == "dw-4" and o.action == "acquire") == 6
            and log
        ),
        30,
        "dw-4 logging its 6 acquisitions",
    )
    assert overlaps(log) == []
    for unit in moved:
        source = before.units[unit].owner
        release = next(
            o for o in log if o.unit == unit and o.pod == source and o.action == "release"
        )
        acquire = next(o for o in log if o.unit == unit and o.pod == "dw-4")
        assert release.time < acquire.time
        assert release.epoch < acquire.epoch
        assert acquire.token == after.units[unit].epoch
    wait_for(
        lambda: Counter(deletion_costs(kubectl, namespace).values()) == {"6": 3, "7": 2},
        30,
        "deletion costs following the holdings",
    )


def test_units_of_a_deleted_pod_move_at_once(
    demo, dev_cluster, namespace, kubectl, wait_for
) -> None:
    before = published(kubectl, namespace, "PartitionSet", "demo")
    victim_uid = before.member_uids["dw-1"]
    units = set(before.by_member()["dw-1"])
    kubectl("delete", "pod", "-n", namespace, "dw-1", "--wait=false")

    def moved():
        found = read_table(kubectl, namespace, "PartitionSet", "demo")
        held = [
            u
            for u in units
            if found.units[u].owner == "dw-1" and found.member_uids.get("dw-1") == victim_uid
        ]
        return found if not held else None

    # handoffTimeout is 60 s: finishing well within it means nobody waited for a timeout.
    during = wait_for(moved, 20, "dw-1's units moving to the other workers")
    # On another pod — possibly already dw-1's replacement, which can be that quick.
    assert all(during.member_uids[during.units[u].owner] != victim_uid for u in units)
    evs = events(kubectl, namespace, "demo")
    assert not [e for e in evs if e["reason"] == "HandoffTimedOut"]
    assert {e["reason"] for e in evs} & {"HandoffCompleted", "OwnerGone"}

    def back():
        obj = get(kubectl, namespace, "pset", "demo")
        found = read_table(kubectl, namespace, "PartitionSet", "demo")
        fresh = found.member_uids.get("dw-1") not in (None, victim_uid)
        return found if fresh and is_true(obj, "Balanced") and not found.releasing() else None

    after = wait_for(back, 90, "Balanced again with dw-1's replacement")
    assert counts(after) == {"dw-0": 8, "dw-1": 8, "dw-2": 8, "dw-3": 8}
    log = ownership_log(dev_cluster, namespace, [f"dw-{i}" for i in range(4)], SET)
    assert overlaps(log) == []
    assert any(o.pod == "dw-1" and o.action == "release" for o in log), "dw-1 drained"
