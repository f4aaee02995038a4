"""The list-then-watch primitive (`apportion.listwatch.ListWatch`) against a scripted API server
on loopback (tests/unit/fake_apiserver.py): what it asks for, where it resumes, when it lists
again. The oracle is the server's own state: after any fault, what the user holds is exactly
what the server holds, each change delivered once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube.resources.core_v1 import ConfigMap

from apportion import listwatch
from apportion.listwatch import EventType, ListWatch, Selection, Timing
from tests.unit.fake_apiserver import FakeApiServer, serving


@dataclass(frozen=True)
class Table:
    name: str
    value: str
    version: int


def decode(raw: dict[str, Any]) -> Table:
    meta = raw["metadata"]
    return Table(meta["name"], (raw.get("data") or {}).get("v", ""), int(meta["resourceVersion"]))


class Store:
    """A user with replace semantics: a list replaces everything held."""

    def __init__(self) -> None:
        self.held: dict[str, Table] = {}
        self.events: list[tuple[str, str, str]] = []
        self.lists = 0
        self.restarts: list[str] = []
        self.changed = asyncio.Event()

    async def on_list(self, items: AsyncIterator[Table]) -> None:
        self.held = {t.name: t async for t in items}
        self.lists += 1
        self.changed.set()

    async def on_event(self, kind: EventType, table: Table) -> None:
        self.events.append((kind, table.name, table.value))
        if kind == "DELETED":
            self.held.pop(table.name, None)
        else:
            self.held[table.name] = table
        self.changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        async def wait() -> None:
            while not done():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), 10)


def put(server: FakeApiServer, name: str, value: str, ns: str = "ns", **labels: str) -> None:
    server.put("configmaps", ns, name, {"app": "t", **labels}, data={"v": value})


def truth(server: FakeApiServer) -> dict[str, str]:
    return {
        name: body["data"]["v"]
        for (_, ns, name), body in server.objects.items()
        if ns == "ns" and body["metadata"]["labels"].get("app") == "t"
    }


def values(store: Store) -> dict[str, str]:
    return {name: t.value for name, t in store.held.items()}


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)


async def running(
    server: FakeApiServer, client: Any, store: Store, **options: Any
) -> tuple[ListWatch[Table], asyncio.Task[None]]:
    watch = ListWatch(
        client,
        ConfigMap,
        "ns",
        decode=decode,
        on_list=store.on_list,
        on_event=store.on_event,
        selection=Selection(labels={"app": "t"}),
        on_restart=store.restarts.append,
        **options,
    )
    task = asyncio.create_task(watch.run())
    await asyncio.wait_for(watch.synced.wait(), 10)
    await asyncio.wait_for(server.watching.wait(), 10)
    server.watching.clear()
    return watch, task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def reconnected(server: FakeApiServer, fault: Callable[[], Awaitable[None] | None]) -> None:
    """Run `fault` while a watch is open, then wait until a watch is open again."""
    result = fault()
    if result is not None:
        await result
    await asyncio.wait_for(server.watching.wait(), 10)
    server.watching.clear()


async def test_lists_in_pages_then_watches_from_the_lists_version_with_bookmarks() -> None:
    async with serving() as (server, client):
        for i in range(5):
            put(server, f"t-{i}", "a")
        put(server, "other", "a", app="x")  # not selected
        store = Store()
        watch, task = await running(server, client, store, timing=Timing(page=2))
        try:
            assert values(store) == truth(server)
            lists = server.requested("list")
            assert [r.params.get("limit") for r in lists] == ["2", "2", "2"]
            assert all(r.params["labelSelector"] == "app=t" for r in lists)
            [opened] = server.requested("watch")
            assert opened.params["resourceVersion"] == str(server.version)
            assert opened.params["allowWatchBookmarks"] == "true"
            put(server, "t-1", "b")
            server.delete("configmaps", "ns", "t-2")
            await store.until(lambda: len(store.events) == 2)
            assert store.events == [("MODIFIED", "t-1", "b"), ("DELETED", "t-2", "a")]
            assert values(store) == truth(server)
            assert watch.relists == 0
        finally:
            await stopped(task)


async def test_a_dropped_watch_resumes_from_the_last_version_seen() -> None:
    async with serving() as (server, client):
        put(server, "t-0", "a")
        store = Store()
        watch, task = await running(server, client, store)
        try:
            put(server, "t-0", "b")
            await store.until(lambda: len(store.events) == 1)
            seen = server.version

            def cut_then_write() -> None:
                server.drop()
                put(server, "t-1", "c")  # while no watch is open

            await reconnected(server, cut_then_write)
            await store.until(lambda: len(store.events) == 2)
            assert store.events == [("MODIFIED", "t-0", "b"), ("ADDED", "t-1", "c")]  # once each
            assert server.requested("watch")[-1].params["resourceVersion"] == str(seen)
            assert len(server.full_lists()) == 1
            assert watch.relists == 0
            assert store.restarts == ["error"]
            assert values(store) == truth(server)
        finally:
            await stopped(task)


async def test_a_bookmark_advances_the_version_a_watch_resumes_from() -> None:
    """Only unselected objects change, then the server compacts its history: the bookmark's
    version is still served, the last selected event's version is not."""
    async with serving() as (server, client):
        put(server, "t-0", "a")
        store = Store()
        watch, task = await running(server, client, store)
        try:
            for i in range(3):
                put(server, f"other-{i}", "x", app="x")
            server.bookmark()
            await asyncio.wait_for(_until(lambda: watch.version == str(server.version)), 10)
            server.compact()
            await reconnected(server, server.drop)
            assert server.requested("watch")[-1].params["resourceVersion"] == str(server.version)
            assert len(server.full_lists()) == 1
            assert watch.relists == 0
            assert store.restarts == ["error"]
        finally:
            await stopped(task)


@pytest.mark.parametrize("in_stream", [False, True], ids=["http-410", "error-event-410"])
async def test_gone_lists_again_and_the_list_replaces_what_was_held(in_stream: bool) -> None:
    """While the watch is down an object is deleted, another changed, a third added, and the
    history compacted: the resumed watch is answered 410 Gone (an HTTP answer, or an ERROR
    event inside the stream), and the relist's view replaces the user's."""
    async with serving() as (server, client):
        server.gone_in_stream = in_stream
        for name in ("t-0", "t-1", "t-2"):
            put(server, name, "a")
        store = Store()
        watch, task = await running(server, client, store)
        try:

            def gap() -> None:
                server.drop()
                server.delete("configmaps", "ns", "t-1")
                put(server, "t-2", "b")
                put(server, "t-3", "c")
                server.compact()

            await reconnected(server, gap)
            await store.until(lambda: store.lists == 2)
            assert values(store) == truth(server) == {"t-0": "a", "t-2": "b", "t-3": "c"}
            assert watch.relists == 1
            assert store.restarts == ["error", "expired"]
            assert server.requested("watch")[-1].params["resourceVersion"] == str(server.version)
            put(server, "t-0", "d")  # and the new watch delivers
            await store.until(lambda: store.held["t-0"].value == "d")
        finally:
            await stopped(task)


async def test_a_store_restored_from_a_backup_is_listed_again() -> None:
    """etcd restored from a backup taken before two changes: the server's versions go back, and
    a watch from the version the client saw would stay silent (the real API server's answer)
    while the restored objects differ. Before resuming, the client asks for a list not older
    than its version, is told 504 ResourceVersionTooLarge, and lists again."""
    async with serving() as (server, client):
        put(server, "t-0", "a")
        put(server, "t-1", "a")
        store = Store()
        watch, task = await running(server, client, store)
        try:
            backup = server.backup()
            put(server, "t-0", "b")
            put(server, "t-2", "c")
            await store.until(lambda: len(store.events) == 2)
            await reconnected(server, lambda: server.restore(backup))
            await store.until(lambda: store.lists == 2)
            assert values(store) == truth(server) == {"t-0": "a", "t-1": "a"}
            assert store.restarts == ["error", "rewound"]
            assert watch.relists == 1
            checked = [r for r in server.requested("list") if "resourceVersionMatch" in r.params]
            assert [r.params["resourceVersionMatch"] for r in checked] == ["NotOlderThan"]
            assert int(checked[0].params["resourceVersion"]) > server.version
            put(server, "t-1", "d")  # and the new watch delivers
            await store.until(lambda: store.held["t-1"].value == "d")
        finally:
            await stopped(task)


async def test_a_silent_watch_is_given_up_and_resumed_from_its_version() -> None:
    async with serving() as (server, client):
        put(server, "t-0", "a")
        store = Store()
        watch, task = await running(server, client, store, timing=Timing(silence_timeout=0.2))
        try:
            # The server's next watch is silent too: the loop keeps resuming, never relists.
            await asyncio.wait_for(server.watching.wait(), 10)
            assert store.restarts
            assert set(store.restarts) == {"silent"}
            assert {r.params["resourceVersion"] for r in server.requested("watch")} == {
                str(server.version)
            }
            assert len(server.full_lists()) == 1
            assert watch.relists == 0
        finally:
            await stopped(task)


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.01)
