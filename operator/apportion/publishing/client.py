"""The field manager the operator writes under, and its client."""

from __future__ import annotations

from lightkube import AsyncClient

FIELD_MANAGER = "apportion-operator"
"""Field manager of every operator write (workers write under their own)."""


def operator_client() -> AsyncClient:
    """A client from the kubeconfig or the in-cluster config, writing as FIELD_MANAGER."""
    return AsyncClient(field_manager=FIELD_MANAGER)
