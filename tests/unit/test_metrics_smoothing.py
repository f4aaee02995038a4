"""Smoothing of load samples: the per-unit half-life EWMA and the per-member Kalman smoother."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.engine.smoothing import ResourceSmoother, UnitLoadSmoother, decay
from tests.support.present import present

loads = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
gaps = st.floats(min_value=0.0, max_value=300.0, allow_nan=False)
half_lives = st.floats(min_value=0.5, max_value=120.0)


def test_one_half_life_closes_half_the_gap() -> None:
    smoother = UnitLoadSmoother(half_life=30.0)
    assert smoother.update({"0": 0.0}, now=100.0) == {"0": 0.0}
    assert smoother.update({"0": 10.0}, now=130.0) == {"0": pytest.approx(5.0)}
    assert smoother.update({"0": 10.0}, now=190.0) == {"0": pytest.approx(8.75)}


def test_first_sample_is_taken_as_it_is_and_missing_units_are_forgotten() -> None:
    smoother = UnitLoadSmoother(half_life=10.0)
    smoother.update({"a": 4.0, "b": 2.0}, now=0.0)
    assert smoother.update({"b": 6.0, "c": 9.0}, now=10.0) == {"b": 4.0, "c": 9.0}
    assert dict(smoother.loads) == {"b": 4.0, "c": 9.0}


@settings(derandomize=True)
@given(half_lives, st.lists(st.tuples(gaps, loads), min_size=1, max_size=30))
def test_the_average_stays_within_the_samples(
    half_life: float, steps: list[tuple[float, float]]
) -> None:
    smoother = UnitLoadSmoother(half_life)
    now, seen = 0.0, []
    for gap, sample in steps:
        now += gap
        seen.append(sample)
        value = smoother.update({"u": sample}, now)["u"]
        assert min(seen) - 1e-6 <= value <= max(seen) + 1e-6


@settings(derandomize=True)
@given(half_lives, loads, loads, gaps, gaps)
def test_update_rate_does_not_matter(
    half_life: float, start: float, sample: float, first: float, second: float
) -> None:
    """Folding a held sample at t1 and t2 equals folding it once at t2."""
    once, twice = UnitLoadSmoother(half_life), UnitLoadSmoother(half_life)
    for smoother in (once, twice):
        smoother.update({"u": start}, now=0.0)
    twice.update({"u": sample}, now=first)
    assert twice.update({"u": sample}, now=first + second)["u"] == pytest.approx(
        once.update({"u": sample}, now=first + second)["u"], rel=1e-9, abs=1e-9
    )


@settings(derandomize=True)
@given(half_lives, loads, loads, st.lists(gaps, min_size=1, max_size=20))
def test_a_held_value_is_approached_monotonically(
    half_life: float, start: float, target: float, steps: list[float]
) -> None:
    smoother = UnitLoadSmoother(half_life)
    smoother.update({"u": start}, now=0.0)
    now, gap = 0.0, abs(target - start)
    for step in steps:
        now += step
        new_gap = abs(smoother.update({"u": target}, now)["u"] - target)
        assert new_gap <= gap + 1e-9
        gap = new_gap
    assert gap == pytest.approx(abs(target - start) * decay(now, half_life), abs=1e-6)


def test_a_longer_half_life_is_steadier() -> None:
    fast, slow = UnitLoadSmoother(5.0), UnitLoadSmoother(60.0)
    for smoother in (fast, slow):
        smoother.update({"u": 0.0}, now=0.0)
    assert slow.update({"u": 100.0}, 10.0)["u"] < fast.update({"u": 100.0}, 10.0)["u"]


def test_time_going_backwards_changes_nothing() -> None:
    smoother = UnitLoadSmoother(10.0)
    smoother.update({"u": 1.0}, now=50.0)
    assert smoother.update({"u": 9.0}, now=40.0) == {"u": 1.0}


@pytest.mark.parametrize("half_life", [0.0, -1.0])
def test_half_life_must_be_positive(half_life: float) -> None:
    with pytest.raises(ValueError, match="half-life must be > 0"):
        UnitLoadSmoother(half_life)


def test_resource_smoother_declines_slowly_and_follows_a_rise_at_once() -> None:
    smoother = ResourceSmoother()
    assert (smoother.cpu_percent, smoother.memory_bytes, smoother.available_bytes) == (
        None,
        None,
        None,
    )
    smoother.update(cpu_percent=20.0, memory_bytes=1e9)
    assert (smoother.cpu_percent, smoother.memory_bytes) == (20.0, 1e9)
    assert smoother.available_bytes is None  # never measured
    smoother.update(cpu_percent=10.0, memory_bytes=5e8, available_bytes=1e9)
    assert 10.0 < present(smoother.cpu_percent, "cpu") < 20.0
    assert 5e8 < present(smoother.memory_bytes, "memory") < 1e9
    smoother.update(cpu_percent=80.0, memory_bytes=2e9)
    assert (smoother.cpu_percent, smoother.memory_bytes) == (80.0, 2e9)
    assert smoother.available_bytes == 1e9  # not measured this time: unchanged
