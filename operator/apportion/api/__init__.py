"""The apportion API: pydantic models of the v1alpha1 resources (group apportion.dev).

Importing this package registers every kind for `parse_resource`.
"""

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
