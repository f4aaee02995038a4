"""The immutable snapshot a grain strategy places against: members sorted by name, with their
metadata (pod labels) and smoothed load statistics, as the operator publishes them: the
members are the published table's own `TableMember`s (apportion.api.placement_table), one type
for a member of a grain table from the operator to the strategies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from apportion.api.placement_table import PlacementTableDocument, TableMember, TableStats


@dataclass(frozen=True, slots=True)
class LoadSheddingThresholds:
    """Orleans' load shedding: a member above either threshold is overloaded and load-aware
    strategies place nothing new on it (Orleans `LoadSheddingOptions`, strictly greater than).
    Disabled, only a member's own `overloaded` flag counts."""

    cpu_threshold: float = 95.0
    memory_threshold: float = 90.0
    enabled: bool = True

    def __post_init__(self) -> None:
        for value in (self.cpu_threshold, self.memory_threshold):
            if not 0 <= value <= 100:
                raise ValueError("load shedding thresholds are percentages in 0..100")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadSheddingThresholds:
        """Read `{enabled, cpuThreshold, memoryThreshold}` (GrainType `spec.loadShedding`)."""
        defaults = cls()
        return cls(
            cpu_threshold=float(data.get("cpuThreshold", defaults.cpu_threshold)),
            memory_threshold=float(data.get("memoryThreshold", defaults.memory_threshold)),
            enabled=bool(data.get("enabled", True)),
        )

    def is_overloaded(self, stats: TableStats | None) -> bool:
        if stats is None:
            return False
        return stats.overloaded or (
            self.enabled
            and (stats.cpu_usage > self.cpu_threshold or stats.memory_usage > self.memory_threshold)
        )


DEFAULT_LOAD_SHEDDING = LoadSheddingThresholds()


class PlacementTable:
    """Members sorted by name plus per-member arrays precomputed once per snapshot, so that the
    per-placement work of every strategy is indexing, not scanning."""

    __slots__ = (
        "activation_counts",
        "has_stats",
        "index",
        "load_shedding",
        "members",
        "names",
        "overloaded",
        "version",
    )

    members: tuple[TableMember, ...]
    names: tuple[str, ...]
    index: Mapping[str, int]
    overloaded: tuple[bool, ...]
    has_stats: tuple[bool, ...]
    activation_counts: tuple[int, ...]
    version: str
    load_shedding: LoadSheddingThresholds

    def __init__(
        self,
        members: Iterable[TableMember],
        *,
        version: str | int = 0,
        load_shedding: LoadSheddingThresholds = DEFAULT_LOAD_SHEDDING,
    ) -> None:
        ordered = tuple(sorted(members, key=lambda m: m.name))
        names = tuple(m.name for m in ordered)
        if len(set(names)) != len(names):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate member names in placement table: {duplicates}")
        self.members = ordered
        self.names = names
        self.index = MappingProxyType({name: i for i, name in enumerate(names)})
        self.overloaded = tuple(load_shedding.is_overloaded(m.stats) for m in ordered)
        self.has_stats = tuple(m.stats is not None for m in ordered)
        self.activation_counts = tuple(
            0 if m.stats is None else m.stats.activation_count for m in ordered
        )
        self.version = str(version)
        self.load_shedding = load_shedding

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementTable:
        """Read `{version, members: [{name, labels, stats: {cpuUsage, ...}}], loadShedding}`."""
        shedding = data.get("loadShedding")
        return cls(
            (TableMember.model_validate(m) for m in data.get("members", ())),
            version=data.get("version", 0),
            load_shedding=DEFAULT_LOAD_SHEDDING
            if shedding is None
            else LoadSheddingThresholds.from_dict(shedding),
        )

    @classmethod
    def from_document(cls, doc: PlacementTableDocument) -> PlacementTable:
        """The snapshot of a published table, its members as they are."""
        return cls(
            doc.members,
            version=doc.version,
            load_shedding=LoadSheddingThresholds.from_dict(
                doc.load_shedding.model_dump(by_alias=True)
            ),
        )

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"PlacementTable(version={self.version!r}, members={list(self.names)!r})"

    def member(self, name: str) -> TableMember:
        return self.members[self.index[name]]


EMPTY_TABLE = PlacementTable(())
