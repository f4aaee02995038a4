"""The snapshot format of ``apportion plan``: one allocation problem as JSON (docs/snapshot.md).

``{"strategy": {"name": ..., ...options}, "units": [...], "members": [{"name", "labels",
"capacity", "ready", "version", "draining"}], "assignment": {member: [units]},
"loads": {unit: number}, "inProgress": [units]}``. Parsing is strict — unknown fields, wrong
types, duplicate keys, duplicate units and units assigned twice are errors — so that a typo never
silently changes a plan. Pure: text in, objects out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apportion.engine.allocation import (
    AllocationError,
    AllocationRequest,
    Member,
    Plan,
    make_strategy,
)

__all__ = ["Snapshot", "SnapshotError", "parse_snapshot", "plan_snapshot", "snapshot_from_json"]

_FIELDS = frozenset({"strategy", "units", "members", "assignment", "loads", "inProgress"})
_MEMBER_FIELDS = frozenset({"name", "labels", "capacity", "ready", "version", "draining"})


class SnapshotError(AllocationError):
    """A snapshot that cannot be planned; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    strategy: Mapping[str, Any]
    request: AllocationRequest


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SnapshotError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def parse_snapshot(text: str) -> Snapshot:
    """Parses snapshot JSON text; raises :class:`SnapshotError` with a clear message."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise SnapshotError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return snapshot_from_json(data)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SnapshotError(f"{where} must be a list of strings")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SnapshotError(f"{where} must be true or false, got {value!r}")
    return value


def _member(raw: Any, k: int) -> Member:
    where = f"members[{k}]"
    if not isinstance(raw, dict):
        raise SnapshotError(f"{where} must be an object")
    unknown = sorted(set(raw) - _MEMBER_FIELDS)
    if unknown:
        raise SnapshotError(f"{where}: unknown field(s) {', '.join(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SnapshotError(f"{where}.name must be a non-empty string")
    where = f"member {name!r}"
    labels = raw.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise SnapshotError(f"{where}: labels must be an object of strings")
    capacity = _number(raw.get("capacity", 1.0), f"{where}: capacity")
    if capacity < 0:
        raise SnapshotError(f"{where}: capacity must not be negative, got {capacity:g}")
    version = raw.get("version", "")
    if not isinstance(version, str):
        raise SnapshotError(f"{where}: version must be a string")
    return Member(
        name=name,
        labels=labels,
        capacity=capacity,
        ready=_boolean(raw.get("ready", True), f"{where}: ready"),
        version=version,
        draining=_boolean(raw.get("draining", False), f"{where}: draining"),
    )


def snapshot_from_json(data: Any) -> Snapshot:
    """Builds a snapshot from decoded JSON; raises :class:`SnapshotError`."""
    if not isinstance(data, dict):
        raise SnapshotError("a snapshot must be a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise SnapshotError(f"unknown field(s) {', '.join(unknown)}")

    strategy = data.get("strategy", {"name": "Balanced"})
    if not isinstance(strategy, dict) or not isinstance(strategy.get("name"), str):
        raise SnapshotError('strategy must be an object with a "name" string')

    raw_members = data.get("members")
    if not isinstance(raw_members, list):
        raise SnapshotError("members must be a list of objects")
    members = [_member(raw, k) for k, raw in enumerate(raw_members)]
    names: set[str] = set()
    for member in members:
        if member.name in names:
            raise SnapshotError(f"member {member.name!r} is listed twice")
        names.add(member.name)

    raw_assignment = data.get("assignment", {})
    if not isinstance(raw_assignment, dict):
        raise SnapshotError("assignment must be an object {member: [units]}")
    assignment = {
        member: _strings(units, f"assignment[{member!r}]")
        for member, units in raw_assignment.items()
    }

    units = None if data.get("units") is None else _strings(data["units"], "units")

    loads = None
    if data.get("loads") is not None:
        raw_loads = data["loads"]
        if not isinstance(raw_loads, dict):
            raise SnapshotError("loads must be an object {unit: number}")
        loads = {u: _number(v, f"load of unit {u!r}") for u, v in raw_loads.items()}
        negative = next((u for u, v in loads.items() if v < 0), None)
        if negative is not None:
            raise SnapshotError(f"load of unit {negative!r} must not be negative")

    in_progress = frozenset(_strings(data.get("inProgress", []), "inProgress"))

    request = AllocationRequest(units, members, assignment, loads, in_progress)
    return Snapshot(strategy, request)


def plan_snapshot(snapshot: Snapshot) -> Plan:
    """Plans a snapshot with its strategy; raises :class:`AllocationError` on bad input."""
    return make_strategy(snapshot.strategy).plan(snapshot.request)
