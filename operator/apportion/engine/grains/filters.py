"""Placement filters (Orleans 9.2 silo-metadata filters): narrow the members a strategy may
choose from by comparing member metadata (pod labels) with the caller's. They run in list order,
before the strategy, and their result is cached per table and caller, so they cost nothing per
placement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from .errors import GrainSpecError
from .table import PlacementTable


@dataclass(frozen=True, slots=True)
class FilterStep:
    """What one filter did, for `explain`."""

    filter: str
    kept: tuple[str, ...]
    removed: tuple[str, ...]


class GrainFilter(ABC):
    """A pure function of (table, candidate indices, caller metadata) to the kept indices,
    in table order. Custom filters subclass this and register under the
    `apportion.grain_filters` entry-point group; the entry-point name is the filter `type`."""

    type_name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        """Build from the camelCase filter spec `{type, keys, minCandidates, ...}`."""

    @abstractmethod
    def apply(
        self, table: PlacementTable, candidates: tuple[int, ...], caller: Mapping[str, str]
    ) -> tuple[int, ...]:
        """Return the subset of `candidates` (indices into `table.members`) to keep."""

    def describe(self) -> str:
        return self.type_name


def _keys(spec: Mapping[str, Any], type_name: str) -> tuple[str, ...]:
    keys = spec.get("keys")
    if (
        not isinstance(keys, Sequence)
        or isinstance(keys, str)
        or not keys
        or not all(isinstance(k, str) and k for k in keys)
    ):
        raise GrainSpecError(f"{type_name} filter needs `keys`: a non-empty list of label keys")
    if len(set(keys)) != len(keys):
        raise GrainSpecError(f"{type_name} filter has duplicate keys: {list(keys)}")
    return tuple(keys)


class RequiredMatch(GrainFilter):
    """Keep members whose metadata equals the caller's on every key (a key missing on both
    sides matches, as in Orleans' RequiredMatchSiloMetadataPlacementFilter)."""

    type_name = "RequiredMatch"

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise GrainSpecError("RequiredMatch needs at least one key")
        self.keys = tuple(keys)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        return cls(_keys(spec, cls.type_name))

    def apply(
        self, table: PlacementTable, candidates: tuple[int, ...], caller: Mapping[str, str]
    ) -> tuple[int, ...]:
        wanted = [(key, caller.get(key)) for key in self.keys]
        members = table.members
        return tuple(
            i
            for i in candidates
            if all(members[i].labels.get(key) == value for key, value in wanted)
        )

    def describe(self) -> str:
        return f"RequiredMatch({', '.join(self.keys)})"


class PreferredMatch(GrainFilter):
    """Prefer members matching the caller on the ordered keys; the last key matters most.

    A member's score is how many keys it matches counting back from the last key, stopping at
    the first mismatch; the filter keeps the highest score level that still leaves at least
    `min_candidates` members, i.e. it drops the earliest keys until enough remain (Orleans'
    PreferredMatchSiloMetadataPlacementFilter). No match at all, no caller metadata, or no more
    than `min_candidates` members: everything is kept.
    """

    type_name = "PreferredMatch"

    def __init__(self, ordered_keys: Sequence[str], min_candidates: int = 2) -> None:
        if not ordered_keys:
            raise GrainSpecError("PreferredMatch needs at least one key")
        if min_candidates < 1:
            raise GrainSpecError(f"PreferredMatch minCandidates must be >= 1, got {min_candidates}")
        self.keys = tuple(ordered_keys)
        self.min_candidates = min_candidates

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        min_candidates = spec.get("minCandidates", 2)
        if isinstance(min_candidates, bool) or not isinstance(min_candidates, int):
            raise GrainSpecError(
                f"PreferredMatch minCandidates must be an integer, got {min_candidates!r}"
            )
        return cls(_keys(spec, cls.type_name), min_candidates)

    def apply(
        self, table: PlacementTable, candidates: tuple[int, ...], caller: Mapping[str, str]
    ) -> tuple[int, ...]:
        if not caller or len(candidates) <= self.min_candidates:
            return candidates
        members = table.members
        scores = []
        for i in candidates:
            labels = members[i].labels
            score = 0
            for key in reversed(self.keys):
                value = caller.get(key)
                if value is None or labels.get(key) != value:
                    break
                score += 1
            scores.append(score)
        if max(scores) == 0:
            return candidates
        at_least = [0] * (len(self.keys) + 2)
        for score in scores:
            at_least[score] += 1
        for level in range(len(self.keys) - 1, -1, -1):
            at_least[level] += at_least[level + 1]
        cutoff = next(
            level
            for level in range(len(self.keys), -1, -1)
            if at_least[level] >= self.min_candidates
        )
        return tuple(i for i, score in zip(candidates, scores, strict=True) if score >= cutoff)

    def describe(self) -> str:
        return f"PreferredMatch({', '.join(self.keys)}; minCandidates={self.min_candidates})"


BUILTIN_FILTERS: Mapping[str, type[GrainFilter]] = {
    RequiredMatch.type_name: RequiredMatch,
    PreferredMatch.type_name: PreferredMatch,
}
