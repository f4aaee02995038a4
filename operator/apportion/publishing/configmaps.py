"""The assignment ConfigMaps of one set: read what is published, write a new table with
optimistic concurrency (docs/assignment-format.md).

The root ConfigMap's resourceVersion fences writers: a write carries the version it read, so a
second operator replica (or a stale pass of this one) that read an older table gets a conflict
instead of overwriting a newer one. Chunks of big tables are written first under names carrying
their epoch and swept once the root that points at them is replaced.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from apportion import API_VERSION
from apportion.api.assignment import (
    AssignmentFormatError,
    AssignmentTable,
    ConfigMapPayload,
    IncompleteAssignment,
    ResourceRef,
    chunk_suffixes,
    decode_assignment,
    encode_assignment,
)
from apportion.publishing.client import ObjectGone, decode, namespace_terminating

logger = logging.getLogger(__name__)

SET_KIND_LABEL = "apportion.dev/set-kind"
SET_NAME_LABEL = "apportion.dev/set-name"
PART_LABEL = "apportion.dev/part"
READ_ATTEMPTS = 5


LABEL_VALUE_MAX = 63


def label_value(name: str) -> str:
    """A set name as a label value: names are up to 253 characters, label values up to 63, so
    longer ones are cut and end in a digest of the whole name (two sets never share a value)."""
    if len(name) <= LABEL_VALUE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: LABEL_VALUE_MAX - len(digest) - 1].rstrip('-.')}-{digest}"


class PublishConflict(Exception):
    """The root ConfigMap is not the version this store last read: reload, decide again."""


async def write_conditionally(client: AsyncClient, body: ConfigMap, version: str | None) -> str:
    """Create `body` when `version` is None (it did not exist when read), else replace it only if
    it is still at `version`; returns the version written. Raises PublishConflict when someone
    else created, changed or deleted it in between, so a newer decision is never overwritten."""
    metadata = body.metadata
    if metadata is None:
        raise ValueError("a ConfigMap to write needs metadata (its name)")
    try:
        if version is None:
            written = await client.create(body)
        else:
            metadata.resourceVersion = version
            written = await client.replace(body)
    except ApiError as error:
        if namespace_terminating(error):
            raise ObjectGone(
                f"ConfigMap {metadata.name} cannot be written: its namespace is being deleted"
            ) from error
        if error.status.code in (404, 409):
            raise PublishConflict(
                f"ConfigMap {metadata.name} changed since it was read ({error.status.reason})"
            ) from error
        raise
    return resource_version(written)


def resource_version(found: ConfigMap) -> str:
    """The version the API server gave `found` (every object it returns has one)."""
    if found.metadata is None or found.metadata.resourceVersion is None:
        raise ValueError("the API server returned a ConfigMap without a resourceVersion")
    return found.metadata.resourceVersion


def owner_reference(set_ref: ResourceRef) -> dict[str, Any]:
    """The set as controller of its ConfigMaps, so garbage collection and GitOps tools treat
    them as its children."""
    return {
        "apiVersion": API_VERSION,
        "kind": set_ref.kind,
        "name": set_ref.name,
        "uid": set_ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the root ConfigMap holds for one set."""

    table: AssignmentTable | None
    """This set's table; None when there is none (see `unreadable`)."""
    unreadable: str | None = None
    """Why a ConfigMap that exists holds no usable table (not JSON, not a table, chunks
    missing); None when it is absent or fine."""


class AssignmentStore:
    """Reads and writes the ConfigMaps holding one set's assignment (root `name`)."""

    def __init__(self, client: AsyncClient, set_ref: ResourceRef, name: str) -> None:
        self.client = client
        self.set_ref = set_ref
        self.name = name
        self._version: str | None = None
        self._chunks: tuple[str, ...] = ()
        self.size = 0
        """Bytes of the table's ConfigMaps as last read or written (`ConfigMapPayload.wire_size`),
        0 when there is none."""

    @property
    def version(self) -> str | None:
        """resourceVersion of the root as last read or written (None: it did not exist)."""
        return self._version

    async def load(self) -> Loaded:
        """The published table; none when the root is absent or was left by an earlier set of
        the same name, or (with the reason) when it holds no usable table. Remembers the root's
        version either way, so the next write replaces exactly what was read."""
        for attempt in range(READ_ATTEMPTS):
            root = await self._get(self.name)
            if root is None:
                self._version, self._chunks, self.size = None, (), 0
                return Loaded(None)
            self._version, self._chunks = root["metadata"]["resourceVersion"], ()
            try:
                payload = ConfigMapPayload.from_configmap(root, self.name)
                suffixes = chunk_suffixes(payload)
                chunks = [await self._get(self.name + s) for s in suffixes]
                payloads = [
                    payload,
                    *(ConfigMapPayload.from_configmap(c, self.name) for c in chunks if c),
                ]
                table = decode_assignment(payloads)
            except IncompleteAssignment as error:
                # A write replaced the root between our reads (its chunks are newer), or the
                # chunks are gone for good.
                if attempt + 1 == READ_ATTEMPTS:
                    return Loaded(None, f"ConfigMap {self.name} is incomplete: {error}")
                await asyncio.sleep(0.1 * (attempt + 1))
                continue
            except AssignmentFormatError as error:
                return Loaded(None, f"ConfigMap {self.name} holds no valid table: {error}")
            self._chunks = suffixes
            self.size = sum(p.wire_size for p in payloads)
            if table.set_ref.uid != self.set_ref.uid:
                logger.info(
                    "ConfigMap %s belongs to an earlier %s; starting over",
                    self.name,
                    self.set_ref.kind,
                )
                return Loaded(None)
            return Loaded(table)
        raise AssertionError("unreachable")

    async def publish(self, table: AssignmentTable) -> None:
        """Write `table`: chunks (if any) first, then the root, conditionally on the version
        read or written last. Raises PublishConflict when someone else wrote in between."""
        root, *chunks = encode_assignment(table)
        for chunk in chunks:
            await self._put_chunk(chunk)
        self._version = await write_conditionally(
            self.client, self._body(root, "root"), self._version
        )
        stale = set(self._chunks) - {c.suffix for c in chunks}
        self._chunks = tuple(c.suffix for c in chunks)
        self.size = root.wire_size + sum(c.wire_size for c in chunks)
        for suffix in stale:
            await self._delete(self.name + suffix)

    def _body(self, payload: ConfigMapPayload, part: str) -> ConfigMap:
        return decode(
            ConfigMap,
            {
                "metadata": {
                    "name": self.name + payload.suffix,
                    "namespace": self.set_ref.namespace,
                    "labels": {
                        "app.kubernetes.io/managed-by": "apportion",
                        SET_KIND_LABEL: self.set_ref.kind,
                        SET_NAME_LABEL: label_value(self.set_ref.name),
                        PART_LABEL: part,
                    },
                    "ownerReferences": [owner_reference(self.set_ref)],
                },
                **payload.body(),
            },
        )

    async def _put_chunk(self, chunk: ConfigMapPayload) -> None:
        body = self._body(chunk, "chunk")
        try:
            await self.client.create(body)
        except ApiError as error:
            if error.status.code != 409:
                raise
            # Left by an attempt at the same epoch that lost a conflict: same name, new bytes.
            await self.client.replace(body)

    async def _get(self, name: str) -> Mapping[str, Any] | None:
        try:
            found = await self.client.get(ConfigMap, name, namespace=self.set_ref.namespace)
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise
        return found.to_dict()

    async def _delete(self, name: str) -> None:
        try:
            await self.client.delete(ConfigMap, name, namespace=self.set_ref.namespace)
        except ApiError as error:
            if error.status.code != 404:
                logger.warning("Could not delete stale chunk ConfigMap %s: %s", name, error)
