"""A worker of a PartitionSet or ShardSet: one JSON line per callback on stdout, serving until
SIGTERM, then draining (its units move away first)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable

from apportion.worker import Hooks, Worker, WorkerOptions


def printer(event: str) -> Callable[[frozenset[str], int], Awaitable[None]]:
    async def callback(units: frozenset[str], epoch: int) -> None:
        print(json.dumps({"event": event, "units": sorted(units), "epoch": epoch}), flush=True)

    return callback


async def main(kind: str, set_name: str) -> None:
    hooks = Hooks(
        on_acquire=printer("acquire"),
        on_release=printer("release"),
        on_revoke=printer("revoke"),
    )
    async with Worker(kind, set_name, hooks, options=WorkerOptions(port=8080)) as worker:
        await worker.wait_drained()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
