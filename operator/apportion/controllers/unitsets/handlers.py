"""PartitionSet (Netherite-style partitions) and ShardSet (Akka-style shards) handlers: both
kinds run the shared unit-set loop (`apportion.controllers.unitsets.loop`)."""

from apportion.api import PartitionSet, ShardSet
from apportion.controllers.unitsets.loop import register

register(PartitionSet)
register(ShardSet)
