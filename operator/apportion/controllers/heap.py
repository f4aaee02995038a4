"""The operator's long-lived heap, kept out of the cyclic garbage collector's walks.

A full collection visits every object the collector tracks, and the caches' objects grow with
the sets and the pods: at 1000 sets over 5000 pods each full collection stopped the event loop
for 0.3 to 1.8 s on a loaded 2-core machine (bench/bench_operator.py --selection, timed by the
collector's own callbacks), the tail of the pod-deleted → new table latency. What the caches
hold lives until a newer version replaces it, and is then freed by reference counting, which
`gc.freeze` does not stop. So the objects alive at each period's end move to the permanent
generation (the use CPython documents `gc.freeze` for) and collections walk only what is
younger. The cost: a reference cycle that was alive at a freeze and dies later is never
collected; the in-flight requests and tasks of one instant are all such a freeze can catch.
"""

from __future__ import annotations

import asyncio
import gc

FREEZE_PERIOD = 60.0
"""Seconds between freezes: the caches fill in the first minute after a start or a relist."""


async def freeze_long_lived(period: float = FREEZE_PERIOD) -> None:
    """Every `period`, move what survived it out of the collector's walks; until cancelled."""
    while True:
        await asyncio.sleep(period)
        gc.freeze()
