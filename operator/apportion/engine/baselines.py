"""Anchors: the placements apportion's unit allocation is measured against, in one lineup for
``bench/bench_allocation.py`` and ``apportion simulate --compare``.

Three are built-in strategies configured as their originals ship them: Akka's LeastShards
(limits 20 / 0.1), Akka's ConsistentHashing (10 virtual nodes) and a Dapr-style placement ring
(ConsistentHashing with 100 virtual nodes). Two are stateless baselines ported here, which are
yardsticks only and not offered as allocation strategies:

- Orleans mod-n: Orleans' HashBasedPlacementDirector applied to units,
  ``sorted_members[(hash & 0x7fffffff) % n]`` (xxh3-64 of the unit name standing in for the
  grain's uniform hash), re-evaluated for every unit on every plan;
- random: new and orphaned units to a uniformly random eligible member, nothing else moves.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from apportion.engine.allocation import (
    AllocationRequest,
    AllocationStrategy,
    Plan,
    PlanQuality,
    make_strategy,
)
from apportion.engine.allocation.options import Options
from apportion.engine.allocation.plan_builder import PlanBuilder, index_request, target_members
from apportion.engine.keys import xxh3_hashes

__all__ = ["ANCHORS", "BASELINES", "OrleansModN", "RandomAllocation", "make_anchor"]

_INT31 = np.uint64(0x7FFFFFFF)


def _count_quality(builder: PlanBuilder) -> PlanQuality:
    return PlanQuality(builder.state.total, len(builder.state.members), builder.moves, 0, 0.0, 0.0)


class OrleansModN:
    """Orleans' hash placement over units: ``sorted_members[(hash & 0x7fffffff) % n]``."""

    name = "OrleansModN"

    @classmethod
    def from_options(cls, spec: Mapping[str, Any]) -> OrleansModN:
        Options(cls.name, spec).done()
        return cls()

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        targets, _ = target_members(state)
        ordered = sorted(targets, key=lambda i: state.members[i].name)
        builder = PlanBuilder(state)
        everyone = [*state.homeless, *((u, i) for i, held in enumerate(state.held) for u in held)]
        if ordered:
            hashes = xxh3_hashes([u for u, _ in everyone]) & _INT31
            slots = (hashes % np.uint64(len(ordered))).tolist()
            for (unit, origin), slot in zip(everyone, slots, strict=True):
                builder.move(unit, origin, ordered[slot])
        return builder.build(_count_quality(builder))


class RandomAllocation:
    """New and orphaned units to a uniformly random eligible member; nothing else moves."""

    name = "Random"

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)

    @classmethod
    def from_options(cls, spec: Mapping[str, Any]) -> RandomAllocation:
        options = Options(cls.name, spec)
        seed = options.integer("seed", 1)
        options.done()
        return cls(1 if seed is None else seed)

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        targets, _ = target_members(state)
        builder = PlanBuilder(state)
        target_set = set(targets)
        pending = [
            *state.homeless,
            *((u, i) for i, held in enumerate(state.held) if i not in target_set for u in held),
        ]
        if targets:
            for unit, origin in pending:
                builder.move(unit, origin, self.rng.choice(targets))
        return builder.build(_count_quality(builder))


BASELINES: Mapping[str, Callable[[Mapping[str, Any]], AllocationStrategy]] = MappingProxyType(
    {
        OrleansModN.name: OrleansModN.from_options,
        RandomAllocation.name: RandomAllocation.from_options,
    }
)
"""The ported baselines by spec name."""

ANCHORS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "LeastShards": {"name": "LeastShards", "absoluteLimit": 20, "relativeLimit": 0.1},
        "ConsistentHashing": {"name": "ConsistentHashing", "virtualNodes": 10},
        "Dapr ring": {"name": "ConsistentHashing", "virtualNodes": 100},
        "Orleans mod-n": {"name": OrleansModN.name},
        "random": {"name": RandomAllocation.name, "seed": 1},
    }
)
"""Every anchor by label, as a spec for :func:`make_anchor`."""


def make_anchor(spec: Mapping[str, Any]) -> AllocationStrategy:
    """The strategy of an anchor spec: a ported baseline by name, else any strategy
    :func:`~apportion.engine.allocation.make_strategy` knows."""
    factory = BASELINES.get(spec.get("name", ""))
    return make_strategy(spec) if factory is None else factory(spec)
