"""Grain activations under a strategy with stale statistics: a seeded, pure discrete-event
simulation used by `bench/bench_grains.py`, the unit tests and `apportion simulate`.

Several placing members each run their own strategy instance (own optimistic state, own
random stream); activations arrive as a Poisson process at random placers; every
`publish_interval` the true counts (and statistics derived from them) are published to all
placers as a fresh table, which is all they learn about each other.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from apportion.api.placement_table import TableMember, TableStats

from .context import PlacementContext
from .errors import PlacementError
from .registry import make_grain_strategy
from .table import (
    PlacementTable,
)

_GIB = 1 << 30


class Placer(Protocol):
    """What the simulation drives: a `GrainStrategy`, or any port with the same two calls."""

    def update(self, table: PlacementTable) -> None: ...

    def place(self, grain_id: str, ctx: PlacementContext) -> str: ...


@dataclass(frozen=True, slots=True)
class LoadModel:
    """How a member's published statistics follow its activation count."""

    cpu_per_activation: float = 0.4
    """CPU percent per activation."""
    memory_per_activation: float = 0.3
    """Memory percent per activation."""
    max_available_memory: int = 4 * _GIB
    cpu_count: int = 4

    def stats(self, activations: int) -> TableStats:
        memory = min(100.0, activations * self.memory_per_activation)
        # Values this model computes within their bounds: skip validation on this hot path.
        return TableStats.model_construct(
            cpu_usage=min(100.0, activations * self.cpu_per_activation),
            memory_usage=memory,
            available_memory=int(self.max_available_memory * (1.0 - memory / 100.0)),
            max_available_memory=self.max_available_memory,
            activation_count=activations,
            cpu_count=self.cpu_count,
        )


@dataclass(frozen=True, slots=True)
class SimulationStep:
    time: float
    active: int
    max_over_mean: float


@dataclass(frozen=True, slots=True)
class SimulationResult:
    label: str
    counts: dict[str, int]
    """Active activations per member at the end."""
    max_over_mean: float
    placements: int
    failures: int
    """Placements that raised `PlacementError` (e.g. all members overloaded)."""
    steps: tuple[SimulationStep, ...]
    """One per table publish."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "maxOverMean": self.max_over_mean,
            "placements": self.placements,
            "failures": self.failures,
            "counts": dict(self.counts),
            "steps": [
                {"time": s.time, "active": s.active, "maxOverMean": s.max_over_mean}
                for s in self.steps
            ],
        }


def max_over_mean(counts: Sequence[int]) -> float:
    """max / mean of the counts; 1.0 when there is nothing to balance."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationScenario:
    """The numbers of a simulated run: `activations` grains arriving at `rate` per second on
    `members` members, placed by `placers` of them (spread evenly through the sorted member
    list), statistics published every `publish_interval` seconds; with `lifetime`, each
    activation ends that many seconds after it started."""

    members: int = 100
    activations: int = 10_000
    placers: int = 8
    rate: float = 1000.0
    publish_interval: float = 1.0
    lifetime: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.members < 1 or self.activations < 0 or not 1 <= self.placers <= self.members:
            raise ValueError("need members >= 1, activations >= 0 and 1 <= placers <= members")
        if (
            self.rate <= 0
            or self.publish_interval <= 0
            or (self.lifetime is not None and self.lifetime <= 0)
        ):
            raise ValueError("rate, publish_interval and lifetime must be > 0")


def simulate_activations(
    strategy: Mapping[str, Any] | Callable[[random.Random], Placer],
    scenario: ActivationScenario | None = None,
    *,
    filters: Sequence[Mapping[str, Any]] = (),
    labels: Callable[[int], Mapping[str, str]] | None = None,
    load: LoadModel | None = None,
    label: str | None = None,
) -> SimulationResult:
    """Run `scenario` (default `ActivationScenario()`). `strategy` is a GrainType strategy spec
    (built with `filters`) or a factory taking the placer's random stream; `labels(i)`: member
    i's labels; `load`: how statistics follow counts (default `LoadModel()`)."""
    scenario = scenario or ActivationScenario()
    members, activations, placers = scenario.members, scenario.activations, scenario.placers
    rate, publish_interval, lifetime = scenario.rate, scenario.publish_interval, scenario.lifetime
    load = load if load is not None else LoadModel()
    rng = random.Random(scenario.seed)
    width = len(str(members - 1))
    names = [f"member-{i:0{width}d}" for i in range(members)]
    member_labels = [dict(labels(i)) if labels is not None else {} for i in range(members)]

    def factory(stream: random.Random) -> Placer:
        if isinstance(strategy, Mapping):
            return make_grain_strategy(strategy, filters, rng=stream)
        return strategy(stream)

    placer_names = [names[(p * members) // placers] for p in range(placers)]
    directors = [factory(random.Random(rng.getrandbits(64))) for _ in placer_names]
    contexts = [PlacementContext(local_member=name) for name in placer_names]
    position = {name: i for i, name in enumerate(names)}
    counts = [0] * members
    ending: list[tuple[float, int]] = []
    steps: list[SimulationStep] = []
    version = 0

    def publish(now: float) -> None:
        nonlocal version
        table = PlacementTable(
            (
                TableMember.model_construct(
                    name=name, labels=member_labels[i], stats=load.stats(counts[i])
                )
                for i, name in enumerate(names)
            ),
            version=version,
        )
        version += 1
        for director in directors:
            director.update(table)
        steps.append(SimulationStep(now, sum(counts), max_over_mean(counts)))

    publish(0.0)
    now = 0.0
    next_publish = publish_interval
    failures = 0
    for n in range(activations):
        now += rng.expovariate(rate)
        while next_publish <= now or (ending and ending[0][0] <= now):
            if ending and ending[0][0] <= min(now, next_publish):
                counts[heapq.heappop(ending)[1]] -= 1
            else:
                publish(next_publish)
                next_publish += publish_interval
        p = int(rng.random() * placers)
        try:
            chosen = position[directors[p].place(f"grain-{n}", contexts[p])]
        except PlacementError:
            failures += 1
            continue
        counts[chosen] += 1
        if lifetime is not None:
            heapq.heappush(ending, (now + lifetime, chosen))
    return SimulationResult(
        label=label if label is not None else _label(strategy),
        counts=dict(zip(names, counts, strict=True)),
        max_over_mean=max_over_mean(counts),
        placements=activations - failures,
        failures=failures,
        steps=tuple(steps),
    )


def _label(strategy: Mapping[str, Any] | Callable[..., Placer]) -> str:
    if isinstance(strategy, Mapping):
        return str(strategy.get("name", "default"))
    return getattr(strategy, "__name__", type(strategy).__name__)
