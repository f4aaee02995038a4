"""Grain placement (one activation -> one member): Orleans' strategies and filters plus our
consistent-hash variant, as a pure library. No Kubernetes, no I/O.

    strategy = make_grain_strategy(
        {"name": "ActivationCountBased"}, [{"type": "RequiredMatch", "keys": ["zone"]}]
    )
    strategy.update(PlacementTable(members, version=7))
    member = strategy.place("cart/42", PlacementContext(local_member="worker-0"))
    why = strategy.explain("cart/42", PlacementContext(local_member="worker-0"))
"""

from .base import CandidateView, GrainStrategy
from .basic import (
    DEFAULT_ROLE_LABEL,
    PreferLocalPlacement,
    RandomPlacement,
    SiloRoleBasedPlacement,
    StatelessWorkerPlacement,
)
from .context import PlacementContext
from .errors import (
    GrainSpecError,
    NoCompatibleMember,
    PlacementError,
    StatelessWorkerAtCapacity,
)
from .filters import FilterStep, GrainFilter, PreferredMatch, RequiredMatch
from .hashing import (
    DEFAULT_VIRTUAL_NODES,
    ConsistentHashBasedPlacement,
    HashBasedPlacement,
    HashRing,
    grain_hash,
)
from .kalman import DualModeKalmanFilter
from .load import (
    ActivationCountBasedPlacement,
    ResourceOptimizedPlacement,
    ResourceWeights,
    resource_terms,
)
from .registry import (
    BUILTIN_STRATEGIES,
    CUSTOM_STRATEGY,
    DEFAULT_GRAIN_STRATEGY,
    FILTER_ENTRY_POINTS,
    STRATEGY_ENTRY_POINTS,
    grain_strategy_names,
    make_grain_filter,
    make_grain_filters,
    make_grain_strategy,
)
from .simulation import (
    ActivationScenario,
    LoadModel,
    Placer,
    SimulationResult,
    SimulationStep,
    max_over_mean,
    simulate_activations,
)
from .table import (
    DEFAULT_LOAD_SHEDDING,
    LoadSheddingThresholds,
    PlacementTable,
)
from .trace import CandidateScore, Explanation, Trace

__all__ = [
    "BUILTIN_STRATEGIES",
    "CUSTOM_STRATEGY",
    "DEFAULT_GRAIN_STRATEGY",
    "DEFAULT_LOAD_SHEDDING",
    "DEFAULT_ROLE_LABEL",
    "DEFAULT_VIRTUAL_NODES",
    "FILTER_ENTRY_POINTS",
    "STRATEGY_ENTRY_POINTS",
    "ActivationCountBasedPlacement",
    "ActivationScenario",
    "CandidateScore",
    "CandidateView",
    "ConsistentHashBasedPlacement",
    "DualModeKalmanFilter",
    "Explanation",
    "FilterStep",
    "GrainFilter",
    "GrainSpecError",
    "GrainStrategy",
    "HashBasedPlacement",
    "HashRing",
    "LoadModel",
    "LoadSheddingThresholds",
    "NoCompatibleMember",
    "PlacementContext",
    "PlacementError",
    "PlacementTable",
    "Placer",
    "PreferLocalPlacement",
    "PreferredMatch",
    "RandomPlacement",
    "RequiredMatch",
    "ResourceOptimizedPlacement",
    "ResourceWeights",
    "SiloRoleBasedPlacement",
    "SimulationResult",
    "SimulationStep",
    "StatelessWorkerAtCapacity",
    "StatelessWorkerPlacement",
    "Trace",
    "grain_hash",
    "grain_strategy_names",
    "make_grain_filter",
    "make_grain_filters",
    "make_grain_strategy",
    "max_over_mean",
    "resource_terms",
    "simulate_activations",
]
