"""The assignment table of a PartitionSet or ShardSet: units, owners, epochs, releases and the
acks workers write (docs/handoff.md). Pure."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final

API_VERSION: Final = "apportion.dev/v1alpha1"
_ANNOTATION_PREFIX: Final = "apportion.dev/"
_ANNOTATION_NAME_MAX: Final = 63


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


# ConfigMap names are DNS subdomains (253); chunk ConfigMaps append "-<epoch>-<i>".
_CONFIG_MAP_NAME_MAX = 253 - 32


def assignment_config_map(kind: str, name: str) -> str:
    """Name of the ConfigMap holding the assignment of the `kind` (PartitionSet, ShardSet) named
    `name`: `<name>-<kind>-assignment`, lower case. Names that would leave no room for chunk
    suffixes (`-<epoch>-<i>`) are cut and end in a digest, so two sets never share one."""
    full = f"{name}-{kind.lower()}-assignment"
    if len(full) <= _CONFIG_MAP_NAME_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: _CONFIG_MAP_NAME_MAX - len(digest) - 1].rstrip('-.')}-{digest}"


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
    """A hand-off in progress: the owner must stop serving the unit and acknowledge. `to`
    None: to nobody — the unit then waits unowned for the owner's next incarnation (a
    StatefulSet pod leaving under `rebalance.restartGrace`, docs/handoff.md)."""

    to: str | None
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
    `set_uid`: the set incarnation whose table `epoch` was, written only by a worker that saw
    the API server go back in time (an etcd restore; optional): the operator then knows that
    epochs up to `epoch` were seen, whatever its status says.
    """

    uid: str
    epoch: int
    pending: frozenset[str] = frozenset()
    draining: bool = False
    failing: Mapping[str, str] = field(default_factory=dict)
    suspended: Suspensions | None = None
    set_uid: str | None = None

    def to_annotation(self) -> str:
        doc: dict[str, Any] = {
            "uid": self.uid,
            "epoch": self.epoch,
            "pending": list(unit_order(self.pending)),
            "draining": self.draining,
        }
        if self.failing:  # absent when empty: the ack of a worker with nothing failing is unchanged
            doc["failing"] = {unit: self.failing[unit] for unit in unit_order(self.failing)}
        if self.set_uid is not None:
            doc["set"] = self.set_uid
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
        set_uid = doc.get("set")
        return cls(
            uid=_string(doc.get("uid"), "ack annotation: uid"),
            epoch=_count(doc.get("epoch"), "ack annotation: epoch"),
            pending=frozenset(pending),
            draining=draining,
            failing=failing,
            suspended=suspended,
            set_uid=None if set_uid is None else _string(set_uid, "ack annotation: set"),
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
        if state.owner is None or release.to == state.owner:
            raise AssignmentFormatError(
                f"unit {unit!r}: a release needs an owner and another member or null as target"
            )
        if release.to is not None and release.to not in members:
            raise AssignmentFormatError(
                f"unit {unit!r}: release target {release.to!r} is not a member"
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
