"""The assignment watch's error paths, which a healthy test cluster does not produce on demand:
410 Gone (history compacted while the watch was down), a dropped or silent watch, a read racing
a chunked write, an invalid table; against a scripted API server on loopback
(tests/unit/fake_apiserver.py). The normal path runs against the real API server in
tests/e2e/test_worker_watch_live.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from apportion import listwatch
from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    ResourceRef,
    UnitState,
    encode_assignment,
)
from apportion.worker._watch import AssignmentWatch
from tests.unit.fake_apiserver import FakeApiServer, serving

NAME = "orders-partitionset-assignment"
REF = ResourceRef("PartitionSet", "ns", "orders", "uid")
MEMBERS = (Incarnation("a", "ua"), Incarnation("b", "ub"))


def table(epoch: int, count: int = 4) -> AssignmentTable:
    units = {str(u): UnitState(MEMBERS[u % 2].name, epoch) for u in range(count)}
    return AssignmentTable(REF, 1, "netherite", count, epoch, MEMBERS, units)


def publish(server: FakeApiServer, t: AssignmentTable, **encoding: int) -> None:
    """Chunks first, then the root, as the operator writes them."""
    root, *chunks = encode_assignment(t, **encoding)
    for part in (*chunks, root):
        server.put("configmaps", "ns", NAME + part.suffix, **part.body())


async def follow(
    server: FakeApiServer, client: Any, until: int, during: Callable[[], None] | None = None
) -> tuple[list[int], AssignmentWatch]:
    """Tables seen until epoch `until`; `during` runs once the first list is handled."""
    seen: list[int] = []
    done = asyncio.Event()

    def on_table(t: AssignmentTable) -> None:
        seen.append(t.epoch)
        if t.epoch >= until:
            done.set()

    watch = AssignmentWatch(client, "ns", NAME, on_table)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.synced.wait(), 10)
        if during is not None:
            await asyncio.wait_for(server.watching.wait(), 10)
            during()
        await asyncio.wait_for(done.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return seen, watch


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)


async def test_gone_lists_again_and_watches_from_the_new_list() -> None:
    async with serving() as (server, client):
        publish(server, table(1))
        server.put("configmaps", "ns", "another-set-assignment", data={"x": "y"})

        def gap() -> None:
            server.drop()
            publish(server, table(2))
            publish(server, table(3))
            server.compact()  # the resumed watch is answered 410 Gone

        seen, watch = await follow(server, client, until=3, during=gap)
        assert seen == [1, 3]  # the relist's table: epoch 2 was overwritten unseen
        assert watch.relists == 1
        lists = server.full_lists()
        assert [r.params["fieldSelector"] for r in lists] == [f"metadata.name={NAME}"] * 2
        assert server.requested("watch")[-1].params["resourceVersion"] == str(server.version)


async def test_a_dropped_watch_resumes_and_misses_nothing() -> None:
    async with serving() as (server, client):
        publish(server, table(1))

        def gap() -> None:
            server.drop()
            publish(server, table(2))
            publish(server, table(3))

        seen, watch = await follow(server, client, until=3, during=gap)
        assert seen == [1, 2, 3]
        assert watch.relists == 0


async def test_a_silent_watch_is_given_up_and_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch whose connection died without a FIN delivers nothing and never ends: after
    SILENCE_TIMEOUT the loop opens another from its version and gets what it missed."""
    monkeypatch.setattr(listwatch, "SILENCE_TIMEOUT", 0.2)
    async with serving() as (server, client):
        publish(server, table(1))

        def gap() -> None:
            server.mute()
            publish(server, table(2))

        seen, watch = await follow(server, client, until=2, during=gap)
        assert seen == [1, 2]
        assert watch.relists == 0


async def test_a_read_racing_a_chunked_write_reads_the_root_again() -> None:
    async with serving() as (server, client):
        publish(server, table(1, 300), inline_limit=0, chunk_limit=64)

        old = set(server.objects)

        async def rewritten() -> None:
            # The listed root points at chunks the newer write sweeps before they are read.
            server.before_list_returns = None
            publish(server, table(2, 300), inline_limit=0, chunk_limit=64)
            for key in old - {("configmaps", "ns", NAME)}:
                server.delete(*key)

        server.before_list_returns = rewritten
        seen, _ = await follow(server, client, until=2)
        assert seen == [2]


async def test_an_invalid_table_is_skipped_and_the_next_one_taken() -> None:
    async with serving() as (server, client):
        server.put("configmaps", "ns", NAME, data={"assignments.json": "{}"})

        seen, watch = await follow(
            server, client, until=4, during=lambda: publish(server, table(4))
        )
        assert seen == [4]
        assert watch.relists == 0
