"""The pod simulator outlives API server restarts: each of its loops runs again after a failure
instead of taking the simulator, and every process pod, down with it (issue 10 item 7)."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from apportion_dev.devcluster.podsim import simulator
from apportion_dev.devcluster.podsim.simulator import supervised


async def test_a_failing_loop_runs_again_until_it_returns(monkeypatch) -> None:
    monkeypatch.setattr(simulator, "MAX_BACKOFF_SECONDS", 0.0)
    runs: list[str] = []

    async def watch() -> None:
        runs.append("run")
        if len(runs) == 1:
            raise httpx2.ConnectError("connection refused")  # the API server restarting
        if len(runs) == 2:
            raise RuntimeError("a 503 while it comes back")

    await asyncio.wait_for(supervised("pod watch", watch), timeout=10)
    assert runs == ["run", "run", "run"]


async def test_cancellation_still_stops_it(monkeypatch) -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    task = asyncio.ensure_future(supervised("heartbeat", forever))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
