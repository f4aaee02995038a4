"""The watch on the sets' own ConfigMaps: a table deleted, edited or replaced by anyone wakes its
set, which reads it back and repairs it (`SetLoop.load`), instead of waiting for an unrelated
event. It follows the ConfigMaps carrying the set-kind label with the list-then-watch primitive
(`apportion.listwatch.ListWatch`), one per namespace of an exact scope, else one over every
namespace filtered by the scope's patterns, as the pod cache does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from lightkube import ALL_NS, AsyncClient
from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap

from apportion.controllers import telemetry
from apportion.controllers.caches import in_scope, watched_namespaces
from apportion.controllers.wakeups import loop_key
from apportion.listwatch import EventType, ListWatch, Selection
from apportion.publishing.configmaps import PART_LABEL, SET_KIND_LABEL

TABLE_REREAD: Final = "reread"


@dataclass(frozen=True)
class TableSeen:
    """What the watch needs of one of the sets' ConfigMaps."""

    namespace: str
    name: str
    version: str
    chunk: bool
    controller: tuple[str, str] | None
    """kind and name of the set that owns it (its controller owner reference)."""

    @classmethod
    def decode(cls, body: Mapping[str, Any]) -> TableSeen:
        meta = body.get("metadata") or {}
        owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
        return cls(
            meta.get("namespace", ""),
            meta.get("name", ""),
            meta.get("resourceVersion", ""),
            (meta.get("labels") or {}).get(PART_LABEL) == "chunk",
            None if owner is None else (owner["kind"], owner["name"]),
        )


@dataclass
class OwnTables:
    """What the watch on the sets' own ConfigMaps saw, until each set's loop takes it."""

    notify: Callable[[str], None] | None = None
    """Called with the loop key of a set whose tables changed (`Wakeups.notify`)."""
    roots: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, root ConfigMap name) → loop key: a table put back by hand may lack the labels
    and owner reference the operator wrote, its name is what identifies it."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """loop key → resourceVersion of its root ConfigMap as last seen (None: deleted,
    TABLE_REREAD: a chunk was deleted)."""

    def changed(self, key: str, version: str | None) -> bool:
        """Whether the set's ConfigMaps changed since its loop read or wrote `version` (its own
        writes come back through the watch with the version it already holds)."""
        if key not in self.versions:
            return False
        return self.versions.pop(key) != version

    def seen(self, event: EventType, table: TableSeen) -> None:
        """One event of the watch: file what changed for the set it belongs to, and wake it."""
        deleted = event == "DELETED"
        version: str | None
        if table.chunk:
            if not deleted or table.controller is None:
                return  # chunks are written before their root, which announces them
            key = loop_key(table.controller[0], table.namespace, table.controller[1])
            version = TABLE_REREAD
        else:
            found = self.roots.get((table.namespace, table.name))
            if found is None:
                return
            key = found
            version = None if deleted else table.version
        self.versions[key] = version
        if self.notify is not None:
            self.notify(key)

    def listed(self, namespace: str | None, tables: Sequence[TableSeen]) -> None:
        """A full list of `namespace` (None: of every one in scope): each root is filed as the
        list has it, and one the list lacks was deleted while nobody watched."""
        present = {(t.namespace, t.name) for t in tables if not t.chunk}
        for table in tables:
            if not table.chunk:
                self.seen("MODIFIED", table)
        for (ns, name), key in list(self.roots.items()):
            if (namespace is None or ns == namespace) and (ns, name) not in present:
                self.versions[key] = None
                if self.notify is not None:
                    self.notify(key)


def follow(
    tables: OwnTables, client: AsyncClient, scope: Sequence[str]
) -> list[ListWatch[TableSeen]]:
    """The watches that keep `tables` current: run each (`ListWatch.run`) while leading."""

    def one(namespace: str | None) -> ListWatch[TableSeen]:
        async def replace(items: AsyncIterator[TableSeen]) -> None:
            tables.listed(namespace, [t async for t in items if in_scope(t.namespace, scope)])

        async def changed(event: EventType, table: TableSeen) -> None:
            if in_scope(table.namespace, scope):
                tables.seen(event, table)

        def restarted(reason: str) -> None:
            telemetry.WATCH_RESTARTS.labels("configmaps", reason).inc()

        return ListWatch(
            client,
            ConfigMap,
            ALL_NS if namespace is None else namespace,
            decode=TableSeen.decode,
            on_list=replace,
            on_event=changed,
            selection=Selection(labels={SET_KIND_LABEL: exists()}),
            on_restart=restarted,
        )

    return [one(namespace) for namespace in watched_namespaces(scope)]


async def run(watches: Sequence[ListWatch[TableSeen]]) -> None:
    """Run `watches` until cancelled."""
    await asyncio.gather(*(watch.run() for watch in watches))
