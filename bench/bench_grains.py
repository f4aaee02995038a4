"""Grain placement benchmarks (figures, not asserts).

1. Placements per second per strategy, single core, 100 members (goal: >= 200k/s for the hash
   and count strategies).
2. max/mean activations of our strategies against ports of Orleans' Random, HashBased and
   ActivationCountBased directors, and against ResourceOptimized with `optimisticAccounting:
   false` (Orleans' own behaviour: no accounting between publishes), on the same simulated
   load: 10k activations on 100 members, statistics published every 1 s, several placing
   members each with its own optimistic increments
   (`apportion.engine.grains.simulate_activations`).
3. Grains moved when a member joins or leaves: HashBased (mod-n) against ConsistentHashBased.

Run: .venv/bin/python -m bench.bench_grains [--quick] [--seeds N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from apportion.api.placement_table import TableMember, TableStats
from apportion.engine.grains import (
    ActivationScenario,
    PlacementContext,
    PlacementTable,
    Placer,
    StatelessWorkerPlacement,
    make_grain_strategy,
    simulate_activations,
)

# --- Ports of Orleans' directors, written from the Orleans source for comparison only -------


def jenkins_hash(data: bytes) -> int:
    """Bob Jenkins' lookup2 hash, as Orleans' JenkinsHash.ComputeHash (little-endian words)."""
    mask = 0xFFFFFFFF

    def mix(a: int, b: int, c: int) -> tuple[int, int, int]:
        a = (a - b - c) & mask ^ (c >> 13)
        b = (b - c - a) & mask ^ (a << 8) & mask
        c = (c - a - b) & mask ^ (b >> 13)
        a = (a - b - c) & mask ^ (c >> 12)
        b = (b - c - a) & mask ^ (a << 16) & mask
        c = (c - a - b) & mask ^ (b >> 5)
        a = (a - b - c) & mask ^ (c >> 3)
        b = (b - c - a) & mask ^ (a << 10) & mask
        c = (c - a - b) & mask ^ (b >> 15)
        return a, b, c

    a = b = 0x9E3779B9
    c = 0
    length = len(data)
    offset = 0
    while length - offset >= 12:
        a = (a + int.from_bytes(data[offset : offset + 4], "little")) & mask
        b = (b + int.from_bytes(data[offset + 4 : offset + 8], "little")) & mask
        c = (c + int.from_bytes(data[offset + 8 : offset + 12], "little")) & mask
        a, b, c = mix(a, b, c)
        offset += 12
    c = (c + length) & mask
    tail = data[offset:]
    # The last byte group feeds c from byte 8 on (shifted by 8: the low byte of c is the length).
    for i, byte in enumerate(tail):
        if i < 4:
            a = (a + (byte << (8 * i))) & mask
        elif i < 8:
            b = (b + (byte << (8 * (i - 4)))) & mask
        else:
            c = (c + (byte << (8 * (i - 7)))) & mask
    return mix(a, b, c)[2]


class OrleansRandom:
    """RandomPlacementDirector: a random compatible silo."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.silos: tuple[str, ...] = ()

    def update(self, table: PlacementTable) -> None:
        self.silos = table.names

    def place(self, grain_id: str, ctx: PlacementContext) -> str:
        return self.silos[self.rng.randrange(len(self.silos))]


class OrleansHashBased(OrleansRandom):
    """HashBasedPlacementDirector: sorted silos, `(hash & 0x7fffffff) % n`, with JenkinsHash
    of the UTF-8 grain id standing in for GrainId.GetUniformHashCode."""

    def place(self, grain_id: str, ctx: PlacementContext) -> str:
        silos = sorted(self.silos)
        return silos[(jenkins_hash(grain_id.encode()) & 0x7FFFFFFF) % len(silos)]


class OrleansActivationCount:
    """ActivationCountPlacementDirector (Orleans 7+): a cache of published statistics plus
    local increments per silo, reset when that silo's statistics arrive; power of
    `choose_out_of` over non-overloaded compatible silos; the pick's increment is the number of
    silos in the cache."""

    def __init__(self, rng: random.Random, choose_out_of: int = 2) -> None:
        self.rng = rng
        self.choose_out_of = choose_out_of
        self.silos: tuple[str, ...] = ()
        self.cache: dict[str, list[Any]] = {}

    def update(self, table: PlacementTable) -> None:
        self.silos = table.names
        self.cache = {
            m.name: [m.stats.activation_count, overloaded, 0]
            for m, overloaded in zip(table.members, table.overloaded, strict=True)
            if m.stats is not None
        }

    def place(self, grain_id: str, ctx: PlacementContext) -> str:
        if not self.cache and ctx.local_member in self.silos:
            return ctx.local_member
        relevant = []
        without_stats = 0
        sampled_without_stats = None
        for silo in self.silos:
            entry = self.cache.get(silo)
            if entry is None:
                without_stats += 1
                if without_stats == 1 or self.rng.randrange(without_stats) == 0:
                    sampled_without_stats = silo
                continue
            if not entry[1]:
                relevant.append((silo, entry))
        if relevant:
            chosen: list[tuple[str, list[int]]] = []
            while len(chosen) < min(len(relevant), self.choose_out_of):
                chosen.append(relevant.pop(self.rng.randrange(len(relevant))))
            best = None
            min_load = sys.maxsize
            for silo, entry in chosen:
                load = entry[2] + entry[0]
                if load < min_load:
                    best, min_load = (silo, entry), load
            assert best is not None
            best[1][2] += len(self.cache)
            return best[0]
        if sampled_without_stats is not None:
            return sampled_without_stats
        raise RuntimeError("all compatible silos are overloaded")


# --- 1. Throughput -----------------------------------------------------------------------------

THROUGHPUT_SPECS: dict[str, Mapping[str, Any]] = {
    "Random": {"name": "Random"},
    "PreferLocal": {"name": "PreferLocal"},
    "HashBased": {"name": "HashBased"},
    "ConsistentHashBased": {"name": "ConsistentHashBased"},
    "ActivationCountBased": {"name": "ActivationCountBased"},
    "StatelessWorker": {"name": "StatelessWorker"},
    "SiloRoleBased": {"name": "SiloRoleBased", "role": "worker"},
    "ResourceOptimized": {"name": "ResourceOptimized"},
    "ResourceOptimized, no accounting": {
        "name": "ResourceOptimized",
        "optimisticAccounting": False,
    },
    "ActivationCountBased+RequiredMatch": {"name": "ActivationCountBased"},
}


def bench_table(members: int = 100) -> PlacementTable:
    rng = random.Random(7)
    return PlacementTable(
        (
            TableMember(
                name=f"member-{i:03d}",
                labels={"zone": f"zone-{i % 3}", "apportion.dev/role": "worker"},
                stats=TableStats(
                    cpu_usage=rng.uniform(5, 90),
                    memory_usage=rng.uniform(5, 85),
                    available_memory=rng.randrange(1, 4) << 30,
                    max_available_memory=4 << 30,
                    activation_count=rng.randrange(0, 500),
                    cpu_count=4,
                ),
            )
            for i in range(members)
        ),
        version=1,
    )


def throughput(placements: int) -> list[tuple[str, float]]:
    table = bench_table()
    ctx = PlacementContext(local_member="member-001")
    grain_ids = [f"cart/{i}" for i in range(placements)]
    rows = []
    for label, spec in THROUGHPUT_SPECS.items():
        filters = [{"type": "RequiredMatch", "keys": ["zone"]}] if "Required" in label else []
        strategy = make_grain_strategy(spec, filters, rng=random.Random(1))
        if isinstance(strategy, StatelessWorkerPlacement):
            strategy.max_local = sys.maxsize
        strategy.update(table)
        place = strategy.place
        place(grain_ids[0], ctx)  # builds the cached view, as the first real placement would
        start = time.perf_counter()
        for grain_id in grain_ids:
            place(grain_id, ctx)
        rows.append((label, placements / (time.perf_counter() - start)))
    return rows


# --- 2. Balance under stale statistics -----------------------------------------------------

OURS: dict[str, Mapping[str, Any]] = {
    "Random": {"name": "Random"},
    "HashBased": {"name": "HashBased"},
    "ConsistentHashBased": {"name": "ConsistentHashBased"},
    "ActivationCountBased": {"name": "ActivationCountBased"},
    "ResourceOptimized": {"name": "ResourceOptimized"},
    "Orleans ResourceOptimized": {"name": "ResourceOptimized", "optimisticAccounting": False},
}
PORTS: dict[str, Callable[[random.Random], Placer]] = {
    "Orleans Random": OrleansRandom,
    "Orleans HashBased": OrleansHashBased,
    "Orleans ActivationCount": OrleansActivationCount,
}


def balance(
    seeds: int, *, placers: int, rate: float, lifetime: float | None = None
) -> dict[str, tuple[float, float]]:
    """Mean and worst max/mean over `seeds` runs for every strategy and port."""
    out = {}
    candidates: dict[str, Mapping[str, Any] | Callable[[random.Random], Placer]] = {
        **PORTS,
        **OURS,
    }
    for label, strategy in candidates.items():
        figures = [
            simulate_activations(
                strategy,
                ActivationScenario(
                    members=100,
                    activations=10_000,
                    placers=placers,
                    rate=rate,
                    lifetime=lifetime,
                    seed=seed,
                ),
            ).max_over_mean
            for seed in range(seeds)
        ]
        out[label] = (statistics.fmean(figures), max(figures))
    return out


# --- 3. Movement on membership change --------------------------------------------------------


def moved_fraction(make: Callable[[], Placer], before: int, after: int, grains: int) -> float:
    def assignment(members: int) -> list[str]:
        placer = make()
        placer.update(PlacementTable(TableMember(name=f"member-{i:03d}") for i in range(members)))
        ctx = PlacementContext()
        return [placer.place(f"cart/{g}", ctx) for g in range(grains)]

    old, new = assignment(before), assignment(after)
    return sum(a != b for a, b in zip(old, new, strict=True)) / grains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer placements and scenarios")
    parser.add_argument("--seeds", type=int, default=5, help="simulation runs per cell")
    args = parser.parse_args()
    seeds = 2 if args.quick else args.seeds

    print("== Placements per second, one core, 100 members (cached view, no hint) ==")
    for label, rate in throughput(50_000 if args.quick else 300_000):
        print(f"  {label:36s} {rate / 1000:8.0f}k/s")

    print()
    print("== max/mean activations: 10k on 100 members, statistics published every 1 s ==")
    print(f"   (mean over {seeds} seeds, worst in brackets; random's expected ~1.26-1.30)")
    scenarios = [(8, 100.0), (8, 1000.0), (100, 100.0), (100, 1000.0)]
    if not args.quick:
        scenarios += [(1, 1000.0), (8, 10000.0), (100, 10000.0)]
    for placers, rate in scenarios:
        print(f"  -- {placers} placing members, {rate:.0f} activations/s cluster-wide --")
        for label, (mean, worst) in balance(seeds, placers=placers, rate=rate).items():
            print(f"    {label:26s} {mean:6.3f}  ({worst:.3f})")
    print("  -- churn: 8 placing members, 1000/s, each activation lives 10 s (~10k active) --")
    for label, (mean, worst) in balance(seeds, placers=8, rate=1000.0, lifetime=10.0).items():
        print(f"    {label:26s} {mean:6.3f}  ({worst:.3f})")

    print()
    print("== Grains moved (10k grains) ==")
    makers: dict[str, Callable[[], Placer]] = {
        "Orleans HashBased": lambda: OrleansHashBased(random.Random(0)),
        "HashBased": lambda: make_grain_strategy({"name": "HashBased"}),
        "ConsistentHashBased": lambda: make_grain_strategy({"name": "ConsistentHashBased"}),
    }
    for before, after in ((100, 101), (100, 99), (10, 11)):
        ideal = abs(after - before) / max(before, after)
        print(f"  -- {before} -> {after} members (ideal {ideal:.3f}) --")
        for label, make in makers.items():
            print(f"    {label:26s} {moved_fraction(make, before, after, 10_000):6.3f}")


if __name__ == "__main__":
    main()
