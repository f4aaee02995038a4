"""Follows one set's assignment ConfigMap through the API server (docs/assignment-format.md).

The list-then-watch primitive (`apportion.listwatch.ListWatch`), narrowed to the root ConfigMap by
name; chunk ConfigMaps of big tables are fetched when the root points at them (the operator writes
them before the root). A table that does not decode is reported and skipped: the last good one
stays in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion import listwatch
from apportion.api.assignment import (
    AssignmentFormatError,
    AssignmentTable,
    ConfigMapPayload,
    IncompleteAssignment,
    chunk_suffixes,
    decode_assignment,
)

logger = logging.getLogger(__name__)

INCOMPLETE_ATTEMPTS = 5
# Decoding an inline JSON table is quick; a gzipped one may hold 100k units: off the loop.
_THREAD_DECODE_BYTES = 64 * 1024


class AssignmentWatch:
    """Calls `on_table` with every table the root ConfigMap `name` holds, in order, and
    `on_rewound` when the API server went back in time (its etcd restored from a backup).

    `synced` is set once the first list has been handled (whether a table exists or not);
    `confirm()` reads the root again to tell whether the table last handled is still current.
    """

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        on_table: Callable[[AssignmentTable], None],
        *,
        on_rewound: Callable[[], None] | None = None,
        watch_timeout: int = listwatch.WATCH_TIMEOUT,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.on_table = on_table
        self.on_rewound = on_rewound
        self._loop = listwatch.ListWatch(
            client,
            ConfigMap,
            namespace,
            decode=dict,
            on_list=self._on_list,
            on_event=self._on_event,
            selection=listwatch.Selection(fields={"metadata.name": name}),
            timing=listwatch.Timing(watch_timeout=watch_timeout),
            on_restart=self._on_restart,
        )
        self.synced = self._loop.synced
        self.version: str | None = None
        """resourceVersion of the root whose table was handled last."""

    @property
    def relists(self) -> int:
        """Lists after the first one: each follows a 410 Gone."""
        return self._loop.relists

    async def run(self) -> None:
        await self._loop.run()

    def _on_restart(self, reason: str) -> None:
        if reason == "rewound" and self.on_rewound is not None:
            self.on_rewound()

    async def _on_list(self, roots: AsyncIterator[dict[str, Any]]) -> None:
        async for root in roots:
            await self._handle(root)

    async def _on_event(self, event: listwatch.EventType, root: dict[str, Any]) -> None:
        if event == "DELETED":
            # Garbage collection after the set's deletion, or a mistake: either way the last
            # table stands (nobody else is granted its units).
            logger.warning("assignment ConfigMap %s was deleted", self.name)
        else:
            await self._handle(root)

    async def confirm(self) -> bool:
        """GET the root (a quorum read): True when it holds the table handled last, or a newer
        one, which is handled first; False when it is gone or does not decode (the serving
        lease then runs out: the table in force cannot be confirmed)."""
        root = await self._get(self.name)
        if root is None:
            return False
        if root.get("metadata", {}).get("resourceVersion") == self.version:
            return True
        return await self._handle(root)

    async def _handle(self, root: Mapping[str, Any]) -> bool:
        """Decode the table `root` holds and hand it on; whether it did."""
        for attempt in range(INCOMPLETE_ATTEMPTS):
            try:
                table = await self._decode(root)
            except IncompleteAssignment as error:
                # A newer root replaced this one (and its chunks) while we read: read it again.
                logger.debug("assignment %s incomplete (%s); reading it again", self.name, error)
                await asyncio.sleep(listwatch.RETRY_MIN * (attempt + 1))
                fresh = await self._get(self.name)
                if fresh is None:
                    return False
                root = fresh
                continue
            except AssignmentFormatError as error:
                logger.error("ignoring invalid assignment in ConfigMap %s: %s", self.name, error)
                return False
            self.on_table(table)
            self.version = root.get("metadata", {}).get("resourceVersion")
            return True
        logger.warning("assignment %s stayed incomplete; waiting for the next write", self.name)
        return False

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
