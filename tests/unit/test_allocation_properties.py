"""Properties every strategy keeps, on random fleets (hypothesis).

No unit is lost or duplicated; the resulting assignment is the request's with the moves applied;
no unit goes to a gone, not-ready, draining or zero-capacity member while an eligible one
exists; units in hand-off stay; each strategy keeps its own limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.engine.allocation import (
    AllocationRequest,
    Member,
    Plan,
    make_strategy,
)
from apportion.engine.allocation.state import hamilton_quotas, index_request, target_members


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
    assert plan.metrics.moves == len(plan.moves)


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
    state = index_request(request)
    rebalanced = [
        m
        for m in plan.moves
        if m.source in {x.name for x in state.members if x.ready and not x.draining}
        and state.members[state.index[m.source]].capacity > 0
    ]
    assert len(rebalanced) <= 3


@settings(max_examples=200, deadline=None)
@given(request=requests(loads=False))
def test_balanced_counts_reach_the_floor_with_the_fewest_moves(request: AllocationRequest) -> None:
    request = AllocationRequest(request.units, request.members, request.assignment)
    plan = make_strategy({"name": "Balanced"}).plan(request)
    check_invariants(request, plan)
    state = index_request(request)
    targets, _ = target_members(state)
    if not targets:
        return
    assert plan.metrics.moves == plan.metrics.lower_bound
    counts = [len(plan.assignment[state.members[i].name]) for i in targets]
    quotas = hamilton_quotas(
        state.total, [state.members[i].capacity for i in targets], [state.count(i) for i in targets]
    )
    assert sorted(counts) == sorted(quotas) or counts == quotas
    if len({state.members[i].capacity for i in targets}) == 1:
        assert max(counts) - min(counts) <= 1


@settings(max_examples=100, deadline=None)
@given(request=requests(loads=True))
def test_balanced_loads_never_raise_the_maximum(request: AllocationRequest) -> None:
    plan = make_strategy({"name": "Balanced"}).plan(request)
    check_invariants(request, plan)
    state = index_request(request)
    settled = not state.homeless and not request.in_progress
    if settled and all(x.eligible for x in request.members if request.assignment.get(x.name)):
        before, after = plan.metrics.load_max_mean_before, plan.metrics.load_max_mean_after
        assert before is not None and after is not None
        assert after <= before + 1e-9


@settings(max_examples=100, deadline=None)
@given(request=requests())
def test_a_second_balanced_plan_is_quiet(request: AllocationRequest) -> None:
    strategy = make_strategy({"name": "Balanced"})
    first = strategy.plan(request)
    again = AllocationRequest(
        None, request.members, dict(first.assignment), request.loads, request.in_progress
    )
    if first.unassigned or request.loads is not None:
        return
    assert strategy.plan(again).moves == ()
