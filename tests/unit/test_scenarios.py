"""Scenario generators: seeded, shaped as their docstrings say."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apportion.engine.scenarios import (
    ALLOCATION_SCENARIOS,
    HEAT,
    ScenarioError,
    crash,
    default_steps,
    drifting_load,
    hot_key,
    make_scenario,
    rolling_update,
    scale_in,
    scale_out,
    zipf_load,
)
from tests.support.present import present

SEEDED = ("crash", "zipf", "drift", "hot-key")


@pytest.mark.parametrize("name", list(ALLOCATION_SCENARIOS))
def test_same_seed_same_scenario(name: str) -> None:
    first = make_scenario(name, units=60, members=5, seed=7)
    again = make_scenario(name, units=60, members=5, seed=7)
    assert first == again
    assert len(first.steps) == default_steps(name, 5)


@pytest.mark.parametrize("name", SEEDED)
def test_other_seed_other_scenario(name: str) -> None:
    a = make_scenario(name, units=60, members=5, steps=6, seed=1)
    b = make_scenario(name, units=60, members=5, steps=6, seed=2)
    assert a.steps != b.steps


def test_steps_keep_the_units_and_their_order() -> None:
    for name in ALLOCATION_SCENARIOS:
        scenario = make_scenario(name, units=30, members=6, steps=5, seed=3)
        assert len(set(scenario.initial.units)) == 30
        units = scenario.initial.units
        for step in scenario.steps:
            # only a resharding step changes the units, and then says where each comes from
            if step.parents is None:
                assert step.world.units == units
            else:
                assert tuple(step.parents) == step.world.units
                assert {p for ps in step.parents.values() for p in ps} == set(units)
            units = step.world.units
            if step.world.loads is not None:
                assert set(step.world.loads) == set(step.world.units)
                assert all(x >= 0 and math.isfinite(x) for x in step.world.loads.values())


def test_scale_out_adds_the_next_ordinal_each_step() -> None:
    scenario = scale_out(units=10, members=3, steps=2)
    names = [[m.name for m in s.world.members] for s in scenario.steps]
    assert names == [
        ["worker-0", "worker-1", "worker-2", "worker-3"],
        ["worker-0", "worker-1", "worker-2", "worker-3", "worker-4"],
    ]


def test_scale_in_drains_then_removes_highest_ordinal_first() -> None:
    scenario = scale_in(units=10, members=4, steps=3)
    fleets = [{m.name: m.draining for m in step.world.members} for step in scenario.steps]
    assert fleets == [
        {"worker-0": False, "worker-1": False, "worker-2": False, "worker-3": True},
        {"worker-0": False, "worker-1": False, "worker-2": True},
        {"worker-0": False, "worker-1": True},
    ]
    with pytest.raises(ScenarioError, match="every one of 4 member"):
        scale_in(units=10, members=4, steps=4)


def test_crash_cycles_not_ready_gone_back() -> None:
    scenario = crash(units=10, members=5, steps=6, seed=4)
    for cycle in range(2):
        down, gone, back = scenario.steps[3 * cycle : 3 * cycle + 3]
        victim = down.event.split()[0]
        assert down.event == f"{victim} not ready"
        assert [m.name for m in down.world.members if not m.ready] == [victim]
        assert victim not in {m.name for m in gone.world.members}
        assert len(gone.world.members) == 4
        # The replacement takes its ordinal's place, ready.
        assert [m.name for m in back.world.members] == [f"worker-{i}" for i in range(5)]
        assert all(m.ready for m in back.world.members)


def test_rolling_update_one_pod_at_a_time_to_the_new_version() -> None:
    scenario = rolling_update(units=10, members=3)
    assert len(scenario.steps) == 6
    for step in scenario.steps:
        assert sum(m.draining for m in step.world.members) <= 1
    order = [s.event.split()[0] for s in scenario.steps[::2]]
    assert order == ["worker-2", "worker-1", "worker-0"]
    final = scenario.steps[-1].world.members
    assert {m.version for m in final} == {"2"}
    assert not any(m.draining for m in final)
    # A longer run starts the next rollout from the top again.
    longer = rolling_update(units=10, members=3, steps=8)
    assert longer.steps[-1].event == "worker-2 ready at v3"


def test_zipf_loads_are_skewed_with_mean_one() -> None:
    scenario = zipf_load(units=1000, members=10, steps=2, seed=5, noise=0.0)
    assert set(present(scenario.initial.loads, "initial loads").values()) == {1.0}
    loads = np.array(list(present(scenario.steps[0].world.loads, "loads").values()))
    assert loads.mean() == pytest.approx(1.0)
    ranked = np.sort(loads)[::-1]
    # Zipf: the k-th largest is 1/k^1.1 of the largest.
    assert ranked[9] / ranked[0] == pytest.approx(10**-1.1)
    # Without noise a re-measurement sees the same loads.
    assert scenario.steps[1].world.loads == scenario.steps[0].world.loads


def test_drift_keeps_the_spread_and_moves_the_loads() -> None:
    scenario = drifting_load(units=5000, members=10, steps=3, seed=6, sigma=0.5)
    logs = [np.log(list(present(s.world.loads, s.event).values())) for s in scenario.steps]
    for log in logs:
        assert log.std() == pytest.approx(0.5, rel=0.05)
    correlation = np.corrcoef(logs[0], logs[1])[0, 1]
    assert correlation == pytest.approx(0.9, abs=0.03)
    with pytest.raises(ScenarioError):
        drifting_load(persistence=1.0)


def test_hot_key_heats_one_unit_relative_to_a_member() -> None:
    scenario = hot_key(units=200, members=4, steps=len(HEAT), seed=8)
    hot = scenario.steps[0].event.split()[0]
    for step, heat in zip(scenario.steps, HEAT, strict=True):
        loads = present(step.world.loads, step.event)
        others = math.fsum(x for u, x in loads.items() if u != hot)
        assert loads[hot] == pytest.approx(heat * others / 4)
        assert max(x for u, x in loads.items() if u != hot) < 1.5


@pytest.mark.parametrize(
    ("units", "members", "steps"), [(0, 3, 1), (10, 0, 1), (10, 3, 0), (10, 3, True)]
)
def test_bad_parameters(units: int, members: int, steps: int) -> None:
    with pytest.raises(ScenarioError, match="must be an integer >= 1"):
        scale_out(units, members, steps)


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(ScenarioError, match=r"unknown scenario 'spike' \(known: scale-out"):
        make_scenario("spike", units=10, members=2)
