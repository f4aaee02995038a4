"""The simulated nodes: registered once, then kept alive with Lease renewals as a kubelet does.

Without the heartbeat the node-lifecycle controller would mark them Unknown after its grace
period, taint them and evict every pod, which is exactly what happens to pods of a real node whose
kubelet died (and to these nodes when the simulator is gone).
"""

from __future__ import annotations

import asyncio
import logging

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from apportion.publishing.client import decode
from apportion_dev.devcluster.podsim import objects
from apportion_dev.devcluster.podsim.ipam import IpPool

log = logging.getLogger(__name__)

LEASE_RENEW_SECONDS = 10.0
STATUS_HEARTBEAT_SECONDS = 60.0


class SimulatedNodes:
    def __init__(self, client: AsyncClient, pool: IpPool, count: int, kubelet_version: str):
        self._client = client
        self._pool = pool
        self._kubelet_version = kubelet_version
        self.names = [objects.node_name(i) for i in range(count)]
        self._since = objects.now_iso()

    def host_ip(self, node: str) -> str:
        return self._pool.node_ip(self.names.index(node))

    async def register(self) -> None:
        for index, name in enumerate(self.names):
            manifest = objects.node_manifest(index)
            try:
                await self._client.create(decode(Node, manifest))
            except ApiError as error:
                if error.status.code != 409:
                    raise
                # Left by an earlier simulator: take its labels back, keep what users added.
                await self._client.patch(Node, name, {"metadata": manifest["metadata"]})
            await self._post_status(name)
            await self._renew(name)
        log.info("registered nodes %s", ", ".join(self.names))

    async def _post_status(self, name: str) -> None:
        status = objects.node_status(
            self.host_ip(name), name, self._kubelet_version, objects.now_iso(), self._since
        )
        await self._client.patch(Node.Status, name, status)

    async def _renew(self, name: str) -> None:
        lease = objects.lease_manifest(name, objects.now_micro())
        await self._client.patch(
            Lease,
            name,
            lease,
            namespace=objects.NODE_LEASE_NAMESPACE,
            patch_type=PatchType.APPLY,
            field_manager="apportion-podsim",
            force=True,
        )

    async def heartbeat(self) -> None:
        """Renew leases every 10 s and post node status every minute, forever."""
        since_status = 0.0
        while True:
            await asyncio.sleep(LEASE_RENEW_SECONDS)
            since_status += LEASE_RENEW_SECONDS
            for name in self.names:
                try:
                    await self._renew(name)
                    if since_status >= STATUS_HEARTBEAT_SECONDS:
                        await self._post_status(name)
                except ApiError as error:
                    log.warning("heartbeat for %s failed: %s", name, error)
                    if error.status.code == 404:
                        await self.register()
                except httpx2.HTTPError as error:
                    log.warning("heartbeat for %s failed: %s", name, error)
            if since_status >= STATUS_HEARTBEAT_SECONDS:
                since_status = 0.0
