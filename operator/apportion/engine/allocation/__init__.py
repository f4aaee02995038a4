"""Unit allocation: which member owns each unit (partition, shard), and which units move.

Strategies are pure: ``make_strategy(spec).plan(request) -> Plan``. Built in: ``Balanced``
(default: best balance in one plan with the fewest moves), ``LeastShards`` (Akka),
``ConsistentHashing`` (Akka; Dapr with 100 virtual nodes), ``External`` (pins + fallback);
custom ones come from the ``apportion.allocation_strategies`` entry-point group.
"""

from apportion.engine.allocation.balanced import Balanced
from apportion.engine.allocation.consistent_hashing import ConsistentHashing, Ring
from apportion.engine.allocation.external import External
from apportion.engine.allocation.least_shards import LeastShards
from apportion.engine.allocation.model import (
    AllocationError,
    AllocationRequest,
    AllocationStrategy,
    HotUnit,
    Member,
    Move,
    Plan,
    PlanQuality,
)
from apportion.engine.allocation.parameters import (
    TOLERANCES,
    BalancedParameters,
    ConsistentHashingParameters,
    LeastShardsParameters,
)
from apportion.engine.allocation.registry import (
    BUILTIN,
    DEFAULT_STRATEGY,
    ENTRY_POINT_GROUP,
    make_strategy,
    strategy_names,
)

__all__ = [
    "BUILTIN",
    "DEFAULT_STRATEGY",
    "ENTRY_POINT_GROUP",
    "TOLERANCES",
    "AllocationError",
    "AllocationRequest",
    "AllocationStrategy",
    "Balanced",
    "BalancedParameters",
    "ConsistentHashing",
    "ConsistentHashingParameters",
    "External",
    "HotUnit",
    "LeastShards",
    "LeastShardsParameters",
    "Member",
    "Move",
    "Plan",
    "PlanQuality",
    "Ring",
    "make_strategy",
    "strategy_names",
]
