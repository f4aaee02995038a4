"""RequiredMatch and PreferredMatch, with Orleans' semantics, and how they chain."""

from __future__ import annotations

import random

import pytest

from apportion.api.placement_table import TableMember
from apportion.engine.grains import (
    GrainSpecError,
    NoCompatibleMember,
    PlacementContext,
    PlacementTable,
    PreferredMatch,
    RequiredMatch,
    make_grain_strategy,
)

TABLE = PlacementTable(
    [
        TableMember(name="a1", labels={"region": "eu", "zone": "eu-1", "rack": "r1"}),
        TableMember(name="a2", labels={"region": "eu", "zone": "eu-1", "rack": "r2"}),
        TableMember(name="a3", labels={"region": "eu", "zone": "eu-2", "rack": "r1"}),
        TableMember(name="b1", labels={"region": "us", "zone": "us-1", "rack": "r1"}),
        TableMember(name="b2", labels={"region": "us", "zone": "us-1"}),
        TableMember(name="c1", labels={}),
    ]
)
ALL = tuple(range(len(TABLE)))


def names(indices: tuple[int, ...]) -> list[str]:
    return [TABLE.names[i] for i in indices]


def test_required_match_keeps_equal_values_on_every_key() -> None:
    f = RequiredMatch(["region", "zone"])
    assert names(f.apply(TABLE, ALL, {"region": "eu", "zone": "eu-1"})) == ["a1", "a2"]
    assert names(f.apply(TABLE, ALL, {"region": "us", "zone": "eu-1"})) == []


def test_required_match_treats_a_key_missing_on_both_sides_as_equal() -> None:
    assert names(RequiredMatch(["rack"]).apply(TABLE, ALL, {})) == ["b2", "c1"]


def test_preferred_match_uses_the_last_key_as_most_important() -> None:
    # region, zone, rack: a1 matches all three; a2 mismatches rack so scores 0 (counting stops
    # at the first mismatch from the end).
    f = PreferredMatch(["region", "zone", "rack"], min_candidates=1)
    caller = {"region": "eu", "zone": "eu-1", "rack": "r1"}
    assert names(f.apply(TABLE, ALL, caller)) == ["a1"]


def test_preferred_match_drops_earliest_keys_until_enough_remain() -> None:
    caller = {"region": "eu", "zone": "eu-1"}
    # Both keys match for a1, a2 (score 2): two candidates are enough.
    assert names(PreferredMatch(["region", "zone"]).apply(TABLE, ALL, caller)) == ["a1", "a2"]
    # Three wanted: only a1 and a2 match even the most important key (zone), so all are kept.
    wide = PreferredMatch(["region", "zone"], min_candidates=3)
    assert names(wide.apply(TABLE, ALL, caller)) == names(ALL)
    # Ordered the other way, `region` is most important: eu members (3) satisfy minCandidates.
    by_region = PreferredMatch(["zone", "region"], min_candidates=3)
    assert names(by_region.apply(TABLE, ALL, caller)) == ["a1", "a2", "a3"]


def test_preferred_match_keeps_everything_without_a_match_or_metadata() -> None:
    f = PreferredMatch(["zone"])
    assert f.apply(TABLE, ALL, {"zone": "nowhere"}) == ALL
    assert f.apply(TABLE, ALL, {}) == ALL
    assert f.apply(TABLE, (0, 3), {"zone": "eu-1"}) == (0, 3)  # no more than minCandidates


def test_filters_run_in_order_and_explain_says_which_removed_whom() -> None:
    strategy = make_grain_strategy(
        {"name": "Random"},
        [
            {"type": "RequiredMatch", "keys": ["region"]},
            {"type": "PreferredMatch", "keys": ["zone"], "minCandidates": 2},
        ],
        rng=random.Random(3),
    )
    strategy.update(TABLE)
    ctx = PlacementContext(local_member="a3")
    explanation = strategy.explain("g", ctx)
    assert [(s.filter, s.removed) for s in explanation.filters] == [
        ("RequiredMatch(region)", ("b1", "b2", "c1")),
        ("PreferredMatch(zone; minCandidates=2)", ()),  # only a3 is in eu-2: keep all three
    ]
    assert {strategy.place(f"g{i}", ctx) for i in range(200)} == {"a1", "a2", "a3"}


def test_caller_metadata_overrides_the_local_members_labels() -> None:
    strategy = make_grain_strategy(
        {"name": "Random"}, [{"type": "RequiredMatch", "keys": ["region"]}]
    )
    strategy.update(TABLE)
    ctx = PlacementContext(local_member="a1", caller_metadata={"region": "us"})
    assert {strategy.place(f"g{i}", ctx) for i in range(100)} == {"b1", "b2"}


def test_a_filter_that_leaves_nobody_fails_clearly() -> None:
    strategy = make_grain_strategy(
        {"name": "Random"}, [{"type": "RequiredMatch", "keys": ["region"]}]
    )
    strategy.update(TABLE)
    ctx = PlacementContext(caller_metadata={"region": "mars"})
    with pytest.raises(NoCompatibleMember, match=r"RequiredMatch\(region\) left no member"):
        strategy.place("g", ctx)
    explanation = strategy.explain("g", ctx)
    assert explanation.chosen is None
    assert explanation.error is not None
    assert "mars" in explanation.error


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "RequiredMatch"}, "needs `keys`"),
        ({"type": "RequiredMatch", "keys": []}, "needs `keys`"),
        ({"type": "RequiredMatch", "keys": "zone"}, "needs `keys`"),
        ({"type": "PreferredMatch", "keys": ["a", "a"]}, "duplicate keys"),
        ({"type": "PreferredMatch", "keys": ["a"], "minCandidates": 0}, ">= 1"),
        ({"type": "PreferredMatch", "keys": ["a"], "minCandidates": "2"}, "integer"),
        ({"keys": ["a"]}, "needs a `type`"),
    ],
)
def test_bad_filter_specs_are_rejected(spec: dict[str, object], message: str) -> None:
    with pytest.raises(GrainSpecError, match=message):
        make_grain_strategy({"name": "Random"}, [spec])
