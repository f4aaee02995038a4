"""External: units pinned by the user (Akka's ``ExternalShardAllocationStrategy``); the rest by a
fallback strategy (default Balanced).

A pin to an eligible member (ready, not draining, capacity > 0) is applied — the unit moves there
if it is elsewhere, even during a hand-off of other units, as Akka applies external locations at
the next rebalance. A pin to a member that is absent or not eligible is ignored for this plan
(reported) and the fallback places that unit. The fallback sees only the units that are not
pinned, so pinned units do not count toward its balance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apportion.engine.allocation.model import (
    AllocationRequest,
    AllocationStrategy,
    Plan,
    PlanQuality,
)
from apportion.engine.allocation.options import Options
from apportion.engine.allocation.plan_builder import (
    PlanBuilder,
    count_ratio,
    index_request,
    target_members,
)


class External:
    """Pins plus a fallback strategy (module docstring)."""

    name = "External"

    def __init__(self, pins: Mapping[str, str], fallback: AllocationStrategy) -> None:
        self.pins = dict(pins)
        self.fallback = fallback

    @classmethod
    def from_options(
        cls,
        spec: Mapping[str, Any],
        make_fallback: Callable[[Mapping[str, Any]], AllocationStrategy],
    ) -> External:
        """`make_fallback` builds the fallback from its mapping (the registry's `make_strategy`,
        passed in so that this module does not import the registry that lists it)."""
        o = Options(cls.name, spec)
        raw = o.raw("pins")
        pins: dict[str, str] = {}
        if isinstance(raw, Mapping):
            items = list(raw.items())
        elif isinstance(raw, list) and all(isinstance(p, Mapping) for p in raw):
            items = [(p.get("unit"), p.get("member")) for p in raw]
        elif raw is None:
            items = []
        else:
            raise o.error("pins must be an object {unit: member} or a list of {unit, member}")
        for unit, member in items:
            if not isinstance(unit, str) or not isinstance(member, str):
                raise o.error(f"pin {unit!r} → {member!r}: unit and member must be strings")
            if unit in pins:
                raise o.error(f"unit {unit!r} is pinned twice")
            pins[unit] = member
        fallback_spec = o.mapping("fallback") or {"name": "Balanced"}
        if fallback_spec.get("name") == cls.name:
            raise o.error("the fallback cannot be External itself")
        o.done()
        return cls(pins, make_fallback(fallback_spec))

    def plan(self, request: AllocationRequest) -> Plan:
        state = index_request(request)
        members = state.members
        builder = PlanBuilder(state)
        reasons: list[str] = []

        applied: dict[str, int] = {}
        ignored: list[str] = []
        for unit, member in self.pins.items():
            i = state.index.get(member)
            if i is not None and members[i].eligible:
                applied[unit] = i
            else:
                ignored.append(unit)

        in_scope: set[str] = {u for u, _ in state.homeless}
        for i, held in enumerate(state.held):
            in_scope.update(held)
            for unit in held:
                target = applied.get(unit)
                if target is not None and unit not in state.in_progress:
                    builder.move(unit, i, target)
        for unit, origin in state.homeless:
            target = applied.get(unit)
            if target is not None:
                builder.move(unit, origin, target)
        pinned_moves = builder.moves
        ignored_in_scope = [u for u in ignored if u in in_scope]
        if ignored_in_scope:
            reasons.append(
                f"{len(ignored_in_scope)} pin(s) to absent or ineligible members ignored, "
                f"e.g. {ignored_in_scope[0]!r} → {self.pins[ignored_in_scope[0]]!r}"
            )

        rest = AllocationRequest(
            units=None if request.units is None else [u for u in request.units if u not in applied],
            members=members,
            assignment={
                member: [u for u in units if u not in applied]
                for member, units in request.assignment.items()
            },
            loads=request.loads,
            in_progress=request.in_progress,
        )
        sub = self.fallback.plan(rest)
        for move in sub.moves:
            came_from = state.index.get(move.source, move.source) if move.source else None
            builder.move(move.unit, came_from, state.index[move.target])
        reasons.extend(sub.quality.reasons)

        targets, _ = target_members(state)
        before = [state.count(i) for i in range(len(members))]
        quality = PlanQuality(
            units=state.total,
            members=len(targets),
            moves=builder.moves,
            lower_bound=pinned_moves + sub.quality.lower_bound,
            max_mean_before=count_ratio(before, state, targets),
            max_mean_after=count_ratio(builder.counts(), state, targets),
            load_max_mean_before=sub.quality.load_max_mean_before,
            load_max_mean_after=sub.quality.load_max_mean_after,
            moved_load=sub.quality.moved_load,
            rounds=sub.quality.rounds,
            converged=sub.quality.converged,
            hot_unit=sub.quality.hot_unit,
            reasons=tuple(reasons),
        )
        return builder.build(quality)
