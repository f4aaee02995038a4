"""PartitionSet: Netherite-style partitions.

A fixed number of partitions (units 0..partitions-1); a key (instance ID) maps to a partition by
hash or by an explicit `!n` suffix; the operator assigns each partition to one worker pod.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from apportion.api.common import immutable
from apportion.api.resource import Resource
from apportion.api.unitset import (
    KeySchemeName,
    UnitSetSpec,
    UnitSetStatus,
    unit_set_crd,
    unit_set_rules,
)

# Netherite allows 1-32 because each partition is an Event Hubs partition with its own storage.
# Here a partition is only an ownership record, so more are cheap; 1024 keeps the per-member
# status rows and the assignment table small. Sets needing more units are ShardSets.
MAX_PARTITIONS = 1024


class PartitionSetSpec(UnitSetSpec):
    """Desired state of a PartitionSet."""

    model_config = ConfigDict(json_schema_extra=unit_set_rules("partitions"))

    partitions: int = Field(
        ge=1,
        le=MAX_PARTITIONS,
        description=f"Number of partitions, 1 to {MAX_PARTITIONS} (Netherite's default is 12). "
        "Changes only with keyScheme apportion, by an integer split or merge factor (online "
        "resharding, docs/resharding.md); fixed with netherite and akka.",
    )
    key_scheme: KeySchemeName = Field(
        KeySchemeName.NETHERITE,
        description="How keys map to partitions: netherite (default: `!n` suffix or FNV-1a), "
        "akka or apportion. Immutable.",
        json_schema_extra=immutable("keyScheme", "changing it remaps every key"),
    )

    @property
    def units(self) -> int:
        return self.partitions


class PartitionSet(Resource):
    """A fixed set of partitions placed on worker pods, Netherite-style: each key belongs to one
    partition (by hash, or by a `!n` suffix) and each partition to one live pod."""

    crd = unit_set_crd("partitionsets", ("pset", "psets"), "partitions")

    kind: Literal["PartitionSet"] = "PartitionSet"
    spec: PartitionSetSpec
    status: UnitSetStatus | None = None
