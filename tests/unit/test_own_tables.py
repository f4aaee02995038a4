"""The watch on the sets' own ConfigMaps (`controllers.own_tables`): a root edited or deleted by
anyone, a chunk deleted, and a root deleted while nobody watched each wake their set with what it
must read back, against the scripted API server on loopback (tests/unit/fake_apiserver.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from apportion import listwatch
from apportion.controllers import own_tables
from apportion.controllers.own_tables import TABLE_REREAD, OwnTables
from apportion.publishing.configmaps import PART_LABEL, SET_KIND_LABEL
from tests.unit.fake_apiserver import FakeApiServer, serving

KEY = "PartitionSet/ns/demo"
ROOT = "demo-partitionset-assignment"


@pytest_asyncio.fixture(loop_scope="function")
async def server() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    async with serving() as running:
        yield running


def table(api: FakeApiServer, name: str, part: str, namespace: str = "ns") -> dict[str, Any]:
    owner = {"kind": "PartitionSet", "name": "demo", "controller": True}
    body = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {SET_KIND_LABEL: "PartitionSet", PART_LABEL: part},
            "ownerReferences": [owner],
        }
    }
    return api.put_object("configmaps", body)


async def eventually(done: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not done():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), 10)


async def following(
    client: Any, scope: tuple[str, ...] = (), namespace: str = "ns"
) -> tuple[OwnTables, list[str], asyncio.Task[None]]:
    woken: list[str] = []
    tables = OwnTables(woken.append)
    tables.roots[(namespace, ROOT)] = f"PartitionSet/{namespace}/demo"
    watches = own_tables.follow(tables, client, scope)
    task = asyncio.create_task(own_tables.run(watches))
    await asyncio.wait_for(asyncio.gather(*(w.synced.wait() for w in watches)), 10)
    return tables, woken, task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_edit_a_deletion_and_a_chunk_deletion_each_wake_the_set(server) -> None:
    api, client = server
    root = table(api, ROOT, "root")
    table(api, f"{ROOT}-1", "chunk")
    tables, woken, task = await following(client)
    assert tables.changed(KEY, root["metadata"]["resourceVersion"]) is False  # as listed

    edited = table(api, ROOT, "root")  # someone else's write
    await eventually(lambda: KEY in tables.versions)
    assert tables.changed(KEY, root["metadata"]["resourceVersion"]) is True
    assert tables.changed(KEY, edited["metadata"]["resourceVersion"]) is False  # taken

    table(api, f"{ROOT}-1", "chunk")  # chunks are announced by their root: nothing
    api.delete("configmaps", "ns", f"{ROOT}-1")
    await eventually(lambda: KEY in tables.versions)
    assert tables.versions[KEY] == TABLE_REREAD

    api.delete("configmaps", "ns", ROOT)
    await eventually(lambda: tables.versions.get(KEY, TABLE_REREAD) is None)
    assert set(woken) == {KEY}
    await stopped(task)


async def test_a_root_deleted_while_nobody_watched_wakes_its_set_after_the_relist(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)
    api, client = server
    root = table(api, ROOT, "root")
    tables, woken, task = await following(client)
    tables.changed(KEY, root["metadata"]["resourceVersion"])
    await eventually(lambda: bool(api._streams))
    api.drop()
    api.delete("configmaps", "ns", ROOT)
    api.compact()  # the deletion is compacted away: only a relist can tell
    await eventually(lambda: tables.versions.get(KEY, "") is None)
    assert woken[-1] == KEY
    await stopped(task)


async def test_tables_outside_the_scope_wake_nobody(server) -> None:
    api, client = server
    _, woken, task = await following(client, scope=("team-*",), namespace="team-a")
    before = len(woken)  # the first list lacked team-a's root: a wake-up to read it
    table(api, ROOT, "root")  # namespace "ns" is not served
    table(api, ROOT, "root", namespace="team-a")  # delivered after it: the watch keeps order
    await eventually(lambda: len(woken) > before)
    assert set(woken) == {"PartitionSet/team-a/demo"}
    await stopped(task)
