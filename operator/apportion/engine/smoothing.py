"""Smoothing of load samples before placement decisions use them. Pure, no I/O.

- `UnitLoadSmoother`: per-unit exponentially weighted moving average with a half-life, over
  samples that arrive at irregular times (spec.metrics.smoothing.halfLife).
- `ResourceSmoother`: one member's CPU, memory usage and available memory through
  `DualModeKalmanFilter`, as Orleans' ResourceOptimized placement filters them (rises are seen
  at once, declines trusted gradually); the memory limit is a bound, not a signal, and stays raw.
"""

from __future__ import annotations

from collections.abc import Mapping

from apportion.engine.grains.kalman import DualModeKalmanFilter


def decay(elapsed: float, half_life: float) -> float:
    """Weight left to the old average after `elapsed` seconds: 1/2 per half-life."""
    if half_life <= 0:
        raise ValueError(f"half-life must be > 0, got {half_life}")
    return float(0.5 ** (max(elapsed, 0.0) / half_life))


class UnitLoadSmoother:
    """EWMA of each unit's load, with time-based weights: a sample held for `dt` seconds moves
    the average by 1 - 2^(-dt / half_life) of the gap (continuous-time EWMA of a signal held
    between samples, e.g. Eckner, "Algorithms for unevenly spaced time series", 2019).

    Folding the same figures twice over two intervals equals folding them once over the whole,
    so callers may update at any rate. A unit's first sample is taken as it is; a unit missing
    from an update is no longer measured and is forgotten (the planner assumes a typical load
    for units it has no figure for).
    """

    __slots__ = ("_loads", "_time", "half_life")

    def __init__(self, half_life: float) -> None:
        decay(0.0, half_life)  # validates
        self.half_life = half_life
        self._loads: dict[str, float] = {}
        self._time: float | None = None

    @property
    def loads(self) -> Mapping[str, float]:
        return self._loads

    def update(self, samples: Mapping[str, float], now: float) -> Mapping[str, float]:
        """Fold the latest load of every measured unit, taken as held since the last update;
        returns the smoothed loads."""
        weight = 0.0 if self._time is None else decay(now - self._time, self.half_life)
        old = self._loads
        self._loads = {
            unit: sample + (old[unit] - sample) * weight if unit in old else sample
            for unit, sample in samples.items()
        }
        self._time = now if self._time is None else max(now, self._time)
        return self._loads


class ResourceSmoother:
    """CPU percent, memory usage and available memory of one member, each through its own
    `DualModeKalmanFilter` (the three signals Orleans' ResourceOptimizedPlacementDirector
    filters). A figure never measured stays None."""

    __slots__ = ("_available", "_cpu", "_memory")

    def __init__(self) -> None:
        self._cpu: DualModeKalmanFilter | None = None
        self._memory: DualModeKalmanFilter | None = None
        self._available: DualModeKalmanFilter | None = None

    def update(
        self,
        *,
        cpu_percent: float | None = None,
        memory_bytes: float | None = None,
        available_bytes: float | None = None,
    ) -> None:
        """Feed one sample; each figure given is a new measurement of that signal."""
        if cpu_percent is not None:
            self._cpu = self._cpu or DualModeKalmanFilter()
            self._cpu.update(cpu_percent)
        if memory_bytes is not None:
            self._memory = self._memory or DualModeKalmanFilter()
            self._memory.update(memory_bytes)
        if available_bytes is not None:
            self._available = self._available or DualModeKalmanFilter()
            self._available.update(available_bytes)

    @property
    def cpu_percent(self) -> float | None:
        return None if self._cpu is None else self._cpu.estimate

    @property
    def memory_bytes(self) -> float | None:
        return None if self._memory is None else self._memory.estimate

    @property
    def available_bytes(self) -> float | None:
        return None if self._available is None else self._available.estimate
