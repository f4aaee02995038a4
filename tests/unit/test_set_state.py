"""The set's decision state between passes (`apportion.engine.set_state.SetState`): the fence
after a repair holds for its full time, also across an operator restart; reservations run ahead
of every table; releases are timed from when this operator knew them; missing loads are a fault
only after their grace. Expected values are worked out by hand from docs/handoff.md."""

from __future__ import annotations

from dataclasses import replace

from apportion.api.assignment import AssignmentTable, ResourceRef
from apportion.engine.set_state import SetState

REF = ResourceRef("ShardSet", "ns", "s", "uid")
TEMPLATE = AssignmentTable.initial(REF, generation=1, key_scheme="akka", count=3)
T0 = 1_795_514_400.0  # 2026-11-24T10:00:00Z
TIMEOUT = 60.0


def at_epoch(epoch: int) -> AssignmentTable:
    return replace(TEMPLATE, epoch=epoch)


def fenced_state() -> tuple[SetState, dict[str, object]]:
    """An operator that found its table deleted after epoch 7 was reserved: it must fence."""
    state = SetState()
    status: dict[str, object] = {"reservedEpoch": 7, "epoch": 7}
    table, repair = state.resume(None, None, status, TEMPLATE, T0, TIMEOUT)
    assert repair is not None
    assert repair.fenced
    assert table.epoch == 8  # above every epoch reserved, so no token is ever handed out twice
    return state, status


def test_a_fence_holds_for_the_hand_off_timeout_and_then_lifts() -> None:
    state, _ = fenced_state()
    assert state.fence(T0) is not None
    assert state.fence(T0 + TIMEOUT - 0.5) is not None
    assert state.fence(T0 + TIMEOUT) is None
    assert state.fence_until is None


def test_a_fence_survives_a_restart_through_the_status_and_never_ends_early() -> None:
    state, status = fenced_state()
    table = state.resume(None, None, status, TEMPLATE, T0, TIMEOUT)[0]
    reservation = state.reservation(table)
    assert reservation == {"reservedEpoch": 8, "fencedUntil": "2026-11-24T10:01:00Z"}
    status.update(reservation)
    successor = SetState.from_status(status)  # the operator died: only the status is left
    assert successor.reserved == 8
    assert successor.fence(T0 + TIMEOUT - 0.5) is not None
    assert successor.fence(T0 + TIMEOUT) is None


def test_a_fence_end_is_rounded_up_to_the_second() -> None:
    state = SetState(fence_until=T0 + 0.2)
    reservation = state.reservation(TEMPLATE)
    assert reservation is not None
    assert reservation["fencedUntil"] == "2026-11-24T10:00:01Z"


def test_the_reservation_runs_ahead_of_every_table_and_is_written_only_when_needed() -> None:
    state = SetState(reserved=3)
    assert state.reservation(at_epoch(3)) is None  # already reserved
    assert state.reservation(at_epoch(4)) == {"reservedEpoch": 4, "fencedUntil": None}
    state.written(at_epoch(4), T0)
    assert state.reserved == 4
    assert state.remembered == at_epoch(4)


def test_missing_loads_are_a_fault_only_after_their_grace_and_a_silent_unit_keeps_its_load() -> (
    None
):
    state = SetState()
    assert state.loads(None, T0, grace=30.0) == (None, False)
    assert state.loads(None, T0 + 29.0, grace=30.0) == (None, False)
    assert state.loads(None, T0 + 30.0, grace=30.0) == (None, True)
    assert state.loads({"0": 2.0, "1": 1.0}, T0 + 31.0, grace=30.0) == ({"0": 2.0, "1": 1.0}, False)
    # unit 1 is in hand-off and reported by nobody for a moment: its load did not vanish
    assert state.loads({"0": 3.0}, T0 + 32.0, grace=30.0) == ({"0": 3.0, "1": 1.0}, False)
    # and a new absence starts a new grace
    assert state.loads(None, T0 + 33.0, grace=30.0) == (None, False)


def test_the_next_wake_is_the_earliest_of_the_pass_the_fence_and_a_reported_timeout() -> None:
    state = SetState(fence_until=T0 + 10.0)
    assert state.next_wake(T0 + 20.0) == T0 + 10.0
    state.hand_off_timed_out(T0, "w-1 did not release", handoff_timeout=5.0)
    state.fence_until = None
    assert state.next_wake(None) == T0 + 60.0  # reported for at least a minute
    assert state.next_wake(T0 + 1.0) == T0 + 1.0
