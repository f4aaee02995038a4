"""Balanced, apportion's default: the best balance in one plan with the fewest moves.

Without loads: every member's unit count reaches its Hamilton quota (equal counts ±1, or in
proportion to capacity), moving only the units of members that are gone, not ready or draining
plus each member's surplus over its quota — exactly the lower bound. With loads: see
:mod:`apportion.engine.allocation.balanced_loads`.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

from apportion.engine.allocation.balanced_loads import plan_loads
from apportion.engine.allocation.model import AllocationRequest, Plan, PlanQuality
from apportion.engine.allocation.options import Options
from apportion.engine.allocation.parameters import TOLERANCES, BalancedParameters
from apportion.engine.allocation.plan_builder import (
    Origin,
    PlanBuilder,
    State,
    count_lower_bound,
    count_ratio,
    domains_of,
    hamilton_quotas,
    index_request,
    target_members,
)


def _tolerance(options: Options) -> float:
    value = options.raw("tolerance")
    if value is None:
        return TOLERANCES["Default"]
    if isinstance(value, str):
        if value in TOLERANCES:
            return TOLERANCES[value]
        if value.endswith("%"):
            try:
                percent = float(value[:-1])
            except ValueError:
                percent = -1.0
            if 0 <= percent <= 100:
                return percent / 100
    elif isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)
    names = ", ".join(TOLERANCES)
    raise options.error(f"tolerance must be one of {names}, a fraction 0..1 or 'N%', got {value!r}")


class Balanced:
    """Balanced allocation (see module docstring)."""

    name = "Balanced"

    def __init__(self, options: BalancedParameters | None = None) -> None:
        self.options = options or BalancedParameters()

    @classmethod
    def from_options(cls, spec: Mapping[str, Any]) -> Balanced:
        o = Options(cls.name, spec)
        options = BalancedParameters(
            tolerance=_tolerance(o),
            hysteresis=o.number("hysteresis", 0.2, 0.0, 1.0) or 0.0,
            max_moves=o.integer("maxMoves", None),
            max_moved_load_percent=o.number("maxMovedLoadPercent", None, 0.0, 100.0),
            topology_key=o.text("topologyKey", None),
            max_skew=o.integer("maxSkew", 1, minimum=1) or 1,
        )
        o.done()
        return cls(options)

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        if request.loads is not None:
            return plan_loads(state, self.options)
        return plan_counts(state, self.options)


def spread_quotas(
    total: int,
    capacities: Sequence[float],
    current: Sequence[int],
    domains: Sequence[str] | None,
    max_skew: int,
) -> list[int]:
    """Hamilton quotas, then, if domain totals differ by more than ``max_skew``, domain totals
    pulled together (largest to smallest) and re-apportioned within each domain."""
    quotas = hamilton_quotas(total, capacities, current)
    if domains is None:
        return quotas
    names = list(dict.fromkeys(domains))
    members_of = {d: [k for k, dk in enumerate(domains) if dk == d] for d in names}
    totals = {d: sum(quotas[k] for k in members_of[d]) for d in names}
    if len(names) < 2 or max(totals.values()) - min(totals.values()) <= max_skew:
        return quotas
    while True:
        high = max(names, key=lambda d: totals[d])
        low = min(names, key=lambda d: totals[d])
        gap = totals[high] - totals[low]
        if gap <= max_skew:
            break
        step = max(1, (gap - max_skew) // 2)
        totals[high] -= step
        totals[low] += step
    for d in names:
        ks = members_of[d]
        part = hamilton_quotas(totals[d], [capacities[k] for k in ks], [current[k] for k in ks])
        for k, q in zip(ks, part, strict=True):
            quotas[k] = q
    return quotas


def plan_counts(state: State, options: BalancedParameters) -> Plan:
    """Counts to their quotas with the fewest moves (module docstring)."""
    members = state.members
    builder = PlanBuilder(state)
    reasons: list[str] = []
    targets, why = target_members(state)
    if why:
        reasons.append(why)
    if state.dropped:
        reasons.append(f"{state.dropped} assigned unit(s) not in units: dropped")
    current = [state.count(i) for i in targets]
    quotas = spread_quotas(
        state.total,
        [members[i].capacity for i in targets],
        current,
        domains_of(state, targets, options.topology_key),
        options.max_skew,
    )

    pool: list[tuple[str, Origin]] = list(state.homeless)
    is_target = [False] * len(members)
    for i in targets:
        is_target[i] = True
    for i, held in enumerate(state.held):
        if not is_target[i] and held:
            pool.extend((u, i) for u in held if u not in state.in_progress)
    # Each member's surplus over its quota, most recently placed units first (they have
    # settled the least); under a move budget the fullest members give first.
    surplus: dict[int, list[str]] = {}
    for k, i in enumerate(targets):
        over = current[k] - quotas[k]
        if over > 0:
            shed = [u for u in reversed(state.held[i]) if u not in state.in_progress][:over]
            if shed:
                surplus[i] = shed
    budget = sum(map(len, surplus.values()))
    if options.max_moves is not None and options.max_moves < budget:
        reasons.append(f"move budget {options.max_moves} reached: the next plan continues")
        budget = options.max_moves
    pool.extend(_fullest_first(surplus, budget))

    if targets:
        _fill(builder, pool, targets, quotas)
    counts = builder.counts()
    before = [state.count(i) for i in range(len(members))]
    reached = all(counts[i] == quotas[k] for k, i in enumerate(targets))
    if not reached and not any("budget" in r for r in reasons):
        reasons.append("units in hand-off held above their member's quota")
    quality = PlanQuality(
        units=state.total,
        members=len(targets),
        moves=builder.moves,
        lower_bound=count_lower_bound(state, targets, quotas),
        max_mean_before=count_ratio(before, state, targets),
        max_mean_after=count_ratio(counts, state, targets),
        rounds=(1 if builder.moves else 0) if reached else None,
        converged=reached,
        reasons=tuple(reasons),
    )
    return builder.build(quality)


def _fullest_first(surplus: dict[int, list[str]], budget: int) -> list[tuple[str, Origin]]:
    """Up to ``budget`` surplus units, one at a time from the member with the most left."""
    if budget >= sum(map(len, surplus.values())):
        return [(u, i) for i, units in surplus.items() for u in units]
    heap = [(-len(units), i) for i, units in surplus.items()]
    heapq.heapify(heap)
    taken: list[tuple[str, Origin]] = []
    given = dict.fromkeys(surplus, 0)
    while heap and len(taken) < budget:
        left, i = heapq.heappop(heap)
        taken.append((surplus[i][given[i]], i))
        given[i] += 1
        if left + 1 < 0:
            heapq.heappush(heap, (left + 1, i))
    return taken


def _fill(
    builder: PlanBuilder,
    pool: list[tuple[str, Origin]],
    targets: Sequence[int],
    quotas: Sequence[int],
) -> None:
    """Gives each pool unit to the target furthest below its quota; once every quota is met
    (held-back hand-offs can leave extra units), to the lowest (count + 1) / capacity. Both by
    lazy heaps: a popped entry whose key is stale is pushed back with its current key."""
    members = builder.state.members
    counts = builder.counts()
    short = [(counts[i] - quotas[k], i) for k, i in enumerate(targets)]
    heapq.heapify(short)

    def level(i: int) -> float:
        return (counts[i] + 1) / members[i].capacity

    spare = [(level(i), i) for i in targets]
    heapq.heapify(spare)
    for unit, origin in pool:
        if short and short[0][0] < 0:
            gap, i = heapq.heappop(short)
            heapq.heappush(short, (gap + 1, i))
        else:
            while spare[0][0] != level(spare[0][1]):
                heapq.heapreplace(spare, (level(spare[0][1]), spare[0][1]))
            i = spare[0][1]
        if isinstance(origin, int):
            counts[origin] -= 1
        counts[i] += 1
        heapq.heappush(spare, (level(i), i))
        builder.move(unit, origin, i)
