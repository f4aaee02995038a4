"""The snapshot format: strict parsing, defaults, order, and clear errors."""

from __future__ import annotations

import json

import pytest

from apportion.engine.allocation import AllocationError
from apportion.engine.snapshot import SnapshotError, parse_snapshot, plan_snapshot


def snapshot(**fields: object) -> str:
    base: dict[str, object] = {
        "strategy": {"name": "Balanced"},
        "members": [{"name": "a"}, {"name": "b"}],
        "assignment": {"a": ["1", "2"], "b": []},
    }
    base.update(fields)
    return json.dumps(base)


def test_defaults_and_order() -> None:
    snap = parse_snapshot(
        json.dumps(
            {
                "strategy": {"name": "LeastShards", "absoluteLimit": 3},
                "members": [
                    {"name": "z", "labels": {"zone": "b"}, "capacity": 2, "version": "1.2"},
                    {"name": "a", "ready": False, "draining": True},
                ],
                "assignment": {"z": ["9", "1"], "gone": ["5"]},
                "loads": {"9": 1.5},
                "inProgress": ["1"],
            }
        )
    )
    request = snap.request
    assert snap.strategy == {"name": "LeastShards", "absoluteLimit": 3}
    assert [m.name for m in request.members] == ["z", "a"]
    z, a = request.members
    assert (z.capacity, z.version, dict(z.labels), z.ready, z.draining) == (
        2.0,
        "1.2",
        {"zone": "b"},
        True,
        False,
    )
    assert (a.capacity, a.ready, a.draining, a.version) == (1.0, False, True, "")
    assert request.assignment == {"z": ["9", "1"], "gone": ["5"]}
    assert request.units is None
    assert request.loads == {"9": 1.5}
    assert request.in_progress == frozenset({"1"})


def test_missing_units_are_allocated_and_gone_members_left() -> None:
    plan = plan_snapshot(
        parse_snapshot(snapshot(units=["1", "2", "3"], assignment={"a": ["1", "2"], "gone": []}))
    )
    assert sorted(u for units in plan.assignment.values() for u in units) == ["1", "2", "3"]
    assert list(plan.assignment) == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (snapshot(strategy={"name": "Nope"}), "unknown allocation strategy 'Nope'"),
        (snapshot(members=[{"name": "a", "capacity": -1}]), "capacity must not be negative"),
        (snapshot(units=["1", "1"]), "unit '1' is listed twice"),
        (snapshot(assignment={"a": ["1"], "b": ["1"]}), "unit '1' is assigned to 'a' and 'b'"),
        (snapshot(assignment={"a": ["1", "1"]}), "unit '1' is assigned to 'a' twice"),
        ('{"members": [', "malformed JSON at line 1"),
        ('{"members": [], "members": []}', "duplicate key 'members'"),
        (snapshot(extra=1), "unknown field(s) extra"),
        (snapshot(members=[{"name": "a", "cpu": 2}]), "unknown field(s) cpu"),
        (snapshot(members=[{"name": "a"}, {"name": "a"}]), "member 'a' is listed twice"),
        (snapshot(members=[{"name": 7}]), "name must be a non-empty string"),
        (snapshot(assignment={"a": [1, 2]}), "must be a list of strings"),
        (snapshot(loads={"1": -2}), "must not be negative"),
        (snapshot(loads={"1": "high"}), "must be a finite number"),
        (snapshot(members=[{"name": "a", "ready": "yes"}]), "ready must be true or false"),
        (snapshot(strategy={"name": "Balanced", "maxMoves": -1}), "maxMoves must be an integer"),
        ("[]", "must be a JSON object"),
        ('{"members": [{"name": "a", "capacity": NaN}]}', "finite number"),
    ],
)
def test_bad_snapshots_fail_clearly(text: str, message: str) -> None:
    with pytest.raises(AllocationError) as caught:
        plan_snapshot(parse_snapshot(text))
    assert message in str(caught.value)


def test_snapshot_errors_are_allocation_errors() -> None:
    assert issubclass(SnapshotError, AllocationError)
