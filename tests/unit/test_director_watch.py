"""The director's table watch against a scripted client: list, then watch from the list's
version; a failed watch lists again, which also drops tables deleted meanwhile; malformed tables
are skipped and the last good one stays. (The real API server: tests/e2e/test_graintype.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apportion.api.placement_table import to_configmap
from apportion.grains import PlacementDirector
from tests.unit.test_director import table


class Listing:
    def __init__(self, items: list[dict[str, Any]], version: str) -> None:
        self.items = items
        self.resourceVersion = version

    async def __aiter__(self):
        for item in self.items:
            yield item


class ScriptedClient:
    """`list` answers with the current objects; each `watch` plays the next script: events,
    then an exception (or waits forever when the script ends with None)."""

    def __init__(self, objects: dict[str, dict[str, Any]], scripts: list[list[Any]]) -> None:
        self.objects = objects
        self.scripts = scripts
        self.lists = 0
        self.watched_from: list[str | None] = []
        self.namespace = "shop"

    def list(self, resource: Any, **kw: Any) -> Listing:
        self.lists += 1
        return Listing(list(self.objects.values()), f"rv{self.lists}")

    async def watch(self, resource: Any, **kw: Any):
        self.watched_from.append(kw.get("resource_version"))
        script = self.scripts.pop(0) if self.scripts else [None]
        for step in script:
            if step is None:
                await asyncio.Event().wait()
            if isinstance(step, BaseException):
                raise step
            yield step


def cm(name: str, version: int, strategy: str = "PreferLocal") -> dict[str, Any]:
    return to_configmap(table(name, {"name": strategy}, version=version))


async def test_list_then_watch_then_relist_after_an_error() -> None:
    objects = {"carts": cm("carts", 1), "orders": cm("orders", 1)}
    broken = cm("carts", 3)
    broken["data"]["placement.json"] = "{not json"
    scripts = [
        [
            ("MODIFIED", cm("carts", 2, "SiloRoleBased")),
            ("MODIFIED", broken),
            ConnectionError("watch dropped"),
        ],
        [None],
    ]
    client = ScriptedClient(objects, scripts)
    director = PlacementDirector("w-0")
    await director.start("shop", client)  # type: ignore[arg-type]
    try:
        assert set(director.tables()) == {"carts", "orders"}
        await director.wait_for_table("carts", min_version=2, timeout=5)
        assert director.table_for("carts").strategy.name == "SiloRoleBased"
        # While the watch is down, "orders" is deleted: the relist drops it.
        del objects["orders"]
        objects["carts"] = cm("carts", 4)
        await director.wait_for_table("carts", min_version=4, timeout=5)
        assert set(director.tables()) == {"carts"}
        assert client.lists == 2 and client.watched_from == ["rv1", "rv2"]
    finally:
        await director.stop()


async def test_deleted_event_removes_the_table_and_waiters_time_out() -> None:
    objects = {"carts": cm("carts", 1)}
    client = ScriptedClient(objects, [[("DELETED", cm("carts", 1)), None]])
    director = PlacementDirector("w-0")
    await director.start("shop", client)  # type: ignore[arg-type]
    try:
        for _ in range(50):
            if not director.tables():
                break
            await asyncio.sleep(0.01)
        assert director.tables() == {}
        with pytest.raises(TimeoutError):
            await director.wait_for_table("carts", timeout=0.1)
    finally:
        await director.stop()
