"""Wake the set daemons of a namespace when something they read changes (a pod, a workload, a
set): a change counter and an asyncio.Condition per namespace. Daemons compare counters, so a
change that lands while a pass runs is never missed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict


class Wakeups:
    def __init__(self) -> None:
        self._ticks: defaultdict[str, int] = defaultdict(int)
        self._conditions: dict[str, asyncio.Condition] = {}

    def _condition(self, namespace: str) -> asyncio.Condition:
        condition = self._conditions.get(namespace)
        if condition is None:
            condition = self._conditions[namespace] = asyncio.Condition()
        return condition

    def tick(self, namespace: str) -> int:
        """The namespace's change counter: pass it to `wait` after reading."""
        return self._ticks[namespace]

    async def notify(self, namespace: str) -> None:
        self._ticks[namespace] += 1
        condition = self._condition(namespace)
        async with condition:
            condition.notify_all()

    async def wait(self, namespace: str, seen: int, timeout: float | None) -> bool:
        """Until the namespace changed since tick `seen`, or `timeout` seconds; True if changed."""
        condition = self._condition(namespace)
        async with condition:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    condition.wait_for(lambda: self._ticks[namespace] != seen), timeout
                )
        return self._ticks[namespace] != seen


wakeups = Wakeups()
"""The operator's one instance: index and event handlers notify, set daemons wait."""
