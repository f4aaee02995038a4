"""LeastShards: Akka's ``LeastShardAllocationStrategy`` (akka-cluster-sharding, 2.6.10+).

One plan is one Akka round: units without a live owner — and every unit of a draining member,
which Akka hands off on graceful shutdown — are allocated one by one to the most suitable
member (not draining, then newest app version, then fewest units, then member order); then one
rebalance round: phase 1 takes from each member its units above ``optimal = ⌈units/members⌉``
(most loaded first), else phase 2 takes one unit from each member at ``optimal`` or above while
members sit two or more below it (at most that deficit); at most
``max(1, min(relativeLimit x units, absoluteLimit))`` units per round; the taken units are
reallocated like new ones. No round while a hand-off is in progress, app versions are mixed
(rolling update) or a member is not ready (Akka: unreachable). Capacity is ignored except that
members with capacity 0 take nothing; not-ready members keep their units, as Akka's
unreachable regions do; draining members sit out the rebalance round.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

from apportion.engine.allocation.model import AllocationRequest, Plan, PlanQuality
from apportion.engine.allocation.options import Options
from apportion.engine.allocation.parameters import LeastShardsParameters
from apportion.engine.allocation.plan_builder import (
    Origin,
    PlanBuilder,
    State,
    count_lower_bound,
    count_ratio,
    index_request,
    target_members,
    version_key,
)


class _Allocator:
    """Akka's ``ShardSuitabilityOrdering`` as a heap: (draining, newest version, fewest units,
    member order)."""

    def __init__(self, state: State, counts: list[int], candidates: Sequence[int]) -> None:
        members = state.members
        versions = sorted({members[i].version for i in candidates}, key=version_key, reverse=True)
        rank = {v: r for r, v in enumerate(versions)}
        self.counts = counts
        self.key = {i: (members[i].draining, rank[members[i].version]) for i in candidates}
        self.heap = [(*self.key[i], counts[i], i) for i in candidates]
        heapq.heapify(self.heap)

    def take(self, i: int) -> None:
        self.counts[i] -= 1
        if i in self.key:
            heapq.heappush(self.heap, (*self.key[i], self.counts[i], i))

    def allocate(self) -> int:
        while True:
            draining, rank, count, i = heapq.heappop(self.heap)
            if count == self.counts[i]:
                break
        self.counts[i] += 1
        heapq.heappush(self.heap, (draining, rank, self.counts[i], i))
        return i


class LeastShards:
    """Akka's LeastShardAllocationStrategy (module docstring)."""

    name = "LeastShards"

    def __init__(self, options: LeastShardsParameters | None = None) -> None:
        self.options = options or LeastShardsParameters()

    @classmethod
    def from_options(cls, spec: Mapping[str, Any]) -> LeastShards:
        o = Options(cls.name, spec)
        options = LeastShardsParameters(
            absolute_limit=o.integer("absoluteLimit", 20) or 0,
            relative_limit=o.number("relativeLimit", 0.1, 0.0, 1.0) or 0.0,
        )
        o.done()
        return cls(options)

    def limit(self, units: int) -> int:
        o = self.options
        return max(1, min(int(o.relative_limit * units), o.absolute_limit))

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        members = state.members
        builder = PlanBuilder(state)
        reasons: list[str] = []
        counts = [state.count(i) for i in range(len(members))]
        candidates = [i for i, m in enumerate(members) if m.ready and m.capacity > 0]
        if not candidates:
            candidates = [i for i, m in enumerate(members) if m.capacity > 0]
            reasons.append(
                "no ready member: allocating to members that are not ready"
                if candidates
                else "no member can take units"
            )

        pending: list[tuple[str, Origin]] = list(state.homeless)
        # Draining members hand everything off, if there is somewhere else to go.
        if any(not members[i].draining for i in candidates):
            for i, m in enumerate(members):
                if (m.draining or m.capacity <= 0) and state.held[i]:
                    pending.extend((u, i) for u in state.held[i] if u not in state.in_progress)
        if candidates:
            allocator = _Allocator(state, counts, candidates)
            for unit, origin in pending:
                if isinstance(origin, int):
                    allocator.take(origin)
                builder.move(unit, origin, allocator.allocate())

            regions = [i for i in candidates if not members[i].draining]
            paused = self._paused(state, regions)
            if paused:
                reasons.append(paused)
            else:
                # Like Akka's coordinator: every taken unit leaves first, then each is allocated.
                taken = self._rebalance(builder, regions, counts)
                for _, i in taken:
                    allocator.take(i)
                for unit, i in taken:
                    builder.move(unit, i, allocator.allocate())
            converged = not self._phases(
                [builder.units_of(i) for i in regions], [counts[i] for i in regions], None
            )
        else:
            converged = not state.total

        targets, _ = target_members(state)
        before = [state.count(i) for i in range(len(members))]
        quality = PlanQuality(
            units=state.total,
            members=len(targets),
            moves=builder.moves,
            lower_bound=count_lower_bound(state, targets),
            max_mean_before=count_ratio(before, state, targets),
            max_mean_after=count_ratio(builder.counts(), state, targets),
            converged=converged,
            reasons=tuple(reasons),
        )
        return builder.build(quality)

    @staticmethod
    def _paused(state: State, regions: Sequence[int]) -> str | None:
        """Why no rebalance round runs now (Akka's ``isAGoodTimeToRebalance``), if so."""
        members = state.members
        if state.in_progress:
            return "rebalance paused: a hand-off is in progress"
        if len({members[i].version for i in regions}) > 1:
            return "rebalance paused: app versions are mixed (rolling update)"
        not_ready = [m.name for m in members if not m.ready]
        if not_ready:
            return f"rebalance paused: member {not_ready[0]!r} is not ready"
        return None

    def _rebalance(
        self, builder: PlanBuilder, regions: Sequence[int], counts: Sequence[int]
    ) -> list[tuple[str, int]]:
        """The units one round takes, with their member."""
        lists = [builder.units_of(i) for i in regions]
        sizes = [counts[i] for i in regions]
        chosen = self._phases(lists, sizes, self.limit(sum(sizes)))
        return [(unit, regions[k]) for unit, k in chosen]

    @staticmethod
    def _phases(
        lists: Sequence[list[str]], sizes: Sequence[int], limit: int | None
    ) -> list[tuple[str, int]]:
        """Akka's rebalance phases 1 and 2 over regions ``lists`` (unit lists, member order);
        ``limit`` None: no limit. Returns (unit, region position) pairs."""
        total, n = sum(sizes), len(sizes)
        if not n or not total:
            return []
        optimal = -(-total // n)
        order = sorted(range(n), key=lambda k: (sizes[k], k))
        cap = total if limit is None else limit
        taken = [
            (unit, k)
            for k in reversed(order)
            if sizes[k] > optimal
            for unit in lists[k][: sizes[k] - optimal]
        ]
        if taken:
            return taken[:cap]
        below = sum(max(0, optimal - 1 - sizes[k]) for k in order)
        if not below:
            return []
        heads = [(lists[k][0], k) for k in order if sizes[k] >= optimal]
        return heads[: min(below, cap)]
