"""`controller.kubernetes.io/pod-deletion-cost` on worker pods: what each pod holds, so that a
ReplicaSet scaling in removes the pods holding least (StatefulSets always remove the highest
ordinal and ignore it).

A pod may serve several sets; its cost is the sum of the units every set assigns it. Each set
reports its holdings here, and a pod is patched only when its sum differs from what it carries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

logger = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
COST_LIMIT = 2**31 - 1  # the annotation is an int32


class DeletionCosts:
    """Holdings per pod incarnation (namespace, uid) and set, and the patches they need."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._holdings: dict[tuple[str, str], dict[str, int]] = {}
        self._written: dict[tuple[str, str], str] = {}

    def cost(self, namespace: str, uid: str) -> int:
        return min(COST_LIMIT, sum(self._holdings.get((namespace, uid), {}).values()))

    async def update(
        self,
        namespace: str,
        set_key: str,
        holdings: Mapping[str, int],
        pods: Mapping[str, tuple[str, str | None]],
    ) -> None:
        """Record that set `set_key` assigns `holdings[uid]` units to each pod, then patch every
        pod of `pods` (uid → (name, the annotation's current value)) whose cost changed."""
        for uid, (_, _) in pods.items():
            mine = self._holdings.setdefault((namespace, uid), {})
            if holdings.get(uid):
                mine[set_key] = holdings[uid]
            else:
                mine.pop(set_key, None)
        for uid, (name, current) in pods.items():
            wanted = str(self.cost(namespace, uid))
            key = (namespace, uid)
            if current == wanted or self._written.get(key) == wanted:
                continue
            try:
                await self.client.patch(
                    Pod,
                    name,
                    {"metadata": {"annotations": {DELETION_COST: wanted}}},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
            except ApiError as error:
                if error.status.code != 404:  # a pod that is gone needs no cost
                    logger.warning("Could not set %s on pod %s: %s", DELETION_COST, name, error)
                continue
            self._written[key] = wanted

    def forget_set(self, namespace: str, set_key: str) -> None:
        """Drop a deleted set's holdings (the pods' costs follow at the next update)."""
        for (ns, _), sets in self._holdings.items():
            if ns == namespace:
                sets.pop(set_key, None)

    def forget_pods(self, namespace: str, live_uids: set[str]) -> None:
        """Drop pods of `namespace` that no longer exist."""
        for key in [k for k in self._holdings if k[0] == namespace and k[1] not in live_uids]:
            del self._holdings[key]
            self._written.pop(key, None)
