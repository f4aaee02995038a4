"""Load-aware strategies: ActivationCountBased (power of k choices) and ResourceOptimized.
Both exclude overloaded members and members that have not reported statistics yet."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from apportion.api.placement_table import TableStats

from .base import CandidateView, GrainStrategy
from .basic import positive_int
from .context import PlacementContext
from .errors import GrainSpecError, NoCompatibleMember
from .filters import GrainFilter
from .table import (
    PlacementTable,
)
from .trace import Trace


def _eligible_or_fallback(
    strategy: GrainStrategy,
    view: CandidateView,
    eligible: Sequence[int],
    without_stats: Sequence[int],
    grain_id: str,
    trace: Trace | None,
) -> Sequence[int] | str:
    """Shared exclusion rule: overloaded members never, members without statistics only when
    no member with statistics is left (Orleans places on one of those at random)."""
    table = view.table
    if trace is not None:
        for i in view.indices:
            if table.overloaded[i]:
                trace.exclude(table.names[i], "overloaded")
            elif not table.has_stats[i]:
                trace.exclude(table.names[i], "no statistics yet")
    if eligible:
        return eligible
    if without_stats:
        names = [table.names[i] for i in without_stats]
        if trace is not None:
            trace.note("no member with statistics is eligible: random among those without")
        return strategy.random_name(names)
    raise NoCompatibleMember(
        f"cannot place {grain_id!r}: all {len(view.indices)} candidates are overloaded"
    )


@dataclass(slots=True)
class _CountView:
    eligible: list[int]
    without_stats: list[int]
    scratch: list[int]
    table_has_stats: bool


class ActivationCountBasedPlacement(GrainStrategy):
    """Power of k choices (Mitzenmacher, "The Power of Two Choices in Randomized Load
    Balancing", 1996), as Orleans' ActivationCountPlacementDirector: sample `choose_out_of`
    eligible members, take the one with the lowest estimated count.

    The estimate is the published count plus this director's optimistic increments since the
    table arrived. Each pick adds the number of members reporting statistics, not 1: every
    member places at a similar rate, so one local pick stands for that many cluster-wide
    (Orleans' trick against herding on stale counts). A fresh table resets the increments.
    """

    name = "ActivationCountBased"

    def __init__(
        self,
        choose_out_of: int = 2,
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> None:
        if choose_out_of < 1:
            raise GrainSpecError(f"chooseOutOf must be >= 1, got {choose_out_of}")
        super().__init__(filters=filters, rng=rng)
        self.choose_out_of = choose_out_of
        self._increments: list[int] = []
        self._step = 1

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        return cls(positive_int(spec, "chooseOutOf", 2) or 2, filters=filters, rng=rng)

    def describe(self) -> str:
        return f"{self.name}(chooseOutOf={self.choose_out_of})"

    def update(self, table: PlacementTable) -> None:
        super().update(table)
        self._increments = [0] * len(table)
        self._step = max(1, sum(table.has_stats))

    def estimated_count(self, index: int) -> int:
        """Published count plus optimistic increments of the member at table `index`."""
        return self._table.activation_counts[index] + self._increments[index]

    def prepare(self, view: CandidateView) -> None:
        table = view.table
        eligible = [i for i in view.indices if table.has_stats[i] and not table.overloaded[i]]
        view.data = _CountView(
            eligible=eligible,
            without_stats=[i for i in view.indices if not table.has_stats[i]],
            scratch=list(range(len(eligible))),
            table_has_stats=any(table.has_stats),
        )

    def accepts(
        self, view: CandidateView, position: int, grain_id: str, ctx: PlacementContext
    ) -> bool:
        return not view.table.overloaded[view.indices[position]]

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        data: _CountView = view.data
        if not data.table_has_stats and view.local_position is not None:
            if trace is not None:
                trace.note("no statistics published yet: local member")
            return view.names[view.local_position]
        eligible = _eligible_or_fallback(
            self, view, data.eligible, data.without_stats, grain_id, trace
        )
        if isinstance(eligible, str):
            return eligible
        m = len(eligible)
        k = min(self.choose_out_of, m)
        scratch = data.scratch
        rnd = self._random
        counts = view.table.activation_counts
        increments = self._increments
        best = -1
        best_load = 0
        for a in range(k):
            # Partial Fisher-Yates: scratch[:k] ends up a uniform sample without replacement.
            j = a + int(rnd() * (m - a))
            p = scratch[j]
            scratch[j] = scratch[a]
            scratch[a] = p
            index = eligible[p]
            load = counts[index] + increments[index]
            if best < 0 or load < best_load:
                best, best_load = index, load
        if trace is None:
            increments[best] += self._step
            return view.table.names[best]
        sampled = {eligible[p] for p in scratch[:k]}
        for index in eligible:
            trace.consider(
                view.table.names[index],
                float(self.estimated_count(index)),
                published=float(counts[index]),
                optimistic=float(increments[index]),
                sampled=float(index in sampled),
            )
        trace.note(f"lowest estimated count of {k} sampled out of {m} eligible")
        return view.table.names[best]


@dataclass(frozen=True, slots=True)
class ResourceWeights:
    """Relative weights, integers 0..100 (Orleans ResourceOptimizedPlacementOptions)."""

    cpu_usage: int = 40
    memory_usage: int = 20
    available_memory: int = 20
    max_available_memory: int = 5
    activation_count: int = 15

    _SPEC_KEYS = (
        ("cpuUsage", "cpu_usage"),
        ("memoryUsage", "memory_usage"),
        ("availableMemory", "available_memory"),
        ("maxAvailableMemory", "max_available_memory"),
        ("activationCount", "activation_count"),
    )

    def __post_init__(self) -> None:
        for _, attr in self._SPEC_KEYS:
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
                raise GrainSpecError(f"weight {attr} must be an integer in 0..100, got {value!r}")

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> ResourceWeights:
        unknown = set(spec) - {key for key, _ in cls._SPEC_KEYS}
        if unknown:
            raise GrainSpecError(f"unknown weights {sorted(unknown)}")
        defaults = cls()
        return cls(**{attr: spec.get(key, getattr(defaults, attr)) for key, attr in cls._SPEC_KEYS})

    def normalized(self) -> tuple[float, float, float, float, float]:
        values = (
            self.cpu_usage,
            self.memory_usage,
            self.available_memory,
            self.max_available_memory,
            self.activation_count,
        )
        total = sum(values)
        return tuple(v / total if total else 0.0 for v in values)  # type: ignore[return-value]


def _unit(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


def _own_terms(
    cpu_usage: float, memory_usage: float, available_memory: float, max_available_memory: int
) -> tuple[float, float, float]:
    """The terms that depend on the member alone: cpu, memory usage, 1 - available/max."""
    cpu = _unit(cpu_usage / 100.0)
    if max_available_memory <= 0:
        return cpu, 0.0, 0.0
    return (
        cpu,
        _unit(memory_usage / 100.0),
        1.0 - _unit(available_memory / max_available_memory),
    )


def resource_terms(
    stats: TableStats, max_max_available_memory: int, max_activation_count: int
) -> tuple[float, float, float, float, float]:
    """The five normalised terms of Orleans' ResourceOptimized score, each in 0..1, higher =
    busier: cpu, memory usage, 1 - available/max, 1 - max/largest max, count/largest count."""
    cpu, memory, available = _own_terms(
        stats.cpu_usage, stats.memory_usage, stats.available_memory, stats.max_available_memory
    )
    max_available = 0.0
    if stats.max_available_memory > 0:
        max_available = 1.0 - _unit(stats.max_available_memory / max_max_available_memory)
    count = stats.activation_count / max_activation_count if max_activation_count else 0.0
    return cpu, memory, available, max_available, count


_TERM_NAMES = (
    "cpuUsage",
    "memoryUsage",
    "availableMemory",
    "maxAvailableMemory",
    "activationCount",
)


@dataclass(slots=True)
class _ResourceView:
    relevant: list[int]
    fixed: list[float]
    """Weighted max-available-memory term per relevant member (normalised within the view)."""
    max_memory: int
    max_count: float
    """Largest (estimated) activation count in the view: the count term's denominator."""
    scratch: list[int]
    sample_size: int
    without_stats: list[int]
    local: int | None
    """Position of the local member in `relevant`, if it is there."""
    any_stats: bool


class ResourceOptimizedPlacement(GrainStrategy):
    """Orleans' ResourceOptimizedPlacementDirector (default since Orleans 9.2; Behluli,
    "Resource-based placement with cooperative dual-mode Kalman filtering", 2024), plus
    optimistic local accounting.

    Scores each eligible member by its weighted normalised terms (`resource_terms`) and samples
    K = ceil(sqrt(n)) of them by partial Fisher-Yates; the lowest score plus a jitter below 1e-5
    wins. The local member is kept when `local_score - margin <= best_score`, where the margin
    is `localSiloPreferenceMargin / 100` because scores lie in 0..1: 0 always takes the least
    loaded, 100 always stays local. No statistics yet: random.

    Optimistic accounting (on by default; `optimisticAccounting: false` is Orleans exactly):
    Orleans scores the last published statistics until the next publish, so a burst piles onto
    the best sampled members and onto the local one. Here each pick adds to the chosen member's
    estimate until a fresh table resets it, as many activations as members report statistics
    (every member places at a similar rate, so one local pick stands for that many cluster-wide:
    the rule of ActivationCountBased and Orleans' ActivationCountPlacementDirector). Each added
    activation raises the activation count by one and CPU and memory by the cluster's published
    usage per activation (CPU in core-percent over the member's cores, memory in bytes over its
    limit); these increments are not clipped at 100 %, so members a burst has filled keep their
    order.
    """

    name = "ResourceOptimized"

    def __init__(
        self,
        weights: ResourceWeights | None = None,
        local_preference_margin: int = 5,
        *,
        optimistic_accounting: bool = True,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= local_preference_margin <= 100:
            raise GrainSpecError(
                f"localSiloPreferenceMargin must be in 0..100, got {local_preference_margin}"
            )
        super().__init__(filters=filters, rng=rng)
        self.weights = weights if weights is not None else ResourceWeights()
        self.local_preference_margin = local_preference_margin
        self.optimistic_accounting = optimistic_accounting
        self._weights = self.weights.normalized()
        self._margin = local_preference_margin / 100.0
        # Per table index: activations added since the table, the estimated count, the weighted
        # cpu + memory + available terms at the estimate, and what one activation adds to them.
        self._added: list[int] = []
        self._counts: list[float] = []
        self._own: list[float] = []
        self._slopes: list[float] = []
        self._cpu_per_activation = 0.0
        self._bytes_per_activation = 0.0
        self._step = 1

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        weights = spec.get("weights") or {}
        if not isinstance(weights, Mapping):
            raise GrainSpecError("weights must be an object")
        margin = spec.get("localSiloPreferenceMargin", 5)
        if isinstance(margin, bool) or not isinstance(margin, int):
            raise GrainSpecError(f"localSiloPreferenceMargin must be an integer, got {margin!r}")
        accounting = spec.get("optimisticAccounting", True)
        if not isinstance(accounting, bool):
            raise GrainSpecError(f"optimisticAccounting must be true or false, got {accounting!r}")
        return cls(
            ResourceWeights.from_spec(weights),
            margin,
            optimistic_accounting=accounting,
            filters=filters,
            rng=rng,
        )

    def describe(self) -> str:
        w = self.weights
        return (
            f"{self.name}(cpu={w.cpu_usage}, memory={w.memory_usage},"
            f" availableMemory={w.available_memory}, maxAvailableMemory={w.max_available_memory},"
            f" activationCount={w.activation_count}, margin={self.local_preference_margin},"
            f" optimisticAccounting={self.optimistic_accounting})"
        )

    def update(self, table: PlacementTable) -> None:
        super().update(table)
        published = [m.stats for m in table.members]
        reporting = [s for s in published if s is not None]
        activations = sum(s.activation_count for s in reporting)
        self._step = max(1, len(reporting))
        cpu = memory = 0.0
        if activations:
            cpu = math.fsum(s.cpu_usage * s.cpu_count for s in reporting) / activations
            memory = (
                math.fsum(s.memory_usage / 100.0 * s.max_available_memory for s in reporting)
                / activations
            )
        self._cpu_per_activation, self._bytes_per_activation = cpu, memory
        w = self._weights
        self._added = [0] * len(table)
        self._counts = [0.0 if s is None else float(s.activation_count) for s in published]
        self._own = []
        self._slopes = []
        for s in published:
            if s is None:
                self._own.append(0.0)
                self._slopes.append(0.0)
                continue
            terms = _own_terms(
                s.cpu_usage, s.memory_usage, s.available_memory, s.max_available_memory
            )
            self._own.append(w[0] * terms[0] + w[1] * terms[1] + w[2] * terms[2])
            slope = w[0] * cpu / (100.0 * s.cpu_count)
            if s.max_available_memory > 0:
                # Memory usage and available memory both move by the bytes over the limit.
                slope += (w[1] + w[2]) * memory / s.max_available_memory
            self._slopes.append(slope)

    def prepare(self, view: CandidateView) -> None:
        table = view.table
        members = table.members
        stats = {i: s for i in view.indices if (s := members[i].stats) is not None}
        max_memory = max((s.max_available_memory for s in stats.values()), default=0)
        relevant = [i for i in stats if not table.overloaded[i]]
        weight = self._weights[3]
        fixed = []
        for i in relevant:
            largest = stats[i].max_available_memory
            fixed.append(weight * (1.0 - _unit(largest / max_memory)) if largest > 0 else 0.0)
        local = None
        if view.local_position is not None:
            index = view.indices[view.local_position]
            if index in relevant:
                local = relevant.index(index)
        view.data = _ResourceView(
            relevant=relevant,
            fixed=fixed,
            max_memory=max_memory,
            max_count=max((self._counts[i] for i in stats), default=0.0),
            scratch=list(range(len(relevant))),
            sample_size=math.ceil(math.sqrt(len(relevant))),
            without_stats=[i for i in view.indices if not table.has_stats[i]],
            local=local,
            any_stats=bool(stats),
        )

    def accepts(
        self, view: CandidateView, position: int, grain_id: str, ctx: PlacementContext
    ) -> bool:
        return not view.table.overloaded[view.indices[position]]

    def _score(self, data: _ResourceView, p: int) -> float:
        """The score of the member at `p` in `data.relevant` (inlined in `choose`'s loop)."""
        scale = self._weights[4] / data.max_count if data.max_count else 0.0
        index = data.relevant[p]
        return data.fixed[p] + self._own[index] + scale * self._counts[index]

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        data: _ResourceView = view.data
        names = view.names
        if not data.any_stats:
            if trace is not None:
                trace.note("no statistics yet: random")
            return self.random_name(names)
        relevant = _eligible_or_fallback(
            self, view, data.relevant, data.without_stats, grain_id, trace
        )
        if isinstance(relevant, str):
            return relevant
        m = len(relevant)
        scratch = data.scratch
        rnd = self._random
        fixed, own, counts = data.fixed, self._own, self._counts
        scale = self._weights[4] / data.max_count if data.max_count else 0.0
        best = -1
        best_score = math.inf
        for a in range(data.sample_size):
            j = a + int(rnd() * (m - a))
            p = scratch[j]
            scratch[j] = scratch[a]
            scratch[a] = p
            index = relevant[p]
            candidate = fixed[p] + own[index] + scale * counts[index]
            if candidate + rnd() * 1e-5 < best_score:
                best, best_score = p, candidate
        if trace is not None:
            self._trace_candidates(data, trace)
        local_score = None if data.local is None else self._score(data, data.local)
        chosen = best
        # Margin 100 is PreferLocal, however far optimistic accounting lifts the local score.
        if local_score is not None and (
            local_score - self._margin <= best_score or self.local_preference_margin == 100
        ):
            chosen = data.local  # type: ignore[assignment]
            if trace is not None:
                trace.note(
                    f"local kept: {local_score:.4f} - margin {self._margin:.2f}"
                    f" <= best {best_score:.4f}"
                )
        elif trace is not None:
            trace.note(f"lowest score of {data.sample_size} sampled out of {m} eligible")
            if local_score is not None:
                trace.note(
                    f"local not kept: {local_score:.4f} - margin {self._margin:.2f}"
                    f" > best {best_score:.4f}"
                )
        index = relevant[chosen]
        if trace is None and self.optimistic_accounting:
            self._account(data, index)
        return view.table.names[index]

    def _account(self, data: _ResourceView, index: int) -> None:
        """One pick of the member at table `index` (class docstring)."""
        step = self._step
        self._added[index] += step
        self._own[index] += step * self._slopes[index]
        count = self._counts[index] = self._counts[index] + step
        # Other views holding this member keep their denominator until the next table: it only
        # scales the count term against the others within one comparison.
        if count > data.max_count:
            data.max_count = count

    def _trace_candidates(self, data: _ResourceView, trace: Trace) -> None:
        sampled = set(data.scratch[: data.sample_size])
        w = self._weights
        for p, index in enumerate(data.relevant):
            stats = self._table.members[index].stats
            assert stats is not None
            added = self._added[index]
            cpu, memory, available, max_available, _ = resource_terms(stats, data.max_memory, 0)
            cpu += added * self._cpu_per_activation / (100.0 * stats.cpu_count)
            if stats.max_available_memory > 0:
                memory += added * self._bytes_per_activation / stats.max_available_memory
                available += added * self._bytes_per_activation / stats.max_available_memory
            count = self._counts[index] / data.max_count if data.max_count else 0.0
            terms = (cpu, memory, available, max_available, count)
            trace.consider(
                self._table.names[index],
                math.fsum(wt * t for wt, t in zip(w, terms, strict=True)),
                sampled=float(p in sampled),
                optimistic=float(added),
                **dict(zip(_TERM_NAMES, terms, strict=True)),
            )
