"""The strategy contract: `update(table)` when a snapshot arrives, `place(grain_id, ctx)` per new
activation, `explain(grain_id, ctx)` for the same decision with its reasons.

Everything that depends only on (table, caller) — filter results, eligible members, scores —
is computed once into a `CandidateView` and cached until the next table, so `place` does only
the per-call work. `explain` runs the very same `choose` with a `Trace`; `place` passes None.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

from .context import PlacementContext
from .errors import NoCompatibleMember, PlacementError
from .filters import FilterStep, GrainFilter
from .table import EMPTY_TABLE, PlacementTable
from .trace import Explanation, Trace

_MAX_CACHED_VIEWS = 64


class CandidateView:
    """The members left after the filters for one caller, with the strategy's precomputation.

    `indices` are positions in `table.members` (table order, i.e. sorted by name), `names` the
    matching names; `position` maps a name to its place in `names`.
    """

    __slots__ = (
        "caller",
        "data",
        "error",
        "indices",
        "local_position",
        "names",
        "position",
        "steps",
        "table",
    )

    def __init__(
        self,
        table: PlacementTable,
        indices: tuple[int, ...],
        caller: Mapping[str, str],
        local_member: str | None,
        steps: tuple[FilterStep, ...],
        error: str | None,
    ) -> None:
        self.table = table
        self.indices = indices
        self.names = tuple(table.names[i] for i in indices)
        self.position = {name: p for p, name in enumerate(self.names)}
        self.local_position = None if local_member is None else self.position.get(local_member)
        self.caller = caller
        self.steps = steps
        self.error = error
        self.data: Any = None


class GrainStrategy(ABC):
    """Base of every grain placement strategy, built-in or custom.

    A custom strategy (entry-point group `apportion.grain_strategies`) subclasses this,
    implements `choose` (and `from_spec` if it has options), and may precompute per view in
    `prepare`. One instance serves one grain type in one process; it is not thread-safe.
    """

    name: ClassVar[str]
    honours_hint: ClassVar[bool] = True

    def __init__(
        self, *, filters: Sequence[GrainFilter] = (), rng: random.Random | None = None
    ) -> None:
        self.filters = tuple(filters)
        self.rng = rng if rng is not None else random.Random()
        self._random = self.rng.random
        self._table = EMPTY_TABLE
        self._views: dict[tuple[object, ...], CandidateView] = {}

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        """Build from the camelCase GrainType strategy spec (ignored by option-less ones)."""
        return cls(filters=filters, rng=rng)

    def describe(self) -> str:
        return self.name

    @property
    def table(self) -> PlacementTable:
        return self._table

    def update(self, table: PlacementTable) -> None:
        """A fresh snapshot: drops cached views. Strategies with per-table state (optimistic
        increments, rings) extend this."""
        self._table = table
        self._views = {}

    def prepare(self, view: CandidateView) -> None:
        """Precompute into `view.data` what `choose` needs for this table and caller."""
        view.data = None

    def accepts(
        self, view: CandidateView, position: int, grain_id: str, ctx: PlacementContext
    ) -> bool:
        """Whether the member at `position` may take this grain (used for placement hints)."""
        return True

    @abstractmethod
    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        """Pick a member name from `view`. With a trace: record why, and change no state."""

    def place(self, grain_id: str, ctx: PlacementContext) -> str:
        """The member a new activation of `grain_id` goes to; raises `PlacementError`."""
        return self._decide(self._view(ctx), grain_id, ctx, None)

    def explain(self, grain_id: str, ctx: PlacementContext) -> Explanation:
        """The decision `place` would make now, with candidates, filter steps and scores.
        Never changes the strategy's state (no optimistic increments)."""
        trace = Trace()
        view = self._view(ctx)
        chosen: str | None = None
        error: str | None = None
        try:
            chosen = self._decide(view, grain_id, ctx, trace)
        except PlacementError as exc:
            error = str(exc)
        return Explanation(
            grain_id=grain_id,
            strategy=self.describe(),
            chosen=chosen,
            error=error,
            table_version=self._table.version,
            members=self._table.names,
            filters=view.steps,
            excluded=trace.excluded,
            candidates=tuple(trace.candidates),
            notes=tuple(trace.notes),
        )

    def random_name(self, names: Sequence[str]) -> str:
        return names[int(self._random() * len(names))]

    def _decide(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        if view.error is not None:
            raise NoCompatibleMember(f"cannot place {grain_id!r}: {view.error}")
        hint = ctx.hint
        if hint is not None and self.honours_hint:
            position = view.position.get(hint)
            if position is not None and self.accepts(view, position, grain_id, ctx):
                if trace is not None:
                    trace.note(f"placement hint {hint!r} honoured")
                return hint
            if trace is not None:
                trace.note(f"placement hint {hint!r} ignored: not an eligible member")
        return self.choose(view, grain_id, ctx, trace)

    def _view(self, ctx: PlacementContext) -> CandidateView:
        view = self._views.get(ctx.cache_key)
        if view is None:
            view = self._build_view(ctx)
            if len(self._views) >= _MAX_CACHED_VIEWS:
                self._views.clear()
            self._views[ctx.cache_key] = view
        return view

    def _build_view(self, ctx: PlacementContext) -> CandidateView:
        table = self._table
        caller = ctx.caller_metadata
        if caller is None:
            local = None if ctx.local_member is None else table.index.get(ctx.local_member)
            caller = {} if local is None else table.members[local].labels
        indices = tuple(range(len(table)))
        steps: list[FilterStep] = []
        error = None if indices else f"placement table {table.version!r} has no members"
        for grain_filter in self.filters:
            if error is not None:
                break
            kept = grain_filter.apply(table, indices, caller)
            kept_set = set(kept)
            steps.append(
                FilterStep(
                    grain_filter.describe(),
                    tuple(table.names[i] for i in kept),
                    tuple(table.names[i] for i in indices if i not in kept_set),
                )
            )
            if not kept:
                error = (
                    f"filter {grain_filter.describe()} left no member"
                    f" (caller metadata {dict(caller)!r}, {len(indices)} members before it)"
                )
            indices = kept
        view = CandidateView(table, indices, caller, ctx.local_member, tuple(steps), error)
        if error is None:
            self.prepare(view)
        return view
