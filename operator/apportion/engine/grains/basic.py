"""Strategies that ignore load: Random, PreferLocal, StatelessWorker and SiloRoleBased, with the
semantics of the Orleans directors of the same names."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Self

from .base import CandidateView, GrainStrategy
from .context import PlacementContext
from .errors import GrainSpecError, NoCompatibleMember, StatelessWorkerAtCapacity
from .filters import GrainFilter
from .trace import Trace

DEFAULT_ROLE_LABEL = "apportion.dev/role"


def positive_int(spec: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GrainSpecError(f"{key} must be an integer >= 1, got {value!r}")
    return value


class RandomPlacement(GrainStrategy):
    """Uniformly random compatible member (Orleans RandomPlacementDirector)."""

    name = "Random"

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        if trace is not None:
            for member in view.names:
                trace.consider(member)
            trace.note(f"uniformly random among {len(view.names)} members")
        return self.random_name(view.names)


class PreferLocalPlacement(RandomPlacement):
    """The local member if it is compatible, else random (Orleans PreferLocalPlacementDirector)."""

    name = "PreferLocal"

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        position = view.local_position
        if position is None:
            if trace is not None:
                trace.note(f"local member {ctx.local_member!r} is not a candidate")
            return super().choose(view, grain_id, ctx, trace)
        if trace is not None:
            trace.consider(view.names[position])
            trace.note("local member is a candidate")
        return view.names[position]


class StatelessWorkerPlacement(PreferLocalPlacement):
    """Local placement with at most `max_local` activations per member (Orleans
    StatelessWorkerDirector + StatelessWorkerPlacement.MaxLocal, default the CPU count).

    At capacity the local member is not returned: `StatelessWorkerAtCapacity` tells the caller
    to reuse a local activation. When the local member is not a candidate, a random one is
    chosen (as Orleans does); the caller then knows nothing of its count, so no limit applies.
    """

    name = "StatelessWorker"

    def __init__(
        self,
        max_local: int | None = None,
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> None:
        if max_local is not None and max_local < 1:
            raise GrainSpecError(f"maxLocal must be >= 1, got {max_local}")
        super().__init__(filters=filters, rng=rng)
        self.max_local = max_local

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        return cls(positive_int(spec, "maxLocal", None), filters=filters, rng=rng)

    def describe(self) -> str:
        return f"{self.name}(maxLocal={self.max_local or 'cpuCount'})"

    def local_limit(self, view: CandidateView, position: int) -> int:
        if self.max_local is not None:
            return self.max_local
        stats = view.table.members[view.indices[position]].stats
        return 1 if stats is None else stats.cpu_count

    def accepts(
        self, view: CandidateView, position: int, grain_id: str, ctx: PlacementContext
    ) -> bool:
        # A hint naming the local member must respect the local limit too.
        return position != view.local_position or ctx.local_activations < self.local_limit(
            view, position
        )

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        position = view.local_position
        if position is not None:
            limit = self.local_limit(view, position)
            if trace is not None:
                trace.note(f"{ctx.local_activations} local activations, maxLocal {limit}")
            if ctx.local_activations >= limit:
                raise StatelessWorkerAtCapacity(view.names[position], limit, ctx.local_activations)
        return super().choose(view, grain_id, ctx, trace)


class SiloRoleBasedPlacement(GrainStrategy):
    """Random member whose role label equals the role (Orleans SiloRoleBasedPlacementDirector).

    The role is `role` from the spec, or — as in Orleans, where the grain key names the role —
    the grain id itself when the spec has none.
    """

    name = "SiloRoleBased"

    def __init__(
        self,
        role_label: str = DEFAULT_ROLE_LABEL,
        role: str | None = None,
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> None:
        if not role_label:
            raise GrainSpecError("roleLabel must be a non-empty label key")
        if role is not None and not role:
            raise GrainSpecError("role must be non-empty when given")
        super().__init__(filters=filters, rng=rng)
        self.role_label = role_label
        self.role = role

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        role_label = spec.get("roleLabel", DEFAULT_ROLE_LABEL)
        role = spec.get("role")
        if not isinstance(role_label, str) or (role is not None and not isinstance(role, str)):
            raise GrainSpecError("roleLabel and role must be strings")
        return cls(role_label, role, filters=filters, rng=rng)

    def describe(self) -> str:
        role = self.role if self.role is not None else "<grain id>"
        return f"{self.name}({self.role_label}={role})"

    def prepare(self, view: CandidateView) -> None:
        groups: dict[str, list[str]] = {}
        members = view.table.members
        for i, name in zip(view.indices, view.names, strict=True):
            role = members[i].labels.get(self.role_label)
            if role is not None:
                groups.setdefault(role, []).append(name)
        view.data = {role: tuple(names) for role, names in groups.items()}

    def accepts(
        self, view: CandidateView, position: int, grain_id: str, ctx: PlacementContext
    ) -> bool:
        labels = view.table.members[view.indices[position]].labels
        return labels.get(self.role_label) == (self.role or grain_id)

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        role = self.role or grain_id
        names = view.data.get(role)
        if trace is not None:
            for p, member in enumerate(view.names):
                if not self.accepts(view, p, grain_id, ctx):
                    trace.exclude(member, f"{self.role_label} is not {role!r}")
            for member in names or ():
                trace.consider(member)
        if not names:
            raise NoCompatibleMember(
                f"cannot place {grain_id!r}: no member labelled {self.role_label}={role}"
                f" among {len(view.names)} candidates"
            )
        return self.random_name(names)
