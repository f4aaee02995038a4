"""PartitionSet (Netherite-style partitions) and ShardSet (Akka-style shards) handlers: both
kinds run `SetLoop` in the shared loop (`runtime.run_loop`), one kopf daemon per set, woken by
changes of the set, of what it selects and of its own ConfigMaps. Every handler reaches the
operator's `Runtime` through kopf's `memo`."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from apportion.api import PartitionSet, ShardSet
from apportion.api.resource import Resource
from apportion.controllers.runtime import TABLE_REREAD, run_loop
from apportion.controllers.unitsets.loop import SetLoop
from apportion.controllers.wakeups import set_key
from apportion.publishing.configmaps import PART_LABEL, SET_KIND_LABEL


def register(kind: type[Resource]) -> None:
    """Run the placement daemon for every object of `kind` (PartitionSet or ShardSet)."""
    resource = (kind.group, kind.version, kind.crd.plural)

    async def place(
        *,
        body: kopf.Body,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        stopped: kopf.DaemonStopped,
        memo: Any,
        **_: Any,
    ) -> None:
        await run_loop(memo.runtime, SetLoop(kind, body, logger, memo.runtime), stopped)

    async def changed(
        *, event: kopf.RawEvent, namespace: str | None, name: str, memo: Any, **_: Any
    ) -> None:
        key = set_key(kind.__name__, namespace or "", name)
        if event.get("type") == "DELETED":
            memo.runtime.wakeups.gone(key)
        else:
            memo.runtime.wakeups.notify(key)

    # The daemon checks `stopped` between passes; a pass in flight is cancelled after the
    # backoff, which is safe: every write is conditional and the next daemon reloads.
    kopf.daemon(*resource, id="placement", cancellation_backoff=1.0, cancellation_timeout=10.0)(
        place
    )
    kopf.on.event(*resource, id="wake")(changed)


register(PartitionSet)
register(ShardSet)


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
        key = set_key(owner["kind"], namespace, owner["name"])
        version = TABLE_REREAD
    else:
        found = tables.roots.get((namespace, meta.get("name", "")))
        if found is None:
            return
        key = found
        version = None if deleted else meta.get("resourceVersion")
    tables.versions[key] = version
    memo.runtime.wakeups.notify(key)
