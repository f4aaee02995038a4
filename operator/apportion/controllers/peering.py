"""kopf peering needs its peering object to exist: without it every replica would run unchecked.
`apportion operator --peering NAME` creates it before kopf starts (the kopf.dev CRDs come with the
manifests)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

logger = logging.getLogger(__name__)

ClusterKopfPeering = create_global_resource(
    "kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings"
)
KopfPeering = create_namespaced_resource("kopf.dev", "v1", "KopfPeering", "kopfpeerings")


async def ensure_peering(name: str, namespaces: Sequence[str] = ()) -> None:
    """Create the ClusterKopfPeering `name` (cluster-wide operator), or a KopfPeering `name` in
    each watched namespace (exact names, not patterns), unless it exists."""
    objects = (
        [KopfPeering(metadata={"name": name, "namespace": ns}) for ns in namespaces]
        if namespaces
        else [ClusterKopfPeering(metadata={"name": name})]
    )
    client = AsyncClient()
    try:
        for obj in objects:
            try:
                await client.create(obj)
                logger.info("Created peering object %s %r", type(obj).__name__, name)
            except ApiError as error:
                if error.status.code != 409:
                    raise
    finally:
        await client.close()
