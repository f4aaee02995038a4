"""A request indexed for planning, and the bookkeeping every strategy shares.

Strategies work on member indices and per-member unit lists; :class:`PlanBuilder` records moves
and produces the resulting assignment, so every strategy gets the invariants (no unit lost or
duplicated, assignment == request assignment with the moves applied) from one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from apportion.engine.allocation.model import (
    AllocationError,
    AllocationRequest,
    Member,
    Move,
    Plan,
    PlanQuality,
)

Origin = int | str | None
"""Where a unit is in the request: a present member's index, a gone member's name, or None."""


@dataclass(slots=True)
class State:
    """``held[i]``: units member ``i`` owns (in scope, in order); ``homeless``: units whose
    owner is gone (with its name) or that had none (None)."""

    request: AllocationRequest
    members: tuple[Member, ...]
    index: dict[str, int]
    held: list[list[str]]
    homeless: list[tuple[str, str | None]]
    total: int
    dropped: int
    in_progress: frozenset[str]

    def count(self, i: int) -> int:
        return len(self.held[i])


def index_request(request: AllocationRequest) -> State:
    """Validates ``request`` and indexes it; raises :class:`AllocationError` on bad input."""
    members = tuple(request.members)
    index: dict[str, int] = {}
    for i, member in enumerate(members):
        if member.name in index:
            raise AllocationError(f"member {member.name!r} is listed twice")
        index[member.name] = i

    assigned: set[str] = set()
    n_assigned = 0
    for units in request.assignment.values():
        assigned.update(units)
        n_assigned += len(units)
    if len(assigned) != n_assigned:
        raise AllocationError(_assigned_twice(request))

    scope: set[str] | None = None
    if request.units is not None:
        scope = set(request.units)
        if len(scope) != len(request.units):
            raise AllocationError(f"unit {_first_duplicate(request.units)!r} is listed twice")
        if scope == assigned:
            scope = None  # the common case: nothing to filter

    held: list[list[str]] = [[] for _ in members]
    homeless: list[tuple[str, str | None]] = []
    dropped = 0
    for name, units in request.assignment.items():
        kept = list(units) if scope is None else [u for u in units if u in scope]
        dropped += len(units) - len(kept)
        at = index.get(name)
        if at is None:
            homeless.extend((u, name) for u in kept)
        else:
            held[at] = kept
    if request.units is not None and scope is not None:
        homeless.extend((u, None) for u in request.units if u not in assigned)

    _check_loads(request)
    total = sum(map(len, held)) + len(homeless)
    return State(request, members, index, held, homeless, total, dropped, request.in_progress)


def _assigned_twice(request: AllocationRequest) -> str:
    owner: dict[str, str] = {}
    for name, units in request.assignment.items():
        for unit in units:
            if unit in owner:
                first = owner[unit]
                where = f"to {first!r} twice" if first == name else f"to {first!r} and {name!r}"
                return f"unit {unit!r} is assigned {where}"
            owner[unit] = name
    raise AssertionError("no duplicate found")


def _first_duplicate(items: Sequence[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    raise AssertionError("no duplicate found")


def _check_loads(request: AllocationRequest) -> None:
    if request.loads is None:
        return
    try:
        values = np.fromiter(request.loads.values(), dtype=float, count=len(request.loads))
    except (TypeError, ValueError):
        values = np.array([math.nan])
    if not bool(np.all(np.isfinite(values) & (values >= 0))):
        bad = next(
            (u, v)
            for u, v in request.loads.items()
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0
        )
        raise AllocationError(
            f"load of unit {bad[0]!r} must be a finite number >= 0, got {bad[1]!r}"
        )


def target_members(state: State) -> tuple[list[int], str | None]:
    """Members units may be placed on, and why the choice is unusual (if it is).

    Ready, not draining, capacity > 0; if there is none, ready ones (draining allowed); then any
    with capacity. Units never go to a not-ready or draining member while another exists.
    """
    tiers: tuple[tuple[Callable[[Member], bool], str | None], ...] = (
        (lambda m: m.eligible, None),
        (
            lambda m: m.ready and m.capacity > 0,
            "no ready member that is not draining: using draining ones",
        ),
        (lambda m: m.capacity > 0, "no ready member: using members that are not ready"),
    )
    for accept, reason in tiers:
        chosen = [i for i, m in enumerate(state.members) if accept(m)]
        if chosen:
            return chosen, reason
    reason = "no member can take units" if state.members else "no members"
    return [], reason


def hamilton_quotas(total: int, capacities: Sequence[float], current: Sequence[int]) -> list[int]:
    """Unit counts proportional to capacity, each the floor or ceiling of its exact share.

    Largest-remainder (Hamilton) apportionment: the round-ups go where they keep the largest
    count / capacity lowest, and among equal choices to members already holding the extra unit,
    so that the fewest units move.
    """
    if not capacities:
        return []
    whole = math.fsum(capacities)
    shares = [total * c / whole for c in capacities]
    quotas = [math.floor(s + 1e-9) for s in shares]
    while sum(quotas) > total:  # rounding pushed a share over an integer
        j = max(range(len(quotas)), key=lambda i: (quotas[i] - shares[i], -i))
        quotas[j] -= 1
    extra = total - sum(quotas)
    if extra:
        # Only a fractional share rounds up (the quota rule): a member whose share is whole
        # gets exactly it, however many units it holds now. The fractions sum to `extra`, each
        # below 1, so more than `extra` members have one.
        fractional = [i for i, s in enumerate(shares) if s - quotas[i] > 1e-9]
        level = {i: round((quotas[i] + 1) / capacities[i], 9) for i in fractional}
        threshold = sorted(level.values())[extra - 1]
        candidates = [i for i, v in level.items() if v <= threshold]
        candidates.sort(key=lambda i: (current[i] <= quotas[i], level[i], i))
        for i in candidates[:extra]:
            quotas[i] += 1
    return quotas


class PlanBuilder:
    """Records moves against a :class:`State` and produces the :class:`Plan`."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._moves: list[Move | None] = []
        self._slot: dict[str, int] = {}
        self._at: dict[str, int] = {}
        self._origin: dict[str, Origin] = {}
        self._removed: dict[int, set[str]] = {}
        self._added: dict[int, list[str]] = {}

    def move(self, unit: str, current: Origin, target: int) -> None:
        """Moves ``unit`` from where it is now (``current``: a member index, or its place in the
        request if it never moved: a gone member's name or None) to member ``target``.

        A unit moved twice keeps one move, to its last target; moving it home cancels it.
        """
        members = self.state.members
        slot = self._slot.get(unit)
        if slot is None:
            if current == target:
                return
            if isinstance(current, int):
                self._removed.setdefault(current, set()).add(unit)
            self._slot[unit] = len(self._moves)
            self._origin[unit] = current
            self._moves.append(Move(unit, _source(current, members), members[target].name))
        else:
            if target == self._at[unit]:
                return
            self._added[self._at[unit]].remove(unit)
            origin = self._origin[unit]
            if origin == target:
                assert isinstance(origin, int)
                self._removed[origin].discard(unit)
                self._moves[slot] = None
                del self._slot[unit], self._at[unit], self._origin[unit]
                return
            self._moves[slot] = Move(unit, _source(origin, members), members[target].name)
        self._at[unit] = target
        self._added.setdefault(target, []).append(unit)

    def moved(self) -> list[tuple[str, Origin, int]]:
        """(unit, origin, current member) of every unit moved so far, latest first."""
        return [
            (m.unit, self._origin[m.unit], self._at[m.unit]) for m in reversed(self._moves) if m
        ]

    def units_of(self, i: int) -> list[str]:
        """Member ``i``'s units after the moves so far."""
        removed = self._removed.get(i)
        held = self.state.held[i]
        kept = [u for u in held if u not in removed] if removed else list(held)
        return kept + self._added.get(i, [])

    @property
    def moves(self) -> int:
        return len(self._slot)

    def counts(self) -> list[int]:
        """Units per member after the moves so far."""
        counts = [len(h) for h in self.state.held]
        for i, units in self._removed.items():
            counts[i] -= len(units)
        for i, added in self._added.items():
            counts[i] += len(added)
        return counts

    def build(self, quality: PlanQuality) -> Plan:
        state = self.state
        assignment: dict[str, tuple[str, ...]] = {}
        for i, member in enumerate(state.members):
            assignment[member.name] = tuple(self.units_of(i))
        unassigned = tuple(u for u, _ in state.homeless if u not in self._slot)
        moves = tuple(m for m in self._moves if m is not None)
        return Plan(moves, assignment, quality, unassigned)


def _source(origin: Origin, members: Sequence[Member]) -> str | None:
    return members[origin].name if isinstance(origin, int) else origin


def count_ratio(counts: Sequence[int], state: State, targets: Sequence[int]) -> float:
    """Largest count / capacity among ``targets`` over the mean (0 when nothing to measure)."""
    if not targets or not state.total:
        return 0.0
    members = state.members
    whole = math.fsum(members[i].capacity for i in targets)
    mean = state.total / whole
    return max(counts[i] / members[i].capacity for i in targets) / mean


def count_lower_bound(
    state: State, targets: Sequence[int], quotas: Sequence[int] | None = None
) -> int:
    """Fewest moves that bring unit counts to ``quotas`` (default: the Hamilton quotas over
    ``targets``, i.e. the count floor).

    Homeless units, units on members that may not keep them (not targets) and each target's
    surplus over its quota all have to move; units in hand-off are held in place.
    """
    members = state.members
    target_set = set(targets)
    forced = len(state.homeless)
    for i, held in enumerate(state.held):
        if i not in target_set and held:
            forced += sum(1 for u in held if u not in state.in_progress)
    current = [len(state.held[i]) for i in targets]
    if quotas is None:
        quotas = hamilton_quotas(state.total, [members[i].capacity for i in targets], current)
    surplus = sum(max(0, c - q) for c, q in zip(current, quotas, strict=True))
    return forced + surplus


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Orders app versions like Akka's ``Version``: dot/dash separated, numbers numerically."""
    parts = version.replace("-", ".").replace("+", ".").split(".") if version else []
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in parts)


def domains_of(state: State, targets: Sequence[int], key: str | None) -> list[str] | None:
    """Each target's topology domain (label value, "" when unlabelled), or None without a key."""
    if key is None:
        return None
    return [state.members[i].labels.get(key, "") for i in targets]
