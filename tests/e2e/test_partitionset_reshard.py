"""Online resharding end to end, under traffic: a PartitionSet (keyScheme apportion) over demo
workers goes 32 -> 128 units on 4 pods, spreads over 6 pods, then merges to 64, with the real
operator, the real API server and the worker library in real processes, while clients send
numbered increments per key (the demo workers keep per-key counters as unit state).

The split moves no unit (every child starts on its parent's pod); afterwards only the moves the
rebalance needed happen, each acknowledged; no two pods ever serve one unit; every increment was
counted by a pod serving the key's unit under the table of its token, and no count is lost:
the counters the pods hold at the end are the clients' acknowledged numbers."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import xxhash

from apportion.api.assignment import AssignmentTable
from apportion_dev.devcluster.net import http_get_json
from tests.support.counting_clients import CountingClients
from tests.support.unitset import (
    Ownership,
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

pytestmark = pytest.mark.shares_operator

SET = "PartitionSet/rs"
PODS = [f"rw-{i}" for i in range(6)]
KEYS = [f"key-{i}" for i in range(200)]
INTERVAL = 2.0
"""Seconds between two increments of one key: about 100 increments per second in all."""
FOREVER = 2**62


@pytest.fixture
def elastic(operator, namespace, kubectl, wait_for):
    apply(kubectl, namespace, workers("rw", 4, command=demo_worker("PartitionSet", "rs")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=rw")) == 4, 90, "4 demo workers")
    spec = {
        "partitions": 32,
        "keyScheme": "apportion",
        "workloadRef": {"kind": "StatefulSet", "name": "rw"},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s", "maxMovesPerRound": "100%"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "rs", spec))
    waited = kubectl(
        "wait", "-n", namespace, "--for=condition=Balanced", "pset/rs", "--timeout=90s"
    )
    assert "condition met" in waited.stdout


def patch_count(kubectl, namespace: str, count: int) -> float:
    """Change the count; the Unix time just before (the workers log and answer in Unix time)."""
    started = time.time()
    kubectl(
        "patch",
        "-n",
        namespace,
        "pset",
        "rs",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"partitions": count}}),
    )
    return started


def addresses(kubectl, namespace: str) -> dict[str, str]:
    pods = get(kubectl, namespace, "pods", "-l", "app=rw")["items"]
    return {
        p["metadata"]["name"]: f"{p['status']['podIP']}:8080"
        for p in pods
        if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
    }


def key_unit(key: str, count: int) -> str:
    """The oracle of the apportion key scheme: xxh3-64 of the key, times count, top 64 bits."""
    return str((xxhash.xxh3_64_intdigest(key.encode()) * count) >> 64)


def held(log: list[Ownership]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """(pod, unit, token) → from the pod's acquire line to its next line ending that hold
    (release, stop, split, merge; none yet: forever)."""
    spans: dict[tuple[str, str, int], tuple[float, float]] = {}
    for entry in log:
        if entry.token is None:
            continue
        hold = (entry.pod, entry.unit, entry.token)
        if entry.action == "acquire":
            spans[hold] = (entry.time, float(FOREVER))
        elif hold in spans and spans[hold][1] == FOREVER:
            spans[hold] = (spans[hold][0], entry.time)
    return spans


def releases(log: list[Ownership], low: int, high: int) -> int:
    """Hand-offs of units held under a token in [low, high): one release line each."""
    return sum(o.action == "release" and low <= (o.token or 0) < high for o in log)


def starts(log: list[Ownership], token: int) -> dict[str, str]:
    """unit → the pod that started serving it under `token` (the units of a resharding write)."""
    return {o.unit: o.pod for o in log if o.action == "acquire" and o.token == token}


def serving(dev_cluster, namespace: str, table: AssignmentTable) -> bool:
    """Every pod logged serving the units `table` gives it, under the table's tokens."""
    log = ownership_log(dev_cluster, namespace, PODS, SET)
    got = {(o.pod, o.unit, o.token) for o in log if o.action == "acquire"}
    return {(s.owner, u, s.epoch) for u, s in table.units.items()} <= got


def starts_at(log: list[Ownership], token: int) -> list[float]:
    return [o.time for o in log if o.action == "acquire" and o.token == token]


def test_split_spread_and_merge_under_traffic(
    elastic, dev_cluster, namespace, kubectl, wait_for
) -> None:
    before = published(kubectl, namespace, "PartitionSet", "rs")
    assert before.count == 32
    assert counts(before) == {f"rw-{i}": 8 for i in range(4)}
    clients = CountingClients(lambda: addresses(kubectl, namespace), KEYS, INTERVAL)
    clients.start()
    try:
        wait_for(lambda: len(clients.served) >= len(KEYS), 30, "traffic under 32 units")

        # x4 split: one write, every child on its parent's pod.
        started = patch_count(kubectl, namespace, 128)
        split = wait_for(
            lambda: (t := published(kubectl, namespace, "PartitionSet", "rs")).count == 128 and t,
            60,
            "the table with 128 units",
        )
        published_after = time.time() - started
        assert split.lineage is not None
        assert split.lineage.from_count == 32
        moved_by_split = [
            u for u in split.units if split.units[u].owner != before.units[str(int(u) // 4)].owner
        ]
        assert moved_by_split == []
        assert not split.releasing()

        wait_for(
            lambda: serving(dev_cluster, namespace, split), 60, "every pod serving its 32 children"
        )
        all_served = max(starts_at(ownership_log(dev_cluster, namespace, PODS, SET), split.epoch))
        all_served -= started
        first = wait_for(
            lambda: min((s.time for s in clients.served if s.token >= split.epoch), default=0),
            30,
            "an increment counted under 128 units",
        )
        obj = get(kubectl, namespace, "pset", "rs")
        assert condition(obj, "Resharding")["status"] == "False"
        assert "resharded from 32" in condition(obj, "Resharding")["message"]
        assert any(e["reason"] == "Resharded" for e in events(kubectl, namespace, "rs"))
        print(
            f"\nx4 split: moves caused by the split {len(moved_by_split)}; after the spec "
            f"change: table published {published_after:.1f}s, first increment counted under 128 "
            f"units "
            f"{first - started:.2f}s, every pod serving its children {all_served:.2f}s"
        )

        # Two pods join: only the moves a balanced end needs (each new pod gets 21 or 22).
        kubectl("scale", "-n", namespace, "statefulset", "rw", "--replicas=6")

        def balanced(count: int, members: int):
            obj = get(kubectl, namespace, "pset", "rs")
            found = read_table(kubectl, namespace, "PartitionSet", "rs")
            # The status must speak of the table read (its epoch), not of an earlier one.
            done = obj["status"].get("members") == members and is_true(obj, "Balanced")
            done = done and obj["status"].get("epoch") == (found and found.epoch)
            settled = found is not None and found.count == count and not found.releasing()
            return found if done and settled else None

        spread = wait_for(lambda: balanced(128, 6), 120, "128 units balanced over 6 pods")
        moved = [u for u in spread.units if spread.units[u].owner != split.units[u].owner]
        assert sorted(counts(spread).values()) == [21, 21, 21, 21, 22, 22]
        assert len(moved) == counts(spread)["rw-4"] + counts(spread)["rw-5"]
        assert {spread.units[u].owner for u in moved} == {"rw-4", "rw-5"}

        # The table can be balanced before the new pods' workers serve what it gives them (a
        # unit moved on before its pod acquired it is released without a line in the log).
        wait_for(
            lambda: serving(dev_cluster, namespace, spread),
            60,
            "every pod serving its units of 128",
        )

        # /2 merge: siblings apart are gathered by hand-offs, then one write merges them.
        apart = sum(
            spread.units[str(2 * p)].owner != spread.units[str(2 * p + 1)].owner for p in range(64)
        )
        merge_started = patch_count(kubectl, namespace, 64)
        merged = wait_for(lambda: balanced(64, 6), 120, "64 units balanced over 6 pods")
        assert merged.lineage is not None
        assert merged.lineage.from_count == 128
        assert sorted(counts(merged).values()) == [10, 10, 11, 11, 11, 11]
    finally:
        clients.stop()

    log = ownership_log(dev_cluster, namespace, PODS, SET)
    merge_epoch = merged.lineage.epoch
    # Unit numbers mean other key ranges under each count: check each count's era apart (an
    # entry's token tells its era: tokens of a count start at the write that introduced it).
    eras = {32: (0, split.epoch), 128: (split.epoch, merge_epoch), 64: (merge_epoch, FOREVER)}
    for low, high in eras.values():
        assert overlaps([o for o in log if o.token is not None and low <= o.token < high]) == []

    # Every increment: counted once (its answer's count is its number), in the key's unit under
    # its token's count, by a pod holding that unit under that token at that moment.
    spans = held(log)
    served = clients.served
    assert [s for s in served if s.count != s.number] == []
    for s in served:
        (count,) = [n for n, (low, high) in eras.items() if low <= s.token < high]
        assert s.unit == key_unit(s.key, count), s
        start, end = spans.get((s.pod, s.unit, s.token), (FOREVER, 0))
        assert start <= s.time <= end, s

    # No count lost: what the pods hold now is what the clients had acknowledged.
    held_now: Counter[str] = Counter()
    found: dict[str, int] = {}
    for address in addresses(kubectl, namespace).values():
        page = http_get_json(f"http://{address}/counters")
        assert page is not None, f"{address} served no counters"
        assert page["count"] == 64
        for unit, keys in page["units"].items():
            for key, value in keys.items():
                assert key_unit(key, 64) == unit
                held_now[key] += 1
                found[key] = value
    assert set(held_now.values()) == {1}
    assert found == clients.acknowledged

    # Moves: the split none, then exactly what the tables say the rebalance needed.
    first64 = starts(log, merge_epoch)
    assert len(first64) == 64
    gathered = [u for u in spread.units if spread.units[u].owner != first64[str(int(u) // 2)]]
    assert len(gathered) == apart
    assert releases(log, 0, split.epoch) == 0
    assert releases(log, *eras[128]) == len(moved) + len(gathered)
    assert releases(log, *eras[64]) == sum(merged.units[u].owner != p for u, p in first64.items())
    assert [o for o in log if o.action == "split"]
    assert [o for o in log if o.action == "merge"]
    evs = events(kubectl, namespace, "rs")
    assert not [e for e in evs if e["reason"] in ("HandoffTimedOut", "OwnerGone")]
    merge_served = max(starts_at(log, merge_epoch)) - merge_started
    print(
        f"/2 merge: {apart} sibling pair(s) sat apart and were gathered; every pod serving its "
        f"64 units {merge_served:.2f}s after the spec change; {len(served)} increments over "
        f"{len(KEYS)} keys, answers {dict(clients.answers)}"
    )
