"""Online resharding: change a set's unit count while it serves, moving nothing by itself.

Range partitioning as in Google's Slicer and Databricks' Dicer, on the `apportion` key scheme:
unit `u` of `n` is the hash range [⌈u·2⁶⁴/n⌉, ⌈(u+1)·2⁶⁴/n⌉), so a split by `k` turns unit `u`
into the children `k·u … k·u+k-1` and a merge turns them back, no key changing parent.

The protocol is a sequence of published tables (docs/resharding.md):

- **Settling.** No new move starts (the pass holds every optional move); hand-offs under way
  finish through the fenced hand-off, so that each unit has exactly one owner.
- **Gathering** (merge only). Siblings are moved, through ordinary hand-offs, onto one pod per
  group: where most of the group already is.
- **Publishing.** One table with the new count, each new unit on the pod of its parent(s) under
  a new token, and a `lineage` saying how it derives from the previous count, so each worker
  splits or merges its local state in place. Only then does the normal rebalance spread the
  new units, again through the hand-off.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.api.assignment import AssignmentTable, Incarnation, Lineage, UnitState
from apportion.engine.handoff import owned_units, releasing_units

HASH_BITS = 64


def hash_range(unit: int, count: int) -> tuple[int, int]:
    """The 64-bit hashes `[lo, hi)` that the apportion scheme maps to `unit` of `count`:
    `(h · count) >> 64 == unit` exactly when `lo ≤ h < hi`."""
    if not 0 <= unit < count:
        raise ValueError(f"unit {unit} is not in 0..{count - 1}")
    return -(-(unit << HASH_BITS) // count), -(-((unit + 1) << HASH_BITS) // count)


def next_count(published: int, wanted: int) -> int:
    """The count of the next table on the way from `published` to `wanted` units: `wanted` when
    one is a multiple of the other, else their greatest common divisor (merge, then split)."""
    small, big = sorted((published, wanted))
    return wanted if big % small == 0 else math.gcd(published, wanted)


def next_lineage(published: AssignmentTable, wanted: int) -> Lineage | None:
    """The resharding the next table makes, None when the published count is the one wanted."""
    if published.count == wanted:
        return None
    tokens = tuple(published.units[str(u)].epoch for u in range(published.count))
    return Lineage(
        published.count, next_count(published.count, wanted), published.epoch + 1, tokens
    )


def gather_targets(lineage: Lineage, target: Mapping[str, str | None]) -> dict[str, str | None]:
    """For a merge: `target` with each group of siblings sent to one member, the one most of the
    group is with or on its way to (ties: the one of the lowest sibling), so that the fewest
    hand-offs gather it. Groups nobody owns stay as `target` has them."""
    gathered = dict(target)
    for parent in range(lineage.to_count):
        siblings = [str(u) for u in lineage.parents(parent)]
        votes = Counter(target.get(u) for u in siblings if target.get(u) is not None)
        if not votes:
            continue
        top = max(votes.values())
        place = next(target[u] for u in siblings if votes.get(target.get(u), 0) == top)
        for unit in siblings:
            gathered[unit] = place
    return gathered


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the next table is: `ready` of its `total` units could be published now."""

    lineage: Lineage
    ready: int
    total: int

    @property
    def phase(self) -> str:
        return "Settling" if self.lineage.split else "Gathering"

    @property
    def done(self) -> bool:
        return self.ready == self.total


def progress(published: AssignmentTable, lineage: Lineage) -> Progress:
    """Which units of the next table have their parents on one pod, with no hand-off under way
    (a unit held by nobody counts as ready: its children or merged unit are unowned too)."""
    ready = 0
    for unit in range(lineage.to_count):
        states = [published.units[str(p)] for p in lineage.parents(unit)]
        owners = {s.owner for s in states}
        if len(owners) == 1 and all(s.releasing is None for s in states):
            ready += 1
    return Progress(lineage, ready, lineage.to_count)


def resharded(published: AssignmentTable, lineage: Lineage, generation: int) -> AssignmentTable:
    """The table with the new count: each unit on the pod of its parent(s), under the new epoch
    as its token (it is a new range: a fencing store must not take it for the old unit of the
    same number). Call only when `progress(...).done`."""
    epoch = published.epoch + 1
    units = {}
    for unit in range(lineage.to_count):
        (owner,) = {published.units[str(p)].owner for p in lineage.parents(unit)}
        units[str(unit)] = UnitState(owner, epoch)
    return AssignmentTable(
        published.set_ref,
        generation,
        published.key_scheme,
        lineage.to_count,
        epoch,
        published.members,
        units,
        Lineage(lineage.from_count, lineage.to_count, epoch, lineage.parent_epochs),
        published.serving_lease,
    )


@dataclass(frozen=True)
class Reshape:
    """What a worker does with its in-memory state when a table changes the count it serves.

    `carried`: new unit → the old units whose state it takes over in place (split: the parent,
    whose state is cut to the child's range; merge: the siblings, joined). `load`: new unit →
    old units whose state is not in memory here and must be loaded as an acquire would (a
    merge whose sibling this process had not acquired yet). `dropped`: old units served whose
    state goes nowhere (served under a stale token, or their children are not mine): stop them.
    `serving`: the serving map in the new count's unit names, to go on with `plan_worker`.
    """

    carried: Mapping[str, tuple[str, ...]]
    load: Mapping[str, tuple[str, ...]]
    dropped: frozenset[str]
    serving: Mapping[str, int]


def reshape(
    table: AssignmentTable, me: Incarnation, view_count: int, serving: Mapping[str, int]
) -> Reshape | None:
    """The worker's resharding rule, before `plan_worker`, for a table whose count differs from
    `view_count`, the count of the last table it handled (None: same count, nothing to do).

    A new unit takes over in-memory state only if it is mine (name, uid) still under the token
    the resharding gave it — also when a later table already marks it releasing from me: the
    state is then handed over by that release, not dropped — and only from parents I served
    under exactly the token they had just before it. Anything else is dropped and acquired afresh by
    `plan_worker`: a worker that missed a whole resharding, or a change of owner in between,
    reloads state as after a move instead of serving stale state.
    """
    if table.count == view_count:
        return None
    lineage = table.lineage
    if lineage is None or lineage.from_count != view_count:
        return Reshape({}, {}, frozenset(serving), {})
    carried: dict[str, tuple[str, ...]] = {}
    load: dict[str, tuple[str, ...]] = {}
    new_serving: dict[str, int] = {}
    mine_now = owned_units(table, me) | releasing_units(table, me)
    for unit in range(lineage.to_count):
        name = str(unit)
        if name not in mine_now or table.units[name].epoch != lineage.epoch:
            continue
        parents = [str(p) for p in lineage.parents(unit)]
        mine = tuple(p for p in parents if serving.get(p) == lineage.parent_epochs[int(p)])
        if mine:
            carried[name] = mine
            new_serving[name] = lineage.epoch
            missing = tuple(p for p in parents if p not in mine)
            if missing:
                load[name] = missing
    used = {p for parents in carried.values() for p in parents}
    return Reshape(carried, load, frozenset(serving.keys() - used), new_serving)


__all__ = [
    "Progress",
    "Reshape",
    "gather_targets",
    "hash_range",
    "next_count",
    "next_lineage",
    "progress",
    "reshape",
    "resharded",
]
