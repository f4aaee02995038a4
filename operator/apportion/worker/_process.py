"""The worker process's own CPU and memory figures for its metrics page (docs/metrics.md).

Standard library only: CPU time from `os.times`, resident memory from /proc, the memory limit
from the cgroup (v2, else v1) the process runs in. Figures that cannot be read stay None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from apportion.api.worker_report import WorkerReport

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
# cgroup v1 reports "no limit" as a huge page-aligned number.
_UNLIMITED = 1 << 60


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def resident_bytes() -> int | None:
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * _PAGE_SIZE


def memory_limit_bytes() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            return int(text)
        return None
    return None


class ProcessStats:
    """CPU use between two readings (the scrape interval), memory as of now."""

    def __init__(self) -> None:
        self._cpus = cpu_count()
        self._limit = memory_limit_bytes()
        self._last = (time.monotonic(), self._cpu_seconds())

    @staticmethod
    def _cpu_seconds() -> float:
        times = os.times()
        return times.user + times.system

    def read(self) -> WorkerReport:
        now, cpu = time.monotonic(), self._cpu_seconds()
        then, cpu_then = self._last
        self._last = (now, cpu)
        elapsed = now - then
        percent = None
        if elapsed > 0:
            percent = min(100.0, max(0.0, 100.0 * (cpu - cpu_then) / elapsed / self._cpus))
        usage = resident_bytes()
        available = None
        if self._limit is not None and usage is not None:
            available = max(0, self._limit - usage)
        return WorkerReport(
            cpu_percent=percent,
            cpu_count=self._cpus,
            memory_usage_bytes=usage,
            memory_available_bytes=available,
            memory_max_available_bytes=self._limit,
        )
