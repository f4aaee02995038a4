"""The director's table watch against a scripted API server on loopback
(tests/unit/fake_apiserver.py): list, then watch from the list's version; a watch answered 410
Gone lists again, which also drops tables deleted meanwhile; malformed tables are skipped and
the last good one stays. (The real API server: tests/e2e/test_graintype.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apportion import listwatch
from apportion.api.placement_table import to_configmap
from apportion.grains import PlacementDirector
from tests.support.present import present
from tests.unit.fake_apiserver import FakeApiServer, serving
from tests.unit.test_director import table


def cm(name: str, version: int, strategy: str = "PreferLocal") -> dict[str, Any]:
    return to_configmap(table(name, {"name": strategy}, version=version))


def put(server: FakeApiServer, body: dict[str, Any]) -> None:
    server.put_object("configmaps", {**body, "metadata": {**body["metadata"], "namespace": "shop"}})


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)


async def test_list_then_watch_then_relist_after_gone() -> None:
    async with serving() as (server, client):
        put(server, cm("carts", 1))
        put(server, cm("orders", 1))
        server.put("configmaps", "shop", "unrelated", {"app": "x"}, data={})
        director = PlacementDirector("w-0")
        await director.start("shop", client)
        try:
            assert set(director.tables()) == {"carts", "orders"}
            put(server, cm("carts", 2, "SiloRoleBased"))
            broken = cm("carts", 3)
            broken["data"]["placement.json"] = "{not json"
            put(server, broken)
            await director.wait_for_table("carts", min_version=2, timeout=5)
            table = present(director.table_for("carts"), "carts' table")
            assert table.strategy.name == "SiloRoleBased"
            # While the watch is down "orders" is deleted and the history compacted: the
            # resumed watch is answered 410 Gone, and the relist drops "orders".
            server.watching.clear()
            server.drop()
            server.delete("configmaps", "shop", cm("orders", 1)["metadata"]["name"])
            put(server, cm("carts", 4))
            server.compact()
            await director.wait_for_table("carts", min_version=4, timeout=5)
            assert set(director.tables()) == {"carts"}
            lists = server.full_lists()
            assert len(lists) == 2
            assert {r.params["labelSelector"] for r in lists} == {
                "apportion.dev/placement-table=true"
            }
        finally:
            await director.stop()


async def test_deleted_event_removes_the_table_and_waiters_time_out() -> None:
    async with serving() as (server, client):
        put(server, cm("carts", 1))
        director = PlacementDirector("w-0")
        await director.start("shop", client)
        try:
            server.delete("configmaps", "shop", cm("carts", 1)["metadata"]["name"])
            for _ in range(500):
                if not director.tables():
                    break
                await asyncio.sleep(0.01)
            assert director.tables() == {}
            with pytest.raises(TimeoutError):
                await director.wait_for_table("carts", timeout=0.1)
        finally:
            await director.stop()
