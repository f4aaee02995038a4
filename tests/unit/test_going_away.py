"""A write into a namespace being deleted is not a failed pass: the API server's refusal (its
body as kube-apiserver 1.36 sent it, captured from the dev-cluster) ends the pass the way a
deleted object does, while a refusal for lack of permission stays an error."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import ConfigMap
from lightkube.models.meta_v1 import ObjectMeta

from apportion.publishing.client import ObjectGone, going_away
from apportion.publishing.configmaps import PublishConflict, write_conditionally

TERMINATING = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'configmaps "new" is forbidden: unable to create new content in namespace doomed '
    "because it is being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "new",
        "kind": "configmaps",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace doomed is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
    "code": 403,
}
NO_PERMISSION = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'configmaps is forbidden: User "system:serviceaccount:x:y" cannot create resource '
    '"configmaps" in API group "" in the namespace "doomed"',
    "reason": "Forbidden",
    "details": {"kind": "configmaps"},
    "code": 403,
}


def refusal(body: dict[str, Any]) -> ApiError:
    return ApiError(
        response=httpx2.Response(
            body["code"], json=body, request=httpx2.Request("POST", "https://api/x")
        )
    )


class Refusing:
    """An AsyncClient whose every write is refused with `error`."""

    def __init__(self, error: ApiError) -> None:
        self.error = error

    async def create(self, body: ConfigMap) -> ConfigMap:
        raise self.error

    async def replace(self, body: ConfigMap) -> ConfigMap:
        raise self.error


def config_map() -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name="new", namespace="doomed"), data={})


def test_only_a_terminating_namespace_or_a_missing_object_is_going_away() -> None:
    assert going_away(refusal(TERMINATING))
    assert going_away(refusal({**NO_PERMISSION, "code": 404, "reason": "NotFound"}))
    assert not going_away(refusal(NO_PERMISSION))


@pytest.mark.parametrize("version", [None, "41"])
async def test_a_table_written_into_a_terminating_namespace_ends_the_pass_as_gone(
    version: str | None,
) -> None:
    with pytest.raises(ObjectGone, match="namespace is being deleted"):
        await write_conditionally(Refusing(refusal(TERMINATING)), config_map(), version)  # type: ignore[arg-type]


async def test_a_table_refused_for_lack_of_permission_stays_an_error() -> None:
    with pytest.raises(ApiError) as raised:
        await write_conditionally(Refusing(refusal(NO_PERMISSION)), config_map(), None)  # type: ignore[arg-type]
    assert not isinstance(raised.value, (ObjectGone, PublishConflict))
