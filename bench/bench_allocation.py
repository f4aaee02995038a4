"""Unit allocation: Balanced against the anchors (figures, not asserts).

1. Equal units, per fleet size: initial placement, scale-out by one member (N -> N+1), scale-in
   by one, each driven by the scenario driver (`apportion.engine.scenarios.run_steps`: plans
   until nothing moves). For each strategy: max/mean unit count, moves / lower bound
   (scale-out: the units the new member must receive, floor(S/(N+1)); scale-in: the leaving
   member's units), rounds (plans that moved something), and the time of the event's first
   plan. Anchors (`apportion.engine.baselines`): Akka
   LeastShards (limits 20 / 0.1, one plan = one rebalance round, hand-offs complete between
   rounds), Akka ConsistentHashing (10 virtual nodes), a Dapr-style ring (100 virtual nodes),
   Orleans mod-n hash (sorted_members[(hash & 0x7fffffff) % n]) and random placement (new
   units to a random member, nothing rebalances).
2. Measured loads: Zipf 1.1 over the units, then drifting load (log-normal random walk, sigma
   0.5 over 10 plans); and pure noise (equal true loads, each plan sees them x lognormal(0, 0.5)).
   Reports load max/mean, the hot-unit floor, max/mean of the members without a hot unit,
   moves per plan (% of units) and plan time.
3. Moves against the exact optimum (OR-Tools CP-SAT), if ortools is installed: the instances
   of tests/unit/test_allocation_oracle.py.

Targets: equal units -> floor after one plan, moves == lower bound (10k units, 100 -> 101:
99 moves); loads -> max/mean <= 1.02 or the hot-unit floor; pure noise -> <= 0.5 % of units
move per plan; moves <= 1.05 x optimum; plan < 50 ms at 10k x 100, < 250 ms at 100k x 1000.

Run: .venv/bin/python -m bench.bench_allocation [--quick]
(--quick: 1k x 10 and 10k x 100 only, fewer plans; the full run adds 1k x 100, 10k x 10,
10k x 1000, 100k x 100 and 100k x 1000. 1k units x 1000 members — one unit per member — is
skipped: there is nothing to balance.)
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apportion.engine.allocation import (
    AllocationRequest,
    AllocationStrategy,
    Balanced,
    Member,
    Plan,
)
from apportion.engine.baselines import ANCHORS, make_anchor
from apportion.engine.scenarios import Scenario, Step, StepResult, World, run_steps

Assignment = Mapping[str, Sequence[str]]

STRATEGIES: Mapping[str, Mapping[str, Any]] = {"Balanced": {"name": "Balanced"}, **ANCHORS}


# --- equal units -------------------------------------------------------------------------------


class Timed:
    """A strategy that records the wall time of each plan, in ms."""

    def __init__(self, strategy: AllocationStrategy) -> None:
        self.strategy = strategy
        self.ms: list[float] = []

    def plan(self, request: AllocationRequest) -> Plan:
        start = time.perf_counter()
        plan = self.strategy.plan(request)
        self.ms.append((time.perf_counter() - start) * 1000)
        return plan


def one_event(
    spec: Mapping[str, Any], start: World, after: World
) -> tuple[StepResult, Assignment, StepResult, float]:
    """The initial placement of ``start``, then the event that leads to ``after``, each planned
    until nothing moves (the scenario driver's rounds): the initial result and assignment, the
    event's result and the time of its first plan."""
    timed = Timed(make_anchor(spec))
    scenario = Scenario("event", "", start, (Step("event", after),))
    steps = run_steps(scenario, timed, max_rounds=200)
    initial, assignment, _ = next(steps)
    timed.ms.clear()
    result, _, _ = next(steps)
    return initial, assignment, result, timed.ms[0]


def equal_units(sizes: Sequence[tuple[int, int]]) -> None:
    print("\n== Equal units: initial placement, scale-out N -> N+1, scale-in N -> N-1 ==")
    print(
        f"{'strategy':<23} {'units':>7} {'members':>7} {'init max/mean':>13} "
        f"{'out moves':>9} {'/LB':>6} {'rounds':>6} {'max/mean':>8} {'plan ms':>8} "
        f"{'in moves/LB':>11}"
    )
    for n_units, n_members in sizes:
        units = tuple(f"u{j}" for j in range(n_units))
        members = tuple(Member(f"m{i:04d}") for i in range(n_members))
        start = World(members, units)
        grown = World((*members, Member(f"m{n_members:04d}")), units)
        shrunk = World(members[:-1], units)
        out_lb = n_units // (n_members + 1)
        for name, spec in STRATEGIES.items():
            initial, placed, out, plan_ms = one_event(spec, start, grown)
            _, _, scale_in, _ = one_event(spec, start, shrunk)
            in_lb = len(placed[members[-1].name])
            print(
                f"{name:<23} {n_units:>7} {n_members:>7} {initial.max_mean:>13.3f} "
                f"{out.moves:>9} {out.moves / out_lb:>6.2f} {out.rounds:>6} "
                f"{out.max_mean:>8.3f} {plan_ms:>8.1f} {scale_in.moves / max(1, in_lb):>11.2f}"
            )


# --- measured loads ----------------------------------------------------------------------------


def zipf_loads(
    units: Sequence[str], rng: np.random.Generator, exponent: float = 1.1
) -> dict[str, float]:
    weights = np.arange(1, len(units) + 1, dtype=float) ** -exponent
    rng.shuffle(weights)
    return {u: float(w) for u, w in zip(units, weights, strict=True)}


def load_profile(plan: Plan, loads: Mapping[str, float]) -> tuple[float, float, float]:
    """(max/mean, hot-unit floor/mean, max/mean among members without a hot unit)."""
    member_loads = {m: math.fsum(loads[u] for u in us) for m, us in plan.assignment.items()}
    mean = math.fsum(member_loads.values()) / len(member_loads)
    floor = max(max(loads.values()) / mean, 1.0)
    hot = plan.quality.hot_unit
    hot_members = set()
    if hot is not None:
        # Members whose largest unit alone exceeds what the others carry on average.
        biggest = {m: max((loads[u] for u in us), default=0.0) for m, us in plan.assignment.items()}
        ranked = sorted(member_loads, key=lambda m: -biggest[m])
        rest_load, rest_n = math.fsum(member_loads.values()), len(member_loads)
        for m in ranked:
            if rest_n <= 1 or biggest[m] <= rest_load / rest_n * 1.02:
                break
            hot_members.add(m)
            rest_load -= member_loads[m]
            rest_n -= 1
    rest = [v for m, v in member_loads.items() if m not in hot_members]
    rest_ratio = max(rest) / (math.fsum(rest) / len(rest)) if rest else 0.0
    return max(member_loads.values()) / mean, floor, rest_ratio


def measured_loads(sizes: Sequence[tuple[int, int]], plans: int) -> None:
    print("\n== Measured loads (Balanced, tolerance Default 10 %, aim 2 %) ==")
    print(
        f"{'scenario':<28} {'units':>7} {'members':>7} {'max/mean':>8} {'floor':>7} "
        f"{'max/floor':>9} {'others':>7} {'moves %/plan':>12} {'plan ms':>8}"
    )
    for n_units, n_members in sizes:
        rng = np.random.default_rng(11)
        units = [f"u{j}" for j in range(n_units)]
        members = [Member(f"m{i:04d}") for i in range(n_members)]
        start = Balanced().plan(AllocationRequest(units, members, {})).assignment
        strategy = Balanced()

        loads = zipf_loads(units, rng)
        t0 = time.perf_counter()
        plan = strategy.plan(AllocationRequest(None, members, start, loads))
        ms = (time.perf_counter() - t0) * 1000
        ratio, floor, rest = load_profile(plan, loads)
        row = f"{n_units:>7} {n_members:>7} {ratio:>8.3f} {floor:>7.2f} {ratio / floor:>9.3f}"
        moved = 100 * len(plan.moves) / n_units
        print(f"{'Zipf 1.1, first plan':<28} {row} {rest:>7.3f} {moved:>12.2f} {ms:>8.1f}")

        step = 0.5 / math.sqrt(10)
        assignment: Assignment = plan.assignment
        history = []
        for _ in range(plans):
            drift = np.exp(rng.normal(0.0, step, n_units))
            loads = {u: x * float(d) for (u, x), d in zip(loads.items(), drift, strict=True)}
            t0 = time.perf_counter()
            plan = strategy.plan(AllocationRequest(None, members, assignment, loads))
            history.append(
                ((time.perf_counter() - t0) * 1000, len(plan.moves), load_profile(plan, loads))
            )
            assignment = plan.assignment
        _summary("Zipf 1.1 + drift (per plan)", n_units, n_members, history)

        assignment = start
        history = []
        for _ in range(plans):
            noisy = {
                u: float(x)
                for u, x in zip(units, np.exp(rng.normal(0.0, 0.5, n_units)), strict=True)
            }
            t0 = time.perf_counter()
            plan = strategy.plan(AllocationRequest(None, members, assignment, noisy))
            history.append(
                ((time.perf_counter() - t0) * 1000, len(plan.moves), load_profile(plan, noisy))
            )
            assignment = plan.assignment
        _summary("pure noise sigma 0.5", n_units, n_members, history)


def _summary(label: str, n_units: int, n_members: int, history: list) -> None:
    ms = [h[0] for h in history]
    moves = [h[1] for h in history]
    worst = max(history, key=lambda h: h[2][0] / h[2][1])[2]
    print(
        f"{label:<28} {n_units:>7} {n_members:>7} {worst[0]:>8.3f} {worst[1]:>7.2f} "
        f"{worst[0] / worst[1]:>9.3f} {max(h[2][2] for h in history):>7.3f} "
        f"{100 * sum(moves) / len(moves) / n_units:>12.2f} {sum(ms) / len(ms):>8.1f}"
    )


# --- exact optimum -----------------------------------------------------------------------------


def against_optimum() -> None:
    print("\n== Moves against the exact optimum (CP-SAT), 10 small instances ==")
    try:
        from tests.unit.test_allocation_oracle import against_optimum
    except ImportError as exc:
        print(f"skipped: {exc}")
        return
    for tolerance in ("Tight", "Default"):
        spec = {"name": "Balanced", "tolerance": tolerance}
        results = [against_optimum(spec, seed) for seed in range(10)]
        planned = sum(moves for moves, _, _ in results)
        optimum = sum(best for _, _, best in results)
        ratio = planned / optimum
        print(
            f"tolerance {tolerance:<8} Balanced {planned} moves, optimum {optimum}: {ratio:.3f} x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two fleet sizes, fewer plans")
    args = parser.parse_args()
    if args.quick:
        sizes = [(1_000, 10), (10_000, 100)]
    else:
        sizes = [
            (1_000, 10),
            (1_000, 100),
            (10_000, 10),
            (10_000, 100),
            (10_000, 1000),
            (100_000, 100),
            (100_000, 1000),
        ]
    equal_units(sizes)
    measured_loads(sizes if not args.quick else [(10_000, 100)], plans=5 if args.quick else 10)
    against_optimum()


if __name__ == "__main__":
    main()
