"""The placement table of a GrainType and its ConfigMap wire format.

The operator writes one ConfigMap per GrainType (owned by it); worker libraries watch it and
place each new activation in-process. docs/placement-table.md specifies the format; this module
is its reference implementation. Pure: ConfigMaps go in and out as plain dicts, the publishing
layer makes the API calls.

Also here, because it is a property of the format: `classify_change`, which tells a membership
change (published at once) from a load change beyond the hysteresis (published on the load
period) from noise (not published).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import Annotated, Any, Final, Literal

from pydantic import Field, StringConstraints, ValidationError, field_validator

from apportion import API_VERSION
from apportion.api.common import ApiModel
from apportion.api.graintype import GrainStrategySpec, LoadShedding, PlacementFilter

TABLE_KIND: Final = "PlacementTable"
DATA_KEY: Final = "placement.json"
TABLE_LABEL: Final = "apportion.dev/placement-table"
"""Label on every placement-table ConfigMap (value "true"): what workers watch."""
GRAIN_TYPE_ANNOTATION: Final = "apportion.dev/graintype"
VERSION_ANNOTATION: Final = "apportion.dev/table-version"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "apportion"}

_NAME_SUFFIX: Final = "-placement"
_NAME_MAX: Final = 253
# A ConfigMap holds at most 1 MiB; refuse to build one that the API server would reject.
MAX_TABLE_BYTES: Final = 1000 * 1024


class PlacementTableFormatError(ValueError):
    """A ConfigMap that does not hold a valid placement table."""


def configmap_name(grain_type: str) -> str:
    """`<GrainType name>-placement`; names too long for that are cut and suffixed with a digest,
    so that two GrainTypes never share a table."""
    name = grain_type + _NAME_SUFFIX
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(grain_type.encode()).hexdigest()[:10]
    return f"{grain_type[: _NAME_MAX - len(_NAME_SUFFIX) - len(digest) - 1]}-{digest}{_NAME_SUFFIX}"


# ------------------------------------------------------------------------------------ document


class TableStats(ApiModel):
    """Smoothed load of one member, as the metrics collector reports it."""

    cpu_usage: float = Field(0.0, ge=0, description="CPU in use, percent of the pod's CPU.")
    memory_usage: float = Field(0.0, ge=0, description="Memory in use, percent of its limit.")
    available_memory: int = Field(0, ge=0, description="Bytes still available.")
    max_available_memory: int = Field(0, ge=0, description="Bytes usable at most (the limit).")
    activation_count: int = Field(0, ge=0, description="Activations of the table's grain types.")
    cpu_count: int = Field(1, ge=1, description="Processors of the member.")
    overloaded: bool = Field(
        False, description="Above a load-shedding threshold (or said so itself): no new work."
    )


class TableMember(ApiModel):
    """A compatible member: a Ready, not terminating worker pod selected by the GrainType."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    address: str | None = Field(None, description="The pod's IP, for callers that route to it.")
    labels: dict[str, str] = Field(default_factory=dict, description="Pod labels (metadata).")
    stats: TableStats | None = Field(None, description="None until the member has reported.")


class GrainTypeRef(ApiModel):
    """The GrainType a table was published for; (uid, version) identifies a table."""

    namespace: str
    name: str
    uid: str
    generation: int = Field(0, ge=0)


class PlacementTableDocument(ApiModel):
    """Everything a worker needs to place a new activation of the table's grain types."""

    api_version: Literal["apportion.dev/v1alpha1"] = "apportion.dev/v1alpha1"
    kind: Literal["PlacementTable"] = TABLE_KIND
    grain_type: GrainTypeRef
    grain_types: list[str] = Field(description="Grain type names this table places.")
    default: bool = Field(
        False, description="Also places every grain type without a GrainType of its own."
    )
    version: int = Field(ge=0, description="Grows by one with every write of the table.")
    published_at: datetime
    strategy: GrainStrategySpec
    filters: list[PlacementFilter] = Field(default_factory=list)
    load_shedding: LoadShedding
    members: list[TableMember] = Field(description="Sorted by name, no duplicates.")

    @field_validator("members")
    @classmethod
    def _sorted_unique(cls, members: list[TableMember]) -> list[TableMember]:
        names = [m.name for m in members]
        if names != sorted(set(names)):
            raise ValueError("members must be sorted by name and unique")
        return members

    def member_names(self) -> list[str]:
        return [m.name for m in self.members]

    def overloaded_members(self) -> list[str]:
        return [m.name for m in self.members if m.stats is not None and m.stats.overloaded]

    def to_json(self) -> str:
        """The compact JSON text stored under `placement.json`. Members keep every field (an
        omitted `stats` means "not reported", never "zero")."""
        return json.dumps(
            self.model_dump(mode="json", by_alias=True, exclude_none=True),
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> PlacementTableDocument:
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            raise PlacementTableFormatError(f"{where}: {first['msg']}") from None


# ----------------------------------------------------------------------------------- ConfigMap


def to_configmap(
    doc: PlacementTableDocument, *, owner_api_version: str = API_VERSION
) -> dict[str, Any]:
    """The whole ConfigMap, owned by its GrainType (controller=true, so the garbage collector
    deletes it with the GrainType)."""
    ref = doc.grain_type
    text = doc.to_json()
    if len(text.encode()) > MAX_TABLE_BYTES:
        raise PlacementTableFormatError(
            f"placement table of {ref.name!r} is {len(text.encode())} bytes with "
            f"{len(doc.members)} members; a ConfigMap holds at most {MAX_TABLE_BYTES}"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(ref.name),
            "namespace": ref.namespace,
            "labels": {**MANAGED_BY, TABLE_LABEL: "true"},
            "annotations": {
                GRAIN_TYPE_ANNOTATION: ref.name,
                VERSION_ANNOTATION: str(doc.version),
            },
            "ownerReferences": [
                {
                    "apiVersion": owner_api_version,
                    "kind": "GrainType",
                    "name": ref.name,
                    "uid": ref.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {DATA_KEY: text},
    }


def from_configmap(configmap: Mapping[str, Any]) -> PlacementTableDocument:
    """Parse a placement-table ConfigMap as the API server returns it."""
    name = (configmap.get("metadata") or {}).get("name", "?")
    text = (configmap.get("data") or {}).get(DATA_KEY)
    if not isinstance(text, str):
        raise PlacementTableFormatError(f"ConfigMap {name!r} has no {DATA_KEY!r} key")
    try:
        return PlacementTableDocument.from_json(text)
    except PlacementTableFormatError as error:
        raise PlacementTableFormatError(f"ConfigMap {name!r}: {error}") from None


# --------------------------------------------------------------------------------- hysteresis


class ChangeKind(IntEnum):
    """How much a candidate table differs from the published one; higher is more urgent."""

    NONE = 0
    """Nothing, or only load moves within the hysteresis: not written."""
    LOAD = 1
    """A load figure moved beyond the hysteresis: written on the load period."""
    MEMBERSHIP = 2
    """Members joined, left or changed labels or address: written at once."""
    SPEC = 3
    """Strategy, filters, load shedding or grain types changed: written at once."""


@dataclass(frozen=True, slots=True)
class TableChange:
    kind: ChangeKind
    reason: str = ""

    @property
    def urgent(self) -> bool:
        return self.kind >= ChangeKind.MEMBERSHIP


NO_CHANGE: Final = TableChange(ChangeKind.NONE)


def _moved(old: float, new: float, scale: float, hysteresis_percent: int) -> bool:
    return abs(new - old) * 100 > hysteresis_percent * scale


def _stats_change(
    name: str, old: TableStats | None, new: TableStats | None, hysteresis_percent: int
) -> str | None:
    if old is None or new is None:
        return None if old is new else f"{name} {'reported' if old is None else 'went silent'}"
    if old.overloaded != new.overloaded:
        return f"{name} {'overloaded' if new.overloaded else 'no longer overloaded'}"
    if old.cpu_count != new.cpu_count:
        return f"{name} cpuCount {old.cpu_count} -> {new.cpu_count}"
    # CPU and memory move against their range (0..100 %), memory sizes against the member's
    # limit, activation counts relative to themselves.
    memory_scale = max(old.max_available_memory, new.max_available_memory, 1)
    checks = (
        ("cpuUsage", old.cpu_usage, new.cpu_usage, 100.0),
        ("memoryUsage", old.memory_usage, new.memory_usage, 100.0),
        ("availableMemory", old.available_memory, new.available_memory, memory_scale),
        ("maxAvailableMemory", old.max_available_memory, new.max_available_memory, memory_scale),
        (
            "activationCount",
            old.activation_count,
            new.activation_count,
            max(old.activation_count, new.activation_count, 1),
        ),
    )
    for field, before, after, scale in checks:
        if _moved(before, after, scale, hysteresis_percent):
            return f"{name} {field} {before:g} -> {after:g}"
    return None


def classify_change(
    published: PlacementTableDocument | None,
    candidate: PlacementTableDocument,
    hysteresis_percent: int,
) -> TableChange:
    """Compare what would be published now with what was published last (not with the previous
    candidate, so slow drifts add up until they cross the hysteresis)."""
    if published is None:
        return TableChange(ChangeKind.SPEC, "first table")
    if (
        published.grain_type.uid != candidate.grain_type.uid
        or published.grain_types != candidate.grain_types
        or published.default != candidate.default
        or published.strategy != candidate.strategy
        or published.filters != candidate.filters
        or published.load_shedding != candidate.load_shedding
    ):
        return TableChange(ChangeKind.SPEC, "GrainType spec changed")
    old_names, new_names = published.member_names(), candidate.member_names()
    if old_names != new_names:
        joined = sorted(set(new_names) - set(old_names))
        left = sorted(set(old_names) - set(new_names))
        parts = ([f"joined {joined}"] if joined else []) + ([f"left {left}"] if left else [])
        return TableChange(ChangeKind.MEMBERSHIP, "members " + ", ".join(parts))
    for old, new in zip(published.members, candidate.members, strict=True):
        if old.labels != new.labels or old.address != new.address:
            return TableChange(ChangeKind.MEMBERSHIP, f"{new.name} changed labels or address")
    for old, new in zip(published.members, candidate.members, strict=True):
        reason = _stats_change(new.name, old.stats, new.stats, hysteresis_percent)
        if reason is not None:
            return TableChange(ChangeKind.LOAD, reason)
    return NO_CHANGE
