"""The placement-table ConfigMap of one GrainType: read what is published, write a new version
with optimistic concurrency."""

from __future__ import annotations

import logging

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion.api.placement_table import (
    PlacementTableDocument,
    PlacementTableFormatError,
    configmap_name,
    from_configmap,
    to_configmap,
)
from apportion.publishing.client import decode
from apportion.publishing.configmaps import resource_version, write_conditionally

logger = logging.getLogger(__name__)


class PlacementTableStore:
    """Reads and writes the ConfigMap `<GrainType>-placement`. A write carries the
    resourceVersion read or written last, so a stale writer (a second operator replica, an old
    pass) gets `PublishConflict` instead of overwriting a newer table."""

    def __init__(self, client: AsyncClient, namespace: str, graintype: str) -> None:
        self.client = client
        self.namespace = namespace
        self.graintype = graintype
        self.name = configmap_name(graintype)
        self._version: str | None = None  # None: no ConfigMap when last read

    async def load(self) -> PlacementTableDocument | None:
        """The published table, or None when there is none (or it cannot be read: the next
        write replaces it). Remembers the ConfigMap's resourceVersion for the next write."""
        try:
            found = await self.client.get(ConfigMap, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            self._version = None
            return None
        self._version = resource_version(found)
        try:
            return from_configmap(found.to_dict())
        except PlacementTableFormatError as error:
            logger.warning("Replacing unreadable placement table: %s", error)
            return None

    async def write(self, doc: PlacementTableDocument) -> None:
        body = decode(ConfigMap, to_configmap(doc))
        self._version = await write_conditionally(self.client, body, self._version)
