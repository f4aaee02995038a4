"""The assignment watch's error paths, which a healthy test cluster does not produce on demand:
410 Gone (history compacted while the watch was down), a read racing a chunked write, an
invalid table. The client stands in for lightkube's AsyncClient with what lightkube raises for
those server answers; the normal path runs against the real API server in
tests/e2e/test_worker_watch.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import ConfigMap

from apportion import listwatch
from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    ResourceRef,
    UnitState,
    encode_assignment,
)
from apportion.worker._watch import AssignmentWatch

NAME = "orders-partitionset-assignment"
REF = ResourceRef("PartitionSet", "ns", "orders", "uid")
MEMBERS = (Incarnation("a", "ua"), Incarnation("b", "ub"))


def table(epoch: int, count: int = 4) -> AssignmentTable:
    units = {str(u): UnitState(MEMBERS[u % 2].name, epoch) for u in range(count)}
    return AssignmentTable(REF, 1, "netherite", count, epoch, MEMBERS, units)


def configmaps(t: AssignmentTable, version: str, **encoding: int) -> list[ConfigMap]:
    return [
        ConfigMap.from_dict(
            {"metadata": {"name": NAME + part.suffix, "resourceVersion": version}, **part.body()}
        )
        for part in encode_assignment(t, **encoding)
    ]


class Listing:
    def __init__(self, items: list[ConfigMap], version: str) -> None:
        self.items = items
        self.resourceVersion = version

    async def __aiter__(self) -> AsyncIterator[ConfigMap]:
        for item in self.items:
            yield item


def gone() -> ApiError:
    # What lightkube raises for a watch ERROR event or an HTTP 410 answer.
    return ApiError(status=Status(code=410, reason="Expired", message="too old resource version"))


class ScriptedClient:
    """lists: (items, version) per list call; watches: events then an exception (or None:
    block) per watch call; objects: what `get` finds by name."""

    def __init__(
        self,
        lists: list[tuple[list[ConfigMap], str]],
        watches: list[tuple[list[tuple[str, ConfigMap]], Exception | None]],
        objects: dict[str, list[ConfigMap]] | None = None,
    ) -> None:
        self.lists = lists
        self.watches = watches
        self.objects = objects or {}
        self.watched_from: list[str | None] = []
        self.fields: list[dict[str, str]] = []

    def list(self, res: type, *, namespace: str, fields: dict[str, str]) -> Listing:
        self.fields.append(fields)
        return Listing(*self.lists.pop(0))

    async def watch(
        self,
        res: type,
        *,
        namespace: str,
        fields: dict[str, str],
        resource_version: str | None,
        server_timeout: int,
    ) -> AsyncIterator[tuple[str, ConfigMap]]:
        self.watched_from.append(resource_version)
        events, error = self.watches.pop(0)
        for event in events:
            yield event
        if error is None:
            await asyncio.Event().wait()
        raise error

    async def get(self, res: type, name: str, *, namespace: str) -> ConfigMap:
        found = self.objects.get(name)
        if not found:
            raise ApiError(status=Status(code=404, reason="NotFound", message="not found"))
        return found.pop(0)


async def follow(client: ScriptedClient, until: int) -> tuple[list[int], AssignmentWatch]:
    seen: list[int] = []
    done = asyncio.Event()

    def on_table(t: AssignmentTable) -> None:
        seen.append(t.epoch)
        if t.epoch >= until:
            done.set()

    watch = AssignmentWatch(client, "ns", NAME, on_table)  # type: ignore[arg-type]
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return seen, watch


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)


async def test_gone_lists_again_and_watches_from_the_new_list() -> None:
    [one] = configmaps(table(1), "10")
    [two] = configmaps(table(2), "11")
    [three] = configmaps(table(3), "20")
    client = ScriptedClient(
        lists=[([one], "10"), ([three], "20")],
        watches=[([("MODIFIED", two)], gone()), ([], None)],
    )
    seen, watch = await follow(client, until=3)
    assert seen == [1, 2, 3]
    assert client.watched_from == ["10", "20"]
    assert client.fields == [{"metadata.name": NAME}] * 2  # only this set's root ConfigMap
    assert watch.relists == 1


async def test_a_silent_watch_is_given_up_and_the_list_taken_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watch whose connection died without a FIN delivers nothing and never ends: after
    SILENCE_TIMEOUT the loop lists again and finds what it missed."""
    monkeypatch.setattr(listwatch, "SILENCE_TIMEOUT", 0.05)
    [one] = configmaps(table(1), "10")
    [two] = configmaps(table(2), "12")
    client = ScriptedClient(lists=[([one], "10"), ([two], "12")], watches=[([], None)] * 2)
    seen, watch = await follow(client, until=2)
    assert seen == [1, 2]
    assert watch.relists == 1


async def test_a_read_racing_a_chunked_write_reads_the_root_again() -> None:
    old_root, *_ = configmaps(table(1, 300), "5", inline_limit=0, chunk_limit=64)
    new_root, *new_chunks = configmaps(table(2, 300), "6", inline_limit=0, chunk_limit=64)
    # The listed root points at chunks the newer write already swept; the fresh root is whole.
    objects: dict[str, list[ConfigMap]] = {NAME: [new_root]}
    for chunk in new_chunks:
        assert chunk.metadata is not None and chunk.metadata.name is not None
        objects[chunk.metadata.name] = [chunk]
    client = ScriptedClient(lists=[([old_root], "6")], watches=[([], None)], objects=objects)
    seen, _ = await follow(client, until=2)
    assert seen == [2]


async def test_an_invalid_table_is_skipped_and_the_next_one_taken() -> None:
    bad = ConfigMap.from_dict(
        {"metadata": {"name": NAME, "resourceVersion": "3"}, "data": {"assignments.json": "{}"}}
    )
    [good] = configmaps(table(4), "4")
    client = ScriptedClient(lists=[([bad], "3")], watches=[([("MODIFIED", good)], None)])
    seen, watch = await follow(client, until=4)
    assert seen == [4] and watch.relists == 0
