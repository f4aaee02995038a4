"""The demo's load generator: its steering settings, its Zipf draws and its routing."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from apportion.api.assignment import AssignmentTable, Incarnation, ResourceRef, UnitState
from apportion_dev.worker.traffic import TrafficSettings, UnitSetRoute, ZipfKeys


def test_settings_from_the_configmap_data() -> None:
    data = {"rate": "12.5", "skew": "0", "keys": "50", "grainRate": "1", "paused": "TRUE"}
    settings, problems = TrafficSettings.from_data(data)
    assert problems == []
    assert settings == TrafficSettings(rate=12.5, skew=0.0, keys=50, grain_rate=1.0, paused=True)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("rate", "fast", "could not convert"),
        ("rate", "-1", "expected a finite number >= 0"),
        ("skew", "nan", "expected a finite number >= 0"),
        ("keys", "0", "expected 1..1000000"),
        ("keys", "2.5", "invalid literal"),
        ("grainLifetime", "inf", "expected a finite number >= 0"),
        ("paused", "yes", "expected true or false"),
    ],
)
def test_a_bad_value_is_reported_and_the_default_kept(key: str, value: str, why: str) -> None:
    settings, problems = TrafficSettings.from_data({key: value, "rate": "7"} | {key: value})
    (problem,) = problems
    assert problem.startswith(f"{key}={value!r}: ")
    assert why in problem
    assert settings == TrafficSettings(rate=7.0 if key != "rate" else TrafficSettings().rate)


def test_zipf_draws_follow_the_law() -> None:
    """P(rank r) = (1/(r+1)^s) / H(n, s): the generalised harmonic number, summed here apart."""
    n, s, draws = 50, 1.2, 40_000
    harmonic = sum(1 / k**s for k in range(1, n + 1))
    zipf, rng = ZipfKeys(n, s), random.Random(7)
    counts = Counter(zipf.draw(rng) for _ in range(draws))
    assert set(counts) <= set(range(n))
    for rank in (0, 1, 4, 20):
        expected = draws / (rank + 1) ** s / harmonic
        # 5 standard deviations of a binomial count: fails only when the law is wrong
        assert abs(counts[rank] - expected) < 5 * expected**0.5 + 1, (rank, counts[rank])


def test_skew_zero_is_uniform() -> None:
    uniform, rng = ZipfKeys(4, 0.0), random.Random(3)
    counts = Counter(uniform.draw(rng) for _ in range(8000))
    assert all(abs(counts[r] - 2000) < 5 * 2000**0.5 for r in range(4))


SET = ResourceRef("PartitionSet", "default", "demo", "uid-1")


def table(owners: dict[str, str]) -> AssignmentTable:
    members = tuple(Incarnation(name, f"uid-{name}") for name in sorted(set(owners.values())))
    units = {unit: UnitState(owner, 1) for unit, owner in owners.items()}
    return AssignmentTable(SET, 1, "netherite", len(owners), 1, members, units)


def test_a_key_goes_to_the_owner_of_its_unit_then_to_what_a_421_taught() -> None:
    route = UnitSetRoute("PartitionSet", "demo", "demo-")
    assert route.route("customer!2") is None  # no table yet: nowhere to send
    route.on_table(table({"0": "w-0", "1": "w-1", "2": "w-0", "3": "w-1"}))
    # netherite: an explicit "!n" suffix is unit n mod count
    assert route.route("customer!2") == ("2", "w-0")
    assert route.route("customer!7") == ("3", "w-1")
    route.learnt["2"] = "w-1"
    assert route.route("customer!2") == ("2", "w-1")
    route.on_table(table({"0": "w-0", "1": "w-1", "2": "w-0", "3": "w-1"}))
    assert route.route("customer!2") == ("2", "w-0"), "a new table replaces what 421s taught"
