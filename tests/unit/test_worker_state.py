"""The worker's pure state: table transitions → callbacks, fencing by epoch and pod uid, and
what the acks it writes say."""

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
from apportion.engine.handoff import is_owner, releasing_units
from apportion.worker._worker_state import WorkerState

REF = ResourceRef("PartitionSet", "ns", "demo", "set-uid-1")
ME = Incarnation("w-0", "uid-0")
OTHER = Incarnation("w-1", "uid-1")


def table(
    epoch: int,
    units: dict[str, UnitState],
    *,
    members: tuple[Incarnation, ...] = (ME, OTHER),
    ref: ResourceRef = REF,
) -> AssignmentTable:
    return AssignmentTable(ref, 1, "netherite", 8, epoch, members, units)  # count: never changes


def owned(owner: str | None, epoch: int) -> UnitState:
    return UnitState(owner, epoch)


def releasing(owner: str, epoch: int, to: str, since_epoch: int) -> UnitState:
    return UnitState(owner, epoch, Release(to, 100.0, since_epoch))


def state() -> WorkerState:
    return WorkerState(ME, "PartitionSet", "ns", "demo")


def start(s: WorkerState, t: AssignmentTable) -> None:
    """Receive `t` and complete whatever it asks."""
    assert s.receive(t)
    while (step := s.next_transition()) is not None:
        s.stopped(step.stop)
        s.released(step.release)
        s.acquired(step.acquire)


def test_first_table_acquires_granted_units_and_serves_them_once_acquired() -> None:
    s = state()
    assert s.next_transition() is None
    assert s.receive(table(1, {"0": owned("w-0", 1), "1": owned("w-1", 1), "2": owned(None, 0)}))
    step = s.next_transition()
    assert step is not None
    assert (step.acquire, step.release, step.stop) == ({"0"}, set(), set())
    assert step.tokens == {"0": 1}
    assert step.epoch == 1
    # Not served while on_acquire runs, and not planned twice.
    assert not s.owns("0")
    assert s.my_units() == set()
    assert s.next_transition() is None
    s.acquired(step.acquire)
    assert s.my_units() == {"0"}
    assert s.token("0") == 1
    assert not s.owns("1")
    assert s.token("1") is None
    assert s.ack_due() is None  # nothing to acknowledge: no Pod write


def test_release_fences_at_once_and_acks_only_after_the_callback() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    s.receive(table(2, {"0": owned("w-0", 1), "1": releasing("w-0", 1, "w-1", 2)}))
    # The newest view decides at once: no new work for unit 1 even before the callback runs.
    assert s.my_units() == {"0"}
    step = s.next_transition()
    assert step is not None
    assert step.release == {"1"}
    assert not step.acquire
    assert not step.stop
    assert s.ack_due() is None  # still finishing unit 1: nothing released to report
    s.released(step.release)
    ack = s.ack_due()
    assert ack == Ack(uid="uid-0", epoch=2, pending=frozenset(), draining=False)
    s.ack_written(ack)
    assert s.ack_due() is None
    # The hand-off completes: unit 1 is w-1's under epoch 3; nothing left to do or write.
    s.receive(table(3, {"0": owned("w-0", 1), "1": owned("w-1", 3)}))
    assert s.next_transition() is None
    assert s.ack_due() is None
    assert s.my_units() == {"0"}


def test_ack_lists_units_still_finishing_as_pending() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    s.receive(table(2, {"0": releasing("w-0", 1, "w-1", 2), "1": releasing("w-0", 1, "w-1", 2)}))
    step = s.next_transition()
    assert step is not None
    assert step.release == {"0", "1"}
    s.released({"0"})  # one callback's worth; "1" still held
    # Callbacks get units in groups, but the rule is per unit: report what is done.
    ack = s.ack_due()
    assert ack is not None
    assert ack.pending == {"1"}
    assert ack.epoch == 2
    s.ack_written(ack)
    s.released({"1"})
    later = s.ack_due()
    assert later is not None
    assert later.pending == frozenset()


def test_units_granted_to_another_incarnation_of_this_pod_are_not_served() -> None:
    s = state()
    old_me = Incarnation("w-0", "uid-old")
    s.receive(table(1, {"0": owned("w-0", 1)}, members=(old_me, OTHER)))
    assert s.next_transition() is None
    assert not s.owns("0")
    # The operator catches up with the new uid: now the unit is acquired.
    s.receive(table(2, {"0": owned("w-0", 2)}))
    step = s.next_transition()
    assert step is not None
    assert step.acquire == {"0"}
    assert step.tokens == {"0": 2}


def test_a_unit_taken_away_without_hand_off_is_stopped_and_regranted_under_a_new_token() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    # Tables 2..4 were missed: unit 0 went elsewhere and came back under epoch 4.
    s.receive(table(5, {"0": owned("w-0", 4), "1": owned("w-1", 5)}))
    assert s.my_units() == set()  # neither token matches the view any more
    step = s.next_transition()
    assert step is not None
    assert step.stop == {"0", "1"}
    assert step.acquire == {"0"}
    assert step.tokens == {"0": 4}
    assert s.ack_due() is None  # a stop is not acknowledged
    s.stopped(step.stop)
    s.acquired(step.acquire)
    assert s.my_units() == {"0"}
    assert s.token("0") == 4


def test_older_and_equal_epochs_are_ignored_a_recreated_set_starts_over() -> None:
    s = state()
    start(s, table(3, {"0": owned("w-0", 3)}))
    assert not s.receive(table(2, {"0": owned("w-1", 2)}))
    assert not s.receive(table(3, {"0": owned("w-1", 3)}))
    assert s.my_units() == {"0"}
    # Same name, new uid: epochs restart, so a held token may match a new unit epoch by chance.
    recreated = ResourceRef(REF.kind, REF.namespace, REF.name, "set-uid-2")
    assert s.receive(table(3, {"0": owned("w-0", 3)}, ref=recreated))
    assert s.my_units() == set()
    step = s.next_transition()
    assert step is not None
    assert step.stop == {"0"}
    assert step.acquire == {"0"}


def test_a_table_of_another_set_is_refused() -> None:
    s = state()
    other = ResourceRef("ShardSet", "ns", "demo", "uid")
    with pytest.raises(ValueError, match="ShardSet ns/demo"):
        s.receive(table(1, {"0": owned("w-0", 1)}, ref=other))


def test_a_busy_unit_is_not_planned_again_and_a_cancelled_release_is_reacquired() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1)}))
    s.receive(table(2, {"0": releasing("w-0", 1, "w-1", 2)}))
    step = s.next_transition()
    assert step is not None
    assert step.release == {"0"}
    # The hand-off is cancelled while on_release still runs: no second callback meanwhile.
    s.receive(table(3, {"0": owned("w-0", 1)}))
    assert s.next_transition() is None
    assert not s.owns("0")  # still being released
    s.released(step.release)
    again = s.next_transition()
    assert again is not None
    assert again.acquire == {"0"}
    assert again.tokens == {"0": 1}


def test_a_failed_release_stays_pending_says_why_and_is_acked_only_once_it_succeeds() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    s.receive(table(2, {"0": owned("w-0", 1), "1": releasing("w-0", 1, "w-1", 2)}))
    step = s.next_transition()
    assert step is not None
    assert step.release == {"1"}
    s.release_failed(step.release, "OSError: " + "x" * 500)
    # Held, busy (the worker retries it), never served, pending with its message.
    assert s.token("1") == 1
    assert not s.owns("1")
    assert s.next_transition() is None
    ack = s.ack_due()
    assert ack is not None
    assert ack.pending == {"1"}
    assert ack.failing["1"].startswith("OSError")
    assert len(ack.failing["1"]) == 200  # FAILING_MESSAGE_LIMIT
    s.ack_written(ack)
    s.release_failed({"1"}, "OSError: another message")
    assert s.ack_due() is None  # a new message alone is no news: no Pod write per retry
    assert s.retry_wanted({"1"}) == {"1"}
    assert not s.drained()
    s.released({"1"})
    assert s.ack_due() == Ack("uid-0", 2)
    assert s.failing == {}


def test_a_failing_release_is_given_up_when_the_unit_is_taken_away() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    s.receive(table(2, {"0": owned("w-0", 1), "1": releasing("w-0", 1, "w-1", 2)}))
    step = s.next_transition()
    assert step is not None
    s.release_failed(step.release, "boom")
    # Cancelled (given back under the same token): still to be finished, then acquired afresh.
    s.receive(table(3, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    assert s.retry_wanted({"1"}) == {"1"}
    assert not s.owns("1")
    assert s.ack_due() is None  # nothing releasing any more: nothing to report
    # handoffTimeout: w-1 owns it under a new token. The retries stop; the unit is stopped.
    s.receive(table(4, {"0": owned("w-0", 1), "1": owned("w-1", 4)}))
    assert s.retry_wanted({"1"}) == frozenset()
    s.release_abandoned({"1"})
    stop = s.next_transition()
    assert stop is not None
    assert stop.stop == {"1"}
    assert s.failing == {}
    s.stopped(stop.stop)
    assert s.token("1") is None


def test_a_failing_release_is_given_up_at_a_change_of_count() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1)}))
    s.receive(table(2, {"0": releasing("w-0", 1, "w-1", 2)}))
    step = s.next_transition()
    assert step is not None
    s.release_failed(step.release, "boom")
    resized = AssignmentTable(REF, 1, "netherite", 16, 3, (ME, OTHER), {"0": owned("w-0", 1)})
    s.receive(resized)  # unit "0" of 16 is not unit "0" of 8: the reshape decides
    assert s.retry_wanted({"0"}) == frozenset()


def test_a_failed_acquire_is_not_served_and_is_retried() -> None:
    s = state()
    s.receive(table(1, {"0": owned("w-0", 1)}))
    step = s.next_transition()
    assert step is not None
    s.acquired(step.acquire, ok=False)
    assert not s.owns("0")
    retry = s.next_transition()
    assert retry is not None
    assert retry.acquire == {"0"}


def test_a_release_of_a_unit_this_process_never_held_is_acknowledged_at_once() -> None:
    # A restarted container (same pod uid) finds a release for a unit it never acquired.
    s = state()
    s.receive(table(4, {"0": releasing("w-0", 2, "w-1", 4), "1": owned("w-0", 2)}))
    step = s.next_transition()
    assert step is not None
    assert step.acquire == {"1"}
    assert not step.release
    ack = s.ack_due()
    assert ack == Ack(uid="uid-0", epoch=4, pending=frozenset(), draining=False)


def test_draining_marks_the_ack_keeps_serving_and_ends_when_everything_moved() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-1", 1)}))
    s.start_draining()
    ack = s.ack_due()
    assert ack == Ack(uid="uid-0", epoch=1, pending=frozenset(), draining=True)
    s.ack_written(ack)
    assert s.ack_due() is None
    assert not s.drained()
    assert s.my_units() == {"0"}  # served until the operator moves it away
    # A table written before the operator saw the mark grants unit 2: served meanwhile too.
    s.receive(
        table(2, {"0": releasing("w-0", 1, "w-1", 2), "1": owned("w-1", 1), "2": owned("w-0", 2)})
    )
    step = s.next_transition()
    assert step is not None
    assert step.release == {"0"}
    assert step.acquire == {"2"}
    s.released(step.release)
    s.acquired(step.acquire)
    ack = s.ack_due()
    assert ack is not None
    assert ack.draining
    assert ack.epoch == 2
    assert not ack.pending
    s.ack_written(ack)
    assert not s.drained()  # unit 2 is still ours
    s.receive(
        table(3, {"0": owned("w-1", 3), "1": owned("w-1", 1), "2": releasing("w-0", 2, "w-1", 3)})
    )
    step = s.next_transition()
    assert step is not None
    assert step.release == {"2"}
    assert s.ack_due() is None
    assert not s.drained()
    s.released(step.release)
    ack = s.ack_due()
    assert ack == Ack(uid="uid-0", epoch=3, pending=frozenset(), draining=True)
    s.ack_written(ack)
    assert s.drained()  # nothing held, nothing owned, every release acknowledged


def test_draining_before_any_table_and_a_stale_mark_from_an_earlier_process() -> None:
    s = state()
    assert s.drained()
    s.start_draining()
    assert s.ack_due() == Ack(uid="uid-0", epoch=0, draining=True)
    # A new process in the same pod finds the old process's draining mark and clears it.
    fresh = state()
    fresh.written = Ack(uid="uid-0", epoch=7, draining=True)
    assert fresh.ack_due() == Ack(uid="uid-0", epoch=0, draining=False)
    # A mark written by an earlier pod incarnation speaks for nobody.
    other = state()
    other.written = Ack(uid="uid-old", epoch=7, draining=True)
    assert other.ack_due() is None


def test_drop_all_gives_up_everything_held() -> None:
    s = state()
    start(s, table(1, {"0": owned("w-0", 1), "1": owned("w-0", 1)}))
    assert s.drop_all() == {"0", "1"}
    assert s.my_units() == set()
    assert not s.held
    assert not s.drained()  # the view still grants them: exit means the pod's deletion fences


# ------------------------------------------------------------------------- properties


UNITS = [str(i) for i in range(4)]
PODS = ["w-0", "w-1"]


@st.composite
def histories(draw: st.DrawFn) -> list[AssignmentTable]:
    """Increasing epochs of valid tables in which units come and go, with releases."""
    tables = []
    states = {unit: owned(None, 0) for unit in UNITS}
    for epoch in range(1, draw(st.integers(1, 8)) + 1):
        for unit in draw(st.lists(st.sampled_from(UNITS), unique=True)):
            current = states[unit]
            if current.owner is not None and current.releasing is None and draw(st.booleans()):
                to = next(p for p in PODS if p != current.owner)
                states[unit] = releasing(current.owner, current.epoch, to, epoch)
            else:
                states[unit] = owned(draw(st.sampled_from([*PODS, None])), epoch)
        me_uid = draw(st.sampled_from(["uid-0", "uid-0", "uid-0", "uid-old"]))
        tables.append(table(epoch, dict(states), members=(Incarnation("w-0", me_uid), OTHER)))
    return tables


@settings(max_examples=300, deadline=None)
@given(history=histories(), data=st.data())
def test_fencing_and_acks_hold_over_any_history(
    history: list[AssignmentTable], data: st.DataObject
) -> None:
    s = state()
    running: list[tuple[str, frozenset[str]]] = []
    for t in history:
        s.receive(t)
        check_fencing(s)  # the newest view rules before any callback has run
        # Callbacks finish in any order, some only later.
        while True:
            step = s.next_transition()
            if step is not None:
                s.stopped(step.stop)
                running += [("release", step.release), ("acquire", step.acquire)]
            if not running or not data.draw(st.booleans(), label="finish one"):
                break
            kind, units = running.pop(data.draw(st.integers(0, len(running) - 1)))
            if kind == "release" and data.draw(st.booleans(), label="release fails"):
                s.release_failed(units, "boom")
                wanted = s.retry_wanted(units)  # the worker tries again what is still its own
                s.release_abandoned(units - wanted)
                running.append(("release", wanted))
            else:
                (s.released if kind == "release" else s.acquired)(units)
        check_fencing(s)
        view = s.view
        assert view is not None
        ack = s.ack_due()
        if ack is not None:
            # An ack never reports a unit released while this process still holds it.
            assert not (releasing_units(view, ME) - ack.pending) & s.held.keys()
            assert ack.failing.keys() <= ack.pending
            assert ack.failing.keys() <= s.failing.keys()
            assert ack.uid == ME.uid
            assert ack.epoch == view.epoch
            s.ack_written(ack)


def check_fencing(s: WorkerState) -> None:
    """Only what the newest view grants this incarnation, under the token it was acquired with."""
    view = s.view
    assert view is not None
    for unit in s.my_units():
        assert is_owner(view, ME, unit)
        assert view.units[unit].epoch == s.token(unit)


def test_a_split_carries_held_units_into_children_and_acquires_nothing() -> None:
    from apportion.api.assignment import Lineage
    from apportion.engine.reshard import hash_range

    s = state()
    before = AssignmentTable(
        REF, 1, "apportion", 2, 3, (ME, OTHER), {"0": owned("w-0", 3), "1": owned("w-1", 2)}
    )
    start(s, before)
    split = AssignmentTable(
        REF,
        1,
        "apportion",
        4,
        4,
        (ME, OTHER),
        {str(u): owned("w-0" if u < 2 else "w-1", 4) for u in range(4)},
        Lineage(2, 4, 4, (3, 2)),
    )
    assert s.receive(split)
    step = s.next_transition()
    assert step is not None
    assert step.resharding is not None
    assert not step.acquire
    assert step.stop == frozenset()
    ((parent, children),) = step.resharding.splits().items()
    assert (parent.unit, parent.lo, parent.hi) == ("0", *hash_range(0, 2))
    assert [c.unit for c in children] == ["0", "1"]
    assert children[0].lo == parent.lo
    assert children[-1].hi == parent.hi
    s.resharded(step.resharding.carried)
    assert s.next_transition() is None
    assert s.my_units() == {"0", "1"}


def test_a_failed_split_callback_falls_back_to_acquiring_afresh() -> None:
    from apportion.api.assignment import Lineage

    s = state()
    start(s, AssignmentTable(REF, 1, "apportion", 1, 1, (ME,), {"0": owned("w-0", 1)}))
    s.receive(
        AssignmentTable(
            REF,
            1,
            "apportion",
            2,
            2,
            (ME,),
            {"0": owned("w-0", 2), "1": owned("w-0", 2)},
            Lineage(1, 2, 2, (1,)),
        )
    )
    step = s.next_transition()
    assert step is not None
    assert step.resharding is not None
    s.resharded(step.resharding.carried, ok=False)
    again = s.next_transition()
    assert again is not None
    assert again.acquire == {"0", "1"}


def test_a_merged_unit_already_releasing_is_carried_then_released_before_any_ack() -> None:
    """The merge table came while sibling 3 was still being acquired, and the next pass had
    already marked the merged unit releasing: no ack until the siblings' state is merged, then
    it is handed over by an ordinary release (not dropped, as a unit this process never held)."""
    from apportion.api.assignment import Lineage

    s = state()
    others = {u: owned("w-1", 2) for u in ("0", "1")}

    def of_four(epoch: int, three: str) -> AssignmentTable:
        units = {"2": owned("w-0", 3), "3": owned(three, epoch if three == "w-0" else 2)}
        return AssignmentTable(REF, 1, "apportion", 4, epoch, (ME, OTHER), {**others, **units})

    start(s, of_four(3, "w-1"))
    assert s.receive(of_four(4, "w-0"))
    acquiring = s.next_transition()
    assert acquiring is not None
    assert acquiring.acquire == {"3"}
    lineage = Lineage(4, 2, 5, (2, 2, 3, 4))
    for epoch, one in ((5, owned("w-0", 5)), (6, releasing("w-0", 5, "w-1", 6))):
        units = {"0": owned("w-1", 5), "1": one}
        assert s.receive(
            AssignmentTable(REF, 1, "apportion", 2, epoch, (ME, OTHER), units, lineage)
        )
    assert s.ack_due() is None  # "1" is not released: its state is still in "2" and "3" of 4
    s.acquired(acquiring.acquire)
    merge = s.next_transition()
    assert merge is not None
    assert merge.resharding is not None
    assert not merge.stop
    assert merge.resharding.carried == {"1": ("2", "3")}
    s.resharded(merge.resharding.carried)
    release = s.next_transition()
    assert release is not None
    assert release.release == {"1"}
    assert s.ack_due() is None  # still finishing: nothing to say yet
    s.released(release.release)
    assert s.ack_due() == Ack(uid=ME.uid, epoch=6, pending=frozenset(), draining=False)


def test_an_older_table_means_the_api_server_went_back_and_the_ack_is_written_again() -> None:
    """An etcd restore rolled the table and the Pod's ack back: the worker acts on nothing
    older, but writes its ack again, at the epoch it saw and naming the set, so the operator
    learns that epoch and finds its releases acknowledged (docs/handoff.md)."""
    s = state()
    start(s, table(3, {"0": owned("w-0", 1), "1": owned("w-1", 1)}))
    start(s, table(5, {"0": releasing("w-0", 1, "w-1", 5), "1": owned("w-1", 1)}))
    written = s.ack_due()
    assert written == Ack(uid="uid-0", epoch=5)
    s.ack_written(written)
    assert s.ack_due() is None
    assert not s.receive(table(3, {"0": owned("w-0", 1), "1": owned("w-1", 1)}))
    again = s.ack_due()
    assert again == Ack(uid="uid-0", epoch=5, set_uid=REF.uid)
    assert s.next_transition() is None, "nothing older is acted on"
    s.ack_written(again)
    assert s.ack_due() is None
    # The next ack names the set too: an operator that has not read the last one yet must
    # still learn the epoch from whatever ack it reads.
    start(s, table(7, {"0": owned("w-1", 7), "2": owned("w-0", 7)}))
    start(s, table(8, {"0": owned("w-1", 7), "2": releasing("w-0", 7, "w-1", 8)}))
    later = s.ack_due()
    assert later == Ack(uid="uid-0", epoch=8, set_uid=REF.uid)


def test_a_replay_or_another_sets_table_is_no_restore() -> None:
    s = state()
    start(s, table(5, {"0": owned("w-0", 1)}))
    assert not s.receive(table(5, {"0": owned("w-0", 1)}))
    assert s.ack_due() is None
    recreated = ResourceRef(REF.kind, REF.namespace, REF.name, "set-uid-2")
    assert s.receive(table(1, {"0": owned("w-0", 1)}, ref=recreated))
    assert not s.rewound


def test_a_rewound_watch_rewrites_the_ack_even_with_nothing_released() -> None:
    s = state()
    start(s, table(4, {"0": owned("w-0", 2)}))
    assert s.ack_due() is None
    s.went_back()
    assert s.ack_due() == Ack(uid="uid-0", epoch=4, set_uid=REF.uid)
