"""Balanced's moves against an exact optimum (OR-Tools CP-SAT) on small instances.

For each instance Balanced plans first; the oracle then finds the fewest moves that put every
member's load inside the same range [min, max] the plan reached (the plan's own assignment is a
solution, so the oracle's answer is a true lower bound for that balance). Instances: 4-8 members,
60-160 units with log-normal loads, a third of the units piled on one member (all members start
outside the tolerance, so the whole fleet is rebalanced).
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from apportion.engine.allocation import AllocationRequest, Member, make_strategy


def fewest_moves(loads: list[int], owner: list[int], members: int, low: int, high: int) -> int:
    model = cp_model.CpModel()
    place = [[model.new_bool_var(f"x{u}_{m}") for m in range(members)] for u in range(len(loads))]
    for row in place:
        model.add_exactly_one(row)
    for m in range(members):
        load = sum(loads[u] * place[u][m] for u in range(len(loads)))
        model.add(load <= high)
        model.add(load >= low)
    model.minimize(sum(1 - place[u][owner[u]] for u in range(len(loads))))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 30
    solver.parameters.num_workers = 2
    assert solver.solve(model) == cp_model.OPTIMAL
    return round(solver.objective_value)


def instance(seed: int) -> tuple[list[int], list[int], int]:
    shape = np.random.default_rng(100 + seed)
    n, units = int(shape.integers(4, 9)), int(shape.integers(60, 160))
    rng = np.random.default_rng(seed)
    loads = np.maximum(1, np.round(rng.lognormal(3, 0.8, units))).astype(int).tolist()
    owner = rng.integers(0, n, units)
    owner[: units // 3] = 0
    return loads, owner.tolist(), n


def against_optimum(spec: dict, seed: int) -> tuple[int, int, int]:
    """Plan instance `seed` with `spec`; (moves planned, the plan's lower bound, the fewest moves
    that reach the same spread of load, found by CP-SAT)."""
    loads, owner, n = instance(seed)
    names = [f"u{j}" for j in range(len(loads))]
    assignment = {f"m{k}": [names[j] for j in range(len(loads)) if owner[j] == k] for k in range(n)}
    request = AllocationRequest(
        None,
        [Member(f"m{k}") for k in range(n)],
        assignment,
        {names[j]: float(x) for j, x in enumerate(loads)},
    )
    plan = make_strategy(spec).plan(request)
    index = {u: j for j, u in enumerate(names)}
    reached = [sum(loads[index[u]] for u in units) for units in plan.assignment.values()]
    best = fewest_moves(loads, owner, n, min(reached), max(reached))
    return plan.quality.moves, plan.quality.lower_bound, best


def test_balanced_moves_within_5_percent_of_the_optimum() -> None:
    planned = optimum = 0
    for seed in range(10):
        moves, lower_bound, best = against_optimum({"name": "Balanced"}, seed)
        assert best <= moves
        assert lower_bound <= best
        planned += moves
        optimum += best
    assert planned <= 1.05 * optimum, (planned, optimum)
