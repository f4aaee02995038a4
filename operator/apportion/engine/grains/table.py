"""The immutable snapshot a grain strategy places against: members sorted by name, with their
metadata (pod labels) and smoothed load statistics, as the operator publishes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GrainMemberStats:
    """Smoothed statistics of one member (the operator smooths CPU and memory with
    `DualModeKalmanFilter` before publishing)."""

    cpu_usage: float = 0.0
    """Percent of the member's CPU in use, 0..100."""
    memory_usage: float = 0.0
    """Percent of the member's memory limit in use, 0..100."""
    available_memory: int = 0
    """Bytes still available to the member."""
    max_available_memory: int = 0
    """Bytes the member may use at most (its memory limit)."""
    activation_count: int = 0
    cpu_count: int = 1
    overloaded: bool = False
    """Set by the member itself (or the operator); load shedding thresholds add to it."""

    def __post_init__(self) -> None:
        if min(self.cpu_usage, self.memory_usage) < 0:
            raise ValueError("cpu_usage and memory_usage must be >= 0")
        if min(self.available_memory, self.max_available_memory, self.activation_count) < 0:
            raise ValueError("memory sizes and activation_count must be >= 0")
        if self.cpu_count < 1:
            raise ValueError("cpu_count must be >= 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GrainMemberStats:
        """Read the camelCase form used in placement tables."""
        return cls(
            cpu_usage=float(data.get("cpuUsage", 0.0)),
            memory_usage=float(data.get("memoryUsage", 0.0)),
            available_memory=int(data.get("availableMemory", 0)),
            max_available_memory=int(data.get("maxAvailableMemory", 0)),
            activation_count=int(data.get("activationCount", 0)),
            cpu_count=int(data.get("cpuCount", 1)),
            overloaded=bool(data.get("overloaded", False)),
        )


@dataclass(frozen=True, slots=True)
class GrainMember:
    """One compatible member (worker pod). `stats` is None until it has reported any."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY_LABELS)
    stats: GrainMemberStats | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GrainMember:
        stats = data.get("stats")
        return cls(
            name=str(data["name"]),
            labels=MappingProxyType(dict(data.get("labels") or {})),
            stats=None if stats is None else GrainMemberStats.from_dict(stats),
        )


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

    def is_overloaded(self, stats: GrainMemberStats | None) -> bool:
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

    members: tuple[GrainMember, ...]
    names: tuple[str, ...]
    index: Mapping[str, int]
    overloaded: tuple[bool, ...]
    has_stats: tuple[bool, ...]
    activation_counts: tuple[int, ...]
    version: str
    load_shedding: LoadSheddingThresholds

    def __init__(
        self,
        members: Iterable[GrainMember],
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
            (GrainMember.from_dict(m) for m in data.get("members", ())),
            version=data.get("version", 0),
            load_shedding=DEFAULT_LOAD_SHEDDING
            if shedding is None
            else LoadSheddingThresholds.from_dict(shedding),
        )

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"PlacementTable(version={self.version!r}, members={list(self.names)!r})"

    def member(self, name: str) -> GrainMember:
        return self.members[self.index[name]]


EMPTY_TABLE = PlacementTable(())
