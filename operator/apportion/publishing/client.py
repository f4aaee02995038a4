"""The operator's one lightkube client and the names it writes under."""

from __future__ import annotations

from lightkube import AsyncClient

FIELD_MANAGER = "apportion-operator"
"""Field manager of every operator write (workers write under their own)."""

_client: AsyncClient | None = None


def api() -> AsyncClient:
    """The process-wide client, created on first use from the kubeconfig or in-cluster config."""
    global _client
    if _client is None:
        _client = AsyncClient(field_manager=FIELD_MANAGER)
    return _client


async def close() -> None:
    global _client
    if _client is not None:
        client, _client = _client, None
        await client.close()
