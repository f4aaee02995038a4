"""Explain a grain placement against the live tables: which member a new activation of a grain
would go to now, from which table, the candidates, what each filter removed and the scores.

    why = await explain_grain("Shop.CartGrain", "cart/42", namespace="shop", local="w-0")
    why.chosen, why.to_dict()

It reads the namespace's placement tables once and asks a fresh `PlacementDirector`, so it sees
what the operator published, not a worker's optimistic increments since then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apportion.api.placement_table import TABLE_LABEL, PlacementTableFormatError, from_configmap
from apportion.grains._director import GrainExplanation, PlacementDirector

if TYPE_CHECKING:
    from lightkube import AsyncClient


async def read_tables(client: AsyncClient, namespace: str) -> PlacementDirector:
    """A director holding the namespace's current tables (malformed ones are skipped)."""
    from lightkube.resources.core_v1 import ConfigMap

    director = PlacementDirector()
    async for configmap in client.list(
        ConfigMap, namespace=namespace, labels={TABLE_LABEL: "true"}
    ):
        try:
            director.apply(from_configmap(configmap.to_dict()))
        except PlacementTableFormatError:
            continue
    return director


async def explain_grain(
    grain_type: str,
    grain_id: str,
    *,
    namespace: str | None = None,
    local: str | None = None,
    hint: str | None = None,
    client: AsyncClient | None = None,
) -> GrainExplanation:
    """What a new activation of `grain_id` (of `grain_type`) placed from member `local` with
    placement hint `hint` would get now. `namespace` defaults to the client's."""
    from lightkube import AsyncClient

    own = client is None
    api = AsyncClient() if client is None else client
    try:
        director = await read_tables(api, namespace or api.namespace)
    finally:
        if own:
            await api.close()
    return director.explain(grain_type, grain_id, local, hint)
