"""Each transition of the hand-off state machine, the worker rule, and properties of `step`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.assignment import (
    Ack,
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
)
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import (
    Reason,
    WorkerSteps,
    invert_assignment,
    is_owner,
    make_ack,
    owned_units,
    plan_worker,
    releasing_units,
    step,
    supersedes,
)

SET = ResourceRef("PartitionSet", "default", "demo", "set-uid")
A, B, C = Incarnation("a", "uid-a"), Incarnation("b", "uid-b"), Incarnation("c", "uid-c")
TIMEOUT = 60.0


def live(*members: Incarnation, draining: tuple[Incarnation, ...] = ()) -> dict[str, WorkerPod]:
    return {m.name: WorkerPod(m.name, m.uid, terminating=m in draining) for m in members}


def settled(owners: dict[str, Incarnation], *members: Incarnation) -> AssignmentTable:
    """A table where each unit is owned by its member, reached through real steps."""
    initial = AssignmentTable.initial(
        SET, generation=1, key_scheme="netherite", count=len(owners), units=owners
    )
    target = {unit: m.name for unit, m in owners.items()}
    table = step(initial, target, {}, live(*members), 0.0, TIMEOUT).new_table
    assert table is not None
    return table


def reasons(decision) -> list[tuple[Reason, str | None, str | None, tuple[str, ...]]]:
    return [(e.reason, e.source, e.target, e.units) for e in decision.events]


@pytest.fixture
def two_on_a() -> AssignmentTable:
    return settled({"0": A, "1": A}, A, B, C)


@pytest.fixture
def releasing(two_on_a: AssignmentTable) -> AssignmentTable:
    """Unit 1 being handed off from a to b, since t=100, by epoch 2."""
    table = step(two_on_a, {"0": "a", "1": "b"}, {}, live(A, B, C), 100.0, TIMEOUT).new_table
    assert table is not None
    assert table.epoch == 2
    return table


def test_first_step_assigns_every_unit_under_epoch_one(two_on_a: AssignmentTable) -> None:
    assert two_on_a.epoch == 1
    assert two_on_a.owners() == {"0": "a", "1": "a"}
    assert {u: s.epoch for u, s in two_on_a.units.items()} == {"0": 1, "1": 1}
    assert two_on_a.members == (A, B, C)
    assert owned_units(two_on_a, A) == {"0", "1"}


def test_initial_decision_reports_assigned() -> None:
    initial = AssignmentTable.initial(SET, generation=1, key_scheme="netherite", count=2)
    decision = step(initial, {"0": "a", "1": "b"}, {}, live(A, B), 0.0, TIMEOUT)
    assert reasons(decision) == [
        (Reason.ASSIGNED, None, "a", ("0",)),
        (Reason.ASSIGNED, None, "b", ("1",)),
    ]
    assert decision.events[0].message() == "assigned 1 unit(s) (0) to a"


def test_same_inputs_write_nothing(two_on_a: AssignmentTable) -> None:
    decision = step(two_on_a, {"0": "a", "1": "a"}, {}, live(A, B, C), 5.0, TIMEOUT)
    assert decision.new_table is None
    assert decision.events == ()
    assert decision.waiting == ()


def test_move_first_marks_the_unit_releasing(
    two_on_a: AssignmentTable, releasing: AssignmentTable
) -> None:
    state = releasing.units["1"]
    assert state == UnitState("a", 1, Release(to="b", since=100.0, epoch=2))
    # a stays nominal owner but takes no new work; b may not take it yet
    assert releasing_units(releasing, A) == {"1"}
    assert owned_units(releasing, A) == {"0"}
    assert not is_owner(releasing, B, "1")
    assert not is_owner(releasing, A, "1")
    plan = plan_worker(releasing, A, {"0": 1, "1": 1})
    assert plan == WorkerSteps(acquire=frozenset(), release=frozenset({"1"}), stop=frozenset())
    decision = step(two_on_a, {"0": "a", "1": "b"}, {}, live(A, B, C), 100.0, TIMEOUT)
    assert reasons(decision) == [(Reason.HANDOFF_STARTED, "a", "b", ("1",))]
    assert decision.waiting == ("1",)
    assert decision.wake_at == 100.0 + TIMEOUT
    # stepping again with the same inputs: waiting, no write
    again = step(releasing, {"0": "a", "1": "b"}, {}, live(A, B, C), 100.0, TIMEOUT)
    assert again.new_table is None
    assert again.waiting == ("1",)


def test_ack_hands_the_unit_over_under_a_new_epoch(releasing: AssignmentTable) -> None:
    ack = make_ack(releasing, A)
    assert ack == Ack(uid="uid-a", epoch=2)
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": ack}, live(A, B, C), 101.0, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.epoch == 3
    assert table.units["1"] == UnitState("b", 3)
    assert reasons(decision) == [(Reason.HANDOFF_COMPLETED, "a", "b", ("1",))]
    assert decision.events[0].type == "Normal"
    assert plan_worker(table, B, {}).acquire == {"1"}
    assert plan_worker(table, A, {"0": 1}) == WorkerSteps(frozenset(), frozenset(), frozenset())


def test_ack_older_than_the_release_does_not_count(releasing: AssignmentTable) -> None:
    stale = Ack(uid="uid-a", epoch=1)  # written before a saw the release
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": stale}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.new_table is None
    assert decision.waiting == ("1",)


def test_ack_of_a_previous_incarnation_does_not_count(releasing: AssignmentTable) -> None:
    foreign = Ack(uid="uid-a-before", epoch=2)
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": foreign}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.new_table is None


def test_ack_newer_than_the_table_read_is_not_trusted(releasing: AssignmentTable) -> None:
    future = Ack(uid="uid-a", epoch=releasing.epoch + 1)
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": future}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.new_table is None


def test_a_pending_unit_waits_for_a_later_ack(releasing: AssignmentTable) -> None:
    ack = make_ack(releasing, A, pending=["1", "0"])
    assert ack.pending == {"1"}  # only units the table releases from a can be pending
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": ack}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.new_table is None
    assert decision.waiting == ("1",)


def test_timeout_counts_from_when_the_operator_knew_the_release(
    releasing: AssignmentTable,
) -> None:
    """A standby that took over at 150 (or a leader whose write returned then) times the
    release of unit 1 (since 100) from 150, whatever `since` its predecessor's clock wrote; a
    release it never saw published does not time out at all."""
    target = {"0": "a", "1": "b"}

    def at(now: float, known: dict[str, float]) -> AssignmentTable | None:
        return step(
            releasing, target, {}, live(A, B, C), now, TIMEOUT, releases_known=known
        ).new_table

    assert at(100.0 + TIMEOUT, {"1": 150.0}) is None
    assert at(150.0 + TIMEOUT - 0.001, {"1": 150.0}) is None
    moved = at(150.0 + TIMEOUT, {"1": 150.0})
    assert moved is not None
    assert moved.units["1"] == UnitState("b", 3)
    assert at(10_000.0, {}) is None
    # Known before `since` (a skewed clock behind the writer's): `since` still holds.
    assert at(100.0 + TIMEOUT - 0.001, {"1": 0.0}) is None
    decision = step(
        releasing, target, {}, live(A, B, C), 120.0, TIMEOUT, releases_known={"1": 150.0}
    )
    assert decision.wake_at == 150.0 + TIMEOUT


def test_a_failing_release_waits_and_is_reported_until_the_timeout(
    releasing: AssignmentTable,
) -> None:
    ack = make_ack(releasing, A, pending=["1", "0"], failing={"1": "IOError: disk", "0": "x"})
    assert ack.pending == {"1"}
    assert ack.failing == {"1": "IOError: disk"}
    target, pods = {"0": "a", "1": "b"}, live(A, B, C)
    decision = step(releasing, target, {"a": ack}, pods, 101.0, TIMEOUT)
    assert decision.new_table is None
    assert decision.waiting == ("1",)
    assert decision.failing == {"1": "IOError: disk"}
    # The ack is trusted as for completions: its own incarnation, about this release, not
    # newer than the table read, and a failing unit must be pending.
    for untrusted in (
        Ack("uid-a-before", 2, frozenset({"1"}), failing={"1": "x"}),
        Ack("uid-a", 1, frozenset({"1"}), failing={"1": "x"}),
        Ack("uid-a", 3, frozenset({"1"}), failing={"1": "x"}),
        Ack("uid-a", 2, frozenset(), failing={"1": "x"}),
    ):
        assert step(releasing, target, {"a": untrusted}, pods, 101.0, TIMEOUT).failing == {}
    # handoffTimeout decides as for a silent owner.
    late = step(releasing, target, {"a": ack}, pods, 100.0 + TIMEOUT, TIMEOUT)
    assert reasons(late) == [(Reason.HANDOFF_TIMED_OUT, "a", "b", ("1",))]
    assert late.failing == {}
    assert late.waiting == ()


def test_acks_without_failing_report_nothing(releasing: AssignmentTable) -> None:
    ack = make_ack(releasing, A, pending=["1"])
    assert ack.failing == {}
    decision = step(releasing, {"0": "a", "1": "b"}, {"a": ack}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.failing == {}


def test_timeout_reassigns_anyway_with_a_warning(releasing: AssignmentTable) -> None:
    target = {"0": "a", "1": "b"}
    early = step(releasing, target, {}, live(A, B, C), 100.0 + TIMEOUT - 0.001, TIMEOUT)
    assert early.new_table is None
    decision = step(releasing, target, {}, live(A, B, C), 100.0 + TIMEOUT, TIMEOUT)
    assert decision.new_table is not None
    assert decision.new_table.units["1"] == UnitState("b", 3)
    (event,) = decision.events
    assert (event.reason, event.type) == (Reason.HANDOFF_TIMED_OUT, "Warning")
    assert "did not acknowledge" in event.message()
    assert "b" in event.message()
    # a, which never saw the release, stops at once when it sees this table
    assert plan_worker(decision.new_table, A, {"0": 1, "1": 1}).stop == {"1"}


def test_retarget_keeps_since_and_release_epoch(releasing: AssignmentTable) -> None:
    decision = step(releasing, {"0": "a", "1": "c"}, {}, live(A, B, C), 130.0, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.units["1"] == UnitState("a", 1, Release(to="c", since=100.0, epoch=2))
    assert reasons(decision) == [(Reason.HANDOFF_RETARGETED, "a", "c", ("1",))]
    assert decision.wake_at == 100.0 + TIMEOUT
    # the ack a gave for the release towards b still counts: it released the unit, wherever next
    ack = make_ack(releasing, A)
    done = step(table, {"0": "a", "1": "c"}, {"a": ack}, live(A, B, C), 131.0, TIMEOUT)
    assert done.new_table is not None
    assert done.new_table.units["1"].owner == "c"


def test_an_acked_release_goes_straight_to_a_new_target(releasing: AssignmentTable) -> None:
    ack = make_ack(releasing, A)
    decision = step(releasing, {"0": "a", "1": "c"}, {"a": ack}, live(A, B, C), 101.0, TIMEOUT)
    assert decision.new_table is not None
    assert decision.new_table.units["1"] == UnitState("c", 3)


def test_target_back_to_the_owner_cancels_and_keeps_its_token(
    releasing: AssignmentTable,
) -> None:
    decision = step(releasing, {"0": "a", "1": "a"}, {}, live(A, B, C), 110.0, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.units["1"] == UnitState("a", 1)
    assert reasons(decision) == [(Reason.HANDOFF_CANCELLED, "a", "b", ("1",))]
    # a, still finishing it, keeps serving; a that had already stopped acquires it again
    assert plan_worker(table, A, {"0": 1, "1": 1}) == WorkerSteps(
        frozenset(), frozenset(), frozenset()
    )
    assert plan_worker(table, A, {"0": 1}).acquire == {"1"}


def test_release_to_a_pod_that_is_gone_is_cancelled(releasing: AssignmentTable) -> None:
    decision = step(releasing, {"0": "a", "1": "b"}, {}, live(A, C), 110.0, TIMEOUT)
    assert decision.new_table is not None
    assert decision.new_table.units["1"] == UnitState("a", 1)
    assert decision.new_table.members == (A, C)


def test_owner_gone_reassigns_at_once_even_mid_handoff(releasing: AssignmentTable) -> None:
    decision = step(releasing, {"0": "c", "1": "b"}, {}, live(B, C), 100.5, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.units["0"] == UnitState("c", 3)
    assert table.units["1"] == UnitState("b", 3)
    assert reasons(decision) == [
        (Reason.OWNER_GONE, "a", "b", ("1",)),
        (Reason.OWNER_GONE, "a", "c", ("0",)),
    ]
    assert all(e.type == "Normal" for e in decision.events)
    assert decision.waiting == ()
    assert decision.wake_at is None


def test_owner_gone_with_nowhere_to_go_leaves_units_unowned(two_on_a: AssignmentTable) -> None:
    decision = step(two_on_a, {"0": "a", "1": "a"}, {}, {}, 5.0, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.owners() == {"0": None, "1": None}
    assert table.units["0"].epoch == 2  # the loss itself is an ownership change
    (event,) = decision.events
    assert event.type == "Warning"
    assert "no member can take them" in event.message()
    later = step(table, {"0": "b", "1": "b"}, {}, live(B), 6.0, TIMEOUT)
    assert later.new_table is not None
    assert later.new_table.owners() == {"0": "b", "1": "b"}


def test_recreated_pod_with_the_same_name_is_a_new_incarnation(
    two_on_a: AssignmentTable,
) -> None:
    reborn = Incarnation("a", "uid-a-2")  # a StatefulSet recreated pod a
    decision = step(two_on_a, {"0": "a", "1": "a"}, {}, live(reborn, B, C), 5.0, TIMEOUT)
    table = decision.new_table
    assert table is not None
    assert table.member_uids["a"] == "uid-a-2"
    assert table.units["0"] == UnitState("a", 2)
    assert table.units["1"] == UnitState("a", 2)
    assert reasons(decision) == [(Reason.OWNER_GONE, "a", "a", ("0", "1"))]
    # the new incarnation owns nothing in the old table, and acquires afresh from the new one
    assert owned_units(two_on_a, reborn) == set()
    assert owned_units(table, reborn) == {"0", "1"}
    assert owned_units(table, A) == set()


def test_draining_pods_receive_nothing() -> None:
    initial = AssignmentTable.initial(SET, generation=1, key_scheme="netherite", count=2)
    target = {"0": "a", "1": "b"}
    by_pod = step(initial, target, {}, live(A, B, draining=(B,)), 0.0, TIMEOUT).new_table
    assert by_pod is not None
    assert by_pod.owners() == {"0": "a", "1": None}
    acks = {"b": Ack(uid="uid-b", epoch=0, draining=True)}
    by_ack = step(initial, target, acks, live(A, B), 0.0, TIMEOUT).new_table
    assert by_ack is not None
    assert by_ack.owners() == {"0": "a", "1": None}
    foreign = {"b": Ack(uid="uid-b-old", epoch=0, draining=True)}
    not_vouched = step(initial, target, foreign, live(A, B), 0.0, TIMEOUT).new_table
    assert not_vouched is not None
    assert not_vouched.owners() == {"0": "a", "1": "b"}


def test_a_draining_owner_hands_off_like_anyone(two_on_a: AssignmentTable) -> None:
    decision = step(two_on_a, {"0": "b", "1": "b"}, {}, live(A, B, draining=(A,)), 1.0, TIMEOUT)
    assert decision.waiting == ("0", "1")
    untargeted = step(two_on_a, {}, {}, live(A, B, C, draining=(A,)), 1.0, TIMEOUT)
    assert untargeted.new_table is None  # nowhere to go: a keeps serving until it is gone


def test_header_and_membership_changes_are_writes(two_on_a: AssignmentTable) -> None:
    target = {"0": "a", "1": "a"}
    regenerated = step(two_on_a, target, {}, live(A, B, C), 1.0, TIMEOUT, generation=2)
    assert regenerated.new_table is not None
    assert regenerated.new_table.generation == 2
    assert regenerated.new_table.units == two_on_a.units
    joined = step(two_on_a, target, {}, live(A, B, C, Incarnation("d", "uid-d")), 1.0, TIMEOUT)
    assert joined.new_table is not None
    assert len(joined.new_table.members) == 4


def test_units_new_in_the_target_are_added(two_on_a: AssignmentTable) -> None:
    decision = step(two_on_a, {"0": "a", "1": "a", "2": "b"}, {}, live(A, B, C), 1.0, TIMEOUT)
    assert decision.new_table is not None
    assert decision.new_table.owners() == {"0": "a", "1": "a", "2": "b"}


def test_handoff_timeout_must_be_positive(two_on_a: AssignmentTable) -> None:
    with pytest.raises(ValueError, match="positive"):
        step(two_on_a, {}, {}, live(A), 0.0, 0.0)


def test_invert_assignment() -> None:
    assert invert_assignment({"a": ["0", "2"], "b": ["1"], "c": []}) == {
        "0": "a",
        "2": "a",
        "1": "b",
    }
    with pytest.raises(ValueError, match="both"):
        invert_assignment({"a": ["0"], "b": ["0"]})


def test_unit_taken_and_given_back_unseen_is_reacquired_under_the_new_token(
    releasing: AssignmentTable,
) -> None:
    """a serves unit 1 under token 1, misses every table while 1 times out to b, b serves it,
    and 1 comes back to a under token 5: a must drop its stale state and acquire afresh."""
    forced = step(releasing, {"0": "a", "1": "b"}, {}, live(A, B, C), 200.0, TIMEOUT).new_table
    assert forced is not None
    assert forced.units["1"] == UnitState("b", 3)
    back = step(forced, {"0": "a", "1": "a"}, {}, live(A, B, C), 201.0, TIMEOUT).new_table
    assert back is not None
    assert back.units["1"].releasing is not None
    acked = {"b": make_ack(back, B)}
    home = step(back, {"0": "a", "1": "a"}, acked, live(A, B, C), 202.0, TIMEOUT).new_table
    assert home is not None
    assert home.units["1"] == UnitState("a", 5)
    plan = plan_worker(home, A, {"0": 1, "1": 1})
    assert plan.stop == {"1"}
    assert plan.acquire == {"1"}
    assert plan.release == set()


def test_worker_stops_units_of_a_table_that_does_not_know_it(two_on_a: AssignmentTable) -> None:
    stranger = Incarnation("a", "uid-somebody-else")
    assert plan_worker(two_on_a, stranger, {"0": 1}).stop == {"0"}
    assert not is_owner(two_on_a, stranger, "0")
    assert is_owner(two_on_a, A, "0")
    assert not is_owner(two_on_a, A, "no-such-unit")


def test_supersedes(two_on_a: AssignmentTable, releasing: AssignmentTable) -> None:
    assert supersedes(two_on_a, None)
    assert supersedes(releasing, two_on_a)
    assert not supersedes(two_on_a, releasing)
    assert not supersedes(two_on_a, two_on_a)
    recreated = AssignmentTable.initial(
        ResourceRef("PartitionSet", "default", "demo", "set-uid-2"),
        generation=1,
        key_scheme="netherite",
        count=2,
    )
    assert supersedes(recreated, releasing)


def test_every_reason_has_a_message() -> None:
    from apportion.engine.handoff import HandoffEvent

    for reason in Reason:
        message = HandoffEvent(reason, "a", "b", tuple(str(i) for i in range(12))).message()
        assert "12 unit(s)" in message
        assert "…" in message


# ----------------------------------------------------------------------------------- properties

NAMES = ("a", "b", "c", "d")
UNITS = ("0", "1", "2", "3", "4", "5")


@st.composite
def published_tables(draw: st.DrawFn) -> AssignmentTable:
    epoch = draw(st.integers(2, 20))
    names = draw(st.lists(st.sampled_from(NAMES), unique=True))
    members = tuple(Incarnation(n, f"uid-{n}") for n in sorted(names))
    units = {}
    for unit in UNITS:
        owner = draw(st.sampled_from([None, *names]))
        unit_epoch = draw(st.integers(0, epoch)) if owner is None else draw(st.integers(1, epoch))
        release = None
        others: list[str | None] = [n for n in names if n != owner]
        if owner is not None and draw(st.booleans()):
            release = Release(
                to=draw(st.sampled_from([*others, None])),  # None: to nobody (a restart hold)
                since=draw(st.floats(0, 100)),
                epoch=draw(st.integers(unit_epoch, epoch)),
            )
        units[unit] = UnitState(owner, unit_epoch, release)
    return AssignmentTable(SET, 1, "netherite", len(UNITS), epoch, members, units)


@st.composite
def step_inputs(draw: st.DrawFn):
    published = draw(published_tables())
    # Mostly the incarnations the table knows, mostly not draining, targets mostly where a
    # release already points: the inputs under which hand-offs progress.
    rarely = st.sampled_from([False, False, False, True])

    def uid(name: str) -> str:
        return draw(st.sampled_from([f"uid-{name}"] * 3 + [f"uid-{name}-new"]))

    live_pods = {
        name: WorkerPod(name, uid(name), terminating=draw(rarely))
        for name in NAMES
        if not draw(rarely)
    }
    acks = {
        name: Ack(
            uid=uid(name),
            epoch=draw(st.just(published.epoch) | st.integers(0, published.epoch)),
            pending=frozenset(draw(st.lists(st.sampled_from(UNITS), max_size=2))),
            draining=draw(rarely),
        )
        for name in NAMES
        if not draw(rarely)
    }
    target = {}
    for unit, state in published.units.items():
        usual = [state.releasing.to or state.owner] * 6 if state.releasing else []
        choice = draw(st.sampled_from([*usual, state.owner, *NAMES, None]))
        if choice is not None:
            target[unit] = choice
    now = draw(st.floats(0, 200))
    return published, target, acks, live_pods, now


@settings(max_examples=300)
@given(step_inputs())
def test_step_properties(inputs) -> None:
    published, target, acks, live_pods, now = inputs
    decision = step(published, target, acks, live_pods, now, TIMEOUT)
    table = decision.new_table
    if table is None:
        table = published
    else:
        assert table.epoch == published.epoch + 1
        assert table.set_ref == published.set_ref
        assert table.members == tuple(Incarnation(n, live_pods[n].uid) for n in sorted(live_pods))
        assert step(table, target, acks, live_pods, now, TIMEOUT).new_table is None
    assert table.units.keys() == published.units.keys()
    completed = {
        u for e in decision.events if e.reason is Reason.HANDOFF_COMPLETED for u in e.units
    }
    timed_out = {
        u for e in decision.events if e.reason is Reason.HANDOFF_TIMED_OUT for u in e.units
    }

    def draining(name: str | None) -> bool:
        pod = live_pods.get(name) if name is not None else None
        ack = acks.get(name) if name is not None else None
        announced = ack is not None and pod is not None and ack.uid == pod.uid and ack.draining
        return pod is not None and (pod.draining or announced)

    for unit, old in published.units.items():
        new = table.units[unit]
        assert new.epoch >= old.epoch
        if (new.owner, new.epoch) != (old.owner, old.epoch):
            assert new.epoch == table.epoch  # every ownership change gets a fresh token
            if new.owner is not None:
                assert target.get(unit) == new.owner
                assert not live_pods[new.owner].draining
        old_owner_alive = (
            old.owner in live_pods and live_pods[old.owner].uid == published.member_uids[old.owner]
        )
        if old_owner_alive and new.owner != old.owner:
            # a live owner loses a unit only after a release, acknowledged or timed out
            assert old.releasing is not None
            ack = acks.get(old.owner)
            acked = (
                ack is not None
                and ack.uid == live_pods[old.owner].uid
                and ack.epoch >= old.releasing.epoch
                and unit not in ack.pending
            )
            assert (unit in completed and acked) or (
                unit in timed_out and now - old.releasing.since >= TIMEOUT
            )
        if new.releasing is not None and new.releasing.to is None:
            # to nobody: only for an owner that leaves, aimed at itself (held for its return)
            assert target.get(unit) == new.owner
            assert draining(new.owner)
        elif new.releasing is not None:
            assert new.releasing.to == target.get(unit)
            assert new.owner != new.releasing.to
    releases = {u: r for u in table.unit_names if (r := table.units[u].releasing) is not None}
    waiting = list(releases)
    assert list(decision.waiting) == waiting
    if waiting:
        deadline = min(r.since for r in releases.values()) + TIMEOUT
        assert decision.wake_at == deadline
    else:
        assert decision.wake_at is None
