"""Smoothing for CPU and memory statistics before they are published."""

from __future__ import annotations


class _Kalman:
    """Scalar Kalman filter for a constant signal: state estimate and its error covariance,
    measurement noise 1 (the scale Orleans uses)."""

    __slots__ = ("covariance", "estimate")

    def __init__(self) -> None:
        self.estimate = 0.0
        self.covariance = 1.0

    def filter(self, measurement: float, process_noise: float) -> float:
        covariance = self.covariance + process_noise
        gain = covariance / (covariance + 1.0)
        self.estimate += gain * (measurement - self.estimate)
        self.covariance = (1.0 - gain) * covariance
        return self.estimate


class DualModeKalmanFilter:
    """Cooperative dual-mode Kalman filter (Behluli, "Resource-based placement with cooperative
    dual-mode Kalman filtering", 2024; Orleans ResourceOptimized).

    Two filters run side by side: a slow one (process noise 0, so its gain decays like 1/n and
    drops turn into a polynomial-like decay) and a fast one (process noise 0.01). A measurement
    above the slow estimate switches to the fast filter, restarted at that measurement, so rises
    are followed at once; the first measurement at or below the slow estimate switches back,
    with the slow filter taking over the fast one's state, so declines are followed slowly.
    A member that just got busy is seen busy now; one that just got idle is trusted gradually.
    """

    __slots__ = ("_fast", "_fast_mode", "_slow", "fast_process_noise", "slow_process_noise")

    def __init__(self, slow_process_noise: float = 0.0, fast_process_noise: float = 0.01) -> None:
        if slow_process_noise < 0 or fast_process_noise < 0:
            raise ValueError("process noise must be >= 0")
        self.slow_process_noise = slow_process_noise
        self.fast_process_noise = fast_process_noise
        self._slow = _Kalman()
        self._fast = _Kalman()
        self._fast_mode = False

    @property
    def fast_mode(self) -> bool:
        return self._fast_mode

    @property
    def estimate(self) -> float:
        return self._fast.estimate if self._fast_mode else self._slow.estimate

    def update(self, measurement: float) -> float:
        """Feed one measurement, return the smoothed value."""
        slow = self._slow.filter(measurement, self.slow_process_noise)
        fast = self._fast.filter(measurement, self.fast_process_noise)
        if measurement > slow:
            if not self._fast_mode:
                self._fast_mode = True
                self._fast.estimate, self._fast.covariance = measurement, 0.0
                fast = self._fast.filter(measurement, self.fast_process_noise)
            return fast
        if self._fast_mode:
            self._fast_mode = False
            # As in Orleans, the slow filter resumes from where the fast one is now and then
            # takes this measurement too, so the decline starts from the recent level.
            self._slow.estimate, self._slow.covariance = self._fast.estimate, self._fast.covariance
            slow = self._slow.filter(measurement, self.slow_process_noise)
        return slow
