"""An assignment table as the JSON document docs/assignment-format.md specifies (`map` layout
for reading, `indexed` for big tables). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from apportion.api.assignment.model import (
    API_VERSION,
    AssignmentFormatError,
    AssignmentTable,
    Incarnation,
    Lineage,
    Release,
    ResourceRef,
    UnitState,
    _array,
    _count,
    _object,
    _string,
)

TABLE_KIND: Final = "Assignment"
FORMAT_VERSION: Final = 2
"""Version 2 adds `lineage` (online resharding); a version 1 reader ignores it, safely
(docs/assignment-format.md, "Resharding")."""
Layout = Literal["map", "indexed"]


def to_document(table: AssignmentTable, layout: Layout = "map") -> dict[str, Any]:
    """The JSON document of a table: `map` is readable, `indexed` is compact (big tables)."""
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": TABLE_KIND,
        "set": {
            "kind": table.set_ref.kind,
            "namespace": table.set_ref.namespace,
            "name": table.set_ref.name,
            "uid": table.set_ref.uid,
        },
        "generation": table.generation,
        "keyScheme": table.key_scheme,
        "count": table.count,
        "ackAnnotation": table.set_ref.ack_annotation,
        "epoch": table.epoch,
        "members": [{"name": m.name, "uid": m.uid} for m in table.members],
        "layout": layout,
    }
    order = table.unit_names
    states = [table.units[unit] for unit in order]
    if layout == "map":
        doc["units"] = {unit: s.owner for unit, s in zip(order, states, strict=True)}
        doc["unitEpochs"] = {unit: s.epoch for unit, s in zip(order, states, strict=True)}
    elif layout == "indexed":
        if order != tuple(str(i) for i in range(len(order))):
            doc["unitNames"] = list(order)
        index = {m.name: i for i, m in enumerate(table.members)}
        doc["owners"] = [-1 if s.owner is None else index[s.owner] for s in states]
        doc["unitEpochs"] = [s.epoch for s in states]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if table.lineage is not None:
        doc["formatVersion"] = FORMAT_VERSION
        doc["lineage"] = {
            "fromCount": table.lineage.from_count,
            "epoch": table.lineage.epoch,
            "parentEpochs": list(table.lineage.parent_epochs),
        }
    if table.serving_lease is not None:
        doc["servingLease"] = table.serving_lease
    doc["releasing"] = {
        unit: {
            "from": s.owner,
            "to": s.releasing.to,
            "since": s.releasing.since,
            "epoch": s.releasing.epoch,
        }
        for unit, s in zip(order, states, strict=True)
        if s.releasing is not None
    }
    return doc


def from_document(doc: Any) -> AssignmentTable:
    """Parse and check a document of either layout; errors name the offending field."""
    if not isinstance(doc, dict):
        raise AssignmentFormatError("assignment document must be a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != TABLE_KIND:
        raise AssignmentFormatError(
            f"unsupported document {doc.get('apiVersion')!r}/{doc.get('kind')!r}; "
            f"this reader understands {API_VERSION}/{TABLE_KIND}"
        )
    set_doc = _object(doc.get("set"), "set")
    set_ref = ResourceRef(
        *(_string(set_doc.get(k), f"set.{k}") for k in ("kind", "namespace", "name", "uid"))
    )
    members = tuple(
        _member(m, f"members[{i}]") for i, m in enumerate(_array(doc.get("members"), "members"))
    )
    layout = doc.get("layout")
    if layout == "map":
        owners, epochs = _map_layout(doc)
    elif layout == "indexed":
        owners, epochs = _indexed_layout(doc, members)
    else:
        raise AssignmentFormatError(f"layout: expected 'map' or 'indexed', got {layout!r}")
    releasing = _releases(_object(doc.get("releasing", {}), "releasing"), owners)
    units = {
        unit: UnitState(owner, epoch, releasing.get(unit))
        for unit, owner, epoch in zip(owners, owners.values(), epochs, strict=True)
    }
    count = _count(doc.get("count"), "count")
    lineage = None
    if "lineage" in doc:
        entry = _object(doc["lineage"], "lineage")
        lineage = Lineage(
            _count(entry.get("fromCount"), "lineage.fromCount"),
            count,
            _count(entry.get("epoch"), "lineage.epoch"),
            tuple(
                _count(e, "lineage.parentEpochs[]")
                for e in _array(entry.get("parentEpochs"), "lineage.parentEpochs")
            ),
        )
    return AssignmentTable(
        set_ref=set_ref,
        generation=_count(doc.get("generation"), "generation"),
        key_scheme=_string(doc.get("keyScheme"), "keyScheme"),
        count=count,
        epoch=_count(doc.get("epoch"), "epoch"),
        members=members,
        units=units,
        lineage=lineage,
        serving_lease=_seconds_or_none(doc.get("servingLease"), "servingLease"),
    )


def _seconds_or_none(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AssignmentFormatError(f"{path}: expected a number of seconds, got {value!r}")
    return float(value)


def _member(value: Any, path: str) -> Incarnation:
    value = _object(value, path)
    return Incarnation(
        _string(value.get("name"), f"{path}.name"), _string(value.get("uid"), f"{path}.uid")
    )


def _map_layout(doc: dict[str, Any]) -> tuple[dict[str, str | None], list[int]]:
    units = _object(doc.get("units"), "units")
    epochs = _object(doc.get("unitEpochs"), "unitEpochs")
    if units.keys() != epochs.keys():
        raise AssignmentFormatError("unitEpochs must have exactly the keys of units")
    owners = {
        unit: None if owner is None else _string(owner, f"units[{unit!r}]")
        for unit, owner in units.items()
    }
    return owners, [_count(epochs[unit], f"unitEpochs[{unit!r}]") for unit in owners]


def _indexed_layout(
    doc: dict[str, Any], members: tuple[Incarnation, ...]
) -> tuple[dict[str, str | None], list[int]]:

    indexes = _array(doc.get("owners"), "owners")
    epochs = _array(doc.get("unitEpochs"), "unitEpochs")
    if "unitNames" in doc:
        names = [_string(u, "unitNames[]") for u in _array(doc["unitNames"], "unitNames")]
    else:
        names = [str(i) for i in range(len(indexes))]
    if not len(names) == len(indexes) == len(epochs):
        raise AssignmentFormatError("owners, unitEpochs (and unitNames) must have equal length")
    if len(set(names)) != len(names):
        raise AssignmentFormatError("unitNames: duplicate unit")
    owners: dict[str, str | None] = {}
    for unit, index in zip(names, indexes, strict=True):
        if type(index) is not int or not -1 <= index < len(members):
            raise AssignmentFormatError(
                f"owners[{unit!r}]: expected -1 or a member index below {len(members)}"
            )
        owners[unit] = None if index < 0 else members[index].name
    return owners, [_count(e, "unitEpochs[]") for e in epochs]


def _release_target(entry: dict[str, Any], path: str) -> str | None:
    """A member's name, or null: to nobody (absent is an error, not a default)."""
    if "to" not in entry:
        raise AssignmentFormatError(f"{path}: expected a member's name or null")
    return None if entry["to"] is None else _string(entry["to"], path)


def _releases(doc: dict[str, Any], owners: Mapping[str, str | None]) -> dict[str, Release]:
    releases = {}
    for unit, entry in doc.items():
        path = f"releasing[{unit!r}]"
        entry = _object(entry, path)
        if unit not in owners or entry.get("from") != owners[unit]:
            raise AssignmentFormatError(f"{path}: 'from' must be the unit's owner")
        since = entry.get("since")
        if isinstance(since, bool) or not isinstance(since, int | float):
            raise AssignmentFormatError(f"{path}.since: expected a number")
        releases[unit] = Release(
            to=_release_target(entry, f"{path}.to"),
            since=float(since),
            epoch=_count(entry.get("epoch"), f"{path}.epoch"),
        )
    return releases
