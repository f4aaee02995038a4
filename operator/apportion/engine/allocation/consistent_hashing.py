"""ConsistentHashing: Akka's ``ConsistentHashingShardAllocationStrategy``.

Consistent hashing (Karger et al., STOC 1997) with virtual nodes: each eligible member puts
``virtualNodes`` points (xxh3-64 of ``"<member>#<k>"``) on a 64-bit ring and a unit belongs to
the first point at or after xxh3-64 of its name. Units whose member is gone, not ready or
draining move to their ring owner at once; other units whose ring owner changed move in
member order, at most ``rebalanceLimit`` per plan (0: no limit), not while a hand-off of that
unit is in progress, and not at all while app versions are mixed or a member is not ready (Akka's
``isAGoodTimeToRebalance``). Capacity is ignored except that members with capacity 0 take
nothing. With 100 virtual nodes and no limit this is also Dapr's actor placement ring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apportion.engine.allocation.model import AllocationRequest, Plan, PlanQuality
from apportion.engine.allocation.options import Options
from apportion.engine.allocation.parameters import ConsistentHashingParameters
from apportion.engine.allocation.plan_builder import (
    PlanBuilder,
    State,
    count_lower_bound,
    count_ratio,
    index_request,
    target_members,
)
from apportion.engine.keys import xxh3_hashes


class Ring:
    """A hash ring over member indices."""

    def __init__(self, names: Sequence[str], owners: Sequence[int], virtual_nodes: int) -> None:
        labels = [f"{name}#{k}" for name in names for k in range(virtual_nodes)]
        points = xxh3_hashes(labels)
        order = np.argsort(points, kind="stable")
        self.points = points[order]
        self.owners = np.repeat(np.asarray(owners, dtype=np.int64), virtual_nodes)[order]

    def owners_of(self, units: Sequence[str]) -> np.ndarray:
        """The ring owner of each unit (member indices)."""
        if not len(self.points):
            raise ValueError("empty ring")
        slots = np.searchsorted(self.points, xxh3_hashes(units), side="left")
        return self.owners[slots % len(self.points)]


class ConsistentHashing:
    """Akka's consistent-hashing allocation (module docstring)."""

    name = "ConsistentHashing"

    def __init__(self, options: ConsistentHashingParameters | None = None) -> None:
        self.options = options or ConsistentHashingParameters()

    @classmethod
    def from_options(cls, spec: Mapping[str, Any]) -> ConsistentHashing:
        o = Options(cls.name, spec)
        options = ConsistentHashingParameters(
            virtual_nodes=o.integer("virtualNodes", 10, minimum=1) or 10,
            rebalance_limit=o.integer("rebalanceLimit", 0) or 0,
        )
        o.done()
        return cls(options)

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        members = state.members
        builder = PlanBuilder(state)
        targets, why = target_members(state)
        reasons = [why] if why else []
        deferred = self._place(state, builder, targets, reasons) if targets else 0
        before = [state.count(i) for i in range(len(members))]
        quality = PlanQuality(
            units=state.total,
            members=len(targets),
            moves=builder.moves,
            lower_bound=count_lower_bound(state, targets),
            max_mean_before=count_ratio(before, state, targets),
            max_mean_after=count_ratio(builder.counts(), state, targets),
            converged=not deferred,
            reasons=tuple(reasons),
        )
        return builder.build(quality)

    def _place(
        self, state: State, builder: PlanBuilder, targets: list[int], reasons: list[str]
    ) -> int:
        """Moves units to their ring owners; returns how many wait for a later plan."""
        members = state.members
        ring = Ring([members[i].name for i in targets], targets, self.options.virtual_nodes)
        if state.homeless:
            owners = ring.owners_of([u for u, _ in state.homeless])
            for (unit, origin), i in zip(state.homeless, owners.tolist(), strict=True):
                builder.move(unit, origin, i)
        is_target = [False] * len(members)
        for i in targets:
            is_target[i] = True
        # Units of members that may not keep them move regardless; the rest follow the ring
        # only in a good time to rebalance, up to the limit.
        paused = self._paused(state)
        budget = self.options.rebalance_limit or state.total
        deferred = 0
        for i, held in enumerate(state.held):
            if not held:
                continue
            for unit, owner in zip(held, ring.owners_of(held).tolist(), strict=True):
                if owner == i or unit in state.in_progress:
                    continue
                if is_target[i]:
                    if paused or not budget:
                        deferred += 1
                        continue
                    budget -= 1
                builder.move(unit, i, owner)
        if deferred:
            why = paused or f"rebalance limit {self.options.rebalance_limit} reached"
            reasons.append(f"{why}: {deferred} unit(s) wait for a later plan")
        return deferred

    @staticmethod
    def _paused(state: State) -> str | None:
        members = state.members
        versions = {m.version for m in members if m.ready and not m.draining}
        if len(versions) > 1:
            return "rebalance paused: app versions are mixed (rolling update)"
        not_ready = [m.name for m in members if not m.ready]
        if not_ready:
            return f"rebalance paused: member {not_ready[0]!r} is not ready"
        return None
