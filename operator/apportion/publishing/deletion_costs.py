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

import httpx2
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
    """What every set assigns each pod, and the patches that bring the pods' annotations there.

    A set's update costs what its own pods cost, never a look at every pod the operator knows
    (a thousand sets in one namespace of five thousand pods update it at every pass). Only pods
    that some set holds, or whose annotation still has to be corrected, are remembered."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._holdings: dict[PodKey, dict[str, int]] = {}
        self._pods: dict[PodKey, tuple[str, str | None]] = {}
        self._held_by: dict[tuple[str, str], set[str]] = {}
        """(namespace, holder key) → uids of the pods it assigns units to."""
        self._dirty: set[PodKey] = set()
        self._task: asyncio.Task[None] | None = None

    def cost(self, key: PodKey) -> int:
        return min(COST_LIMIT, sum(self._holdings.get(key, {}).values()))

    def update(
        self,
        namespace: str,
        holder_key: str,
        holdings: Mapping[str, int],
        pods: Mapping[str, tuple[str, str | None]],
    ) -> None:
        """Set `holder_key` gives `holdings[uid]` units to each pod of `pods` (uid → (name, the
        annotation's current value): the pods it sees); pods of `pods` missing from `holdings`
        hold none of it, and so do the pods it held before and no longer sees (gone, or out of
        its selection)."""
        held = {uid for uid, units in holdings.items() if units and uid in pods}
        before = self._held_by.get((namespace, holder_key), set())
        for uid in before - pods.keys():
            self._assign(namespace, uid, holder_key, 0, None)
        for uid, seen in pods.items():
            self._assign(namespace, uid, holder_key, holdings.get(uid, 0), seen)
        if held:
            self._held_by[(namespace, holder_key)] = held
        else:
            self._held_by.pop((namespace, holder_key), None)
        if self._dirty and self._task is None:
            self._task = asyncio.create_task(self._flush(), name="apportion deletion costs")

    def _assign(
        self,
        namespace: str,
        uid: str,
        holder_key: str,
        units: int,
        seen: tuple[str, str | None] | None,
    ) -> None:
        """`seen`: the pod's name and annotation as the set sees it now; None for a pod it no
        longer sees (gone, or out of its selection: it is patched to what the others assign it
        on what was last known of it, and a patch of a pod that is gone finds nothing)."""
        key = (namespace, uid)
        mine = self._holdings.setdefault(key, {})
        if units:
            mine[holder_key] = units
        else:
            mine.pop(holder_key, None)
        if seen is not None:
            self._pods[key] = seen
        known = self._pods.get(key)
        if not mine and (known is None or known[1] in (None, "0")):
            self._forget(key)  # held by nobody, and nothing to correct that can be seen
        elif known is not None and known[1] != str(self.cost(key)):
            self._dirty.add(key)

    def _forget(self, key: PodKey) -> None:
        self._holdings.pop(key, None)
        self._pods.pop(key, None)
        self._dirty.discard(key)

    def forget_set(self, namespace: str, holder_key: str) -> None:
        """A deleted set: its units no longer count, and its pods, which most likely still run,
        are patched to what the other sets assign them."""
        for uid in self._held_by.pop((namespace, holder_key), set()):
            self._assign(namespace, uid, holder_key, 0, None)
        if self._dirty and self._task is None:
            self._task = asyncio.create_task(self._flush(), name="apportion deletion costs")

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
        name, current = self._pods[key]
        wanted = str(self.cost(key))
        if current != wanted:
            await self._annotate(key, name, wanted)
        if not self._holdings.get(key) and key not in self._dirty:
            self._forget(key)  # corrected, or gone: nothing more to do for a pod nobody holds

    async def _annotate(self, key: PodKey, name: str, wanted: str) -> None:
        namespace, uid = key
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
        except httpx2.TransportError as error:
            # The API server is away (restarting, restored): the next flush tries again.
            logger.warning("Could not set %s on pod %s: %s", DELETION_COST, name, error)
            self._dirty.add(key)
            return
        self._pods[key] = (name, wanted)
