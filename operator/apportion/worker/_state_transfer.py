"""Unit state handed from the pod that releases a unit to the pod that acquires it
(docs/worker.md#handing-state-over).

One Lease object per unit and count, `<set>-<kind>-unit-<count>-<unit>`, holds the unit's state
as JSON in the annotation `apportion.dev/unit-state`. The releasing worker writes it inside
`on_release`, that is before it acknowledges; the operator grants the unit to another pod only
after that acknowledgement, so the acquirer's read (a quorum GET) sees it. A Lease rather than a
ConfigMap because the worker role (manifests/worker-rbac.yaml) already lets workers write
Leases, while a grant to write ConfigMaps would let a worker rewrite its set's assignment table.
The Leases are owned by the set: the garbage collector deletes them with it.

Unit numbers name other key ranges under another count, hence the count in the name; a state
written in an earlier era of the same count (before a split and a merge back) is older than the
era's first table and is ignored, as is one of an earlier set of the same name (another uid).
An annotation holds 256 KiB at most: enough for the demo, not a store for real data.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from apportion import API_VERSION
from apportion.api.assignment import AssignmentTable

if TYPE_CHECKING:
    from lightkube import AsyncClient

logger = logging.getLogger(__name__)
T = TypeVar("T")

ANNOTATION: Final = "apportion.dev/unit-state"
ATTEMPTS: Final = 8
"""API calls tried before a save or load gives up (0.2 s doubling to 2 s between them): a
release must not be acknowledged before its state is stored, a merge not done without its
missing siblings' state."""
FIELD_MANAGER: Final = "apportion-worker"
_NAME_MAX: Final = 253


@dataclass(frozen=True, slots=True)
class UnitSnapshot:
    """What a releasing worker left for unit `unit` of `count`: `data` as it was when it stopped
    serving the unit under fencing token `token`."""

    set_uid: str
    count: int
    unit: str
    token: int
    pod: str
    data: Mapping[str, Any]

    def current(self, table: AssignmentTable, count: int) -> bool:
        """Left by the set of `table` and, when `count` is `table`'s count, in its era (a state
        older than the era's first table was left before a split and a merge back)."""
        if self.set_uid != table.set_ref.uid or self.count != count:
            return False
        return count != table.count or self.token >= era_start(table)

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "setUid": self.set_uid,
                "count": self.count,
                "unit": self.unit,
                "token": self.token,
                "pod": self.pod,
                "data": self.data,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, text: str) -> UnitSnapshot:
        raw = json.loads(text)
        return cls(
            str(raw["setUid"]),
            int(raw["count"]),
            str(raw["unit"]),
            int(raw["token"]),
            str(raw["pod"]),
            dict(raw["data"]),
        )


def era_start(table: AssignmentTable) -> int:
    """Epoch of the first table with this table's count (0: the count never changed)."""
    return 0 if table.lineage is None else table.lineage.epoch


def lease_name(kind: str, set_name: str, count: int, unit: str) -> str:
    full = f"{set_name}-{kind.lower()}-unit-{count}-{unit}"
    if len(full) <= _NAME_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: _NAME_MAX - len(digest) - 1].rstrip('-.')}-{digest}"


class UnitStateStore:
    """Saves and loads the state of one set's units in the set's namespace."""

    def __init__(self, client: AsyncClient, namespace: str, kind: str, set_name: str) -> None:
        self.client = client
        self.namespace = namespace
        self.kind = kind
        self.set_name = set_name

    async def save(self, state: UnitSnapshot) -> None:
        """Write `state`, raising the last error after ATTEMPTS failures."""
        from lightkube.models.coordination_v1 import LeaseSpec
        from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
        from lightkube.resources.coordination_v1 import Lease

        name = lease_name(self.kind, self.set_name, state.count, state.unit)
        lease = Lease(
            metadata=ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels={"apportion.dev/set": f"{self.kind.lower()}.{self.set_name}"[:63]},
                annotations={ANNOTATION: state.to_annotation()},
                ownerReferences=[
                    OwnerReference(
                        apiVersion=API_VERSION,
                        kind=self.kind,
                        name=self.set_name,
                        uid=state.set_uid,
                    )
                ],
            ),
            spec=LeaseSpec(holderIdentity=state.pod),
        )
        await _retrying(
            f"saving the state of unit {state.unit}",
            lambda: self.client.apply(lease, field_manager=FIELD_MANAGER, force=True),
        )

    async def load(self, table: AssignmentTable, count: int, unit: str) -> UnitSnapshot | None:
        """The state left for `unit` of `count` by the set of `table` — of `table`'s era when
        `count` is its count — or None (never released: a new unit, or its last owner did not
        hand it over). Raises the last error after ATTEMPTS failures."""
        from lightkube import ApiError
        from lightkube.resources.coordination_v1 import Lease

        name = lease_name(self.kind, self.set_name, count, unit)

        async def get() -> Lease | None:
            try:
                return await self.client.get(Lease, name, namespace=self.namespace)
            except ApiError as error:
                if error.status.code == 404:
                    return None
                raise

        lease = await _retrying(f"loading the state of unit {unit}", get)
        if lease is None:
            return None
        text = ((lease.metadata and lease.metadata.annotations) or {}).get(ANNOTATION)
        if text is None:
            return None
        try:
            state = UnitSnapshot.from_annotation(text)
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("Lease %s: unreadable unit state (%s); starting empty", name, error)
            return None
        return state if state.current(table, count) else None


async def _retrying(what: str, call: Callable[[], Awaitable[T]]) -> T:
    delay, attempt = 0.2, 1
    while True:
        try:
            return await call()
        except Exception as error:
            if attempt == ATTEMPTS:
                raise
            logger.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
        await asyncio.sleep(delay)
        delay, attempt = min(delay * 2, 2.0), attempt + 1
