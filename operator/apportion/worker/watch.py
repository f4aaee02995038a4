"""Follows one set's assignment ConfigMap through the API server (docs/assignment-format.md).

A list, then a watch from the list's resourceVersion, both narrowed to the root ConfigMap by
name; chunk ConfigMaps of big tables are fetched when the root points at them (the operator
writes them before the root). lightkube re-opens a watch the server closed from the last
version seen; anything else — 410 Gone, a dropped connection, an unreachable API — ends in a
fresh list after a short pause, so no change is ever missed for long. A table that does not
decode is reported and skipped: the last good one stays in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion.api.assignment import (
    AssignmentFormatError,
    AssignmentTable,
    ConfigMapPayload,
    IncompleteAssignment,
    chunk_suffixes,
    decode_assignment,
)

logger = logging.getLogger(__name__)

WATCH_TIMEOUT = 300
"""Seconds after which the server ends a watch and lightkube opens the next one from the last
version seen, so a connection that died silently is noticed within this time."""
RETRY_MIN = 0.2
RETRY_MAX = 5.0
INCOMPLETE_ATTEMPTS = 5
# Decoding an inline JSON table is quick; a gzipped one may hold 100k units: off the loop.
_THREAD_DECODE_BYTES = 64 * 1024


class AssignmentWatch:
    """Calls `on_table` with every table the root ConfigMap `name` holds, in order.

    `synced` is set once the first list has been handled (whether a table exists or not).
    """

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        on_table: Callable[[AssignmentTable], None],
        *,
        watch_timeout: int = WATCH_TIMEOUT,
    ) -> None:
        self.client = client
        self.watch_timeout = watch_timeout
        self.namespace = namespace
        self.name = name
        self.on_table = on_table
        self.synced = asyncio.Event()
        self.relists = 0
        """Lists after the first one: each follows a watch that ended in an error."""

    async def run(self) -> None:
        delay = RETRY_MIN
        fields = {"metadata.name": self.name}
        while True:
            try:
                listing = self.client.list(ConfigMap, namespace=self.namespace, fields=fields)
                async for configmap in listing:
                    await self._handle(configmap.to_dict())
                version = listing.resourceVersion
                self.synced.set()
                delay = RETRY_MIN
                async for event, configmap in self.client.watch(
                    ConfigMap,
                    namespace=self.namespace,
                    fields=fields,
                    resource_version=version,
                    server_timeout=self.watch_timeout,
                ):
                    if event == "DELETED":
                        # Garbage collection after the set's deletion, or a mistake: either way
                        # the last table stands (nobody else is granted its units).
                        logger.warning("assignment ConfigMap %s was deleted", self.name)
                    elif event in ("ADDED", "MODIFIED"):
                        await self._handle(configmap.to_dict())
            except asyncio.CancelledError:
                raise
            except Exception as error:  # 410 Gone, connection loss, API errors: list again
                gone = isinstance(error, ApiError) and error.status.code == 410
                log = logger.info if gone else logger.warning
                log("watch of ConfigMap %s ended (%s); listing again", self.name, error)
                self.relists += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    async def _handle(self, root: Mapping[str, Any]) -> None:
        for attempt in range(INCOMPLETE_ATTEMPTS):
            try:
                table = await self._decode(root)
            except IncompleteAssignment as error:
                # A newer root replaced this one (and its chunks) while we read: read it again.
                logger.debug("assignment %s incomplete (%s); reading it again", self.name, error)
                await asyncio.sleep(RETRY_MIN * (attempt + 1))
                fresh = await self._get(self.name)
                if fresh is None:
                    return
                root = fresh
                continue
            except AssignmentFormatError as error:
                logger.error("ignoring invalid assignment in ConfigMap %s: %s", self.name, error)
                return
            self.on_table(table)
            return
        logger.warning("assignment %s stayed incomplete; waiting for the next write", self.name)

    async def _decode(self, root: Mapping[str, Any]) -> AssignmentTable:
        payload = ConfigMapPayload.from_configmap(root, self.name)
        parts = [payload]
        for suffix in chunk_suffixes(payload):
            chunk = await self._get(self.name + suffix)
            if chunk is None:
                raise IncompleteAssignment(f"chunk ConfigMap {self.name}{suffix} is missing")
            parts.append(ConfigMapPayload.from_configmap(chunk, self.name))
        if sum(p.wire_size for p in parts) > _THREAD_DECODE_BYTES:
            return await asyncio.to_thread(decode_assignment, parts)
        return decode_assignment(parts)

    async def _get(self, name: str) -> Mapping[str, Any] | None:
        try:
            found = await self.client.get(ConfigMap, name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise
        return found.to_dict()
