"""`controller.kubernetes.io/pod-deletion-cost` on worker pods: what each pod holds, so that a
ReplicaSet scaling in removes the pods holding least (StatefulSets always remove the highest
ordinal and ignore it).

A pod may serve several sets; its cost is the sum of the units every set assigns it. Sets
report their holdings here; one background task patches, at most once per `FLUSH_SECONDS`,
each pod whose sum differs from what it carries — so twenty sets over the same pods cost one
patch per pod, not twenty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from apportion.api.pods import DELETION_COST

logger = logging.getLogger(__name__)

COST_LIMIT = 2**31 - 1  # the annotation is an int32
FLUSH_SECONDS = 1.0

PodKey = tuple[str, str]
"""(namespace, pod uid): one incarnation of a pod."""


class DeletionCosts:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._holdings: dict[PodKey, dict[str, int]] = {}
        self._pods: dict[PodKey, tuple[str, str | None]] = {}
        self._dirty: set[PodKey] = set()
        self._task: asyncio.Task[None] | None = None

    def cost(self, key: PodKey) -> int:
        return min(COST_LIMIT, sum(self._holdings.get(key, {}).values()))

    def update(
        self,
        namespace: str,
        set_key: str,
        holdings: Mapping[str, int],
        pods: Mapping[str, tuple[str, str | None]],
    ) -> None:
        """Set `set_key` assigns `holdings[uid]` units to each pod of `pods` (uid → (name, the
        annotation's current value)); pods of `pods` missing from `holdings` hold none of it."""
        for uid, (name, current) in pods.items():
            key = (namespace, uid)
            mine = self._holdings.setdefault(key, {})
            if holdings.get(uid):
                mine[set_key] = holdings[uid]
            else:
                mine.pop(set_key, None)
            self._pods[key] = (name, current)
            if current != str(self.cost(key)):
                self._dirty.add(key)
        if self._dirty and self._task is None:
            self._task = asyncio.create_task(self._flush(), name="apportion deletion costs")

    def forget_set(self, namespace: str, set_key: str) -> None:
        """A deleted set: its units no longer count (pods are patched at the next update)."""
        for (ns, _), sets in self._holdings.items():
            if ns == namespace:
                sets.pop(set_key, None)

    def forget_pods(self, namespace: str, live_uids: set[str]) -> None:
        """Drop pods of `namespace` that no longer exist."""
        for key in [k for k in self._pods if k[0] == namespace and k[1] not in live_uids]:
            self._holdings.pop(key, None)
            self._pods.pop(key, None)
            self._dirty.discard(key)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _flush(self) -> None:
        try:
            while self._dirty:
                await asyncio.sleep(FLUSH_SECONDS)
                dirty, self._dirty = self._dirty, set()
                for key in dirty:
                    if key in self._pods:
                        await self._patch(key)
        finally:
            self._task = None

    async def _patch(self, key: PodKey) -> None:
        namespace, uid = key
        name, current = self._pods[key]
        wanted = str(self.cost(key))
        if current == wanted:
            return
        try:
            await self.client.patch(
                Pod,
                name,
                # The uid makes the patch conditional: never the next pod of the same name.
                {"metadata": {"uid": uid, "annotations": {DELETION_COST: wanted}}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            if error.status.code not in (404, 409):  # a pod that is gone needs no cost
                logger.warning("Could not set %s on pod %s: %s", DELETION_COST, name, error)
            return
        self._pods[key] = (name, wanted)
