"""PartitionSet: Netherite-style partitions, placed by the shared unit-set loop
(`apportion.controllers.unitset`)."""

from apportion.api import PartitionSet
from apportion.controllers.unitset import register

register(PartitionSet)
