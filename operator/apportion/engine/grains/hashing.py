"""Hash strategies: Orleans' mod-n HashBased and our ConsistentHashBased, which moves only the
grains of the member that joined or left."""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, Self

import xxhash

from .base import CandidateView, GrainStrategy
from .basic import positive_int
from .context import PlacementContext
from .errors import GrainSpecError
from .filters import GrainFilter
from .table import PlacementTable
from .trace import Trace

_xxh3_64 = xxhash.xxh3_64_intdigest

DEFAULT_VIRTUAL_NODES = 100
"""Ring points per member (the GrainType default, as Dapr); member shares spread ~1/sqrt(100)."""


def grain_hash(grain_id: str) -> int:
    """Stable 64-bit hash of a grain id: xxh3-64 of its UTF-8 bytes (seed 0).

    Orleans hashes its binary GrainId with JenkinsHash; ours hashes the id string, which is what
    apportion's workers have, and is stable across processes, versions and platforms.
    """
    return _xxh3_64(grain_id.encode())


class HashBasedPlacement(GrainStrategy):
    """`sorted_members[(hash & 0x7fffffff) % n]` (Orleans HashBasedPlacementDirector); most
    grains remap when membership changes."""

    name = "HashBased"

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        names = view.names
        index = (_xxh3_64(grain_id.encode()) & 0x7FFFFFFF) % len(names)
        if trace is not None:
            trace.consider(names[index], None, index=float(index))
            trace.note(f"(hash & 0x7fffffff) % {len(names)} = {index}")
        return names[index]


class HashRing:
    """Consistent hashing with virtual nodes (Karger et al., STOC 1997): a grain belongs to the
    first member point clockwise from its hash."""

    __slots__ = ("owners", "points")

    def __init__(self, names: Sequence[str], virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> None:
        ring = sorted(
            (_xxh3_64(f"{name}\x00{v}".encode()), name)
            for name in names
            for v in range(virtual_nodes)
        )
        self.points = [point for point, _ in ring]
        self.owners = [name for _, name in ring]

    def owner(self, h: int) -> str:
        i = bisect_right(self.points, h)
        return self.owners[i if i < len(self.points) else 0]


class ConsistentHashBasedPlacement(GrainStrategy):
    """Our consistent variant of HashBased (asked for in orleans#1806): a ring with
    `virtual_nodes` points per member, so a membership change moves only ~1/n of the grains."""

    name = "ConsistentHashBased"

    def __init__(
        self,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> None:
        if virtual_nodes < 1:
            raise GrainSpecError(f"virtualNodes must be >= 1, got {virtual_nodes}")
        super().__init__(filters=filters, rng=rng)
        self.virtual_nodes = virtual_nodes
        # Rings depend only on member names: keep them across load-only table updates.
        self._rings: dict[tuple[str, ...], HashRing] = {}
        self._previous_rings: dict[tuple[str, ...], HashRing] = {}

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        virtual_nodes = positive_int(spec, "virtualNodes", DEFAULT_VIRTUAL_NODES)
        return cls(virtual_nodes or DEFAULT_VIRTUAL_NODES, filters=filters, rng=rng)

    def describe(self) -> str:
        return f"{self.name}(virtualNodes={self.virtual_nodes})"

    def update(self, table: PlacementTable) -> None:
        super().update(table)
        self._previous_rings, self._rings = self._rings, {}

    def prepare(self, view: CandidateView) -> None:
        ring = self._rings.get(view.names) or self._previous_rings.get(view.names)
        if ring is None:
            ring = HashRing(view.names, self.virtual_nodes)
        self._rings[view.names] = ring
        view.data = ring

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        h = _xxh3_64(grain_id.encode())
        owner: str = view.data.owner(h)
        if trace is not None:
            trace.consider(owner, None, hash=float(h))
            trace.note(f"ring of {len(view.names)} members x {self.virtual_nodes} points")
        return owner
