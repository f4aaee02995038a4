"""Properties every strategy keeps, on random fleets (hypothesis).

No unit is lost or duplicated; the resulting assignment is the request's with the moves applied;
no unit goes to a gone, not-ready, draining or zero-capacity member while an eligible one
exists; units in hand-off stay; each strategy keeps its own limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from apportion.engine.allocation import (
    AllocationRequest,
    Member,
    Plan,
    make_strategy,
)


@st.composite
def requests(draw: st.DrawFn, loads: bool | None = None) -> AllocationRequest:
    members = [
        Member(
            f"m{i}",
            labels={"zone": draw(st.sampled_from("ab"))},
            capacity=draw(st.sampled_from([1.0, 1.0, 1.0, 2.0, 0.5, 0.0])),
            ready=draw(st.sampled_from([True, True, True, False])),
            version=draw(st.sampled_from(["1.0", "1.0", "1.1"])),
            draining=draw(st.sampled_from([False, False, False, True])),
        )
        for i in range(draw(st.integers(0, 7)))
    ]
    n_units = draw(st.integers(0, 60))
    units = [f"u{j}" for j in range(n_units)]
    homes = [m.name for m in members] + ["gone-a", "gone-b", None]
    assignment: dict[str, list[str]] = {}
    for unit in units:
        home = draw(st.sampled_from(homes))
        if home is not None:
            assignment.setdefault(home, []).append(unit)
    in_progress = frozenset(u for u in units if draw(st.integers(0, 9)) == 0)
    with_loads = draw(st.booleans()) if loads is None else loads
    unit_loads = None
    if with_loads:
        unit_loads = {
            u: draw(st.floats(0, 100, allow_nan=False)) for u in units if draw(st.integers(0, 9))
        }
    everything_assigned = sum(map(len, assignment.values())) == n_units
    listed = None if everything_assigned and draw(st.booleans()) else units
    return AllocationRequest(listed, members, assignment, unit_loads, in_progress)


@st.composite
def settled_requests(draw: st.DrawFn) -> AllocationRequest:
    """Every unit on a member that may keep it (ready, not draining, capacity > 0), none in
    hand-off, loads on most units; members that hold nothing may be unready or draining."""
    holders = [
        Member(f"m{i}", capacity=draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])))
        for i in range(draw(st.integers(1, 7)))
    ]
    idle = [
        Member(f"x{i}", ready=draw(st.booleans()), draining=True)
        for i in range(draw(st.integers(0, 2)))
    ]
    units = [f"u{j}" for j in range(draw(st.integers(1, 60)))]
    assignment: dict[str, list[str]] = {}
    for unit in units:
        assignment.setdefault(draw(st.sampled_from(holders)).name, []).append(unit)
    loads = {u: draw(st.floats(0, 100, allow_nan=False)) for u in units if draw(st.integers(0, 9))}
    return AllocationRequest(units, holders + idle, assignment, loads)


def fewest_moves_to_fair_counts(
    request: AllocationRequest,
) -> tuple[int, dict[str, set[int]]]:
    """The oracle for Balanced without loads, from the definitions alone: the eligible members
    get counts that are each the floor or ceiling of their capacity share (Hamilton), with the
    lowest largest count / capacity among such vectors; every unit not on an eligible member
    moves, and an eligible member above its count gives up the difference. Returns the fewest
    moves over all fair vectors and, per member, the counts fair vectors give it."""
    eligible = [m for m in request.members if m.eligible]
    scope = set(request.units or ())
    scope |= {u for units in request.assignment.values() for u in units}
    where = {u: m for m, units in request.assignment.items() for u in units}
    current = [sum(1 for u in scope if where.get(u) == m.name) for m in eligible]
    capacities = [m.capacity for m in eligible]
    shares = [len(scope) * c / math.fsum(capacities) for c in capacities]
    choices = [{math.floor(s + 1e-9), math.ceil(s - 1e-9)} for s in shares]
    vectors = [v for v in itertools.product(*choices) if sum(v) == len(scope)]

    def level(v: tuple[int, ...]) -> float:
        return max(q / c for q, c in zip(v, capacities, strict=True))

    lowest = min(level(v) for v in vectors)
    fair = [v for v in vectors if level(v) <= lowest + 1e-9]
    off = len(scope) - sum(current)

    def moves(v: tuple[int, ...]) -> int:
        return off + sum(max(0, c - q) for c, q in zip(current, v, strict=True))

    fewest = min(moves(v) for v in fair)
    best = [v for v in fair if moves(v) == fewest]
    allowed = {m.name: {v[i] for v in best} for i, m in enumerate(eligible)}
    return fewest, allowed


SPECS: list[Mapping[str, Any]] = [
    {"name": "Balanced"},
    {"name": "Balanced", "tolerance": "Tight", "maxMoves": 3},
    {"name": "Balanced", "topologyKey": "zone", "maxSkew": 1},
    {"name": "LeastShards", "absoluteLimit": 2, "relativeLimit": 0.5},
    {"name": "LeastShards"},
    {"name": "ConsistentHashing", "rebalanceLimit": 2},
    {"name": "ConsistentHashing", "virtualNodes": 100},
    {"name": "External", "pins": {"u1": "m0", "u2": "m1", "u3": "gone-a"}},
    {"name": "External", "pins": {"u0": "m2"}, "fallback": {"name": "LeastShards"}},
]


def check_invariants(request: AllocationRequest, plan: Plan) -> None:
    names = [m.name for m in request.members]
    assert list(plan.assignment) == names

    assigned = {u for units in request.assignment.values() for u in units}
    scope = set(request.units) if request.units is not None else assigned
    placed = [u for units in plan.assignment.values() for u in units]
    assert len(placed) == len(set(placed)), "a unit is assigned twice"
    assert set(placed).isdisjoint(plan.unassigned)
    assert set(placed) | set(plan.unassigned) == scope, "a unit was lost or invented"

    where = {u: m for m, units in request.assignment.items() for u in units if u in scope}
    seen: set[str] = set()
    for move in plan.moves:
        assert move.unit not in seen, "a unit moved twice in one plan"
        seen.add(move.unit)
        assert where.get(move.unit) == move.source
        assert move.target in names, "moved to a member that is gone"
        assert move.target != move.source
        where[move.unit] = move.target
    for member, units in plan.assignment.items():
        assert set(units) == {u for u, m in where.items() if m == member}
    assert set(plan.unassigned) == {u for u in scope if where.get(u) not in names}

    eligible = {m.name for m in request.members if m.eligible}
    if eligible:
        assert all(m.target in eligible for m in plan.moves), "moved to an ineligible member"
    for move in plan.moves:
        if move.unit in request.in_progress:
            assert move.source not in names, "a unit in hand-off moved"
    assert plan.quality.moves == len(plan.moves)


def optional_moves(request: AllocationRequest, plan: Plan) -> int:
    """Moves away from eligible members (ready, not draining, capacity > 0): the ones a
    strategy's limit or budget governs; units of any other member move regardless."""
    keepers = {m.name for m in request.members if m.eligible}
    return sum(1 for m in plan.moves if m.source in keepers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(), spec=st.sampled_from(SPECS))
def test_plans_keep_the_invariants(request: AllocationRequest, spec: Mapping[str, Any]) -> None:
    plan = make_strategy(spec).plan(request)
    check_invariants(request, plan)
    name = spec["name"]
    if name == "LeastShards":
        assert optional_moves(request, plan) <= spec.get("absoluteLimit", 20)
    if name == "ConsistentHashing" and "rebalanceLimit" in spec:
        assert optional_moves(request, plan) <= spec["rebalanceLimit"]
    if name == "Balanced" and "maxMoves" in spec:
        assert optional_moves(request, plan) <= spec["maxMoves"]


@settings(max_examples=150, deadline=None)
@given(request=requests(loads=False))
def test_least_shards_rounds_are_limited(request: AllocationRequest) -> None:
    strategy = make_strategy({"name": "LeastShards", "absoluteLimit": 3, "relativeLimit": 1.0})
    plan = strategy.plan(request)
    check_invariants(request, plan)
    assert optional_moves(request, plan) <= 3


@settings(max_examples=200, deadline=None)
@given(request=requests(loads=False))
def test_balanced_counts_reach_the_floor_with_the_fewest_moves(request: AllocationRequest) -> None:
    request = AllocationRequest(request.units, request.members, request.assignment)
    assume(any(m.eligible for m in request.members))
    plan = make_strategy({"name": "Balanced"}).plan(request)
    check_invariants(request, plan)
    fewest, allowed = fewest_moves_to_fair_counts(request)
    assert plan.quality.moves == fewest
    for name, counts in allowed.items():
        assert len(plan.assignment[name]) in counts


@settings(max_examples=100, deadline=None)
@given(request=settled_requests())
def test_balanced_loads_never_raise_the_maximum(request: AllocationRequest) -> None:
    plan = make_strategy({"name": "Balanced"}).plan(request)
    check_invariants(request, plan)
    assert plan.quality.load_max_mean_before is not None
    assert plan.quality.load_max_mean_after is not None
    assert plan.quality.load_max_mean_after <= plan.quality.load_max_mean_before + 1e-9


@settings(max_examples=100, deadline=None)
@given(request=requests(loads=False))
def test_a_second_balanced_plan_is_quiet(request: AllocationRequest) -> None:
    strategy = make_strategy({"name": "Balanced"})
    first = strategy.plan(request)
    assume(not first.unassigned)
    again = AllocationRequest(
        None, request.members, dict(first.assignment), None, request.in_progress
    )
    assert strategy.plan(again).moves == ()
