"""LeastShards reproduces Akka's own published scenarios (LeastShardAllocationStrategySpec).

Akka's spec names regions A, B, C (addresses 127.0.0.1..3, so A sorts first) and shards
"001".."999"; ``createAllocations(a, b, c)`` gives A the first ``a`` shards, B the next ``b``, C
the next ``c``. One apportion plan is one Akka rebalance round followed by the reallocation of
the rebalanced shards (the spec's ``afterRebalance``), so each scenario checks the set of moved
units (Akka's ``rebalance`` result) and the counts after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from apportion.engine.allocation import (
    AllocationRequest,
    LeastShards,
    LeastShardsParameters,
    Member,
    Plan,
)
from apportion.engine.allocation.least_shards import _Allocator
from apportion.engine.allocation.plan_builder import index_request

SHARDS = [f"{n:03d}" for n in range(1, 1000)]
UNLIMITED = LeastShards(LeastShardsParameters(absolute_limit=1000, relative_limit=1.0))


def members(names: str = "ABC", **versions: str) -> list[Member]:
    return [Member(n, version=versions.get(n, "1.0.0")) for n in names]


def create_allocations(*counts: int, names: str = "ABC") -> dict[str, list[str]]:
    result, start = {}, 0
    for name, count in zip(names, counts, strict=False):
        result[name] = SHARDS[start : start + count]
        start += count
    for name in names[len(counts) :]:
        result[name] = []
    return result


def round_of(
    strategy: LeastShards,
    assignment: Mapping[str, Sequence[str]],
    regions: Sequence[Member] | None = None,
    in_progress: frozenset[str] = frozenset(),
) -> Plan:
    regions = regions if regions is not None else members("".join(assignment))
    return strategy.plan(AllocationRequest(None, regions, assignment, in_progress=in_progress))


def moved(plan: Plan) -> set[str]:
    return {m.unit for m in plan.moves}


def counts(plan: Plan) -> list[int]:
    return [len(units) for units in plan.assignment.values()]


def test_allocate_to_region_with_least_number_of_shards() -> None:
    allocations = create_allocations(1, 1)
    plan = UNLIMITED.plan(AllocationRequest(["001", "002", "003"], members(), allocations))
    assert [(m.unit, m.source, m.target) for m in plan.moves] == [("003", None, "C")]


def test_rebalance_1_2_0() -> None:
    plan = round_of(UNLIMITED, create_allocations(1, 2))
    assert moved(plan) == {"002"}
    assert counts(plan) == [1, 1, 1]


def test_rebalance_2_0_0() -> None:
    plan = round_of(UNLIMITED, create_allocations(2))
    assert moved(plan) == {"001"}
    assert counts(plan) == [1, 1, 0]


def test_not_rebalance_1_1_0() -> None:
    plan = round_of(UNLIMITED, create_allocations(1, 1))
    assert plan.moves == ()
    assert plan.quality.converged


def test_rebalance_3_0_0() -> None:
    plan = round_of(UNLIMITED, create_allocations(3))
    assert moved(plan) == {"001", "002"}
    assert counts(plan) == [1, 1, 1]


def test_rebalance_4_4_0() -> None:
    plan = round_of(UNLIMITED, create_allocations(4, 4))
    assert moved(plan) == {"001", "005"}
    assert counts(plan) == [3, 3, 2]


def test_rebalance_4_4_2_by_phase_2() -> None:
    plan = round_of(UNLIMITED, create_allocations(4, 4, 2))
    assert moved(plan) == {"001"}
    assert counts(plan) == [3, 4, 3]


def test_rebalance_5_5_0_in_two_rounds() -> None:
    first = round_of(UNLIMITED, create_allocations(5, 5))
    assert moved(first) == {"001", "006"}
    assert counts(first) == [4, 4, 2]
    assert not first.quality.converged
    second = round_of(UNLIMITED, dict(first.assignment))
    assert moved(second) == {"002"}
    assert counts(second) == [3, 4, 3]
    assert second.quality.converged


def test_rebalance_50_50_0_in_two_rounds() -> None:
    allocations = {"A": SHARDS[:50], "B": [], "C": SHARDS[50:100]}
    first = round_of(UNLIMITED, allocations)
    assert moved(first) == set(SHARDS[:16]) | set(SHARDS[50:66])
    assert sorted(counts(first)) == [32, 34, 34]
    second = round_of(UNLIMITED, dict(first.assignment))
    assert moved(second) == {"017"}
    assert sorted(counts(second)) == [33, 33, 34]


def test_respect_absolute_limit() -> None:
    strategy = LeastShards(LeastShardsParameters(absolute_limit=3, relative_limit=1.0))
    plan = round_of(strategy, create_allocations(1, 9))
    assert moved(plan) == {"002", "003", "004"}
    assert counts(plan) == [2, 6, 2]


def test_respect_relative_limit() -> None:
    strategy = LeastShards(LeastShardsParameters(absolute_limit=5, relative_limit=0.3))
    plan = round_of(strategy, create_allocations(1, 9))
    assert moved(plan) == {"002", "003", "004"}
    assert counts(plan) == [2, 6, 2]


def test_not_rebalance_when_in_progress() -> None:
    plan = round_of(UNLIMITED, create_allocations(10), in_progress=frozenset({"002", "003"}))
    assert plan.moves == ()
    assert "in progress" in plan.quality.reasons[0]


def test_prefer_least_shards_latest_version_and_not_leaving() -> None:
    # Akka's ordering test: B fewest + newest, C newest with one shard, D newest with two,
    # the old-version member next, the leaving member last.
    regions = [
        Member("fewest", version="1.0.1"),
        Member("leaving", version="1.0.0", draining=True),
        Member("most", version="1.0.1"),
        Member("oldapp", version="1.0.0"),
        Member("oneshard", version="1.0.1"),
    ]
    assignment = {"most": ["ShardId2", "ShardId3"], "oneshard": ["ShardId1"]}
    state = index_request(AllocationRequest(None, regions, assignment))
    allocator = _Allocator(state, [state.count(i) for i in range(5)], range(5))
    order = [regions[i].name for *_, i in sorted(allocator.heap)]
    assert order == ["fewest", "oneshard", "most", "oldapp", "leaving"]


def test_new_units_go_to_the_newest_version_during_a_rolling_update() -> None:
    regions = [Member("old", version="1.0.0"), Member("new", version="1.0.10")]
    plan = UNLIMITED.plan(
        AllocationRequest(["a", "b", "c"], regions, {"old": [], "new": ["a", "b"]})
    )
    assert [(m.unit, m.target) for m in plan.moves] == [("c", "new")]


def test_not_rebalance_when_rolling_update_in_progress() -> None:
    regions = [Member("A", version="1.0.0"), Member("B", version="1.0.1"), Member("C")]
    for in_progress in (frozenset(), frozenset({"001", "002"})):
        plan = round_of(UNLIMITED, create_allocations(5, 5), regions, in_progress)
        assert plan.moves == ()


def test_not_rebalance_when_regions_are_unreachable() -> None:
    regions = [Member("A"), Member("B", ready=False), Member("C")]
    plan = round_of(UNLIMITED, create_allocations(5, 5), regions)
    assert plan.moves == ()
    assert "'B' is not ready" in plan.quality.reasons[0]


def test_prefer_to_rebalance_from_more_unbalanced_regions() -> None:
    strategy = LeastShards(LeastShardsParameters(absolute_limit=1, relative_limit=1.0))
    allocations = {"A": [], "B": SHARDS[0:1], "C": SHARDS[1:4], "D": SHARDS[4:8]}
    first = round_of(strategy, allocations)
    assert moved(first) == {"005"}
    assert first.assignment["A"] == ("005",)
    assert first.assignment["D"] == ("006", "007", "008")
    second = round_of(strategy, dict(first.assignment))
    assert moved(second) == {"006"}
    assert second.assignment["A"] == ("005", "006")
    assert second.assignment["B"] == ("001",)
    assert second.assignment["D"] == ("007", "008")
    third = round_of(strategy, dict(second.assignment))
    assert moved(third) == {"002"}
    assert counts(third) == [2, 2, 2, 2]
    assert third.assignment["B"] == ("001", "002")


def test_rebalance_from_the_most_unbalanced_region_first() -> None:
    strategy = LeastShards(LeastShardsParameters(absolute_limit=1, relative_limit=1.0))
    allocations = {
        "A": [],
        "B": SHARDS[0:1],
        "C": SHARDS[1:3],
        "D": SHARDS[3:8],
        "E": SHARDS[8:15],
    }
    plan = round_of(strategy, allocations)
    assert moved(plan) == {"009"}
    assert sorted(counts(plan)) == [1, 1, 2, 5, 6]
    assert plan.assignment["A"] == ("009",)
    assert plan.assignment["E"] == tuple(SHARDS[9:15])


def test_take_several_from_the_most_unbalanced_region_under_a_tight_limit() -> None:
    strategy = LeastShards(LeastShardsParameters(absolute_limit=3, relative_limit=1.0))
    allocations = {"A": [], "B": [], "C": SHARDS[0:3], "D": SHARDS[3:8]}
    plan = round_of(strategy, allocations)
    assert moved(plan) == {"004", "005", "006"}
    assert sorted(counts(plan)) == [1, 2, 2, 3]
    assert plan.assignment["C"] == ("001", "002", "003")
    assert plan.assignment["D"] == ("007", "008")


def test_default_limits_are_20_and_a_tenth() -> None:
    strategy = LeastShards()
    assert strategy.limit(1000) == 20
    assert strategy.limit(100) == 10
    assert strategy.limit(5) == 1


def test_scale_out_needs_many_rounds() -> None:
    # 100 -> 101 members, 10k units: Akka moves at most 20 per round, phase 2 one per member.
    names = [f"m{i:03d}" for i in range(101)]
    units = [f"u{j}" for j in range(10_000)]
    assignment: dict[str, Sequence[str]] = {
        n: units[k * 100 : (k + 1) * 100] for k, n in enumerate(names[:100])
    }
    assignment[names[100]] = []
    regions = [Member(n) for n in names]
    rounds = 0
    plan = None
    while plan is None or not plan.quality.converged:
        plan = LeastShards().plan(AllocationRequest(None, regions, assignment))
        assignment = dict(plan.assignment)
        rounds += 1
        assert plan.quality.moves <= 20
    assert rounds > 1
    assert max(map(len, assignment.values())) - min(map(len, assignment.values())) <= 2


def test_draining_members_are_handed_off_and_gone_members_reallocated() -> None:
    regions = [Member("A"), Member("B", draining=True), Member("C")]
    plan = round_of(UNLIMITED, {"A": ["1"], "B": ["2", "3"], "C": [], "gone": ["4"]}, regions)
    assert plan.assignment["B"] == ()
    assert {m.unit for m in plan.moves} == {"2", "3", "4"}
    assert all(m.target != "B" for m in plan.moves)
