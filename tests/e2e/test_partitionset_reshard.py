"""Online resharding end to end: a PartitionSet (keyScheme apportion) over demo workers goes
32 -> 128 units on 4 pods, spreads over 6 pods, then merges to 64, with the real operator, the
real API server and the worker library in real processes. The split moves no unit (every child
starts on its parent's pod); afterwards only the moves the rebalance needed happen, each
acknowledged; no two pods ever serve one unit."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from unitset_support import (
    apply,
    condition,
    counts,
    demo_worker,
    events,
    get,
    is_true,
    overlaps,
    ownership_log,
    read_table,
    ready_pods,
    unit_set,
    workers,
)

SET = "PartitionSet/rs"


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
    started = time.monotonic()
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


def test_split_spread_and_merge(elastic, dev_cluster, namespace, kubectl, wait_for) -> None:
    before = read_table(kubectl, namespace, "PartitionSet", "rs")
    assert before.count == 32 and counts(before) == {f"rw-{i}": 8 for i in range(4)}

    # x4 split: one write, every child on its parent's pod.
    started = patch_count(kubectl, namespace, 128)
    split = wait_for(
        lambda: (t := read_table(kubectl, namespace, "PartitionSet", "rs")).count == 128 and t,
        60,
        "the table with 128 units",
    )
    published = time.monotonic() - started
    assert split.lineage is not None and split.lineage.from_count == 32
    moved_by_split = [
        u for u in split.units if split.units[u].owner != before.units[str(int(u) // 4)].owner
    ]
    assert moved_by_split == [] and not split.releasing()
    pods = [f"rw-{i}" for i in range(6)]

    def serving_new_count():
        log = ownership_log(dev_cluster, namespace, pods, SET)
        got = {(o.pod, o.unit) for o in log if o.action == "acquire" and o.token == split.epoch}
        return got == {(s.owner, u) for u, s in split.units.items()} and log

    wait_for(serving_new_count, 60, "every pod serving its 32 children")
    served = time.monotonic() - started
    obj = get(kubectl, namespace, "pset", "rs")
    assert condition(obj, "Resharding")["status"] == "False"
    assert "resharded from 32" in condition(obj, "Resharding")["message"]
    assert any(e["reason"] == "Resharded" for e in events(kubectl, namespace, "rs"))
    print(
        f"\nx4 split: moves caused by the split {len(moved_by_split)}; table published "
        f"{published:.1f}s and 128 units served {served:.1f}s after the spec change"
    )

    # Two pods join: only the moves a balanced end needs (each new pod gets 21 or 22).
    kubectl("scale", "-n", namespace, "statefulset", "rw", "--replicas=6")

    def balanced(count: int, members: int):
        obj = get(kubectl, namespace, "pset", "rs")
        found = read_table(kubectl, namespace, "PartitionSet", "rs")
        done = obj["status"].get("members") == members and is_true(obj, "Balanced")
        return found if done and found.count == count and not found.releasing() else None

    spread = wait_for(lambda: balanced(128, 6), 120, "128 units balanced over 6 pods")
    moved = [u for u in spread.units if spread.units[u].owner != split.units[u].owner]
    assert sorted(counts(spread).values()) == [21, 21, 21, 21, 22, 22]
    assert len(moved) == counts(spread)["rw-4"] + counts(spread)["rw-5"]
    assert {spread.units[u].owner for u in moved} == {"rw-4", "rw-5"}

    # /2 merge: siblings apart are gathered by hand-offs, then one write merges them.
    apart = sum(
        spread.units[str(2 * p)].owner != spread.units[str(2 * p + 1)].owner for p in range(64)
    )
    patch_count(kubectl, namespace, 64)
    merged = wait_for(lambda: balanced(64, 6), 120, "64 units balanced over 6 pods")
    assert merged.lineage is not None and merged.lineage.from_count == 128
    assert sorted(counts(merged).values()) == [10, 10, 11, 11, 11, 11]
    # Unit numbers mean other key ranges under each count: check each count's era apart (an
    # entry's token tells its era: tokens of a count start at the write that introduced it).
    log = ownership_log(dev_cluster, namespace, pods, SET)
    eras = (0, split.epoch, merged.lineage.epoch, merged.epoch + 1)
    for low, high in itertools.pairwise(eras):
        era = [o for o in log if o.token is not None and low <= o.token < high]
        assert overlaps(era) == []
    evs = events(kubectl, namespace, "rs")
    assert not [e for e in evs if e["reason"] in ("HandoffTimedOut", "OwnerGone")]
    print(f"/2 merge: {apart} sibling pair(s) sat apart and were gathered")
