"""ShardSet: Akka-style shards, placed by the shared unit-set loop
(`apportion.controllers.unitset`)."""

from apportion.api import ShardSet
from apportion.controllers.unitset import register

register(ShardSet)
