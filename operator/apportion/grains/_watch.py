"""Keeps a `PlacementDirector` current from the API server through the list-then-watch primitive
(`apportion.listwatch.ListWatch`) over the namespace's placement-table ConfigMaps; a list (the
first, or one after 410 Gone) replaces the director's tables: those deleted while nobody watched
are dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion.api.placement_table import (
    GRAIN_TYPE_ANNOTATION,
    TABLE_LABEL,
    PlacementTableFormatError,
    from_configmap,
)
from apportion.listwatch import EventType, ListWatch, Selection

if TYPE_CHECKING:  # the director starts its watch: a runtime import would be a cycle
    from apportion.grains._director import PlacementDirector

logger = logging.getLogger(__name__)

_SELECTOR = {TABLE_LABEL: "true"}


def _owner(raw: dict[str, Any]) -> str | None:
    return ((raw.get("metadata") or {}).get("annotations") or {}).get(GRAIN_TYPE_ANNOTATION)


def _apply(director: PlacementDirector, raw: dict[str, Any]) -> str | None:
    """Apply one ConfigMap; returns the GrainType name it belongs to. A malformed table is
    logged and skipped: the last good one stays in use."""
    try:
        doc = from_configmap(raw)
    except PlacementTableFormatError as error:
        logger.warning("ignoring placement table: %s", error)
        return _owner(raw)
    director.apply(doc)
    return doc.grain_type.name


class TableWatch:
    """The background task feeding one director from one namespace."""

    def __init__(self, director: PlacementDirector, namespace: str, client: AsyncClient) -> None:
        self.director = director
        self.namespace = namespace
        self.client = client
        self._loop = ListWatch(
            client,
            ConfigMap,
            namespace,
            decode=dict,
            on_list=self._on_list,
            on_event=self._on_event,
            selection=Selection(labels=_SELECTOR),
        )
        self.synced = self._loop.synced
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        director.on_change(self._changed.set)

    async def start(self, timeout: float | None = 30.0) -> None:
        """Start watching; return once the first list has been applied."""
        self._task = asyncio.create_task(
            self._loop.run(), name=f"placement-tables/{self.namespace}"
        )
        waiter = asyncio.create_task(self.synced.wait())
        done, _ = await asyncio.wait(
            {waiter, self._task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
        if waiter not in done:
            waiter.cancel()
            if self._task.done():
                self._task.result()  # raises what stopped it
            raise TimeoutError(f"placement tables of {self.namespace!r} not listed in {timeout}s")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def wait_for(
        self, grain_type: str, *, min_version: int = 0, timeout: float = 30.0
    ) -> int:
        """Wait until a table places `grain_type` with at least `min_version`; its version."""

        async def table_version() -> int:
            while True:
                self._changed.clear()
                doc = self.director.table_for(grain_type)
                if doc is not None and doc.version >= min_version:
                    return doc.version
                await self._changed.wait()

        return await asyncio.wait_for(table_version(), timeout)

    async def _on_list(self, configmaps: AsyncIterator[dict[str, Any]]) -> None:
        present = {_apply(self.director, raw) async for raw in configmaps}
        self.director.retain({owner for owner in present if owner is not None})

    async def _on_event(self, event: EventType, raw: dict[str, Any]) -> None:
        if event == "DELETED":
            owner = _owner(raw)
            if owner is not None:
                self.director.remove(owner)
        else:
            _apply(self.director, raw)
