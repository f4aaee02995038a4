"""A ShardSet of 1000 shards allocated by LeastShards over demo workers, as Akka's
LeastShardAllocationStrategy does it: new shards to the region with the fewest, and when a
region joins, rebalance rounds of at most max(1, min(relativeLimit x shards, absoluteLimit))
shards, one round at a time (none while a hand-off is in progress), until the counts converge."""

from __future__ import annotations

import math

import pytest

from tests.support.unitset import (
    apply,
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
    unit_set,
    workers,
)

pytestmark = pytest.mark.shares_operator

SHARDS = 1000
LIMIT = 20  # min(10 % of 1000, absoluteLimit 20)


def test_least_shards_rebalances_in_limited_rounds_until_even(
    operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    apply(kubectl, namespace, workers("cw", 3, command=demo_worker("ShardSet", "carts")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=cw")) == 3, 60, "3 demo workers")
    spec = {
        "shards": SHARDS,
        "workloadRef": {"kind": "StatefulSet", "name": "cw"},
        "strategy": {
            "name": "LeastShards",
            "leastShards": {"absoluteLimit": 20, "relativeLimitPercent": 10},
        },
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    apply(kubectl, namespace, unit_set("ShardSet", "carts", spec))
    kubectl("wait", "-n", namespace, "--for=condition=Balanced", "sset/carts", "--timeout=60s")
    first = published(kubectl, namespace, "ShardSet", "carts")
    assert sorted(counts(first).values()) == [333, 333, 334]
    assert first.key_scheme == "akka"
    assert first.count == SHARDS

    kubectl("scale", "-n", namespace, "statefulset", "cw", "--replicas=4")

    def converged():
        obj = get(kubectl, namespace, "sset", "carts")
        found = read_table(kubectl, namespace, "ShardSet", "carts")
        status = obj["status"]
        settled = status.get("members") == status.get("readyMembers") == 4
        settled = settled and is_true(obj, "Balanced")
        return found if settled and not found.releasing() else None

    final = wait_for(converged, 180, "LeastShards converging over 4 workers")
    assert counts(final) == {"cw-0": 250, "cw-1": 250, "cw-2": 250, "cw-3": 250}

    evs = events(kubectl, namespace, "carts")
    rounds = [
        note_number(e, r"rebalancing (\d+) unit") for e in evs if e["reason"] == "Rebalancing"
    ]
    assert rounds
    assert max(rounds) <= LIMIT
    assert sum(rounds) == 250, "only the new region's share moved"
    assert len(rounds) == math.ceil(250 / LIMIT)
    assert not [e for e in evs if e["reason"] in ("HandoffTimedOut", "OwnerGone")]

    pods = [f"cw-{i}" for i in range(4)]
    log = wait_for(
        lambda: (
            (log := ownership_log(dev_cluster, namespace, pods, "ShardSet/carts"))
            and sum(1 for o in log if o.pod == "cw-3" and o.action == "acquire") == 250
            and log
        ),
        30,
        "cw-3 logging its 250 acquisitions",
    )
    assert overlaps(log) == []


def test_the_first_placement_waits_for_every_replica(
    operator, dev_cluster, namespace, kubectl, wait_for
) -> None:
    """A ShardSet created with its StatefulSet, whose pods come up one at a time: the first
    table waits for all three (startup barrier, Akka's min-nr-of-members) instead of putting
    every shard on the first pod and moving two thirds of them again."""
    sts = workers("sw", 3, command=demo_worker("ShardSet", "early"))
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    spec = {"shards": 90, "workloadRef": {"kind": "StatefulSet", "name": "sw"}}
    apply(kubectl, namespace, sts, unit_set("ShardSet", "early", spec))

    def first_table():
        table = read_table(kubectl, namespace, "ShardSet", "early")
        return table if table is not None and table.epoch >= 1 else None

    table = wait_for(first_table, 120, "the first placement")
    assert sorted(counts(table).values()) == [30, 30, 30], counts(table)
    moved = [e for e in events(kubectl, namespace, "early") if e["reason"] == "HandoffStarted"]
    assert moved == [], "nothing placed had to move again"
