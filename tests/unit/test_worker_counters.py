"""The demo worker's unit state: per-key counters (numbered increments counted once, cut and
joined by key range) and the per-unit state a releasing pod leaves for the acquirer."""

from __future__ import annotations

import xxhash

from apportion.api.assignment import AssignmentTable, Incarnation, Lineage, ResourceRef, UnitState
from apportion.engine.keys import get_scheme
from apportion.worker import UnitRange
from apportion.worker._state_transfer import UnitSnapshot, era_start, lease_name
from apportion_dev.worker import counters

SCHEME = get_scheme("apportion")
KEYS = [f"order-{i}" for i in range(2000)]


def test_a_numbered_increment_counts_once() -> None:
    counts: counters.Counts = {}
    assert [counters.increment(counts, "a", n).count for n in (1, 2, 2, 1, 3)] == [1, 2, 2, 2, 3]
    assert [counters.increment(counts, "b").count for _ in range(3)] == [1, 2, 3]
    assert counters.from_json(counters.to_json(counts)) == counts


def test_a_split_puts_each_key_into_the_child_whose_hash_range_holds_it() -> None:
    parent = UnitRange.of("3", 8)
    mine = {k: counters.KeyCount(i + 1, i + 1) for i, k in enumerate(KEYS)}
    mine = {k: v for k, v in mine.items() if SCHEME.unit(k, 8) == 3}
    children = tuple(UnitRange.of(str(u), 32) for u in (12, 13, 15))  # 14 is another pod's
    parts = counters.split(mine, children, SCHEME.unit)
    assert sorted(parts) == ["12", "13", "15"]
    for child in children:
        # Oracle: the range arithmetic on xxh3-64 itself.
        expected = {k for k in mine if child.lo <= xxhash.xxh3_64_intdigest(k.encode()) < child.hi}
        assert set(parts[child.unit]) == expected
        assert expected
    lost = set(mine) - set().union(*parts.values())
    assert lost == {k for k in mine if SCHEME.unit(k, 32) == 14}
    assert all(parent.lo <= xxhash.xxh3_64_intdigest(k.encode()) < parent.hi for k in lost)
    everything = counters.split(
        mine, tuple(UnitRange.of(str(u), 32) for u in range(12, 16)), SCHEME.unit
    )
    assert counters.merge(everything.values()) == mine


def table(lineage: Lineage | None, epoch: int = 9, count: int = 4) -> AssignmentTable:
    me = Incarnation("w-0", "uid-0")
    return AssignmentTable(
        ResourceRef("PartitionSet", "ns", "rs", "set-uid"),
        1,
        "apportion",
        count,
        epoch,
        (me,),
        {str(u): UnitState("w-0", epoch) for u in range(count)},
        lineage,
    )


def test_saved_state_round_trips_and_names_its_era() -> None:
    state = UnitSnapshot("set-uid", 4, "2", 7, "w-1", {"k": [3, 3]})
    assert UnitSnapshot.from_annotation(state.to_annotation()) == state
    assert era_start(table(None)) == 0
    merged = table(Lineage(8, 4, 8, (1,) * 8))
    assert era_start(merged) == 8
    assert state.current(table(None), 4)
    assert not state.current(merged, 4)  # left in an earlier era of 4 units
    assert not state.current(table(None), 8)  # another count's unit 2
    assert UnitSnapshot("set-uid", 4, "2", 8, "w-1", {}).current(merged, 4)
    assert state.current(table(None, count=16), 4)  # a merge loading a sibling of 4
    assert not UnitSnapshot("old-uid", 4, "2", 7, "w-1", {}).current(table(None), 4)


def test_lease_names_fit_and_stay_apart() -> None:
    assert lease_name("PartitionSet", "rs", 128, "5") == "rs-partitionset-unit-128-5"
    long = "x" * 250
    names = {lease_name("ShardSet", long, 64, str(u)) for u in range(3)}
    assert len(names) == 3
    assert all(len(n) <= 253 for n in names)
