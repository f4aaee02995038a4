"""ShardSet: Akka Cluster Sharding-style shards.

Many shards (units 0..shards-1); an entity ID maps to a shard by hash; the operator allocates
shards to worker pods with a pluggable strategy and rebalances them with a fenced hand-off.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from apportion.api.common import immutable
from apportion.api.resource import Resource
from apportion.api.unitset import (
    MAX_UNITS,
    KeySchemeName,
    UnitSetSpec,
    UnitSetStatus,
    unit_set_crd,
    unit_set_rules,
)


class ShardSetSpec(UnitSetSpec):
    """Desired state of a ShardSet."""

    model_config = ConfigDict(json_schema_extra=unit_set_rules("shards"))

    shards: int = Field(
        ge=1,
        le=MAX_UNITS,
        description=f"Number of shards, 1 to {MAX_UNITS} (Akka's default is 1000; about ten "
        "times the largest number of workers). Changes only with keyScheme apportion, by an "
        "integer split or merge factor (online resharding, docs/resharding.md); fixed with akka "
        "and netherite.",
    )
    key_scheme: KeySchemeName = Field(
        KeySchemeName.AKKA,
        description="How entity IDs map to shards: akka (default: abs(String.hashCode mod "
        "shards)), netherite or apportion. Immutable.",
        json_schema_extra=immutable("keyScheme", "changing it remaps every entity"),
    )

    @property
    def units(self) -> int:
        return self.shards


class ShardSet(Resource):
    """Shards placed on worker pods, Akka Cluster Sharding-style: each entity belongs to one shard
    and each shard to one live pod; shards move by a fenced, acknowledged hand-off."""

    crd = unit_set_crd("shardsets", ("sset", "ssets"), "shards")

    kind: Literal["ShardSet"] = "ShardSet"
    spec: ShardSetSpec
    status: UnitSetStatus | None = None
