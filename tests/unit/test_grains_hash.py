"""Grain hashing: a stable vector, and the consistent ring moving only ~1/n on membership
changes (where mod-n HashBased moves almost everything)."""

from __future__ import annotations

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.placement_table import TableMember
from apportion.engine.grains import (
    HashRing,
    PlacementContext,
    PlacementTable,
    grain_hash,
    make_grain_strategy,
)

GRAINS = [f"cart/{i}" for i in range(3000)]


def test_grain_hash_is_xxh3_64_of_the_utf8_id() -> None:
    # Published XXH3-64 test vector (empty input, seed 0).
    assert grain_hash("") == 0x2D06800538D394C2
    # The UTF-8 bytes of the ID, not another encoding: "ü" is C3 BC in UTF-8, FC in Latin-1.
    assert grain_hash("ü") == xxhash.xxh3_64_intdigest(b"\xc3\xbc")
    assert grain_hash("ü") != xxhash.xxh3_64_intdigest(b"\xfc")
    assert grain_hash("cart/1") != grain_hash("cart/2")


def placements(name: str, members: list[str]) -> list[str]:
    strategy = make_grain_strategy({"name": name})
    strategy.update(PlacementTable(TableMember(name=m) for m in members))
    ctx = PlacementContext()
    return [strategy.place(g, ctx) for g in GRAINS]


member_sets = st.lists(
    st.text("abcdefghij0123456789-", min_size=1, max_size=10), min_size=2, max_size=30, unique=True
)


@settings(derandomize=True, deadline=None, max_examples=40)
@given(member_sets, st.text("xyz", min_size=1, max_size=6))
def test_a_joining_member_takes_about_1_over_n_and_only_for_itself(
    members: list[str], newcomer: str
) -> None:
    if newcomer in members:
        return
    before = placements("ConsistentHashBased", members)
    after = placements("ConsistentHashBased", [*members, newcomer])
    moved = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert all(b == newcomer for _, b in moved)
    n = len(members) + 1
    assert len(moved) / len(GRAINS) <= 2.0 / n + 0.02


@settings(derandomize=True, deadline=None, max_examples=40)
@given(member_sets, st.data())
def test_a_leaving_member_moves_only_its_own_grains(
    members: list[str], data: st.DataObject
) -> None:
    leaving = data.draw(st.sampled_from(members))
    before = placements("ConsistentHashBased", members)
    after = placements("ConsistentHashBased", [m for m in members if m != leaving])
    for a, b in zip(before, after, strict=True):
        assert (a == b) != (a == leaving)


def test_on_average_a_join_moves_1_over_n_where_mod_n_moves_n_over_n_plus_1() -> None:
    members = [f"worker-{i:02d}" for i in range(20)]
    grown = [*members, "worker-20"]
    moved = {}
    for name in ("ConsistentHashBased", "HashBased"):
        before, after = placements(name, members), placements(name, grown)
        moved[name] = sum(a != b for a, b in zip(before, after, strict=True)) / len(GRAINS)
    assert 0.5 / 21 <= moved["ConsistentHashBased"] <= 1.5 / 21
    assert moved["HashBased"] > 0.9


def test_ring_points_per_member() -> None:
    ring = HashRing(["a", "b"], virtual_nodes=7)
    assert len(ring.points) == 14
    assert ring.points == sorted(ring.points)
    assert sorted(set(ring.owners)) == ["a", "b"]
    # Past the last point wraps to the first.
    assert ring.owner(2**64 - 1) == ring.owners[0]
