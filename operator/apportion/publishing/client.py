"""The field manager the operator writes under, its client, and typed bodies for it."""

from __future__ import annotations

from typing import Any, TypeVar

from lightkube import AsyncClient
from lightkube.core.dictmixin import DictMixin

Resource = TypeVar("Resource", bound=DictMixin)

FIELD_MANAGER = "apportion-operator"
"""Field manager of every operator write (workers write under their own)."""


def operator_client() -> AsyncClient:
    """A client from the kubeconfig or the in-cluster config, writing as FIELD_MANAGER."""
    return AsyncClient(field_manager=FIELD_MANAGER)


def decode(kind: type[Resource], manifest: dict[str, Any]) -> Resource:
    """`kind.from_dict(manifest)` typed as `kind` (lightkube declares it returns DictMixin)."""
    resource = kind.from_dict(manifest)
    if not isinstance(resource, kind):
        raise TypeError(f"{kind.__name__}.from_dict returned a {type(resource).__name__}")
    return resource
