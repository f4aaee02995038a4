"""The assignment table deleted, garbled or rolled back by hand (issue 10, docs/handoff.md "When
the table is lost"): the operator notices at once (it watches its own ConfigMaps), republishes
what the workers serve at an epoch above every epoch it ever used, and no unit is ever served by
two pods at once — checked in the workers' own acquire/release/stop logs."""

from __future__ import annotations

import json

from apportion.api.assignment import AssignmentFormatError, assignment_config_map
from tests.support.unitset import (
    Operator,
    apply,
    condition,
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

CM = assignment_config_map("ShardSet", "carts")
PODS = [f"cw-{i}" for i in range(5)]


def shard_set(kubectl, namespace, wait_for, replicas: int = 3, handoff_timeout: str = "60s"):
    """The issue's repro: 60 shards, LeastShards, a StatefulSet of demo workers."""
    apply(kubectl, namespace, workers("cw", replicas, command=demo_worker("ShardSet", "carts")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=cw")) == replicas, 60, "demo workers")
    spec = {
        "shards": 60,
        "workloadRef": {"kind": "StatefulSet", "name": "cw"},
        "strategy": {"name": "LeastShards"},
        "rebalance": {"interval": "1s", "handoffTimeout": handoff_timeout},
    }
    apply(kubectl, namespace, unit_set("ShardSet", "carts", spec))
    return settled(kubectl, namespace, wait_for, replicas)


def settled(kubectl, namespace, wait_for, replicas: int):
    def done():
        obj = get(kubectl, namespace, "sset", "carts")
        table = read_table(kubectl, namespace, "ShardSet", "carts")
        ok = (
            is_true(obj, "Balanced")
            and obj["status"].get("readyMembers") == replicas
            and table is not None
            and not table.releasing()
            and len(counts(table)) == replicas
        )
        return table if ok else None

    return wait_for(done, 120, f"Balanced over {replicas} workers")


def scale(kubectl, namespace, replicas: int) -> None:
    kubectl("scale", "-n", namespace, "statefulset", "cw", f"--replicas={replicas}")


def no_overlap(dev_cluster, namespace) -> None:
    log = ownership_log(dev_cluster, namespace, PODS, "ShardSet/carts")
    assert log, "the workers logged nothing"
    assert overlaps(log) == []


def republished_above(kubectl, namespace, wait_for, epoch: int, what: str):
    """The table once the operator has written it again above `epoch`."""

    def above():
        try:
            table = read_table(kubectl, namespace, "ShardSet", "carts")
        except AssignmentFormatError:
            return None  # still garbled: the repair is yet to come
        return table if table is not None and table.epoch > epoch else None

    return wait_for(above, 30, what)


def reasons_of(kubectl, namespace) -> set[str]:
    return {e["reason"] for e in events(kubectl, namespace, "carts")}


def test_a_deleted_table_comes_back_at_once_with_the_same_owners(
    operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    shard_set(kubectl, namespace, wait_for)
    for replicas in (4, 5, 4, 5):
        scale(kubectl, namespace, replicas)
        before = settled(kubectl, namespace, wait_for, replicas)
    kubectl("delete", "-n", namespace, "configmap", CM)

    # Nothing else happens: the deletion alone wakes the set.
    again = republished_above(
        kubectl, namespace, wait_for, before.epoch, "the table republished after its deletion"
    )
    assert again.owners() == before.owners(), "nothing moves: the workers serve these"
    assert "AssignmentTableLost" in reasons_of(kubectl, namespace)
    scale(kubectl, namespace, 4)
    after = settled(kubectl, namespace, wait_for, 4)
    assert after.epoch > again.epoch
    no_overlap(dev_cluster, namespace)


def test_a_rolled_back_table_is_replaced_above_every_epoch_used(
    operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    shard_set(kubectl, namespace, wait_for)
    old = json.loads(kubectl("get", "-n", namespace, "configmap", CM, "-o", "json").stdout)
    old_epoch = published(kubectl, namespace, "ShardSet", "carts").epoch
    scale(kubectl, namespace, 4)
    newest = settled(kubectl, namespace, wait_for, 4)
    assert newest.epoch > old_epoch
    # A valid table of an earlier epoch put back by hand (a GitOps rollback, a backup restore).
    old["metadata"] = {k: old["metadata"][k] for k in ("name", "namespace", "labels")}
    kubectl("replace", "-f", "-", input=json.dumps(old))

    again = republished_above(
        kubectl, namespace, wait_for, newest.epoch, "the newest owners republished above it"
    )
    assert again.owners() == newest.owners()
    assert "AssignmentTableRolledBack" in reasons_of(kubectl, namespace)
    scale(kubectl, namespace, 5)
    settled(kubectl, namespace, wait_for, 5)
    no_overlap(dev_cluster, namespace)


def test_a_garbled_table_is_repaired_and_the_status_never_claims_otherwise(
    operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    """While the table is unreadable and after, the status names only epochs of tables that
    were readable: the one before, or the repair above it; never a lower one."""
    before = shard_set(kubectl, namespace, wait_for)
    patch = {"data": {"assignments.json": "{this is not json"}}
    kubectl("patch", "-n", namespace, "configmap", CM, "--type=merge", "-p", json.dumps(patch))

    claimed: list[int] = []

    def repaired():
        claimed.append(get(kubectl, namespace, "sset", "carts")["status"]["epoch"])
        try:
            table = read_table(kubectl, namespace, "ShardSet", "carts")
        except AssignmentFormatError:
            return None  # still garbled: the repair is yet to come
        return table if table is not None and table.epoch > before.epoch else None

    again = wait_for(repaired, 30, "the table rewritten after it was garbled")
    assert again.owners() == before.owners()
    assert "AssignmentTableUnreadable" in reasons_of(kubectl, namespace)
    final = wait_for(
        lambda: (
            (e := get(kubectl, namespace, "sset", "carts")["status"]["epoch"]) >= again.epoch and e
        ),
        30,
        "the status naming the repaired table",
    )
    assert set(claimed) <= {before.epoch} | set(range(again.epoch, final + 1)), claimed
    scale(kubectl, namespace, 4)
    settled(kubectl, namespace, wait_for, 4)
    no_overlap(dev_cluster, namespace)


def test_a_table_lost_while_the_operator_was_down_is_fenced_before_anything_is_assigned(
    operator, dev_cluster, namespace, kubectl, wait_for, tmp_path
) -> None:
    """No copy survives a restart: every unit is unowned at a new epoch (the workers stop),
    and nothing is assigned until handoffTimeout has passed."""
    before = shard_set(kubectl, namespace, wait_for, handoff_timeout="5s")
    assert operator.stop() == 0
    kubectl("delete", "-n", namespace, "configmap", CM)
    restarted = Operator(dev_cluster, namespace, tmp_path / "restarted.log")
    try:

        def fenced():
            obj = get(kubectl, namespace, "sset", "carts")
            table = read_table(kubectl, namespace, "ShardSet", "carts")
            if table is None or table.epoch <= before.epoch:
                return None
            return (obj, table) if condition(obj, "Ready")["reason"] == "AssignmentFenced" else None

        obj, fence = wait_for(fenced, 60, "the fence published")
        assert set(fence.owners().values()) == {None}
        assert obj["status"]["reservedEpoch"] >= fence.epoch
        after = settled(kubectl, namespace, wait_for, 3)
        assert after.epoch > fence.epoch
        no_overlap(dev_cluster, namespace)
    finally:
        assert restarted.stop() == 0, restarted.text()
