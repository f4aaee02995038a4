"""The placement-table ConfigMap of one GrainType: read what is published, write a new version
with optimistic concurrency, and count every write (the benchmark and the tests read
`WRITES`)."""

from __future__ import annotations

import logging
from collections import Counter

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion.api.placement_table import (
    PlacementTableDocument,
    PlacementTableFormatError,
    configmap_name,
    from_configmap,
    to_configmap,
)
from apportion.publishing.configmaps import PublishConflict

logger = logging.getLogger(__name__)

WRITES: Counter[tuple[str, str]] = Counter()
"""Placement-table writes (API requests that changed the ConfigMap) by (namespace, GrainType)."""


class PlacementTableStore:
    """Reads and writes the ConfigMap `<GrainType>-placement`. A write carries the
    resourceVersion read or written last, so a stale writer (a second operator replica, an old
    pass) gets `PublishConflict` instead of overwriting a newer table."""

    def __init__(self, client: AsyncClient, namespace: str, graintype: str) -> None:
        self.client = client
        self.namespace = namespace
        self.graintype = graintype
        self.name = configmap_name(graintype)
        self._version: str | None = None
        self._exists = False

    async def load(self) -> PlacementTableDocument | None:
        """The published table, or None when there is none (or it cannot be read: the next
        write replaces it). Remembers the ConfigMap's resourceVersion for the next write."""
        try:
            found = await self.client.get(ConfigMap, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            self._version, self._exists = None, False
            return None
        self._version, self._exists = found.metadata.resourceVersion, True
        try:
            return from_configmap(found.to_dict())
        except PlacementTableFormatError as error:
            logger.warning("Replacing unreadable placement table: %s", error)
            return None

    async def write(self, doc: PlacementTableDocument) -> None:
        body = ConfigMap.from_dict(to_configmap(doc))
        try:
            if not self._exists:
                written = await self.client.create(body)
            else:
                body.metadata.resourceVersion = self._version
                written = await self.client.replace(body)
        except ApiError as error:
            if error.status.code in (404, 409):
                raise PublishConflict(
                    f"ConfigMap {self.name} changed since it was read ({error.status.reason})"
                ) from error
            raise
        WRITES[self.namespace, self.graintype] += 1
        self._version, self._exists = written.metadata.resourceVersion, True
