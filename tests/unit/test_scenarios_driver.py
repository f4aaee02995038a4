"""The scenario driver: units are never lost or duplicated across steps (hypothesis), rounds and
simulated time follow each strategy's own pace, and the yardsticks are the same for all."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.engine.allocation import Balanced, Member
from apportion.engine.scenarios import (
    COMPARE,
    GRAIN_STRATEGIES,
    Scenario,
    Step,
    World,
    crash,
    drive,
    grain_activations,
    run_steps,
    scale_out,
)

SPECS: list[Mapping[str, Any]] = [
    *COMPARE.values(),
    {"name": "Balanced", "tolerance": "Tight", "maxMoves": 2},
    {"name": "LeastShards", "absoluteLimit": 1, "relativeLimit": 0.0},
    {"name": "ConsistentHashing", "rebalanceLimit": 1},
]
NAMES = [f"worker-{i}" for i in range(7)]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    members = tuple(
        Member(
            name,
            capacity=draw(st.sampled_from([1.0, 1.0, 1.0, 2.0, 0.0])),
            ready=draw(st.sampled_from([True, True, True, False])),
            version=draw(st.sampled_from(["1", "1", "2"])),
            draining=draw(st.sampled_from([False, False, False, True])),
        )
        for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=6))
    )
    units = tuple(draw(st.lists(st.sampled_from([f"u{j}" for j in range(40)]), unique=True)))
    loads = None
    if draw(st.booleans()):
        loads = {u: draw(st.floats(0, 50, allow_nan=False)) for u in units}
    return World(members, units, loads)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    start = draw(worlds())
    steps = tuple(Step(f"step {k}", draw(worlds())) for k in range(draw(st.integers(1, 4))))
    return Scenario("random", "hypothesis", start, steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), spec=st.sampled_from(SPECS))
def test_no_unit_lost_or_duplicated_across_steps(
    scenario: Scenario, spec: Mapping[str, Any]
) -> None:
    worlds_in_order = [scenario.initial, *(s.world for s in scenario.steps)]
    results = list(run_steps(scenario, spec, max_rounds=30, interval=7.0))
    assert len(results) == len(worlds_in_order)
    for world, (result, assignment, unassigned) in zip(worlds_in_order, results, strict=True):
        placed = Counter(u for units in assignment.values() for u in units)
        placed.update(unassigned)
        assert placed == Counter(world.units), "every unit exactly once, nothing else"
        assert list(assignment) == [m.name for m in world.members]
        if unassigned:
            assert all(m.capacity == 0 for m in world.members)
        not_ready = {m.name for m in world.members if not m.ready}
        assert result.stranded == len(unassigned) + sum(len(assignment[name]) for name in not_ready)
        assert result.members == len(world.members)
        assert result.units == len(world.units)
        assert 0 <= result.rounds <= 30
        assert result.seconds == max(0, result.rounds - 1) * 7.0
        assert result.moves >= result.rounds
        if result.converged:
            assert result.rounds < 30 or result.moves == 0
        if spec == {"name": "Balanced"} and world.loads is None:
            # Balanced reaches the count floor in one plan with exactly the lower bound.
            assert result.rounds <= 1
            assert result.moves == result.lower_bound


def test_scale_out_target_balanced_one_plan_akka_several_rounds() -> None:
    # The target: 10k units, 100 -> 101 members; the newcomer's floor is 99 units.
    scenario = scale_out(units=10_000, members=100, steps=1)
    balanced = drive(scenario, COMPARE["Balanced"])
    akka = drive(scenario, COMPARE["LeastShards"], interval=10.0)
    lower_bound = 10_000 // 101
    for run in (balanced, akka):
        (step,) = run.steps
        assert step.lower_bound == lower_bound
        assert step.moves == lower_bound
        assert step.max_mean == 100 / (10_000 / 101)
        assert step.converged
    assert balanced.steps[0].rounds == 1
    assert balanced.steps[0].seconds == 0
    # Akka's phase 2 takes one unit from each full member per round, at most 20 (its limit).
    rounds = math.ceil(lower_bound / 20)
    assert akka.steps[0].rounds == rounds
    assert akka.steps[0].seconds == (rounds - 1) * 10.0


def test_out_of_rounds_is_not_converged() -> None:
    run = drive(scale_out(units=1000, members=10, steps=1), COMPARE["LeastShards"], max_rounds=2)
    (step,) = run.steps
    assert step.rounds == 2
    assert step.moves == 40
    assert not step.converged


def test_crash_akka_keeps_units_on_the_unreachable_member_balanced_moves_them() -> None:
    scenario = crash(units=500, members=5, steps=3, seed=1)
    victim = scenario.steps[0].event.split()[0]
    akka = drive(scenario, COMPARE["LeastShards"])
    balanced = drive(scenario, COMPARE["Balanced"])
    held = 500 // 5
    down_akka, gone_akka, _ = akka.steps
    assert down_akka.moves == 0
    assert down_akka.stranded == held
    assert down_akka.eligible == 4
    assert any(f"member {victim!r} is not ready" in n for n in down_akka.notes)
    assert gone_akka.moves == held
    down, gone, back = balanced.steps
    assert (down.moves, down.stranded, gone.moves) == (held, 0, 0)
    assert back.moves == back.lower_bound == held
    assert balanced.moves == balanced.lower_bound == 2 * held


def test_drive_takes_an_instance_and_labels_it() -> None:
    run = drive(scale_out(units=20, members=2, steps=1), Balanced())
    assert run.strategy == "Balanced"
    assert run.initial.step == 0
    assert run.initial.event == "start"
    assert run.initial.moves == run.initial.lower_bound == 20
    assert sorted(u for units in run.assignment.values() for u in units) == sorted(
        scale_out(units=20, members=2, steps=1).initial.units
    )
    document = run.to_json()
    assert document["totals"] == {"moves": 6, "lowerBound": 6, "rounds": 1, "seconds": 0.0}
    assert [s["event"] for s in document["steps"]] == ["worker-2 joins"]


def test_grain_activations_run_every_grain_strategy_with_one_seed() -> None:
    first = grain_activations(activations=300, members=6, steps=3, seed=2)
    again = grain_activations(activations=300, members=6, steps=3, seed=2)
    assert [r.label for r in first] == list(GRAIN_STRATEGIES)
    assert [r.to_dict() for r in first] == [r.to_dict() for r in again]
    for result in first:
        assert sum(result.counts.values()) == result.placements == 300 - result.failures
        assert len(result.counts) == 6
        # One publish at the start and one a second until the last arrival (about 3 s).
        assert 3 <= len(result.steps) <= 5
