"""The apportion API: pydantic models of the v1alpha1 resources (group apportion.dev).

The names below load on first use (PEP 562): a worker pod that needs only
`apportion.api.assignment` starts without building every pydantic model, which is most of its
import time. `parse_resource` and `resource_kinds` taken from here load every kind first, so
that they know them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apportion.api.conditions import Condition, ConditionStatus, ConditionType, set_condition
    from apportion.api.graintype import GrainType, GrainTypeSpec, GrainTypeStatus
    from apportion.api.partitionset import PartitionSet, PartitionSetSpec
    from apportion.api.resource import Resource, parse_resource, resource_kinds
    from apportion.api.shardset import ShardSet, ShardSetSpec
    from apportion.api.unitset import UnitSetSpec, UnitSetStatus

__all__ = [
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "GrainType",
    "GrainTypeSpec",
    "GrainTypeStatus",
    "PartitionSet",
    "PartitionSetSpec",
    "Resource",
    "ShardSet",
    "ShardSetSpec",
    "UnitSetSpec",
    "UnitSetStatus",
    "parse_resource",
    "resource_kinds",
    "set_condition",
]
# Importing all of them registers every kind for parse_resource.
_MODULES = ("conditions", "graintype", "partitionset", "resource", "shardset", "unitset")


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    modules = [importlib.import_module(f"{__name__}.{module}") for module in _MODULES]
    value = next(vars(m)[name] for m in modules if name in vars(m))
    globals()[name] = value
    return value
