"""DualModeKalmanFilter: follows rises at once, decays slowly, stays within the signal."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from apportion.engine.grains import DualModeKalmanFilter

levels = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@settings(derandomize=True, deadline=None)
@given(st.lists(levels, min_size=1, max_size=200))
def test_output_stays_within_the_measurements(measurements: list[float]) -> None:
    f = DualModeKalmanFilter()
    for i, x in enumerate(measurements):
        seen = measurements[: i + 1]
        assert min(seen) - 1e-9 <= f.update(x) <= max(seen) + 1e-9


@settings(derandomize=True, deadline=None)
@given(
    st.lists(levels, min_size=1, max_size=100),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.01, max_value=100.0),
)
def test_a_rise_after_a_decline_is_followed_at_once(
    history: list[float], drop: float, step: float
) -> None:
    f = DualModeKalmanFilter()
    for x in history:
        f.update(x)
    f.update(min(history) * drop)  # a decline, unless the slow estimate still lags below it
    assume(not f.fast_mode)
    rise = f.estimate + step
    assert f.update(rise) == rise
    assert f.fast_mode


@settings(derandomize=True, deadline=None)
@given(
    st.floats(min_value=10.0, max_value=100.0),
    st.floats(min_value=0.0, max_value=0.9),
    st.integers(min_value=1, max_value=60),
)
def test_a_decline_decays_slowly_and_monotonically(
    high: float, low_fraction: float, plateau: int
) -> None:
    low = high * low_fraction
    f = DualModeKalmanFilter()
    for _ in range(plateau):
        f.update(high)
    start = f.estimate
    gap = start - low
    outputs = [f.update(low) for _ in range(1000)]
    assert all(b <= a for a, b in zip([start, *outputs], outputs, strict=False))
    assert all(out > low for out in outputs)
    assert outputs[9] - low >= 0.3 * gap  # still most of the way up after 10 publishes
    assert outputs[999] - low <= 0.05 * gap  # but it does come down
    assert not f.fast_mode


@pytest.mark.parametrize("level", [0.0, 1.0, 42.5, 100.0])
def test_a_constant_signal_is_passed_through(level: float) -> None:
    f = DualModeKalmanFilter()
    assert [f.update(level) for _ in range(20)] == [level] * 20


def test_negative_process_noise_is_rejected() -> None:
    with pytest.raises(ValueError, match="process noise"):
        DualModeKalmanFilter(fast_process_noise=-0.1)
