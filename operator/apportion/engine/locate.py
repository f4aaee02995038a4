"""Where IDs live: the unit of each ID and, given a published table, the pod serving it.

One function for every front end (`apportion locate`, `kubectl apportion locate`) so that they
answer alike, including mid-resharding: the published table is what workers serve, so its own
count decides the unit, and its lineage names the unit the ID had before the last change of
count (docs/resharding.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from apportion.api.assignment import AssignmentTable
from apportion.engine.keys import get_scheme


@dataclass(frozen=True, slots=True)
class Location:
    """`unit` of `id`; with a table also its `owner` pod (None: unowned), whether it is being
    handed off (`releasing`) and to which pod (None: to nobody, a restart in place), and the
    unit it had under the previous count when the table carries a lineage."""

    id: str
    unit: int
    owner: str | None = None
    releasing: bool = False
    releasing_to: str | None = None
    previous_unit: int | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"id": self.id, "unit": self.unit}
        if self.owner is not None:
            doc["pod"] = self.owner
        if self.releasing:
            doc["releasingTo"] = self.releasing_to  # null: to nobody
        if self.previous_unit is not None:
            doc["previousUnit"] = self.previous_unit
        return doc


def locate(
    ids: Sequence[str],
    *,
    scheme: str = "apportion",
    count: int | None = None,
    table: AssignmentTable | None = None,
) -> list[Location]:
    """The location of each ID: under `scheme` and `count`, or under `table` (its scheme and
    count, its owners, and its lineage)."""
    if table is None:
        if count is None:
            raise ValueError("give a count or a table")
        units = get_scheme(scheme).units(ids, count).tolist()
        return [Location(i, u) for i, u in zip(ids, units, strict=True)]
    keys = get_scheme(table.key_scheme)
    units = keys.units(ids, table.count).tolist()
    lineage = table.lineage
    previous = (
        keys.units(ids, lineage.from_count).tolist() if lineage is not None else [None] * len(ids)
    )
    result = []
    for key, unit, before in zip(ids, units, previous, strict=True):
        state = table.units[str(unit)]
        release = state.releasing
        to = release.to if release else None
        result.append(Location(key, unit, state.owner, release is not None, to, before))
    return result


__all__ = ["Location", "locate"]
