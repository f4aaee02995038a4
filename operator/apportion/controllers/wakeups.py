"""Wake a loop when something it reads changes (a pod or workload it selects, its own object):
a change counter and an asyncio.Event per loop key (`loop_key`). Loops compare counters, so a
change that lands while a pass runs is never missed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict


def loop_key(kind: str, namespace: str, name: str) -> str:
    """The key an object's loop waits on and its selections are filed under
    (`Kind/namespace/name`)."""
    return f"{kind}/{namespace}/{name}"


class Wakeups:
    def __init__(self) -> None:
        self._ticks: defaultdict[str, int] = defaultdict(int)
        self._events: dict[str, asyncio.Event] = {}
        self._gone: set[str] = set()

    def tick(self, key: str) -> int:
        """The key's change counter: pass it to `wait` after reading."""
        return self._ticks[key]

    def notify(self, key: str) -> None:
        self._ticks[key] += 1
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    async def wait(self, key: str, seen: int, timeout: float | None) -> bool:
        """Until `key` changed since tick `seen`, or `timeout` seconds; True if changed."""
        if self._ticks[key] == seen:
            event = self._events.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        return self._ticks[key] != seen

    def gone(self, key: str) -> None:
        """The object of `key` was deleted: its loop ends at its next wake-up (without a
        finalizer, the operator learns of a deletion only once the object is gone)."""
        self._gone.add(key)
        self.notify(key)

    def is_gone(self, key: str) -> bool:
        return key in self._gone

    def forget(self, key: str) -> None:
        """The loop of `key` is gone."""
        self._ticks.pop(key, None)
        self._events.pop(key, None)
        self._gone.discard(key)
