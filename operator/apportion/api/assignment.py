"""The assignment table of a PartitionSet or ShardSet and its ConfigMap wire format.

The operator is the only writer; worker pods in any language read it, so the format is specified
in docs/assignment-format.md (with a JSON Schema) and this module is its reference implementation.
Pure: ConfigMaps go in and out as plain dicts, the publishing layer does the API calls.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final, Literal

API_VERSION: Final = "apportion.dev/v1alpha1"
TABLE_KIND: Final = "Assignment"
INDEX_KIND: Final = "AssignmentIndex"

DATA_KEY: Final = "assignments.json"
GZIP_KEY: Final = "assignments.json.gz"
INDEX_KEY: Final = "assignments.index.json"
CHUNK_KEY: Final = "assignments.part"

# A plain table stays readable (`kubectl get cm -o yaml`) up to this many bytes of JSON.
INLINE_LIMIT: Final = 64 * 1024
# The API server caps data + binaryData (decoded) at 1 MiB per ConfigMap; keep headroom.
CHUNK_LIMIT: Final = 768 * 1024
# A reader never inflates more than this, whatever a ConfigMap claims.
MAX_DOCUMENT_BYTES: Final = 64 * 1024 * 1024

_ANNOTATION_PREFIX: Final = "apportion.dev/"
_ANNOTATION_NAME_MAX: Final = 63

Layout = Literal["map", "indexed"]


class AssignmentFormatError(ValueError):
    """The ConfigMaps (or an ack annotation) do not hold a valid assignment document."""


class IncompleteAssignment(AssignmentFormatError):
    """Chunks are missing or do not match their index: a read raced a write; read again."""


def ack_annotation_key(set_kind: str, set_name: str) -> str:
    """The Pod annotation through which a worker acknowledges releases for one set.

    An annotation's name part is at most 63 characters; long set names are cut and suffixed
    with a digest so that two sets never share a key.
    """
    local = f"ack.{set_kind.lower()}.{set_name}"
    if len(local) > _ANNOTATION_NAME_MAX:
        digest = hashlib.sha256(local.encode()).hexdigest()[:10]
        local = f"{local[: _ANNOTATION_NAME_MAX - len(digest) - 1]}-{digest}"
    return _ANNOTATION_PREFIX + local


def _unit_sort_key(unit: str) -> tuple[int, int, str]:
    # Partition and shard ids are decimal numbers; order them as numbers, anything else after.
    if unit.isdecimal() and unit.isascii() and (unit == "0" or unit[0] != "0"):
        return (0, int(unit), "")
    return (1, 0, unit)


def unit_order(units: Iterable[str]) -> tuple[str, ...]:
    """The canonical order of units: numbers numerically, then other names lexicographically."""
    return tuple(sorted(units, key=_unit_sort_key))


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """The PartitionSet or ShardSet a table belongs to; (uid, epoch) versions the table."""

    kind: str
    namespace: str
    name: str
    uid: str

    @property
    def ack_annotation(self) -> str:
        return ack_annotation_key(self.kind, self.name)


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One incarnation of a worker pod: a StatefulSet pod keeps its name, never its uid."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Release:
    """A hand-off in progress: the owner must stop serving the unit and acknowledge."""

    to: str
    since: float  # operator clock (Unix seconds) when the release was first published
    epoch: int  # table epoch that first published this release; older acks do not count


@dataclass(frozen=True, slots=True)
class UnitState:
    """Nominal owner of a unit, the epoch at which it got it (the unit's fencing token), and a
    release in progress if any."""

    owner: str | None
    epoch: int
    releasing: Release | None = None


UNOWNED: Final = UnitState(owner=None, epoch=0)

FORMAT_VERSION: Final = 2
"""Version 2 adds `lineage` (online resharding); a version 1 reader ignores it, safely
(docs/assignment-format.md, "Resharding")."""


@dataclass(frozen=True, slots=True)
class Lineage:
    """How this table's units derive from the table before a change of count: the table of
    `epoch` turned `from_count` units into `to_count` (the table's count) by splitting each unit
    into `to_count / from_count` children, or by merging groups of `from_count / to_count`
    siblings. Unit `u` of `n` holds the hash range [⌈u·2⁶⁴/n⌉, ⌈(u+1)·2⁶⁴/n⌉) (keyScheme
    apportion), so the children's ranges tile their parent's."""

    from_count: int
    to_count: int
    epoch: int
    parent_epochs: tuple[int, ...] = ()
    """Token of each unit of `from_count` in the table just before `epoch`: a worker carries
    a parent's in-memory state into its children only if it served the parent under exactly
    this token (else it missed a change of owner and its state is stale)."""

    def __post_init__(self) -> None:
        small, big = sorted((self.from_count, self.to_count))
        if small < 1 or big % small or small == big:
            raise AssignmentFormatError(
                f"lineage: {self.from_count} -> {self.to_count} is not a split or merge by an "
                "integer factor"
            )
        if len(self.parent_epochs) != self.from_count or any(
            not 0 <= e < self.epoch for e in self.parent_epochs
        ):
            raise AssignmentFormatError(
                "lineage.parentEpochs: one token per previous unit, each below lineage.epoch"
            )

    @property
    def split(self) -> bool:
        return self.to_count > self.from_count

    @property
    def factor(self) -> int:
        small, big = sorted((self.from_count, self.to_count))
        return big // small

    def parents(self, unit: int) -> range:
        """Units of the previous count whose keys unit `unit` (of `to_count`) now holds."""
        k = self.factor
        return range(unit // k, unit // k + 1) if self.split else range(k * unit, k * unit + k)

    def children(self, old_unit: int) -> range:
        """Units of `to_count` that hold the keys of unit `old_unit` (of `from_count`)."""
        k = self.factor
        return (
            range(k * old_unit, k * old_unit + k)
            if self.split
            else range(old_unit // k, old_unit // k + 1)
        )


@dataclass(frozen=True, slots=True)
class Suspensions:
    """How often this pod incarnation stopped serving because its serving lease ran out
    (docs/handoff.md), and how long the last time lasted, in seconds."""

    count: int
    last_seconds: float


@dataclass(frozen=True, slots=True)
class Ack:
    """What a worker writes on its own Pod, annotation `ResourceRef.ack_annotation`.

    Reads: "I am pod incarnation `uid`; I have processed table `epoch`; every unit that table
    marks releasing from me has been released, except `pending`." `failing`: pending units whose
    release callback failed, with why; the worker retries them (optional, for the operator to
    report; an ack without it says nothing is failing). `suspended`: the serving lease ran out
    (optional; the operator reports each new one, since none could be written while it lasted).
    """

    uid: str
    epoch: int
    pending: frozenset[str] = frozenset()
    draining: bool = False
    failing: Mapping[str, str] = field(default_factory=dict)
    suspended: Suspensions | None = None

    def to_annotation(self) -> str:
        doc: dict[str, Any] = {
            "uid": self.uid,
            "epoch": self.epoch,
            "pending": list(unit_order(self.pending)),
            "draining": self.draining,
        }
        if self.failing:  # absent when empty: the ack of a worker with nothing failing is unchanged
            doc["failing"] = {unit: self.failing[unit] for unit in unit_order(self.failing)}
        if self.suspended is not None:
            doc["suspended"] = {
                "count": self.suspended.count,
                "lastSeconds": round(self.suspended.last_seconds, 1),
            }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_annotation(cls, text: str) -> Ack:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise AssignmentFormatError(f"ack annotation is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise AssignmentFormatError("ack annotation must be a JSON object")
        pending = doc.get("pending", [])
        if not isinstance(pending, list) or not all(isinstance(u, str) for u in pending):
            raise AssignmentFormatError("ack annotation: pending must be a list of unit names")
        draining = doc.get("draining", False)
        if not isinstance(draining, bool):
            raise AssignmentFormatError("ack annotation: draining must be a boolean")
        failing = doc.get("failing", {})
        if not isinstance(failing, dict) or not all(isinstance(m, str) for m in failing.values()):
            raise AssignmentFormatError("ack annotation: failing must map unit names to messages")
        suspended = doc.get("suspended")
        if suspended is not None:
            last = suspended.get("lastSeconds") if isinstance(suspended, dict) else None
            if (
                not isinstance(last, int | float)
                or isinstance(last, bool)
                or not 0 <= last < math.inf
            ):
                raise AssignmentFormatError(
                    "ack annotation: suspended must hold count and lastSeconds (seconds, >= 0)"
                )
            count = _count(suspended.get("count"), "ack annotation: suspended.count")
            suspended = Suspensions(count, float(last))
        return cls(
            uid=_string(doc.get("uid"), "ack annotation: uid"),
            epoch=_count(doc.get("epoch"), "ack annotation: epoch"),
            pending=frozenset(pending),
            draining=draining,
            failing=failing,
            suspended=suspended,
        )


@dataclass(frozen=True)
class AssignmentTable:
    """Which member owns each unit, under which epoch. Immutable; `units` is taken over as is.

    Invariants (checked on construction): member names are unique; every owner and every
    release target is a member; unit epochs never exceed the table epoch; only owned units
    are releasing, never to their own owner.
    """

    set_ref: ResourceRef
    generation: int
    key_scheme: str
    count: int
    epoch: int
    members: tuple[Incarnation, ...]
    units: Mapping[str, UnitState]
    lineage: Lineage | None = None
    serving_lease: float | None = None
    """Seconds a worker may serve after its last confirmation of the table (the serving lease,
    docs/handoff.md); None: no lease (KeepServing)."""

    def __post_init__(self) -> None:
        if self.lineage is not None and (
            self.lineage.to_count != self.count or self.lineage.epoch > self.epoch
        ):
            raise AssignmentFormatError("lineage: toCount must be count, epoch at most epoch")
        if self.serving_lease is not None and not 0 < self.serving_lease < math.inf:
            raise AssignmentFormatError("servingLease: must be a positive number of seconds")
        if not isinstance(self.units, MappingProxyType):
            object.__setattr__(self, "units", MappingProxyType(dict(self.units)))
        for name, value in (
            ("generation", self.generation),
            ("count", self.count),
            ("epoch", self.epoch),
        ):
            _count(value, name)
        names = self.member_uids
        if len(names) != len(self.members):
            raise AssignmentFormatError("members: duplicate member name")
        for unit, state in self.units.items():
            self._check_unit(unit, state, names)

    def _check_unit(self, unit: str, state: UnitState, members: Mapping[str, str]) -> None:
        if state.owner is not None and state.owner not in members:
            raise AssignmentFormatError(f"unit {unit!r}: owner {state.owner!r} is not a member")
        if not 0 <= state.epoch <= self.epoch:
            raise AssignmentFormatError(
                f"unit {unit!r}: epoch {state.epoch} outside 0..{self.epoch}"
            )
        release = state.releasing
        if release is None:
            return
        if state.owner is None or release.to == state.owner or release.to not in members:
            raise AssignmentFormatError(
                f"unit {unit!r}: a release needs an owner and another member as target"
            )
        if not state.epoch <= release.epoch <= self.epoch or not math.isfinite(release.since):
            raise AssignmentFormatError(f"unit {unit!r}: release epoch or time out of range")

    @classmethod
    def initial(
        cls,
        set_ref: ResourceRef,
        *,
        generation: int,
        key_scheme: str,
        count: int,
        units: Iterable[str] | None = None,
    ) -> AssignmentTable:
        """Epoch 0, nobody owns anything: what the operator steps from before its first write."""
        names = (str(i) for i in range(count)) if units is None else units
        return cls(set_ref, generation, key_scheme, count, 0, (), {unit: UNOWNED for unit in names})

    @cached_property
    def unit_names(self) -> tuple[str, ...]:
        return unit_order(self.units)

    @cached_property
    def member_uids(self) -> Mapping[str, str]:
        return MappingProxyType({m.name: m.uid for m in self.members})

    def owners(self) -> dict[str, str | None]:
        """unit → nominal owner (a releasing unit still belongs to its owner)."""
        return {unit: self.units[unit].owner for unit in self.unit_names}

    def by_member(self) -> dict[str, list[str]]:
        """member → units it nominally owns, for every member (placement input, deletion cost)."""
        result: dict[str, list[str]] = {m.name: [] for m in self.members}
        for unit in self.unit_names:
            owner = self.units[unit].owner
            if owner is not None:
                result[owner].append(unit)
        return result

    def releasing(self) -> dict[str, Release]:
        return {
            unit: state.releasing
            for unit in self.unit_names
            if (state := self.units[unit]).releasing is not None
        }


# ---------------------------------------------------------------------------------- documents


def to_document(table: AssignmentTable, layout: Layout = "map") -> dict[str, Any]:
    """The JSON document of a table: `map` is readable, `indexed` is compact (big tables)."""
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": TABLE_KIND,
        "set": {
            "kind": table.set_ref.kind,
            "namespace": table.set_ref.namespace,
            "name": table.set_ref.name,
            "uid": table.set_ref.uid,
        },
        "generation": table.generation,
        "keyScheme": table.key_scheme,
        "count": table.count,
        "ackAnnotation": table.set_ref.ack_annotation,
        "epoch": table.epoch,
        "members": [{"name": m.name, "uid": m.uid} for m in table.members],
        "layout": layout,
    }
    order = table.unit_names
    states = [table.units[unit] for unit in order]
    if layout == "map":
        doc["units"] = {unit: s.owner for unit, s in zip(order, states, strict=True)}
        doc["unitEpochs"] = {unit: s.epoch for unit, s in zip(order, states, strict=True)}
    elif layout == "indexed":
        if order != tuple(str(i) for i in range(len(order))):
            doc["unitNames"] = list(order)
        index = {m.name: i for i, m in enumerate(table.members)}
        doc["owners"] = [-1 if s.owner is None else index[s.owner] for s in states]
        doc["unitEpochs"] = [s.epoch for s in states]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if table.lineage is not None:
        doc["formatVersion"] = FORMAT_VERSION
        doc["lineage"] = {
            "fromCount": table.lineage.from_count,
            "epoch": table.lineage.epoch,
            "parentEpochs": list(table.lineage.parent_epochs),
        }
    if table.serving_lease is not None:
        doc["servingLease"] = table.serving_lease
    doc["releasing"] = {
        unit: {
            "from": s.owner,
            "to": s.releasing.to,
            "since": s.releasing.since,
            "epoch": s.releasing.epoch,
        }
        for unit, s in zip(order, states, strict=True)
        if s.releasing is not None
    }
    return doc


def from_document(doc: Any) -> AssignmentTable:
    """Parse and check a document of either layout; errors name the offending field."""
    if not isinstance(doc, dict):
        raise AssignmentFormatError("assignment document must be a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != TABLE_KIND:
        raise AssignmentFormatError(
            f"unsupported document {doc.get('apiVersion')!r}/{doc.get('kind')!r}; "
            f"this reader understands {API_VERSION}/{TABLE_KIND}"
        )
    set_doc = _object(doc.get("set"), "set")
    set_ref = ResourceRef(
        *(_string(set_doc.get(k), f"set.{k}") for k in ("kind", "namespace", "name", "uid"))
    )
    members = tuple(
        _member(m, f"members[{i}]") for i, m in enumerate(_array(doc.get("members"), "members"))
    )
    layout = doc.get("layout")
    if layout == "map":
        owners, epochs = _map_layout(doc)
    elif layout == "indexed":
        owners, epochs = _indexed_layout(doc, members)
    else:
        raise AssignmentFormatError(f"layout: expected 'map' or 'indexed', got {layout!r}")
    releasing = _releases(_object(doc.get("releasing", {}), "releasing"), owners)
    units = {
        unit: UnitState(owner, epoch, releasing.get(unit))
        for unit, owner, epoch in zip(owners, owners.values(), epochs, strict=True)
    }
    count = _count(doc.get("count"), "count")
    lineage = None
    if "lineage" in doc:
        entry = _object(doc["lineage"], "lineage")
        lineage = Lineage(
            _count(entry.get("fromCount"), "lineage.fromCount"),
            count,
            _count(entry.get("epoch"), "lineage.epoch"),
            tuple(
                _count(e, "lineage.parentEpochs[]")
                for e in _array(entry.get("parentEpochs"), "lineage.parentEpochs")
            ),
        )
    return AssignmentTable(
        set_ref=set_ref,
        generation=_count(doc.get("generation"), "generation"),
        key_scheme=_string(doc.get("keyScheme"), "keyScheme"),
        count=count,
        epoch=_count(doc.get("epoch"), "epoch"),
        members=members,
        units=units,
        lineage=lineage,
        serving_lease=_seconds_or_none(doc.get("servingLease"), "servingLease"),
    )


def _seconds_or_none(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AssignmentFormatError(f"{path}: expected a number of seconds, got {value!r}")
    return float(value)


def _member(value: Any, path: str) -> Incarnation:
    value = _object(value, path)
    return Incarnation(
        _string(value.get("name"), f"{path}.name"), _string(value.get("uid"), f"{path}.uid")
    )


def _map_layout(doc: dict[str, Any]) -> tuple[dict[str, str | None], list[int]]:
    units = _object(doc.get("units"), "units")
    epochs = _object(doc.get("unitEpochs"), "unitEpochs")
    if units.keys() != epochs.keys():
        raise AssignmentFormatError("unitEpochs must have exactly the keys of units")
    owners = {
        unit: None if owner is None else _string(owner, f"units[{unit!r}]")
        for unit, owner in units.items()
    }
    return owners, [_count(epochs[unit], f"unitEpochs[{unit!r}]") for unit in owners]


def _indexed_layout(
    doc: dict[str, Any], members: tuple[Incarnation, ...]
) -> tuple[dict[str, str | None], list[int]]:
    indexes = _array(doc.get("owners"), "owners")
    epochs = _array(doc.get("unitEpochs"), "unitEpochs")
    if "unitNames" in doc:
        names = [_string(u, "unitNames[]") for u in _array(doc["unitNames"], "unitNames")]
    else:
        names = [str(i) for i in range(len(indexes))]
    if not len(names) == len(indexes) == len(epochs):
        raise AssignmentFormatError("owners, unitEpochs (and unitNames) must have equal length")
    if len(set(names)) != len(names):
        raise AssignmentFormatError("unitNames: duplicate unit")
    owners: dict[str, str | None] = {}
    for unit, index in zip(names, indexes, strict=True):
        if type(index) is not int or not -1 <= index < len(members):
            raise AssignmentFormatError(
                f"owners[{unit!r}]: expected -1 or a member index below {len(members)}"
            )
        owners[unit] = None if index < 0 else members[index].name
    return owners, [_count(e, "unitEpochs[]") for e in epochs]


def _releases(doc: dict[str, Any], owners: Mapping[str, str | None]) -> dict[str, Release]:
    releases = {}
    for unit, entry in doc.items():
        path = f"releasing[{unit!r}]"
        entry = _object(entry, path)
        if unit not in owners or entry.get("from") != owners[unit]:
            raise AssignmentFormatError(f"{path}: 'from' must be the unit's owner")
        since = entry.get("since")
        if isinstance(since, bool) or not isinstance(since, int | float):
            raise AssignmentFormatError(f"{path}.since: expected a number")
        releases[unit] = Release(
            to=_string(entry.get("to"), f"{path}.to"),
            since=float(since),
            epoch=_count(entry.get("epoch"), f"{path}.epoch"),
        )
    return releases


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AssignmentFormatError(f"{path}: expected an object")
    return value


def _array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise AssignmentFormatError(f"{path}: expected an array")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise AssignmentFormatError(f"{path}: expected a non-empty string")
    return value


def _count(value: Any, path: str) -> int:
    if type(value) is not int or value < 0:
        raise AssignmentFormatError(f"{path}: expected a non-negative integer, got {value!r}")
    return value


# -------------------------------------------------------------------------------- ConfigMaps


@dataclass(frozen=True)
class ConfigMapPayload:
    """Contents of one ConfigMap: named `<base name><suffix>`; `binary_data` values are base64,
    as in the API. The root has suffix ""; chunks have "-<epoch>-<i>"."""

    suffix: str
    data: Mapping[str, str] = field(default_factory=dict)
    binary_data: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes the API server counts against its 1 MiB ConfigMap limit."""
        return sum(len(v.encode()) for v in self.data.values()) + sum(
            len(v) * 3 // 4 - v.count("=") for v in self.binary_data.values()
        )

    @property
    def wire_size(self) -> int:
        """Bytes of data and binaryData values as they travel in JSON (base64 included)."""
        return sum(len(v.encode()) for v in self.data.values()) + sum(
            len(v) for v in self.binary_data.values()
        )

    def body(self) -> dict[str, dict[str, str]]:
        """The `data` and `binaryData` fields of the ConfigMap (replace both on every write)."""
        return {"data": dict(self.data), "binaryData": dict(self.binary_data)}

    @classmethod
    def from_configmap(cls, configmap: Mapping[str, Any], base_name: str) -> ConfigMapPayload:
        name = configmap.get("metadata", {}).get("name", "")
        if not name.startswith(base_name):
            raise AssignmentFormatError(f"ConfigMap {name!r} is not part of {base_name!r}")
        return cls(
            suffix=name[len(base_name) :],
            data=configmap.get("data") or {},
            binary_data=configmap.get("binaryData") or {},
        )


def encode_assignment(
    table: AssignmentTable, *, inline_limit: int = INLINE_LIMIT, chunk_limit: int = CHUNK_LIMIT
) -> list[ConfigMapPayload]:
    """The ConfigMaps holding `table`, root first. Deterministic: same table, same bytes.

    Small tables: readable `map` JSON in `data`. Otherwise the `indexed` layout, gzipped, in
    `binaryData`; past `chunk_limit` the gzip stream is split into chunk ConfigMaps named by
    epoch and the root holds an index with their checksums. Write the chunks first and the root
    last: readers follow the root, so they never see a half-written table.
    """
    # The map layout needs well over 12 bytes per unit; skip building it when it cannot fit.
    if len(table.units) * 12 <= inline_limit:
        plain = _json_bytes(to_document(table, "map"))
        if len(plain) <= inline_limit:
            return [ConfigMapPayload("", data={DATA_KEY: plain.decode()})]
    blob = gzip.compress(_json_bytes(to_document(table, "indexed")), compresslevel=9, mtime=0)
    if len(blob) <= chunk_limit:
        return [ConfigMapPayload("", binary_data={GZIP_KEY: _b64(blob)})]
    parts = [blob[i : i + chunk_limit] for i in range(0, len(blob), chunk_limit)]
    chunks = [
        ConfigMapPayload(f"-{table.epoch}-{i}", binary_data={CHUNK_KEY: _b64(part)})
        for i, part in enumerate(parts)
    ]
    index = {
        "apiVersion": API_VERSION,
        "kind": INDEX_KIND,
        "set": {
            "kind": table.set_ref.kind,
            "namespace": table.set_ref.namespace,
            "name": table.set_ref.name,
            "uid": table.set_ref.uid,
        },
        "epoch": table.epoch,
        "encoding": "gzip",
        "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "chunks": [
            {"suffix": c.suffix, "size": len(p), "sha256": hashlib.sha256(p).hexdigest()}
            for c, p in zip(chunks, parts, strict=True)
        ],
    }
    root = ConfigMapPayload("", data={INDEX_KEY: _json_bytes(index).decode()})
    return [root, *chunks]


def chunk_suffixes(root: ConfigMapPayload) -> tuple[str, ...]:
    """Suffixes of the chunk ConfigMaps a reader must fetch besides the root (often none)."""
    if INDEX_KEY not in root.data:
        return ()
    return tuple(c["suffix"] for c in _index(root)["chunks"])


def decode_assignment(configmaps: Iterable[ConfigMapPayload]) -> AssignmentTable:
    """The table held by a root ConfigMap (suffix "") and, when it is an index, its chunks.

    Raises IncompleteAssignment when chunks are missing or stale (read again), and
    AssignmentFormatError when the content is invalid.
    """
    by_suffix = {c.suffix: c for c in configmaps}
    root = by_suffix.get("")
    if root is None:
        raise AssignmentFormatError("no root ConfigMap (suffix '') among the payloads")
    if DATA_KEY in root.data:
        raw = root.data[DATA_KEY].encode()
    elif GZIP_KEY in root.binary_data:
        raw = _gunzip(_unb64(root.binary_data[GZIP_KEY], GZIP_KEY))
    elif INDEX_KEY in root.data:
        raw = _gunzip(_join_chunks(_index(root), by_suffix))
    else:
        raise AssignmentFormatError(
            f"ConfigMap holds none of {DATA_KEY!r}, {GZIP_KEY!r} (binaryData), {INDEX_KEY!r}"
        )
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise AssignmentFormatError(f"assignment document is not JSON: {exc}") from None
    return from_document(doc)


def _index(root: ConfigMapPayload) -> dict[str, Any]:
    try:
        index = json.loads(root.data[INDEX_KEY])
    except ValueError as exc:
        raise AssignmentFormatError(f"{INDEX_KEY} is not JSON: {exc}") from None
    index = _object(index, INDEX_KEY)
    if index.get("apiVersion") != API_VERSION or index.get("kind") != INDEX_KIND:
        raise AssignmentFormatError(
            f"{INDEX_KEY}: unsupported index {index.get('apiVersion')!r}/{index.get('kind')!r}"
        )
    if index.get("encoding") != "gzip":
        raise AssignmentFormatError(f"{INDEX_KEY}: unsupported encoding {index.get('encoding')!r}")
    for i, chunk in enumerate(_array(index.get("chunks"), f"{INDEX_KEY}.chunks")):
        chunk = _object(chunk, f"{INDEX_KEY}.chunks[{i}]")
        _string(chunk.get("suffix"), f"{INDEX_KEY}.chunks[{i}].suffix")
        _string(chunk.get("sha256"), f"{INDEX_KEY}.chunks[{i}].sha256")
    _string(index.get("sha256"), f"{INDEX_KEY}.sha256")
    return index


def _join_chunks(index: dict[str, Any], by_suffix: Mapping[str, ConfigMapPayload]) -> bytes:
    parts = []
    for chunk in index["chunks"]:
        payload = by_suffix.get(chunk["suffix"])
        if payload is None or CHUNK_KEY not in payload.binary_data:
            raise IncompleteAssignment(
                f"chunk {chunk['suffix']!r} of epoch {index.get('epoch')} is missing"
            )
        part = _unb64(payload.binary_data[CHUNK_KEY], f"chunk {chunk['suffix']!r}")
        if hashlib.sha256(part).hexdigest() != chunk["sha256"]:
            raise IncompleteAssignment(f"chunk {chunk['suffix']!r} does not match its checksum")
        parts.append(part)
    blob = b"".join(parts)
    if hashlib.sha256(blob).hexdigest() != index["sha256"]:
        raise IncompleteAssignment("chunks do not add up to the indexed table")
    return blob


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise AssignmentFormatError(f"{what}: invalid base64: {exc}") from None


def _gunzip(blob: bytes) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(blob, MAX_DOCUMENT_BYTES)
    except zlib.error as exc:
        raise AssignmentFormatError(f"assignment is not valid gzip: {exc}") from None
    if inflater.unconsumed_tail:
        raise AssignmentFormatError(f"assignment inflates beyond {MAX_DOCUMENT_BYTES} bytes")
    if not inflater.eof:
        raise AssignmentFormatError("assignment gzip stream is truncated")
    return raw
