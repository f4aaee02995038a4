"""`apportion crds --migrate-storage`: rewrite every stored apportion object in its CRD's storage
version, then record that only that version is stored (docs/operations.md, "API versions").

When a release adds an API version and makes it the storage version, the objects already in
etcd stay in the version they were written in until something writes them again, and the CRD's
`status.storedVersions` keeps naming the old version; until both change, the old version cannot
leave the CRD. This is what kube-storage-version-migrator does, and the built-in
StorageVersionMigration (beta since Kubernetes 1.35, off by default) would: an empty patch to
each object, which the API server stores in the current storage version, then storedVersions
narrowed to it. An empty patch changes neither spec nor generation, so the operator sees no new
intent and moves nothing. The list is one consistent snapshot, and an object created after it is
written in the storage version already; storedVersions is narrowed only when every listed object
was rewritten (or is gone).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lightkube import ApiError, AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from apportion import GROUP
from apportion.api import resource_kinds

NOT_FOUND = 404


class MigrationError(Exception):
    """What the API server answered cannot be migrated; nothing was narrowed."""


@dataclass(frozen=True)
class Migrated:
    crd: str
    storage: str
    rewritten: int
    stored_before: tuple[str, ...]

    def __str__(self) -> str:
        if self.stored_before == (self.storage,):
            return f"{self.crd}: only {self.storage} stored, nothing to do"
        return (
            f"{self.crd}: {self.rewritten} object(s) rewritten in {self.storage}; storedVersions "
            f"[{', '.join(self.stored_before)}] -> [{self.storage}]"
        )


def crd_names() -> list[str]:
    return sorted(f"{kind.crd.plural}.{GROUP}" for kind in resource_kinds().values())


async def migrate_crd(client: AsyncClient, name: str) -> Migrated:
    crd = await client.get(CustomResourceDefinition, name)
    if crd.spec is None or crd.status is None:
        raise MigrationError(f"{name}: the API server sent a CRD without spec or status")
    (storage,) = (v.name for v in crd.spec.versions if v.storage)
    stored = tuple(crd.status.storedVersions or ())
    if stored == (storage,):
        return Migrated(name, storage, 0, stored)
    names = crd.spec.names
    if crd.spec.scope != "Namespaced":  # every apportion kind is namespaced
        raise MigrationError(f"{name}: scope {crd.spec.scope}, not Namespaced")
    resource = create_namespaced_resource(crd.spec.group, storage, names.kind, names.plural)
    rewritten = 0
    async for obj in client.list(resource, namespace="*"):
        meta = obj.metadata
        if meta is None or meta.name is None:
            raise MigrationError(f"{name}: the API server listed an object without a name")
        try:
            await client.patch(
                resource, meta.name, {}, namespace=meta.namespace, patch_type=PatchType.MERGE
            )
        except ApiError as error:
            if error.status.code != NOT_FOUND:  # deleted since the list: nothing left to store
                raise
            continue
        rewritten += 1
    await client.patch(
        CustomResourceDefinition.Status,
        name,
        {"status": {"storedVersions": [storage]}},
        patch_type=PatchType.MERGE,
    )
    return Migrated(name, storage, rewritten, stored)


async def migrate(names: Iterable[str] | None = None) -> list[Migrated]:
    """Migrate each CRD of `names` (default: apportion's), with the kubeconfig kubectl would use."""
    client = AsyncClient(KubeConfig.from_env())
    try:
        return [await migrate_crd(client, name) for name in names or crd_names()]
    finally:
        await client.close()
