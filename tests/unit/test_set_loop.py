"""What the set loop decides around a pass (`apportion.engine.set_loop`): whether anything is new
since the last pass, owners that left the selection, the table standing under a fence, and when
to look again. The loop itself only gathers and writes (controllers/unitsets/loop.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apportion.api.pods import WorkerPod
from apportion.engine.set_loop import (
    Gathered,
    departed_owners,
    next_wake,
    prepare,
    run,
    written,
)
from apportion.engine.set_pass import PassInput, Problem, initial_table, plan_pass
from apportion.engine.set_state import SetState
from tests.unit.test_unitset_pass import REF, pods, pset, workers

NOW = 1_000.0


def spec(**extra: Any) -> Any:
    return pset(partitions=8, rebalance={"interval": "10s", "handoffTimeout": "30s"}, **extra)


def placed(members: list[WorkerPod]) -> Any:
    table = plan_pass(PassInput(spec(), initial_table(REF, spec(), 1), 1, members, NOW)).new_table
    assert table is not None
    return table


def test_an_owner_out_of_the_selection_but_running_departs() -> None:
    members = workers(3)
    table = placed(members)
    relabelled = members[2]  # still runs, same pod: hands its units off
    # A new pod of an owner's name, not selected (yet): it owns nothing, the old one is gone.
    replaced = WorkerPod("w-1", "uid-new")
    bystander = WorkerPod("other", "uid-other")
    visible = [members[0], replaced, relabelled, bystander]
    assert departed_owners(table, visible, [members[0]]) == [relabelled]
    assert departed_owners(table, visible, visible) == []


def test_a_pass_with_nothing_new_is_skipped_until_its_wake_up() -> None:
    members = workers(2)
    table = placed(members)
    state = SetState()
    g = Gathered(spec(), table, 1, members, members, NOW)
    first = prepare(g, state, None, None)
    assert first.new
    assert not prepare(g, state, first.fingerprint, NOW + 5).new
    assert prepare(replace(g, now=NOW + 5), state, first.fingerprint, NOW + 5).new, "due"
    unready = [replace(members[0], ready=False), members[1]]
    assert prepare(replace(g, members=unready), state, first.fingerprint, None).new
    assert prepare(replace(g, generation=2), state, first.fingerprint, None).new


def test_load_figures_replan_once_per_interval() -> None:
    members = workers(2)
    g = Gathered(spec(), placed(members), 1, members, members, NOW, loads={"0": 1.0})
    state = SetState()
    first = prepare(g, state, None, None)
    same_tick = replace(g, now=NOW + 9.5, loads={"0": 2.0})
    assert not prepare(same_tick, state, first.fingerprint, None).new
    assert prepare(replace(g, now=NOW + 10), state, first.fingerprint, None).new
    result = run(g, first, state).result
    assert next_wake(g, first, result, state) == NOW + 10, "the next load tick"


def test_a_fence_keeps_the_table_and_lifts_at_its_end() -> None:
    members = workers(2)
    g = Gathered(spec(), initial_table(REF, spec(), 1), 1, members, members, NOW)
    state = SetState(fence_until=NOW + 30)
    state.fence_problem = fence = Problem("AssignmentFenced", "fenced")
    fenced = prepare(g, state, None, None)
    outcome = run(g, fenced, state)
    assert outcome.result.decision is None
    assert not outcome.planned
    assert outcome.result.problems == (fence,)
    assert next_wake(g, fenced, outcome.result, state) == NOW + 30, "woken when the fence ends"
    later = replace(g, now=NOW + 30)
    lifted = prepare(later, state, fenced.fingerprint, NOW + 30)
    assert lifted.problem is None
    assert lifted.new
    after = run(later, lifted, state)
    assert after.planned
    assert after.result.new_table is not None


def test_a_missing_workload_keeps_the_table() -> None:
    members = pods("w-0")
    problem = Problem("WorkloadNotFound", "gone")
    g = Gathered(spec(), placed(members), 1, [], members, NOW, problem=problem)
    outcome = run(g, prepare(g, SetState(), None, None), SetState())
    assert outcome.result.decision is None
    assert outcome.result.problems == (problem,)


def test_a_written_table_starts_its_round_and_reports_a_forced_hand_off() -> None:
    two = workers(2)
    three = workers(3)
    state = SetState()
    g = Gathered(spec(), placed(two), 1, three, three, NOW)
    round_ = run(g, prepare(g, state, None, None), state).result
    assert round_.round_started
    assert round_.new_table is not None
    state.written(round_.new_table, NOW)  # as SetLoop.write_table: the releases known from now
    written(state, round_, NOW, 30.0)
    assert state.last_round == NOW
    assert state.timeout_problem(NOW) is None

    late = replace(g, published=round_.new_table, now=NOW + 120)  # nobody acked
    forced = run(late, prepare(late, state, None, None), state).result
    assert forced.new_table is not None
    written(state, forced, late.now, 30.0)
    problem = state.timeout_problem(late.now)
    assert problem is not None
    assert problem.reason == "HandoffTimedOut"
    assert state.last_round == NOW, "a forced hand-off starts no round"
