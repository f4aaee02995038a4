"""From a PartitionSet/ShardSet spec to the specification mapping `make_strategy` reads.

The API speaks to users (percentages, a separate `rebalance` block, `topologySpread`); the engine
speaks to algorithms (fractions, one options mapping per strategy). This is the only place that
knows both vocabularies.
"""

from __future__ import annotations

from typing import Any

from apportion.api.common import scaled_value
from apportion.api.unitset import (
    RebalancePolicy,
    UnitSetSpec,
    UnitStrategyName,
)


def move_budget(rebalance: RebalancePolicy, units: int) -> int:
    """Optional moves one round may make: `maxMovesPerRound` resolved against the unit count
    (percentages round up, as Kubernetes' maxSurge)."""
    return scaled_value(rebalance.max_moves_per_round, units)


def strategy_spec(spec: UnitSetSpec, *, budget: int | None = None) -> dict[str, Any]:
    """The `make_strategy` mapping for `spec.strategy`.

    `budget`: optional moves allowed in this plan (default: `move_budget`); the controller passes
    0 while rebalancing is held (rollout, interval), so strategies that plan within a budget
    (Balanced with loads) choose their best moves themselves.
    """
    if budget is None:
        budget = move_budget(spec.rebalance, spec.units)
    strategy = spec.strategy
    name = strategy.name
    if name is UnitStrategyName.EXTERNAL:
        external = strategy.options()
        return {
            "name": "External",
            "pins": {str(pin.unit): pin.member for pin in external.pins},
            "fallback": _builtin(spec, UnitStrategyName(external.fallback.value), budget),
        }
    if name is UnitStrategyName.CUSTOM:
        custom = strategy.options()
        return {"name": custom.entry_point, **custom.parameters}
    return _builtin(spec, name, budget)


def _builtin(spec: UnitSetSpec, name: UnitStrategyName, budget: int) -> dict[str, Any]:
    options = spec.strategy.options(name)
    match name:
        case UnitStrategyName.BALANCED:
            result: dict[str, Any] = {
                "name": name.value,
                "tolerance": spec.rebalance.tolerance(),
                "maxMoves": budget,
                "maxMovedLoadPercent": float(options.max_moved_load_percent),
            }
            if spec.topology_spread is not None:
                result["topologyKey"] = spec.topology_spread.topology_key
                result["maxSkew"] = spec.topology_spread.max_skew
            return result
        case UnitStrategyName.LEAST_SHARDS:
            return {
                "name": name.value,
                "absoluteLimit": options.absolute_limit,
                "relativeLimit": options.relative_limit_percent / 100,
            }
        case UnitStrategyName.CONSISTENT_HASHING:
            return {
                "name": name.value,
                "virtualNodes": options.virtual_nodes,
                "rebalanceLimit": options.rebalance_limit,
            }
    raise ValueError(f"{name} is not a built-in fallback strategy")
