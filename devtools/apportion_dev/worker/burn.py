"""Real CPU work per unit for the demo worker (`--burn-cpu`): each unit it holds costs
`millicores * its profile load` thousandths of a core, spent spinning on one thread, and the
CPU each unit really got (the thread's CPU clock, not the wall clock) is what the worker reports
as the unit's load. So the load the operator balances is measured work, and metrics-server sees
the same CPU on the pod.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

PERIOD = 0.1
"""Seconds between rounds; each round spends every unit's share of it."""
WINDOW = 10.0
"""Seconds over which a unit's CPU rate is measured."""


class CpuBurner:
    def __init__(self, millicores: float, weight: Callable[[str], float]) -> None:
        """`weight(unit)`: the unit's profile load; it costs `millicores * weight` of a core."""
        self.millicores = millicores
        self.weight = weight
        self._held: set[str] = set()
        self._spent: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-burner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def hold(self, units: frozenset[str]) -> None:
        with self._lock:
            self._held |= units

    def drop(self, units: frozenset[str]) -> None:
        with self._lock:
            self._held -= units
            for unit in units:
                self._spent.pop(unit, None)

    def rate(self, unit: str) -> float:
        """CPU seconds per second the unit got over the last WINDOW seconds."""
        now = time.monotonic()
        with self._lock:
            spent = self._spent.get(unit)
            if not spent:
                return 0.0
            while spent and spent[0][0] < now - WINDOW:
                spent.popleft()
            return sum(cpu for _, cpu in spent) / WINDOW

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            with self._lock:
                held = sorted(self._held)
            for unit in held:
                used = spin(self.millicores / 1000 * self.weight(unit) * PERIOD)
                with self._lock:
                    if unit in self._held:
                        self._spent.setdefault(unit, deque()).append((time.monotonic(), used))
            self._stop.wait(max(0.0, PERIOD - (time.monotonic() - began)))


def spin(seconds: float) -> float:
    """Spend `seconds` of this thread's CPU time; return what was spent. Short slices, so the
    event loop's thread gets the interpreter between them."""
    start = time.thread_time()
    while (spent := time.thread_time() - start) < seconds:
        sum(range(2000))
    return spent
