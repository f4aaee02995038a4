"""PartitionSet (Netherite-style partitions) and ShardSet (Akka-style shards) handlers: both
kinds run `SetLoop` in the runtime's shared loop (`runtime.run_loop`), one per set while this
replica leads, woken by changes of the set, of what it selects and of its own ConfigMaps. Every
handler reaches the operator's `Runtime` through kopf's `memo`."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from apportion.api import PartitionSet, ShardSet
from apportion.api.resource import Resource
from apportion.controllers.runtime import TABLE_REREAD, ReconcilerFactory, Runtime, watch
from apportion.controllers.unitsets.loop import SetLoop
from apportion.controllers.wakeups import loop_key
from apportion.publishing.configmaps import PART_LABEL, SET_KIND_LABEL


def reconciler(kind: type[Resource]) -> ReconcilerFactory:
    def build(body: dict[str, Any], runtime: Runtime) -> SetLoop:
        meta = body["metadata"]
        logger = logging.getLogger(f"apportion.{kind.__name__}.{meta['namespace']}.{meta['name']}")
        return SetLoop(kind, body, logger, runtime)

    return build


watch(PartitionSet, reconciler(PartitionSet))
watch(ShardSet, reconciler(ShardSet))


@kopf.on.event("", "v1", "configmaps", labels={SET_KIND_LABEL: kopf.PRESENT})
async def assignment_changed(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    """A set's table deleted, edited or replaced by anyone wakes the set, which reads it back
    and repairs it if needed: the operator does not wait for an unrelated event."""
    tables = memo.runtime.tables
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace", "")
    deleted = event.get("type") == "DELETED"
    version: str | None
    if (meta.get("labels") or {}).get(PART_LABEL) == "chunk":
        owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
        if not deleted or owner is None:
            return  # chunks are written before their root, which announces them
        key = loop_key(owner["kind"], namespace, owner["name"])
        version = TABLE_REREAD
    else:
        found = tables.roots.get((namespace, meta.get("name", "")))
        if found is None:
            return
        key = found
        version = None if deleted else meta.get("resourceVersion")
    tables.versions[key] = version
    memo.runtime.wakeups.notify(key)
