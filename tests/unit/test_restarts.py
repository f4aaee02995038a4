"""Restarts in place (rebalance.restartGrace, apportion.engine.restarts): a member whose container
restarts, or whose StatefulSet pod is recreated under its name, keeps its units for the grace;
past it, or for a pod that will not come back, placement is as before."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.api import PartitionSet
from apportion.api.assignment import Ack, AssignmentTable, ResourceRef
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import Reason
from apportion.engine.restarts import (
    MAX_RANGES_TEXT,
    RestartHold,
    hold_from_row,
    hold_rows,
    parse_unit_ranges,
    stateful_identity,
    unit_ranges,
)
from apportion.engine.set_pass import PassInput, PassResult, initial_table, plan_pass
from apportion.engine.set_state import SetState
from apportion.engine.set_status import StatusInput, unit_set_status
from tests.support.passes import decided, written

REF = ResourceRef("PartitionSet", "ns", "demo", "set-uid")
GRACE = 30.0
T0 = 1000.0


def spec(grace: str = "30s", **extra: Any) -> Any:
    body = {
        "partitions": 32,
        "workloadRef": {"kind": "StatefulSet", "name": "w"},
        "rebalance": {"interval": "1s", "handoffTimeout": "5s", "restartGrace": grace},
        **extra,
    }
    return PartitionSet.model_validate({"metadata": {"name": "demo"}, "spec": body}).spec


def workers(n: int = 4, **changes: Any) -> list[WorkerPod]:
    return [WorkerPod(f"w-{i}", f"uid-w-{i}", **changes) for i in range(n)]


def run(s: Any, table: AssignmentTable, pods: list[WorkerPod], now: float, **kw: Any) -> PassResult:
    kw.setdefault("desired_members", 4)
    return plan_pass(PassInput(s, table, 1, pods, now=now, **kw))


def balanced(s: Any) -> AssignmentTable:
    table = written(run(s, initial_table(REF, s, 1), workers(), T0))
    assert table is not None
    return table


def units_of(table: AssignmentTable, name: str) -> set[str]:
    return {u for u, state in table.units.items() if state.owner == name}


def with_pod(pods: list[WorkerPod], pod: WorkerPod | None, name: str = "w-3") -> list[WorkerPod]:
    """`pods` with member `name` replaced by `pod` (None: absent)."""
    return [p for p in pods if p.name != name] + ([pod] if pod is not None else [])


# ------------------------------------------------------------------------- container restart


def test_without_a_grace_a_not_ready_member_loses_its_units() -> None:
    """What docs/handoff.md used to deny: membership follows readiness, so a container restart
    hands the member's units to its siblings (and back once it is Ready)."""
    s = spec("0s")
    table = balanced(s)
    restarting = with_pod(workers(), WorkerPod("w-3", "uid-w-3", ready=False))
    result = run(s, table, restarting, T0 + 1)
    assert result.new_table is not None
    assert {u for u, r in written(result).releasing().items()} == units_of(table, "w-3")
    assert not result.restart_holds


def test_a_container_restart_within_the_grace_moves_nothing() -> None:
    s = spec()
    table = balanced(s)
    mine = units_of(table, "w-3")
    restarting = with_pod(workers(), WorkerPod("w-3", "uid-w-3", ready=False))
    first = run(s, table, restarting, T0 + 1)
    assert first.new_table is None, "no release, no reassignment"
    assert first.restart_holds == {"w-3": RestartHold("w-3", T0 + 1, frozenset(mine))}
    assert first.wake_at == T0 + 1 + GRACE, "passes again when the grace ends"

    later = run(s, table, restarting, T0 + 20, restart_holds=first.restart_holds)
    assert later.new_table is None
    assert later.restart_holds["w-3"].since == T0 + 1

    back = run(s, table, workers(), T0 + 25, restart_holds=later.restart_holds)
    assert back.new_table is None
    assert not back.restart_holds


def test_past_the_grace_a_restarting_members_units_move_as_usual() -> None:
    s = spec()
    table = balanced(s)
    restarting = with_pod(workers(), WorkerPod("w-3", "uid-w-3", ready=False))
    held = run(s, table, restarting, T0 + 1).restart_holds
    expired = run(s, table, restarting, T0 + 1 + GRACE, restart_holds=held)
    assert expired.restart_holds == {"w-3": RestartHold("w-3", T0 + 1, frozenset())}, "spent"
    moving = written(expired)
    assert moving is not None
    assert set(moving.releasing()) == units_of(table, "w-3")

    # Still NotReady: the spent hold keeps a new one from starting and undoing the moves.
    later = run(s, moving, restarting, T0 + 2 + GRACE, restart_holds=expired.restart_holds)
    assert later.restart_holds == expired.restart_holds
    assert later.new_table is None or set(written(later).releasing()) == set(moving.releasing())
    assert later.wake_at != T0 + 2 + 2 * GRACE, "no grace runs any more"

    back = run(s, moving, workers(), T0 + 3 + GRACE, restart_holds=later.restart_holds)
    assert not back.restart_holds, "Ready again: the next restart gets a grace of its own"


# ------------------------------------------------------------- StatefulSet pod recreated


def test_a_recreated_statefulset_pod_gets_its_units_back_under_new_tokens() -> None:
    s = spec()
    table = balanced(s)
    mine = units_of(table, "w-3")
    gone = with_pod(workers(), None)

    first = run(s, table, gone, T0 + 1)
    unowned = written(first)
    assert unowned is not None
    assert {u for u, st_ in unowned.units.items() if st_.owner is None} == mine
    assert units_of(unowned, "w-0") == units_of(table, "w-0"), "siblings take nothing"
    assert [e.reason for e in decided(first).events] == [Reason.HELD_FOR_RESTART]
    assert decided(first).events[0].type == "Normal"
    status = unit_set_status(StatusInput(unowned, first, gone, 1, "cm", T0 + 1))
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WaitingForRestart")
    assert status["restartHolds"] == hold_rows(first.restart_holds, GRACE)

    waiting = run(s, unowned, gone, T0 + 10, restart_holds=first.restart_holds)
    assert waiting.new_table is None, "still waiting: nothing to write"

    new = WorkerPod("w-3", "uid-w-3-again", ready=False)
    back = run(s, unowned, with_pod(workers(), new), T0 + 12, restart_holds=waiting.restart_holds)
    returned = written(back)
    assert returned is not None
    assert units_of(returned, "w-3") == mine
    assert returned.member_uids["w-3"] == "uid-w-3-again"
    assert all(returned.units[u].epoch == returned.epoch > table.units[u].epoch for u in mine), (
        "the new incarnation acquires like a newcomer, under tokens above the old ones"
    )
    assert "w-3" in back.restart_holds, "starting (not Ready): still kept for it"

    up = with_pod(workers(), replace(new, ready=True))
    settled = run(s, returned, up, T0 + 14, restart_holds=back.restart_holds)
    assert settled.new_table is None
    assert not settled.restart_holds


def test_a_recreated_pod_that_comes_too_late_gets_nothing_reserved() -> None:
    s = spec()
    table = balanced(s)
    gone = with_pod(workers(), None)
    first = run(s, table, gone, T0 + 1)
    late = run(s, written(first), gone, T0 + 1 + GRACE, restart_holds=first.restart_holds)
    assert all(hold.spent for hold in late.restart_holds.values())
    placed = written(late)
    assert placed is not None
    assert all(state.owner in {"w-0", "w-1", "w-2"} for state in placed.units.values())


@pytest.mark.parametrize(
    ("extra", "replicas", "why"),
    [
        ({}, 3, "ordinal 3 of a StatefulSet scaled in to 3 never returns"),
        ({"workloadRef": {"kind": "Deployment", "name": "w"}}, 4, "a Deployment's pod has no name"),
        ({"workloadRef": None, "selector": {"matchLabels": {"app": "w"}}}, None, "no workload"),
    ],
)
def test_a_pod_that_will_not_come_back_is_not_waited_for(extra, replicas, why) -> None:
    s = spec(**extra)
    table = balanced(s)
    result = run(s, table, with_pod(workers(), None), T0 + 1, desired_members=replicas)
    assert not result.restart_holds, why
    assert {e.reason for e in decided(result).events} == {Reason.OWNER_GONE}
    assert all(state.owner is not None for state in written(result).units.values())


@pytest.mark.parametrize(
    ("why", "pod", "replicas"),
    [
        ("scaled in: w-3 does not come back", WorkerPod("w-3", "uid-w-3", terminating=True), 3),
        ("kubectl apportion drain", WorkerPod("w-3", "uid-w-3", drained=True), 4),
    ],
)
def test_a_pod_leaving_for_good_is_drained_not_held(why: str, pod: WorkerPod, replicas: int):
    s = spec()
    table = balanced(s)
    result = run(s, table, with_pod(workers(), pod), T0 + 1, desired_members=replicas)
    assert not result.restart_holds, why
    releases = written(result).releasing()
    assert set(releases) == units_of(table, "w-3")
    assert {r.to for r in releases.values()} <= {"w-0", "w-1", "w-2"}


def test_a_terminating_statefulset_pod_releases_to_nobody_and_its_next_incarnation_gets_all():
    """A rolling update's deletion (terminating, ordinal below replicas): the units are released
    by the old incarnation as in any hand-off, then wait unowned (no sibling gets them) and go
    to the new incarnation of the name under newer epochs."""
    s = spec()
    table = balanced(s)
    mine = units_of(table, "w-3")
    leaving = WorkerPod("w-3", "uid-w-3", terminating=True)
    first = run(s, table, with_pod(workers(), leaving), T0 + 1)
    assert set(first.restart_holds) == {"w-3"}
    released = written(first)
    assert {u: r.to for u, r in released.releasing().items()} == dict.fromkeys(mine)
    assert {e.reason for e in decided(first).events} == {Reason.HELD_FOR_RESTART}

    ack = Ack(uid="uid-w-3", epoch=released.epoch, draining=True).to_annotation()
    acked = replace(leaving, acks={released.set_ref.ack_annotation: ack})
    second = run(s, released, with_pod(workers(), acked), T0 + 2, restart_holds=first.restart_holds)
    parked = written(second)
    assert {u for u, st_ in parked.units.items() if st_.owner is None} == mine
    assert not parked.releasing()
    assert {e.reason for e in decided(second).events} == {Reason.HANDOFF_COMPLETED}

    gone = run(s, parked, with_pod(workers(), None), T0 + 3, restart_holds=second.restart_holds)
    assert gone.new_table is None or all(written(gone).units[u].owner is None for u in mine), (
        "nobody else takes them while w-3 is away"
    )
    back = with_pod(workers(), WorkerPod("w-3", "uid-w-3-new", ready=False))
    third = run(s, parked, back, T0 + 4, restart_holds=second.restart_holds)
    assert units_of(written(third), "w-3") == mine
    assert all(written(third).units[u].epoch > table.units[u].epoch for u in mine)
    assert written(third).member_uids["w-3"] == "uid-w-3-new"


def test_a_ready_new_incarnation_gets_its_units_back_and_nothing_else_moves() -> None:
    """The units held for it count as its own when the round plans: had the strategy seen it
    empty, it would send it a sibling's unit too, and the next round would take that back
    (seen end to end: unit 5 went rip-2 → rip-0 → rip-2 under two new tokens)."""
    s = spec()
    table = balanced(s)
    mine = units_of(table, "w-3")
    leaving = WorkerPod("w-3", "uid-w-3", terminating=True)
    first = run(s, table, with_pod(workers(), leaving), T0 + 1)
    ack = Ack(uid="uid-w-3", epoch=written(first).epoch, draining=True).to_annotation()
    acked = replace(leaving, acks={table.set_ref.ack_annotation: ack})
    second = run(
        s, written(first), with_pod(workers(), acked), T0 + 2, restart_holds=first.restart_holds
    )
    parked = written(second)
    back = with_pod(workers(), WorkerPod("w-3", "uid-w-3-new"))
    third = run(s, parked, back, T0 + 4, restart_holds=second.restart_holds)
    returned = written(third)
    assert units_of(returned, "w-3") == mine
    assert not returned.releasing(), returned.releasing()
    assert {u: st_.owner for u, st_ in returned.units.items() if u not in mine} == {
        u: st_.owner for u, st_ in table.units.items() if u not in mine
    }


def test_a_parked_release_that_outlasts_the_grace_goes_to_the_siblings() -> None:
    s = spec()
    table = balanced(s)
    leaving = with_pod(workers(), WorkerPod("w-3", "uid-w-3", terminating=True))
    first = run(s, table, leaving, T0 + 1)
    # handoffTimeout (5 s) is over too: the never acknowledged release is forced to a sibling.
    late = run(s, written(first), leaving, T0 + 1 + GRACE, restart_holds=first.restart_holds)
    after = written(late).units
    going = {u: s.releasing.to if s.releasing else s.owner for u, s in after.items()}
    assert {going[u] for u in units_of(table, "w-3")} <= {"w-0", "w-1", "w-2"}
    assert late.restart_holds["w-3"].spent


@pytest.mark.parametrize(
    ("pod", "replicas", "expected"),
    [("w-0", 4, True), ("w-3", 4, True), ("w-4", 4, False), ("w-x", 4, False), ("v-1", 4, False)],
)
def test_stateful_identity(pod: str, replicas: int, expected: bool) -> None:
    s = spec()
    assert stateful_identity(pod, s.workload_ref, replicas) is expected


# ------------------------------------------------------------------- surviving a restart


def test_a_hold_is_in_the_status_before_the_table_that_leaves_its_units_unowned() -> None:
    s = spec()
    table = balanced(s)
    first = run(s, table, with_pod(workers(), None), T0 + 1)
    state = SetState(reserved=table.epoch + 63)
    state.note_holds(first.restart_holds, GRACE)
    reserved = state.reservation(written(first))
    assert reserved is not None
    assert reserved["restartHolds"][0]["pod"] == "w-3"

    successor = SetState.from_status(reserved)
    assert successor.restart_holds == {
        "w-3": replace(first.restart_holds["w-3"], since=float(int(T0 + 1)))
    }
    assert successor.reservation(written(first)) is None, "nothing new to write"
    again = run(
        s, written(first), with_pod(workers(), None), T0 + 5, restart_holds=successor.restart_holds
    )
    assert again.new_table is None, "the successor goes on waiting instead of placing them"


@given(st.sets(st.integers(0, 5000)))
def test_unit_ranges_round_trip(numbers: set[int]) -> None:
    units = frozenset(map(str, numbers))
    assert parse_unit_ranges(unit_ranges(units)) == units


def test_unit_ranges_are_cut_at_a_range_boundary() -> None:
    scattered = frozenset(str(n) for n in range(0, 60_000, 2))
    text = unit_ranges(scattered)
    assert len(text) <= MAX_RANGES_TEXT
    kept = parse_unit_ranges(text)
    assert kept <= scattered
    assert len(kept) == text.count(",") + 1


def test_hold_rows_round_trip() -> None:
    hold = RestartHold("w-1", 1_700_000_000.0, frozenset({"0", "1", "2", "7"}))
    (row,) = hold_rows({"w-1": hold}, GRACE)
    assert row == {
        "pod": "w-1",
        "since": "2023-11-14T22:13:20Z",
        "until": "2023-11-14T22:13:50Z",
        "units": "0-2,7",
    }
    assert hold_from_row(row) == hold


def test_a_pass_that_decides_nothing_keeps_the_holds_and_wakes_for_none_past() -> None:
    """With no member at all (a one-pod StatefulSet restarting), the hold is kept as it was;
    once its grace is over it is spent, so the loop does not wake again and again for it."""
    s = spec()
    table = balanced(s)
    holds = {"w-3": RestartHold("w-3", T0, frozenset(units_of(table, "w-3")))}
    waiting = run(s, table, [], T0 + 5, restart_holds=holds)
    assert waiting.decision is None
    assert waiting.restart_holds == holds
    assert waiting.wake_at == T0 + GRACE
    over = run(s, table, [], T0 + GRACE + 1, restart_holds=holds)
    assert over.restart_holds == {"w-3": RestartHold("w-3", T0, frozenset())}
    assert over.wake_at is None


def test_a_pod_no_longer_selected_or_drained_is_not_held() -> None:
    """A departed pod (relabelled out of the set) still runs: it hands its units off like a
    drained one, instead of keeping them as if it were restarting."""
    s = spec()
    table = balanced(s)
    departed = run(
        s,
        table,
        with_pod(workers(), None),
        T0 + 1,
        departed=[WorkerPod("w-3", "uid-w-3", ready=False)],
    )
    assert not departed.restart_holds
    assert set(written(departed).releasing()) == units_of(table, "w-3")
    cordoned = WorkerPod("w-3", "uid-w-3", drained=True, ready=False)
    drained = run(s, table, with_pod(workers(), cordoned), T0 + 1)
    assert not drained.restart_holds
