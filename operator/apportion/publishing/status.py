"""Status of PartitionSets, ShardSets and GrainTypes, written through the status subresource."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from apportion import GROUP, VERSION
from apportion.api import GrainType, PartitionSet, ShardSet
from apportion.publishing.client import ObjectGone, going_away

SET_RESOURCES = {
    kind.__name__: create_namespaced_resource(GROUP, VERSION, kind.__name__, kind.crd.plural)
    for kind in (PartitionSet, ShardSet, GrainType)
}
"""lightkube classes of our kinds, by kind."""


async def patch_status(
    client: AsyncClient, kind: str, namespace: str, name: str, status: Mapping[str, Any]
) -> None:
    """Merge-patch `status` (its None values delete fields; lists are replaced whole)."""
    try:
        await client.patch(
            SET_RESOURCES[kind].Status,
            name,
            {"status": dict(status)},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as error:
        if going_away(error):
            raise ObjectGone(f"{kind} {namespace}/{name} is gone") from error
        raise
