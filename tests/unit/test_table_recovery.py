"""`engine.handoff.recover`: what the operator writes when its table is lost, garbled, rolled back
or tampered with (docs/handoff.md, "When the table is lost")."""

from __future__ import annotations

import pytest

from apportion.api.assignment import AssignmentTable, Incarnation, ResourceRef, UnitState
from apportion.engine.handoff import TableDamage, plan_worker, recover

SET = ResourceRef("ShardSet", "ns", "carts", "uid-1")
TEMPLATE = AssignmentTable.initial(SET, generation=1, key_scheme="akka", count=4)
A, B = Incarnation("w-0", "uid-a"), Incarnation("w-1", "uid-b")


def table(epoch: int, owners: dict[str, str]) -> AssignmentTable:
    units = {u: UnitState(owners.get(u), min(epoch, 3) if u in owners else 0) for u in "0123"}
    return AssignmentTable(SET, 1, "akka", 4, epoch, (A, B), units)


LAST = table(8, {"0": "w-0", "1": "w-1", "2": "w-0", "3": "w-1"})
OLD = table(5, {"0": "w-1", "1": "w-0", "2": "w-1", "3": "w-0"})


def test_an_intact_table_is_continued() -> None:
    assert recover(LAST, None, published=8, reserved=8, remembered=LAST, template=TEMPLATE) is None


def test_a_new_set_starts_from_nothing() -> None:
    assert recover(None, None, published=0, reserved=0, remembered=None, template=TEMPLATE) is None


@pytest.mark.parametrize(
    ("found", "unreadable", "damage"),
    [
        (None, None, TableDamage.LOST),
        (None, "ConfigMap carts-shardset-assignment holds no valid table", TableDamage.UNREADABLE),
        (OLD, None, TableDamage.ROLLED_BACK),
        (table(8, {"0": "w-1"}), None, TableDamage.TAMPERED),
    ],
)
def test_with_the_last_table_remembered_its_owners_return_above_every_reserved_epoch(
    found: AssignmentTable | None, unreadable: str | None, damage: TableDamage
) -> None:
    repair = recover(found, unreadable, published=8, reserved=8, remembered=LAST, template=TEMPLATE)
    assert repair is not None
    assert repair.damage is damage
    assert not repair.fenced
    assert repair.table.epoch == 9, "above everything that may have been published"
    assert repair.table.owners() == LAST.owners()
    assert repair.table.members == LAST.members
    # Each worker keeps serving exactly what it served, under the same tokens: nothing moves.
    for me in (A, B):
        serving = {u: LAST.units[u].epoch for u, o in LAST.owners().items() if o == me.name}
        plan = plan_worker(repair.table, me, serving)
        assert not plan.acquire
        assert not plan.release
        assert not plan.stop


def test_without_a_copy_the_fence_makes_every_worker_stop() -> None:
    repair = recover(None, None, published=8, reserved=8, remembered=None, template=TEMPLATE)
    assert repair is not None
    assert repair.fenced
    assert repair.damage is TableDamage.LOST
    assert repair.table.epoch == 9
    assert set(repair.table.owners().values()) == {None}
    # A unit's token grows even into Unowned, so the next owner's is above every old one.
    assert {s.epoch for s in repair.table.units.values()} == {9}
    for me in (A, B):
        serving = {u: LAST.units[u].epoch for u, o in LAST.owners().items() if o == me.name}
        assert plan_worker(repair.table, me, serving).stop == frozenset(serving)


def test_after_a_restart_the_table_at_the_reservation_is_continued() -> None:
    """The status lags the table (written after it); the reservation does not (before it)."""
    assert recover(LAST, None, published=7, reserved=8, remembered=None, template=TEMPLATE) is None


def test_a_table_below_the_reservation_is_kept_while_it_is_the_one_remembered() -> None:
    """The write of epoch 9 failed after its reservation: the table is the last one written."""
    assert recover(LAST, None, published=8, reserved=9, remembered=LAST, template=TEMPLATE) is None


def test_after_a_restart_a_table_below_the_reservation_is_fenced() -> None:
    """Rolled back while the status lagged, or the write after the reservation failed: without
    a copy the two look alike, and the fence is the safe answer to both."""
    repair = recover(LAST, None, published=8, reserved=9, remembered=None, template=TEMPLATE)
    assert repair is not None
    assert repair.fenced
    assert repair.table.epoch == 10


def test_a_rolled_back_table_without_a_copy_is_not_trusted() -> None:
    """Its owners are stale: a worker that got a unit since would serve it beside the old one.
    The status's epoch (8) says a newer table was published."""
    repair = recover(OLD, None, published=8, reserved=8, remembered=None, template=TEMPLATE)
    assert repair is not None
    assert repair.fenced
    assert repair.damage is TableDamage.ROLLED_BACK
    assert repair.table.epoch == 9


def test_a_table_above_the_reservation_was_not_written_by_the_operator() -> None:
    forged = table(500, {"0": "w-1"})
    repair = recover(forged, None, published=8, reserved=8, remembered=LAST, template=TEMPLATE)
    assert repair is not None
    assert repair.damage is TableDamage.TAMPERED
    assert repair.table.epoch == 501
    assert repair.table.owners() == LAST.owners()


def test_a_table_of_an_earlier_set_of_the_same_name_is_not_remembered() -> None:
    other = AssignmentTable(
        ResourceRef("ShardSet", "ns", "carts", "uid-0"), 1, "akka", 4, 9, (A, B), LAST.units
    )
    repair = recover(None, None, published=8, reserved=8, remembered=other, template=TEMPLATE)
    assert repair is not None
    assert repair.fenced


def test_a_reported_handoff_timeout_survives_a_restart() -> None:
    """The successor reads HandoffTimedOut back from the status and keeps it for its full time
    (60 s from the transition) instead of clearing it in its first pass."""
    from apportion.engine.set_state import TIMEOUT_REPORT_SECONDS, SetState

    degraded = {
        "type": "Degraded",
        "status": "True",
        "reason": "HandoffTimedOut",
        "message": "w-1 did not release 3 unit(s) within 60s",
        "lastTransitionTime": "2026-11-24T10:00:00Z",
    }
    state = SetState.from_status({"conditions": [degraded]})
    until = 1795514400.0 + TIMEOUT_REPORT_SECONDS  # 2026-11-24T10:00:00Z, by hand
    problem = state.timeout_problem(until - 1)
    assert problem is not None
    assert (problem.reason, problem.message) == ("HandoffTimedOut", degraded["message"])
    assert state.timeout_problem(until) is None
    other = {**degraded, "reason": "NoMembers"}
    assert SetState.from_status({"conditions": [other]}).timeout_problem(0.0) is None
    assert SetState.from_status({}).timeout_problem(0.0) is None


# An etcd restore rolls the table, the status and the acks back at once: the restored table
# is consistent with the restored status (OLD at epoch 5, reserved 5), and only the workers,
# which saw epoch 8, know better (docs/handoff.md, "When the cluster is restored from a backup").


def test_a_restore_the_workers_saw_past_is_fenced_above_what_they_saw() -> None:
    """Broken variant, without `acked`: recover(OLD, reserved=5, published=5) is None, and the
    operator's next table (epoch 6) would reuse an epoch the workers have seen and ignore."""
    assert recover(OLD, None, published=5, reserved=5, remembered=None, template=TEMPLATE) is None
    repair = recover(
        OLD, None, published=5, reserved=5, remembered=None, template=TEMPLATE, acked=8
    )
    assert repair is not None
    assert repair.damage is TableDamage.ROLLED_BACK
    assert repair.fenced, "the restored owners are stale: a unit may have moved since"
    assert repair.table.epoch == 9, "above every epoch a worker saw"
    assert {s.epoch for s in repair.table.units.values()} == {9}


def test_a_restore_under_a_running_operator_republishes_what_it_remembers() -> None:
    """The operator kept the newest table in memory: the workers serve exactly its owners."""
    for acked in (0, 7, 8):
        repair = recover(
            OLD, None, published=5, reserved=5, remembered=LAST, template=TEMPLATE, acked=acked
        )
        assert repair is not None
        assert not repair.fenced
        assert repair.table.epoch == 9
        assert repair.table.owners() == LAST.owners()


def test_an_ack_above_the_remembered_table_makes_the_copy_stale() -> None:
    """The operator remembers a table it wrote after the restore (epoch 6, reusing an epoch the
    workers ignore as old): its owners are not what they serve."""
    after = table(6, {"0": "w-0", "1": "w-0", "2": "w-0", "3": "w-0"})
    repair = recover(
        after, None, published=6, reserved=6, remembered=after, template=TEMPLATE, acked=8
    )
    assert repair is not None
    assert repair.fenced
    assert repair.table.epoch == 9


def test_acks_at_or_below_what_the_cluster_holds_are_no_news() -> None:
    assert (
        recover(LAST, None, published=8, reserved=8, remembered=None, template=TEMPLATE, acked=8)
        is None
    )


def test_only_acks_naming_this_set_and_written_by_the_pod_count_as_seen_epochs() -> None:
    """A pod keeps the ack of a deleted set of the same name until it acks again: its epochs
    are not this set's, so only an ack naming this set incarnation tells of a restore."""
    from apportion.api.assignment import Ack
    from apportion.api.pods import WorkerPod
    from apportion.engine.set_pass import acked_epoch

    key = SET.ack_annotation

    def pod(name: str, uid: str, ack: Ack) -> WorkerPod:
        return WorkerPod(name, uid, acks={key: ack.to_annotation()})

    plain = pod("w-0", "uid-a", Ack("uid-a", 50))
    earlier_set = pod("w-1", "uid-b", Ack("uid-b", 40, set_uid="uid-0"))
    earlier_pod = pod("w-2", "uid-c", Ack("uid-old", 30, set_uid=SET.uid))
    assert acked_epoch([plain, earlier_set, earlier_pod], SET) == 0
    seen = pod("w-3", "uid-d", Ack("uid-d", 9, set_uid=SET.uid))
    assert acked_epoch([plain, earlier_set, earlier_pod, seen], SET) == 9
