"""From a PartitionSet/ShardSet spec to the allocation strategy it asks for.

The API speaks to users (percentages, a separate `rebalance` block, `topologySpread`); the engine
speaks to algorithms (fractions, one parameter object per strategy). This is the only place that
knows both vocabularies.
"""

from __future__ import annotations

from apportion.api.common import scaled_value
from apportion.api.unitset import (
    RebalancePolicy,
    UnitSetSpec,
    UnitStrategyName,
)
from apportion.engine.allocation.balanced import Balanced
from apportion.engine.allocation.consistent_hashing import ConsistentHashing
from apportion.engine.allocation.external import External
from apportion.engine.allocation.least_shards import LeastShards
from apportion.engine.allocation.model import AllocationStrategy
from apportion.engine.allocation.parameters import (
    BalancedParameters,
    ConsistentHashingParameters,
    LeastShardsParameters,
)
from apportion.engine.allocation.registry import make_strategy


def move_budget(rebalance: RebalancePolicy, units: int) -> int:
    """Optional moves one round may make: `maxMovesPerRound` resolved against the unit count
    (percentages round up, as Kubernetes' maxSurge)."""
    return scaled_value(rebalance.max_moves_per_round, units)


def strategy_for(spec: UnitSetSpec, *, budget: int | None = None) -> AllocationStrategy:
    """The strategy `spec.strategy` names, built from the spec's typed options (no mapping in
    between; custom strategies get theirs from `make_strategy`).

    `budget`: optional moves allowed in this plan (default: `move_budget`); the controller passes
    0 while rebalancing is held (rollout, interval), so strategies that plan within a budget
    (Balanced with loads) choose their best moves themselves. Raises `AllocationError` for a
    custom strategy that is unknown or rejects its parameters.
    """
    if budget is None:
        budget = move_budget(spec.rebalance, spec.units)
    strategy = spec.strategy
    name = strategy.name
    if name is UnitStrategyName.EXTERNAL:
        external = strategy.options()
        return External(
            {str(pin.unit): pin.member for pin in external.pins},
            _builtin(spec, UnitStrategyName(external.fallback.value), budget),
        )
    if name is UnitStrategyName.CUSTOM:
        custom = strategy.options()
        return make_strategy({"name": custom.entry_point, **custom.parameters})
    return _builtin(spec, name, budget)


def _builtin(spec: UnitSetSpec, name: UnitStrategyName, budget: int) -> AllocationStrategy:
    options = spec.strategy.options(name)
    match name:
        case UnitStrategyName.BALANCED:
            spread = spec.topology_spread
            return Balanced(
                BalancedParameters(
                    tolerance=spec.rebalance.tolerance(),
                    max_moves=budget,
                    max_moved_load_percent=float(options.max_moved_load_percent),
                    topology_key=None if spread is None else spread.topology_key,
                    max_skew=1 if spread is None else spread.max_skew,
                )
            )
        case UnitStrategyName.LEAST_SHARDS:
            return LeastShards(
                LeastShardsParameters(
                    absolute_limit=options.absolute_limit,
                    relative_limit=options.relative_limit_percent / 100,
                )
            )
        case UnitStrategyName.CONSISTENT_HASHING:
            return ConsistentHashing(
                ConsistentHashingParameters(
                    virtual_nodes=options.virtual_nodes,
                    rebalance_limit=options.rebalance_limit,
                )
            )
    raise ValueError(f"{name} is not a built-in fallback strategy")
