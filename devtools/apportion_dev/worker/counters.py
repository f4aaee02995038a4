"""Per-key counters: the demo worker's unit state (docs/worker.md#unit-state-counters-per-key).

Each unit holds, for each key it has served, how many increments it applied and the number of
the last one. A client numbers its increments of a key 1, 2, 3 …, so an increment that is sent
again (the answer was lost, the pod moved) is applied once: a number not above the key's last
one is a repeat. Pure: the worker moves these maps between pods (`apportion.worker._state_transfer`)
and cuts or joins them when the unit count changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from apportion.worker._worker_state import UnitRange

UnitOf = Callable[[str, int], int]
"""`unit_of(key, count)`: the key's unit under `count` units (the set's key scheme)."""


@dataclass(slots=True)
class KeyCount:
    count: int = 0
    last: int = 0
    """Number of the last numbered increment applied (0: none)."""

    def to_json(self) -> list[int]:
        return [self.count, self.last]

    @classmethod
    def from_json(cls, value: object) -> KeyCount:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and v >= 0 for v in value)
        ):
            raise ValueError(f"a key's counter is [count, last], not {value!r}")
        return cls(value[0], value[1])


Counts = dict[str, KeyCount]
"""One unit's counters: key → its counter."""


def increment(counts: Counts, key: str, number: int | None = None) -> KeyCount:
    """Count one increment of `key`; numbered ones (≥ 1) only when above the key's last."""
    entry = counts.setdefault(key, KeyCount())
    if number is None or number > entry.last:
        entry.count += 1
        entry.last = max(entry.last, number or 0)
    return entry


def split(counts: Counts, children: tuple[UnitRange, ...], unit_of: UnitOf) -> dict[str, Counts]:
    """`counts` of a parent cut into `children` (each key into the child holding it); keys of
    children not listed belong to another pod's children and are left out."""
    result: dict[str, Counts] = {child.unit: {} for child in children}
    if not result:
        return result
    (count,) = {child.count for child in children}
    for key, entry in counts.items():
        unit = str(unit_of(key, count))
        if unit in result:
            result[unit][key] = entry
    return result


def merge(parts: Iterable[Counts]) -> Counts:
    """The counters of siblings joined (their key ranges are disjoint)."""
    merged: Counts = {}
    for part in parts:
        merged.update(part)
    return merged


def to_json(counts: Counts) -> dict[str, list[int]]:
    return {key: entry.to_json() for key, entry in sorted(counts.items())}


def from_json(data: Mapping[str, object]) -> Counts:
    return {str(key): KeyCount.from_json(value) for key, value in data.items()}
