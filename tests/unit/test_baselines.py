"""The anchors: Orleans mod-n and random as ported, and the lineup `--compare` and the bench use."""

from __future__ import annotations

import pytest
import xxhash

from apportion.engine.allocation import (
    AllocationError,
    AllocationRequest,
    Balanced,
    ConsistentHashing,
    LeastShards,
    Member,
)
from apportion.engine.baselines import ANCHORS, OrleansModN, RandomAllocation, make_anchor
from apportion.engine.scenarios import COMPARE, drive, scale_out

UNITS = [f"u{j}" for j in range(200)]


def fleet(n: int) -> list[Member]:
    # Listed out of name order: Orleans sorts the silos itself.
    return [Member(f"m{i}") for i in reversed(range(n))]


def test_orleans_mod_n_places_by_hash_over_sorted_members() -> None:
    members = [*fleet(5), Member("m9", ready=False), Member("m8", draining=True)]
    plan = OrleansModN().plan(AllocationRequest(UNITS, members, {}))
    eligible = sorted(f"m{i}" for i in range(5))
    for unit in UNITS:
        expected = eligible[(xxhash.xxh3_64_intdigest(unit.encode()) & 0x7FFFFFFF) % 5]
        assert unit in plan.assignment[expected]
    assert plan.assignment["m9"] == plan.assignment["m8"] == ()


def test_orleans_mod_n_reshuffles_on_membership_change() -> None:
    placed = OrleansModN().plan(AllocationRequest(UNITS, fleet(10), {})).assignment
    grown = OrleansModN().plan(AllocationRequest(None, fleet(11), placed))
    # mod-n keeps a unit only when h mod 10 == h mod 11: about 1 in 11.
    assert len(grown.moves) > 0.8 * len(UNITS)
    again = OrleansModN().plan(AllocationRequest(None, fleet(11), grown.assignment))
    assert again.moves == ()


def test_random_places_only_new_and_orphaned_units() -> None:
    placed = RandomAllocation(seed=3).plan(AllocationRequest(UNITS, fleet(4), {})).assignment
    assert sorted(u for us in placed.values() for u in us) == sorted(UNITS)
    assert all(placed.values())  # 200 units at random: no member left empty
    # m3 leaves, m4 and m5 join: m3's units find new homes, nothing else moves.
    members = [Member(f"m{i}") for i in (0, 1, 2, 4, 5)]
    plan = RandomAllocation(seed=3).plan(AllocationRequest(None, members, placed))
    assert sorted(m.unit for m in plan.moves) == sorted(placed["m3"])
    assert all(m.source == "m3" for m in plan.moves)
    for name in ("m0", "m1", "m2"):
        assert plan.assignment[name][: len(placed[name])] == placed[name]


def test_random_is_seeded() -> None:
    def place(seed: int) -> object:
        return RandomAllocation(seed).plan(AllocationRequest(UNITS, fleet(6), {})).assignment

    assert place(7) == place(7)
    assert place(7) != place(8)


def test_make_anchor_builds_the_lineup() -> None:
    kinds = {label: type(make_anchor(spec)) for label, spec in ANCHORS.items()}
    assert kinds == {
        "LeastShards": LeastShards,
        "ConsistentHashing": ConsistentHashing,
        "Dapr ring": ConsistentHashing,
        "Orleans mod-n": OrleansModN,
        "random": RandomAllocation,
    }
    assert make_anchor(ANCHORS["Dapr ring"]).options.virtual_nodes == 100  # type: ignore[attr-defined]
    assert isinstance(make_anchor({"name": "Balanced"}), Balanced)
    assert list(COMPARE) == ["Balanced", *ANCHORS]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "OrleansModN", "virtualNodes": 3}, "unknown option"),
        ({"name": "Random", "seed": "x"}, "seed must be an integer"),
        ({"name": "Nope"}, "unknown allocation strategy 'Nope'"),
    ],
)
def test_bad_anchor_specs_are_clear_errors(spec: dict[str, object], message: str) -> None:
    with pytest.raises(AllocationError, match=message):
        make_anchor(spec)


def test_the_scenario_driver_runs_the_anchors() -> None:
    scenario = scale_out(units=1000, members=10, steps=1)
    mod_n = drive(scenario, ANCHORS["Orleans mod-n"])
    rand = drive(scenario, ANCHORS["random"])
    assert mod_n.steps[0].moves > 800
    assert mod_n.steps[0].rounds == 1
    assert rand.steps[0].moves == 0  # the newcomer stays empty
    assert rand.initial.moves == 1000
    assert rand.initial.converged
