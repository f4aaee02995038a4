"""ConsistentHashing, External, the registry and custom strategies from entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from apportion.engine.allocation import (
    ENTRY_POINT_GROUP,
    AllocationError,
    AllocationRequest,
    Balanced,
    ConsistentHashing,
    ConsistentHashingParameters,
    External,
    LeastShards,
    Member,
    Ring,
    make_strategy,
    strategy_names,
)
from apportion.engine.allocation import registry as registry_module

UNITS = [f"shard-{j}" for j in range(1000)]


def fleet(n: int) -> list[Member]:
    return [Member(f"m{i:02d}") for i in range(n)]


# --- ConsistentHashing ------------------------------------------------------------------


def test_ring_places_every_unit_on_its_ring_owner() -> None:
    members = fleet(10)
    plan = ConsistentHashing().plan(AllocationRequest(UNITS, members, {}))
    ring = Ring([m.name for m in members], list(range(10)), 10)
    owners = ring.owners_of(UNITS).tolist()
    for unit, owner in zip(UNITS, owners, strict=True):
        assert unit in plan.assignment[members[owner].name]


def test_adding_a_member_moves_only_units_to_it() -> None:
    members = fleet(10)
    first = ConsistentHashing().plan(AllocationRequest(UNITS, members, {}))
    grown = [*members, Member("m10")]
    second = ConsistentHashing().plan(AllocationRequest(None, grown, dict(first.assignment)))
    assert second.moves
    assert {m.target for m in second.moves} == {"m10"}
    assert len(second.moves) < len(UNITS) / 5  # ~1/11 of the units, not a reshuffle


def test_removing_a_member_moves_only_its_units() -> None:
    members = fleet(10)
    first = ConsistentHashing().plan(AllocationRequest(UNITS, members, {}))
    second = ConsistentHashing().plan(AllocationRequest(None, members[1:], dict(first.assignment)))
    assert {m.source for m in second.moves} == {"m00"}
    assert len(second.moves) == len(first.assignment["m00"])


def test_rebalance_limit_defers_the_rest() -> None:
    members = fleet(10)
    first = ConsistentHashing().plan(AllocationRequest(UNITS, members, {}))
    limited = ConsistentHashing(ConsistentHashingParameters(rebalance_limit=5))
    second = limited.plan(
        AllocationRequest(None, [*members, Member("m10")], dict(first.assignment))
    )
    assert len(second.moves) == 5
    assert not second.quality.converged
    assert "wait for a later plan" in second.quality.reasons[0]


def test_no_ring_rebalance_while_versions_are_mixed() -> None:
    members = fleet(4)
    first = ConsistentHashing().plan(AllocationRequest(UNITS[:100], members, {}))
    rolling = [*members, Member("new", version="2")]
    second = ConsistentHashing().plan(AllocationRequest(None, rolling, dict(first.assignment)))
    assert second.moves == ()
    assert "versions are mixed" in second.quality.reasons[0]


def test_more_virtual_nodes_spread_better() -> None:
    members = fleet(20)
    spread = {}
    for vnodes in (10, 100):
        plan = ConsistentHashing(ConsistentHashingParameters(virtual_nodes=vnodes)).plan(
            AllocationRequest(UNITS, members, {})
        )
        spread[vnodes] = plan.quality.max_mean_after
    assert spread[100] < spread[10]


# --- External ---------------------------------------------------------------------------


def test_pins_apply_and_the_rest_follow_the_fallback() -> None:
    members = fleet(3)
    strategy = External({"shard-0": "m02", "shard-1": "m02"}, Balanced())
    plan = strategy.plan(AllocationRequest(UNITS[:9], members, {}))
    assert {"shard-0", "shard-1"} <= set(plan.assignment["m02"])
    unpinned = [
        len([u for u in units if u not in {"shard-0", "shard-1"}])
        for units in plan.assignment.values()
    ]
    assert max(unpinned) - min(unpinned) <= 1


def test_pin_moves_an_assigned_unit() -> None:
    members = fleet(2)
    strategy = External({"a": "m01"}, Balanced())
    plan = strategy.plan(AllocationRequest(None, members, {"m00": ["a", "b"], "m01": ["c"]}))
    assert ("a", "m00", "m01") in [(m.unit, m.source, m.target) for m in plan.moves]
    assert "a" in plan.assignment["m01"]


def test_pin_to_absent_member_is_ignored_and_reported() -> None:
    members = fleet(2)
    strategy = External({"a": "nobody"}, Balanced())
    plan = strategy.plan(AllocationRequest(["a", "b"], members, {}))
    assert sorted(len(u) for u in plan.assignment.values()) == [1, 1]
    assert "ignored" in plan.quality.reasons[0]


def test_external_from_options() -> None:
    strategy = make_strategy(
        {
            "name": "External",
            "pins": [{"unit": "a", "member": "m00"}],
            "fallback": {"name": "LeastShards", "absoluteLimit": 5},
        }
    )
    assert isinstance(strategy, External)
    assert isinstance(strategy.fallback, LeastShards)
    assert strategy.fallback.options.absolute_limit == 5
    with pytest.raises(AllocationError, match="pinned twice"):
        make_strategy({"name": "External", "pins": [{"unit": "a", "member": "x"}] * 2})
    with pytest.raises(AllocationError, match="itself"):
        make_strategy({"name": "External", "fallback": {"name": "External"}})


# --- registry ---------------------------------------------------------------------------


def test_unknown_strategy_and_options_are_errors() -> None:
    with pytest.raises(AllocationError, match="unknown allocation strategy 'Nope'"):
        make_strategy({"name": "Nope"})
    with pytest.raises(AllocationError, match="unknown option"):
        make_strategy({"name": "LeastShards", "absolutLimit": 3})
    with pytest.raises(AllocationError, match="relativeLimit"):
        make_strategy({"name": "LeastShards", "relativeLimit": 2})
    with pytest.raises(AllocationError, match="tolerance"):
        make_strategy({"name": "Balanced", "tolerance": "Medium"})


def test_default_strategy_is_balanced() -> None:
    assert isinstance(make_strategy({}), Balanced)
    assert strategy_names()[:4] == ["Balanced", "LeastShards", "ConsistentHashing", "External"]


def test_custom_strategy_from_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    # A real EntryPoint that loads a real factory: LeastShards published under another name.
    custom = EntryPoint(
        name="MyLeast",
        value="apportion.engine.allocation.least_shards:LeastShards.from_options",
        group=ENTRY_POINT_GROUP,
    )
    broken = EntryPoint(name="Broken", value="no_such_module:make", group=ENTRY_POINT_GROUP)

    def fake_entry_points(group: str) -> list[EntryPoint]:
        return [custom, broken] if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    assert "MyLeast" in strategy_names()
    strategy = make_strategy({"name": "MyLeast", "absoluteLimit": 7})
    assert isinstance(strategy, LeastShards)
    assert strategy.options.absolute_limit == 7
    with pytest.raises(AllocationError, match="failed to load"):
        make_strategy({"name": "Broken"})
