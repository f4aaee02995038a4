"""One placement pass of a unit set (apportion.engine.set_pass): strategy plan, moves held back
for rollouts, intervals and budgets, the hand-off step, and the status that reports it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from apportion.api import PartitionSet, ShardSet
from apportion.api.assignment import Ack, AssignmentTable, Incarnation, ResourceRef, Suspensions
from apportion.api.common import rfc3339
from apportion.api.pods import WorkerPod
from apportion.engine.allocation import Member as EngineMember
from apportion.engine.handoff import Reason, make_ack
from apportion.engine.set_pass import (
    PassInput,
    PassResult,
    Rollout,
    imbalance,
    initial_table,
    plan_pass,
)
from apportion.engine.set_status import StatusInput, suspension_news, suspensions, unit_set_status
from tests.support.passes import decided, written
from tests.support.present import present

REF = ResourceRef("PartitionSet", "ns", "demo", "set-uid")
ACK = REF.ack_annotation

NOW = 1_700_000_000.0
"""The pass's clock; the engine reads no other."""


def pset(**spec: Any) -> Any:
    body = {"partitions": 32, "selector": {"matchLabels": {"app": "w"}}, **spec}
    return PartitionSet.model_validate({"metadata": {"name": "demo"}, "spec": body}).spec


def sset(**spec: Any) -> Any:
    body = {"shards": 1000, "selector": {"matchLabels": {"app": "w"}}, **spec}
    return ShardSet.model_validate({"metadata": {"name": "carts"}, "spec": body}).spec


def pods(*names: str, **changes: Any) -> list[WorkerPod]:
    return [WorkerPod(name, f"uid-{name}", **changes) for name in names]


def workers(n: int) -> list[WorkerPod]:
    return pods(*(f"w-{i}" for i in range(n)))


def run(
    spec: Any, table: AssignmentTable, members: list[WorkerPod], now: float = 1000.0, **kw: Any
) -> PassResult:
    return plan_pass(PassInput(spec, table, 1, members, now=now, **kw))


def counts(table: AssignmentTable) -> dict[str, int]:
    return {name: len(units) for name, units in table.by_member().items()}


def acked(table: AssignmentTable, members: list[WorkerPod]) -> list[WorkerPod]:
    """Every member acknowledges every release `table` asks of it (as the worker rule does)."""
    return [
        replace(
            p,
            acks={
                table.set_ref.ack_annotation: make_ack(
                    table, Incarnation(p.name, p.uid)
                ).to_annotation()
            },
        )
        if p.name in table.member_uids
        else p
        for p in members
    ]


def settle(
    spec: Any, table: AssignmentTable, members: list[WorkerPod], now: float, limit: int = 200
) -> tuple[AssignmentTable, list[PassResult]]:
    """Passes with instant acks until nothing changes; the time moves one interval per pass."""
    results = []
    for _ in range(limit):
        result = run(spec, table, acked(table, members), now)
        results.append(result)
        if result.new_table is None:
            return table, results
        table = written(result)
        now += spec.rebalance.interval.total_seconds()
    raise AssertionError("no fixed point")


@pytest.fixture
def spec() -> Any:
    return pset(rebalance={"interval": "1s", "handoffTimeout": "5s"})


@pytest.fixture
def balanced4(spec: Any) -> AssignmentTable:
    result = run(spec, initial_table(REF, spec, 1), workers(4))
    assert result.new_table is not None
    return written(result)


def test_first_pass_assigns_every_unit_evenly(spec: Any) -> None:
    result = run(spec, initial_table(REF, spec, 1), workers(4))
    table = written(result)
    assert table is not None
    assert table.epoch == 1
    assert counts(table) == {"w-0": 8, "w-1": 8, "w-2": 8, "w-3": 8}
    assert {e.reason for e in decided(result).events} == {Reason.ASSIGNED}
    assert not result.round_started, "placing unowned units is not a rebalance round"


def test_scale_out_moves_the_minimum_through_releases(spec: Any, balanced4: AssignmentTable):
    members = workers(5)
    result = run(spec, balanced4, members)
    assert len(result.kept) == 6
    assert result.held == 0
    assert result.round_started
    table = written(result)
    assert table.epoch == 2
    assert len(table.releasing()) == 6
    assert {r.to for r in table.releasing().values()} == {"w-4"}
    assert counts(table)["w-4"] == 0, "nothing changes hands before the owners acknowledge"
    assert "rebalancing 6 unit(s)" in present(result.summary, "summary")

    done = run(spec, table, acked(table, members), now=1000.5)
    final = written(done)
    assert sorted(counts(final).values()) == [6, 6, 6, 7, 7]
    assert {e.reason for e in decided(done).events} == {Reason.HANDOFF_COMPLETED}
    assert all(final.units[u].epoch == 3 for u in table.releasing())


def test_unacknowledged_release_is_forced_after_the_timeout(spec, balanced4) -> None:
    members = workers(5)
    table = written(run(spec, balanced4, members))
    waiting = run(spec, table, members, now=1004.0)
    assert waiting.new_table is None
    assert decided(waiting).wake_at == 1005.0
    forced = run(spec, table, members, now=1005.0)
    assert {e.reason for e in decided(forced).events} == {Reason.HANDOFF_TIMED_OUT}
    assert counts(written(forced))["w-4"] == 6


def test_units_of_a_gone_pod_move_at_once_even_when_rebalancing_is_held(spec, balanced4):
    survivors = workers(4)[:3]
    rolling = Rollout(True, "rev-2", "rolling")
    result = run(spec, balanced4, survivors, last_round=999.9, rollout=rolling)
    table = written(result)
    assert {e.reason for e in decided(result).events} == {Reason.OWNER_GONE}
    assert "w-3" not in counts(table)
    assert sum(counts(table).values()) == 32
    assert result.hold_reason.startswith("rollout in progress")


def test_a_new_incarnation_of_the_same_name_does_not_inherit_units(spec, balanced4) -> None:
    members = workers(4)
    members[3] = WorkerPod("w-3", "uid-w-3-again")
    result = run(spec, balanced4, members)
    gone = [e for e in decided(result).events if e.reason is Reason.OWNER_GONE]
    assert gone
    assert all(e.source == "w-3" for e in gone)
    assert written(result).member_uids["w-3"] == "uid-w-3-again"


def test_rollout_holds_optional_moves_unless_told_not_to(balanced4) -> None:
    rolling = Rollout(True, "rev-2", "StatefulSet w: 1 of 5 member(s) at revision rev-2")
    held_spec = pset(rebalance={"interval": "1s"})
    held = run(held_spec, balanced4, workers(5), rollout=rolling)
    assert written(held).releasing() == {}
    assert held.held == 6
    assert "StatefulSet w" in present(held.hold_reason, "hold reason")

    free_spec = pset(rebalance={"interval": "1s", "pauseDuringRollout": False})
    free = run(free_spec, balanced4, workers(5), rollout=rolling)
    assert len(written(free).releasing()) == 6


def test_a_round_waits_for_the_interval(spec, balanced4) -> None:
    early = run(spec, balanced4, workers(5), now=1000.0, last_round=999.5)
    assert early.held == 6
    assert early.next_round == 1000.5
    assert early.wake_at == 1000.5
    on_time = run(spec, balanced4, workers(5), now=1000.5, last_round=999.5)
    assert on_time.held == 0
    assert on_time.round_started


def test_max_moves_per_round_bounds_optional_moves(balanced4) -> None:
    spec = pset(rebalance={"interval": "1s", "maxMovesPerRound": 2})
    result = run(spec, balanced4, workers(5))
    assert len(written(result).releasing()) == 2
    assert not present(result.plan, "plan").quality.converged
    assert result.next_round == 1001.0
    table, _ = settle(spec, balanced4, workers(5), now=1000.0)
    assert sorted(counts(table).values()) == [6, 6, 6, 7, 7]


def test_zero_moves_per_round_still_places_units_of_gone_pods(balanced4) -> None:
    spec = pset(rebalance={"maxMovesPerRound": 0})
    result = run(spec, balanced4, workers(3))
    assert sum(counts(written(result)).values()) == 32
    assert written(run(spec, written(result), workers(4))).releasing() == {}


def test_no_members_keeps_the_published_table_and_says_why(spec, balanced4) -> None:
    result = run(spec, balanced4, [])
    assert result.decision is None
    assert result.new_table is None
    assert [p.reason for p in result.problems] == ["NoMembers"]
    status = unit_set_status(StatusInput(balanced4, result, [], 1, "cm", NOW))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Degraded"]["reason"] == "NoMembers"
    assert conditions["Ready"]["status"] == "False"
    assert status["epoch"] == balanced4.epoch
    # The pass's clock stamps the transitions: 1.7e9 s after the epoch is this instant.
    assert {c["lastTransitionTime"] for c in status["conditions"]} == {"2023-11-14T22:13:20Z"}


def test_a_pod_no_longer_selected_hands_its_units_off(spec, balanced4) -> None:
    selected = workers(4)[:3]
    departed = workers(4)[3:]
    result = run(spec, balanced4, selected, departed=departed)
    releases = written(result).releasing()
    assert len(releases) == 8
    assert {balanced4.units[u].owner for u in releases} == {"w-3"}
    assert counts(written(result))["w-3"] == 8, "kept until w-3 acknowledges"


def test_a_worker_announcing_drain_gets_its_units_moved(spec, balanced4) -> None:
    members = workers(4)
    me = Incarnation("w-0", "uid-w-0")
    ack = make_ack(balanced4, me, draining=True).to_annotation()
    members[0] = WorkerPod("w-0", "uid-w-0", acks={ACK: ack})
    releases = written(run(spec, balanced4, members)).releasing()
    assert len(releases) == 8
    assert {balanced4.units[u].owner for u in releases} == {"w-0"}


def test_terminating_pods_are_drained_at_once(spec, balanced4) -> None:
    members = workers(4)
    members[1] = WorkerPod("w-1", "uid-w-1", terminating=True)
    result = run(spec, balanced4, members, last_round=999.9)
    assert len(written(result).releasing()) == 8, "forced moves do not wait for a round"


def test_a_drained_pod_hands_everything_off_and_takes_units_back_when_uncordoned(
    spec, balanced4
) -> None:
    members = workers(4)
    members[1] = replace(members[1], drained=True)
    first = run(spec, balanced4, members, last_round=999.9)
    releases = written(first).releasing()
    assert len(releases) == 8
    assert {balanced4.units[u].owner for u in releases} == {"w-1"}
    assert "w-1" not in {r.to for r in releases.values()}
    assert counts(written(first))["w-1"] == 8, "kept until w-1 acknowledges: a hand-off"
    drained, _ = settle(spec, written(first), members, 1000.0)
    assert sorted(counts(drained).values()) == [0, 10, 11, 11]
    assert counts(drained)["w-1"] == 0
    uncordoned, _ = settle(spec, drained, workers(4), 2000.0)
    assert counts(uncordoned) == {"w-0": 8, "w-1": 8, "w-2": 8, "w-3": 8}


def test_invalid_ack_is_reported(spec, balanced4) -> None:
    members = workers(4)
    members[2] = WorkerPod("w-2", "uid-w-2", acks={ACK: "{not json"})
    result = run(spec, balanced4, members)
    assert [p.reason for p in result.problems] == ["InvalidAck"]
    assert "w-2" in result.problems[0].message


def test_capacity_label_weighs_members() -> None:
    spec = pset(strategy={"name": "Balanced", "balanced": {"capacityLabel": "cap"}})
    members = [WorkerPod("a", "ua", {"cap": "3"}), WorkerPod("b", "ub", {"cap": "1"})]
    table = written(run(spec, initial_table(REF, spec, 1), members))
    assert counts(table) == {"a": 24, "b": 8}
    bad = [WorkerPod("a", "ua", {"cap": "lots"}), WorkerPod("b", "ub")]
    result = run(spec, initial_table(REF, spec, 1), bad)
    assert [p.reason for p in result.problems] == ["InvalidCapacity"]


def test_least_shards_moves_at_most_its_limit_per_round_and_converges() -> None:
    spec = sset(
        strategy={
            "name": "LeastShards",
            "leastShards": {"absoluteLimit": 20, "relativeLimitPercent": 10},
        },
        rebalance={"interval": "1s", "maxMovesPerRound": "100%"},
    )
    ref = ResourceRef("ShardSet", "ns", "carts", "uid")
    table = written(run(spec, initial_table(ref, spec, 1), workers(3)))
    assert sorted(counts(table).values()) == [333, 333, 334]
    table, results = settle(spec, table, workers(4), now=2000.0)
    rounds = [r for r in results if r.round_started]
    assert all(len(r.kept) <= 20 for r in rounds)
    assert len(rounds) == 13  # ⌈250 / 20⌉: Akka moves at most 20 shards per round
    assert sorted(counts(table).values()) == [250, 250, 250, 250]


def test_rollout_prefers_new_revision_members_for_least_shards() -> None:
    spec = sset(strategy={"name": "LeastShards"})
    ref = ResourceRef("ShardSet", "ns", "carts", "uid")
    table = written(run(spec, initial_table(ref, spec, 1), workers(3)))
    members = [
        WorkerPod("w-0", "uid-w-0", revision="old"),
        WorkerPod("w-1", "uid-w-1", revision="old"),
        WorkerPod("w-3", "uid-w-3", revision="new"),
    ]
    result = run(spec, table, members, rollout=Rollout(True, "new", "rolling"))
    moved = [e for e in decided(result).events if e.reason is Reason.OWNER_GONE]
    assert {e.target for e in moved} == {"w-3"}, "w-2's shards go to the new revision"


def test_epochs_continue_from_the_reported_epoch() -> None:
    spec = pset()
    table = initial_table(REF, spec, 1, epoch=41)
    assert written(run(spec, table, workers(2))).epoch == 42


def test_status_of_a_balanced_set() -> None:
    spec = pset()
    table = written(run(spec, initial_table(REF, spec, 1), workers(4)))
    members = workers(4)
    result = run(spec, table, members)
    status = unit_set_status(StatusInput(table, result, members, 1, "demo-cm", NOW, last_round=0.0))
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Ready": ("True", "Assigned"),
        "Reconciling": ("False", "Settled"),
        "Stalled": ("False", "AsExpected"),
        "Balanced": ("True", "Balanced"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
        "Resharding": ("False", "Resharded"),
    }
    assert status["imbalance"] == "1.00"
    assert status["movesInProgress"] == 0
    assert status["releasesFailing"] == 0
    assert status["members"] == status["readyMembers"] == 4
    assert status["assignedUnits"] == 32
    assert [r["units"] for r in status["memberUnits"]] == [8, 8, 8, 8]
    assert status["lastRebalanceTime"] == "1970-01-01T00:00:00Z"


def test_status_while_handing_off() -> None:
    spec = pset()
    table = written(run(spec, initial_table(REF, spec, 1), workers(4)))
    result = run(spec, table, workers(5))
    status = unit_set_status(StatusInput(written(result), result, workers(5), 1, "cm", NOW))
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Balanced"] == ("False", "HandoffInProgress")
    assert conditions["Progressing"] == ("True", "HandoffInProgress")
    assert status["movesInProgress"] == 6
    assert status["imbalance"] == "1.25"


def test_a_release_reported_failing_is_a_fault_in_the_status_until_the_timeout(
    spec, balanced4
) -> None:
    members = workers(5)
    table = written(run(spec, balanced4, members))
    w0 = Incarnation("w-0", "uid-w-0")
    stuck = sorted(u for u, r in table.releasing().items() if table.units[u].owner == "w-0")
    ack = make_ack(table, w0, pending=stuck, failing=dict.fromkeys(stuck, "OSError: flush"))
    members[0] = replace(members[0], acks={ACK: ack.to_annotation()})
    result = run(spec, table, members, now=1001.0)
    assert result.new_table is None
    assert set(decided(result).failing) == set(stuck)
    (problem,) = result.problems
    assert problem.reason == "ReleaseFailing"
    assert problem.message.startswith(f"w-0 cannot release {len(stuck)} unit(s) ({stuck[0]}")
    assert "OSError: flush" in problem.message
    assert "handoffTimeout" in problem.message
    status = unit_set_status(StatusInput(table, result, members, 1, "cm", NOW))
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Degraded"] == ("True", "ReleaseFailing")
    assert status["releasesFailing"] == len(stuck)
    assert status["movesInProgress"] == 6
    # The owner never succeeds: handoffTimeout reassigns, and nothing is reported failing.
    forced = run(spec, table, members, now=1005.0)
    assert {e.reason for e in decided(forced).events} == {Reason.HANDOFF_TIMED_OUT}
    assert forced.problems == ()
    assert decided(forced).failing == {}


def test_suspensions_told_by_acks_are_counted_in_the_status_and_each_new_one_reported(
    spec, balanced4
) -> None:
    """A worker tells of its serving lease's outages in its ack once it serves again: the
    status sums them over the members, and each one not yet reported is news, once."""
    members = workers(4)

    def told(pod: WorkerPod, count: int, seconds: float, uid: str | None = None) -> WorkerPod:
        ack = Ack(uid or pod.uid, balanced4.epoch, suspended=Suspensions(count, seconds))
        return replace(pod, acks={ACK: ack.to_annotation()})

    members[1] = told(members[1], 1, 12.34)
    members[2] = told(members[2], 3, 0.5)
    members[3] = told(members[3], 9, 1.0, uid="an-earlier-incarnation")  # not this pod's word
    result = run(spec, balanced4, members)
    status = unit_set_status(StatusInput(balanced4, result, members, 1, "cm", NOW))
    assert status["servingSuspensions"] == 4
    by_uid = suspensions(members, ACK)
    assert set(by_uid) == {"uid-w-1", "uid-w-2"}
    news = suspension_news(by_uid, {"uid-w-2": 1})
    assert news == [
        "w-1 served nothing for 12.3s: its serving lease ran out, as it could not confirm the "
        "assignment (API server out of reach, or the process paused); it serves again",
        "w-2 served nothing 2 times; the last time for 0.5s: its serving lease ran out, as it "
        "could not confirm the assignment (API server out of reach, or the process paused); it "
        "serves again",
    ]
    assert suspension_news(by_uid, {"uid-w-1": 1, "uid-w-2": 3}) == []
    # Without any, the status says 0 (a merge patch clears an older figure).
    quiet = unit_set_status(StatusInput(balanced4, result, workers(4), 1, "cm", NOW))
    assert quiet["servingSuspensions"] == 0


def test_imbalance_by_counts_and_by_load() -> None:
    members = [EngineMember("a"), EngineMember("b")]
    owners = {"0": "a", "1": "a", "2": "a", "3": "b"}
    assert imbalance(owners, members) == pytest.approx(1.5)
    assert imbalance(owners, members, {"0": 1, "1": 1, "2": 1, "3": 9}) == pytest.approx(1.5)
    assert imbalance({}, members) is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 7), min_size=1, max_size=8), min_size=1, max_size=6))
def test_every_membership_settles_balanced_with_one_owner_per_unit(changes) -> None:
    """Whatever the sequence of memberships, passes with acknowledging workers reach a table
    where every unit belongs to one current member, counts differ by at most one, and epochs
    only grew on the way."""
    spec = pset(rebalance={"interval": "1s", "maxMovesPerRound": 3})
    table = initial_table(REF, spec, 1)
    now = 1000.0
    for alive in changes:
        members = pods(*(f"w-{i}" for i in sorted(alive)))
        before = table.epoch
        table, results = settle(spec, table, members, now)
        now += len(results) + 1
        assert table.epoch >= before
        owners = Counter(state.owner for state in table.units.values())
        assert set(owners) <= {m.name for m in members}
        assert None not in owners
        assert max(owners.values()) - min(owners.values()) <= 1
        assert len(owners) == len(members) or len(members) > 32
        assert not table.releasing()


def test_not_balanced_while_a_member_is_starting() -> None:
    spec = pset()
    table = written(run(spec, initial_table(REF, spec, 1), workers(4)))
    members = [*workers(4), WorkerPod("w-4", "uid-w-4", ready=False)]
    result = run(spec, table, members)
    assert result.new_table is not None, "w-4 joins, takes nothing yet"
    assert not result.kept, "w-4 joins, takes nothing yet"
    status = unit_set_status(StatusInput(written(result), result, members, 1, "cm", NOW))
    (balanced,) = [c for c in status["conditions"] if c["type"] == "Balanced"]
    assert (balanced["status"], balanced["reason"]) == ("False", "MembersNotReady")
    assert balanced["message"] == "waiting for 1 member(s): w-4"


def test_a_pin_to_a_pod_that_is_not_a_member_is_reported_and_placed_by_the_fallback() -> None:
    spec = sset(
        shards=4,
        strategy={
            "name": "External",
            "external": {"pins": [{"unit": 0, "member": "w-1"}, {"unit": 1, "member": "gohst-7"}]},
        },
    )
    result = run(spec, initial_table(REF, spec, 1), workers(2))
    assert [p.reason for p in result.problems] == ["PinToUnknownPod"]
    assert "unit 1 → 'gohst-7'" in result.problems[0].message
    placed = written(result).owners()
    assert placed["0"] == "w-1"
    assert placed["1"] in {"w-0", "w-1"}
    status = unit_set_status(StatusInput(written(result), result, workers(2), 1, "cm", NOW))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PinToUnknownPod")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", "the units are served: a pin with no effect is no outage"


def test_the_first_placement_waits_for_the_workloads_replicas_then_places_evenly() -> None:
    """Akka's min-nr-of-members: a ShardSet starting while one of three workers is ready must
    not put every shard on it; with all three it places a third on each."""
    spec = sset(shards=300)
    table = initial_table(REF, spec, 1)
    starting = [*workers(1), *pods("w-1", "w-2", ready=False)]
    result = run(spec, table, starting, now=1000.0, desired_members=3, created=990.0)
    assert result.new_table is None
    assert [p.reason for p in result.problems] == ["WaitingForMembers"]
    assert result.wake_at == 990.0 + 60.0, "looked at again when startup.timeout ends"
    status = unit_set_status(StatusInput(table, result, starting, 1, "cm", NOW))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "WaitingForMembers",
    )
    assert conditions["Degraded"]["status"] == "False", "waiting at start-up is no fault"
    placed = run(spec, table, workers(3), now=1001.0, desired_members=3, created=990.0)
    assert sorted(counts(written(placed)).values()) == [100, 100, 100]


def test_the_start_up_wait_ends_at_its_timeout_and_min_members_waits_for_good() -> None:
    spec = sset(shards=30)
    table = initial_table(REF, spec, 1)
    starting = [*workers(1), *pods("w-1", ready=False)]
    late = run(spec, table, starting, now=1051.0, desired_members=2, created=990.0)
    assert late.new_table is not None, "after startup.timeout the ready member takes them"
    pinned = sset(shards=30, startup={"minMembers": 2})
    forever = run(pinned, initial_table(REF, pinned, 1), starting, now=99999.0, created=990.0)
    assert forever.new_table is None
    assert forever.wake_at is None
    # Once something was placed, the barrier is gone: later fleets rebalance as usual.
    assert run(pinned, written(late), starting, now=99999.0).problems == ()


def _moves(tables: list[AssignmentTable]) -> Counter[str]:
    """How often each unit changed owner along a sequence of tables."""
    moved: Counter[str] = Counter()
    for before, after in pairwise(tables):
        old, new = before.owners(), after.owners()
        moved.update(u for u, owner in new.items() if owner is not None and owner != old.get(u))
    return moved


def _ago(seconds_before: float, now: float = 1000.0) -> str:
    return rfc3339(now - seconds_before)


def _scale_up(spec: Any, before: int, after: int) -> tuple[list[AssignmentTable], PassResult]:
    """`before` pods settled, then the new pods of a scale-up to `after` turning Ready one at a
    time (StatefulSet OrderedReady), each settled before the next; the tables along the way and
    the first pass after the first new pod turned Ready."""
    start, _ = settle(spec, initial_table(REF, spec, 1), workers(before), 1000.0)
    tables, table, first = [start], start, None
    for ready in range(before + 1, after + 1):
        # Created a minute ago, Ready 5 s ago: a slow start (a JVM's) must not use the wait up.
        fleet = [replace(p, created=_ago(60.0), ready_since=_ago(5.0)) for p in workers(ready)]
        result = run(spec, table, acked(table, fleet), desired_members=after)
        first = first or result
        for _ in range(50):
            result = run(spec, table, acked(table, fleet), desired_members=after)
            if result.new_table is None:
                break
            table = written(result)
            tables.append(table)
    assert first is not None
    return tables, first


def test_a_scale_up_fills_the_new_pods_in_one_round_so_no_unit_moves_twice() -> None:
    """3 → 5 pods, 12 units: planned as each pod turns Ready, 3 units move onto the 4th and 2
    more after the 5th, one of them off the 4th again; waiting for the replicas moves 4."""
    waiting = pset(partitions=12, rebalance={"interval": "1s", "handoffTimeout": "5s"})
    tables, first = _scale_up(waiting, 3, 5)
    assert first.kept == (), "nothing moves onto w-3 while w-4 is missing"
    assert first.held > 0, "nothing moves onto w-3 while w-4 is missing"
    assert "3 of 5 ready" not in (first.hold_reason or "")
    assert "4 of 5 ready" in (first.hold_reason or "")
    assert "rebalance.scaleUpWait" in (first.hold_reason or "")
    assert first.wake_at == 995.0 + 30.0, "looked at again when the wait for w-4 ends"
    final = tables[-1].by_member()
    moved = _moves(tables)
    # The oracle: units only leave the old pods, so the least moves is what the new pods hold.
    assert sum(moved.values()) == len(final["w-3"]) + len(final["w-4"]) == 4
    assert max(moved.values()) == 1

    eager = pset(
        partitions=12, rebalance={"interval": "1s", "handoffTimeout": "5s", "scaleUpWait": "0s"}
    )
    tables, first = _scale_up(eager, 3, 5)
    assert first.kept, "0s: w-3 is filled as soon as it is Ready"
    assert sum(_moves(tables).values()) > 4


def test_the_scale_up_wait_ends_after_scale_up_wait_and_spares_other_moves() -> None:
    spec = pset(partitions=12, rebalance={"interval": "1s", "handoffTimeout": "5s"})
    table, _ = settle(spec, initial_table(REF, spec, 1), workers(3), 1000.0)
    stuck = [*workers(3), WorkerPod("w-3", "uid-w-3", created=_ago(40.0), ready_since=_ago(31.0))]
    late = run(spec, table, stuck, desired_members=5)
    assert late.kept, "w-4 never started: w-3 is not kept empty"
    assert late.hold_reason is None, "w-4 never started: w-3 is not kept empty"
    # A pod that is gone still hands its units off at once: the wait only holds optional moves.
    gone = [*workers(2), WorkerPod("w-3", "uid-w-3", ready_since=_ago(5.0))]
    forced = run(spec, table, gone, desired_members=5)
    assert {m.unit for m in forced.kept} == set(table.by_member()["w-2"])
    assert "scaleUpWait" in (forced.hold_reason or "")
    # Without a workloadRef there are no replicas to wait for.
    assert run(spec, table, [*workers(3), *stuck[3:]], desired_members=None).kept


@settings(max_examples=60, deadline=None)
@given(
    units=st.integers(4, 40),
    before=st.integers(1, 4),
    added=st.integers(1, 4),
)
def test_a_scale_up_within_the_wait_moves_each_unit_at_most_once(
    units: int, before: int, added: int
) -> None:
    spec = pset(partitions=units, rebalance={"interval": "1s", "handoffTimeout": "5s"})
    tables, _ = _scale_up(spec, before, before + added)
    moved = _moves(tables)
    final = tables[-1].by_member()
    new_pods = [f"w-{i}" for i in range(before, before + added)]
    event("units moved" if moved else "nothing moved")
    assert sum(moved.values()) == sum(len(final.get(p, ())) for p in new_pods)
    assert max(moved.values(), default=0) <= 1
