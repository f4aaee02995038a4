"""PartitionSet (Netherite-style partitions) and ShardSet (Akka-style shards) handlers: both
kinds run `SetLoop` in the runtime's shared loop (`runtime.run_loop`), one per set while this
replica leads, woken by changes of the set, of what it selects and of its own ConfigMaps
(`own_tables`). Every handler reaches the operator's `Runtime` through kopf's `memo`."""

from __future__ import annotations

import logging
from typing import Any

from apportion.api import PartitionSet, ShardSet
from apportion.api.resource import Resource
from apportion.controllers.runtime import ReconcilerFactory, Runtime, watch
from apportion.controllers.unitsets.loop import SetLoop


def reconciler(kind: type[Resource]) -> ReconcilerFactory:
    def build(body: dict[str, Any], runtime: Runtime) -> SetLoop:
        meta = body["metadata"]
        logger = logging.getLogger(f"apportion.{kind.__name__}.{meta['namespace']}.{meta['name']}")
        return SetLoop(kind, body, logger, runtime)

    return build


watch(PartitionSet, reconciler(PartitionSet))
watch(ShardSet, reconciler(ShardSet))
