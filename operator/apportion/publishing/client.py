"""The field manager the operator writes under, its client, and typed bodies for it."""

from __future__ import annotations

from typing import Any, TypeVar

from lightkube import ApiError, AsyncClient
from lightkube.core.dictmixin import DictMixin

Resource = TypeVar("Resource", bound=DictMixin)

FIELD_MANAGER = "apportion-operator"
"""Field manager of every operator write (workers write under their own)."""


NAMESPACE_TERMINATING = "NamespaceTerminating"
"""The cause the API server's NamespaceLifecycle admission gives when it refuses to create
anything in a namespace being deleted."""


class ObjectGone(Exception):
    """The object a write was for no longer exists: deleted, or its namespace is, and the watch
    has not said so yet. Its loop ends when the deletion arrives; nothing failed."""


def namespace_terminating(error: ApiError) -> bool:
    """Whether a write was refused because its namespace is being deleted (403
    NamespaceTerminating) rather than for lack of a permission."""
    status = error.status
    causes = (status.details.causes if status.details else None) or []
    return status.code == 403 and any(c.reason == NAMESPACE_TERMINATING for c in causes)


def going_away(error: ApiError) -> bool:
    """Whether a write failed because its object is gone (404) or its namespace is going."""
    return error.status.code == 404 or namespace_terminating(error)


def operator_client() -> AsyncClient:
    """A client from the kubeconfig or the in-cluster config, writing as FIELD_MANAGER."""
    return AsyncClient(field_manager=FIELD_MANAGER)


def decode(kind: type[Resource], manifest: dict[str, Any]) -> Resource:
    """`kind.from_dict(manifest)` typed as `kind` (lightkube declares it returns DictMixin)."""
    resource = kind.from_dict(manifest)
    if not isinstance(resource, kind):
        raise TypeError(f"{kind.__name__}.from_dict returned a {type(resource).__name__}")
    return resource
