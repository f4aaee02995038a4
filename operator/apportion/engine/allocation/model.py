"""The vocabulary of unit allocation: members, requests, moves, plans and their quality."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "AllocationError",
    "AllocationRequest",
    "AllocationStrategy",
    "HotUnit",
    "Member",
    "Move",
    "Plan",
    "PlanQuality",
]


class AllocationError(ValueError):
    """A request or strategy specification that cannot be planned; the message says why."""


@dataclass(frozen=True, slots=True)
class Member:
    """A worker that can own units.

    ``capacity`` weighs the member's share (0 = takes no units); ``ready`` False means it is
    unreachable or not yet serving; ``draining`` True means it is on its way out (Akka's leaving);
    ``version`` is the app version, newest preferred during a rolling update.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    capacity: float = 1.0
    ready: bool = True
    version: str = ""
    draining: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise AllocationError(f"member name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.capacity, int | float) and math.isfinite(self.capacity)):
            raise AllocationError(f"member {self.name!r}: capacity must be a finite number")
        if self.capacity < 0:
            raise AllocationError(
                f"member {self.name!r}: capacity must not be negative, got {self.capacity}"
            )

    @property
    def eligible(self) -> bool:
        """Whether new units may go here in the normal course (ready, not draining, capacity)."""
        return self.ready and not self.draining and self.capacity > 0


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    """Everything a strategy decides from.

    ``units``: the units to place, in order (None: every unit in ``assignment``; assigned units
    not listed are dropped). ``assignment``: member name → its units, in order; a member not in
    ``members`` has left and its units must be placed again. ``loads``: unit → measured load
    (None: balance unit counts). ``in_progress``: units in hand-off, which stay where they are.
    """

    units: Sequence[str] | None
    members: Sequence[Member]
    assignment: Mapping[str, Sequence[str]]
    loads: Mapping[str, float] | None = None
    in_progress: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Move:
    """Unit ``unit`` goes from ``source`` (None: it had no owner) to ``target``."""

    unit: str
    source: str | None
    target: str


@dataclass(frozen=True, slots=True)
class HotUnit:
    """One unit whose load alone sets the floor of the most loaded member."""

    unit: str
    member: str
    load: float
    floor: float
    """The member's load / capacity with only this unit, relative to the mean."""
    split: int
    """Suggested number of parts so that each part fits under the mean member load."""


@dataclass(frozen=True, slots=True)
class PlanQuality:
    """How good a plan is and what it was held against.

    ``max_mean_*``: the most loaded eligible member's unit count / capacity over the mean;
    ``load_max_mean_*`` the same by load (when loads are given). ``lower_bound``: fewest moves
    that reach the balance this plan reaches (count floor, or the plan's max load); ``rounds``:
    plans needed to converge when known (0: nothing to do); ``converged``: another plan on the
    result would move nothing.
    """

    units: int
    members: int
    moves: int
    lower_bound: int
    max_mean_before: float
    max_mean_after: float
    load_max_mean_before: float | None = None
    load_max_mean_after: float | None = None
    moved_load: float | None = None
    rounds: int | None = None
    converged: bool = True
    hot_unit: HotUnit | None = None
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-ready camelCase fields (``apportion plan`` output)."""
        hot = self.hot_unit
        return {
            "units": self.units,
            "members": self.members,
            "moves": self.moves,
            "lowerBound": self.lower_bound,
            "maxMeanBefore": _round(self.max_mean_before),
            "maxMeanAfter": _round(self.max_mean_after),
            "loadMaxMeanBefore": _round(self.load_max_mean_before),
            "loadMaxMeanAfter": _round(self.load_max_mean_after),
            "movedLoad": _round(self.moved_load),
            "rounds": self.rounds,
            "converged": self.converged,
            "hotUnit": None
            if hot is None
            else {
                "unit": hot.unit,
                "member": hot.member,
                "load": _round(hot.load),
                "floor": _round(hot.floor),
                "split": hot.split,
            },
            "reasons": list(self.reasons),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True, slots=True)
class Plan:
    """Ordered moves, the assignment after them (every current member, in member order) and
    its quality. ``unassigned``: units no member can take (there is none)."""

    moves: tuple[Move, ...]
    assignment: Mapping[str, tuple[str, ...]]
    quality: PlanQuality
    unassigned: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"moves": [{"unit", "from", "to"}], "assignment": {...}, "metrics": {...}}``."""
        result: dict[str, Any] = {
            "moves": [{"unit": m.unit, "from": m.source, "to": m.target} for m in self.moves],
            "assignment": {member: list(units) for member, units in self.assignment.items()},
            # The key `apportion plan` has always printed; scripts read it.
            "metrics": self.quality.to_json(),
        }
        if self.unassigned:
            result["unassigned"] = list(self.unassigned)
        return result


@runtime_checkable
class AllocationStrategy(Protocol):
    """A pure function from a request to a plan."""

    def plan(self, request: AllocationRequest) -> Plan:
        """Plans one round for ``request``."""
        ...
