"""The caches of selected pods (`controllers.caches`): what is kept, whom an event wakes,
and that no deleted pod lingers, against a scripted API server (list, watch, label filters)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from lightkube import ALL_NS
from lightkube.operators import Operator

from apportion.api.common import LabelSelector
from apportion.api.pods import WorkerPod
from apportion.controllers.caches import SelectedCache, Want


class Listing:
    def __init__(self, items: list[dict[str, Any]], version: str) -> None:
        self.items, self.resourceVersion = items, version

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async def each() -> AsyncIterator[dict[str, Any]]:
            for item in self.items:
                yield item

        return each()


class ApiServer:
    """Pods of one namespace; lists honour label equality and `metadata.name` (an operator in
    a label query lists a superset, as a key required twice does); every change goes to the
    open watch."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.watch_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.lists: list[dict[str, Any]] = []
        self.before_list_returns: Any = None

    def put(self, name: str, labels: dict[str, str], uid: str | None = None) -> None:
        self.version += 1
        uid = uid or f"uid-{name}"
        event = "MODIFIED" if uid in self.pods else "ADDED"
        self.pods[uid] = {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": uid,
                "labels": labels,
                "resourceVersion": str(self.version),
            }
        }
        self.watch_queue.put_nowait((event, self.pods[uid]))

    def delete(self, name: str, *, tell_watch: bool = True) -> None:
        self.version += 1
        uid = next(uid for uid, pod in self.pods.items() if pod["metadata"]["name"] == name)
        body = self.pods.pop(uid)
        body["metadata"]["resourceVersion"] = str(self.version)
        if tell_watch:
            self.watch_queue.put_nowait(("DELETED", body))

    def list(self, resource: Any, namespace: str | None, **query: Any) -> Listing:
        assert namespace in ("ns", ALL_NS)  # lightkube reads None as the client's namespace
        self.lists.append(query)
        labels = query.get("labels") or {}
        name = (query.get("fields") or {}).get("metadata.name")
        items = [
            pod
            for pod in self.pods.values()
            if (name is None or pod["metadata"]["name"] == name)
            and all(
                isinstance(v, Operator) or pod["metadata"]["labels"].get(k) == v
                for k, v in labels.items()
            )
        ]
        if self.before_list_returns is not None:
            self.before_list_returns()
        return Listing([dict(pod) for pod in items], str(self.version))

    async def watch(
        self, resource: Any, namespace: str | None, **_: Any
    ) -> AsyncIterator[tuple[str, Any]]:
        assert namespace == ALL_NS, "an operator without --namespace watches every namespace"
        while True:
            item = await self.watch_queue.get()
            if isinstance(item, Exception):
                raise item
            yield item


def selector(**labels: str) -> LabelSelector:
    return LabelSelector(match_labels=labels)


def pod_body_fact(body: Any) -> WorkerPod:
    return WorkerPod.from_body({**body, "status": {}})


async def started(server: ApiServer) -> tuple[SelectedCache[WorkerPod], list[str]]:
    woken: list[str] = []
    cache = SelectedCache("pods", "Pod", "", pod_body_fact, server, woken.append)  # type: ignore[arg-type]
    await cache.start()
    return cache, woken


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def names(cache: SelectedCache[WorkerPod]) -> set[str]:
    return {pod.name for pod in cache.get("ns", ())}


async def test_only_selected_pods_are_kept_and_only_their_sets_woken() -> None:
    server = ApiServer()
    for i in range(3):
        server.put(f"w-{i}", {"app": "w"})
    for i in range(50):
        server.put(f"other-{i}", {"app": "other"})
    cache, woken = await started(server)
    assert cache.kept() == 0  # nobody wants anything yet
    await cache.want("A", Want("ns", (selector(app="w"),)))
    assert names(cache) == {"w-0", "w-1", "w-2"}
    assert server.lists[-1] == {"labels": {"app": "w"}}  # filled by a filtered LIST
    await cache.want("B", Want("ns", (selector(app="x"),)))

    server.put("other-0", {"app": "other", "touched": "yes"})
    server.put("w-3", {"app": "w"})
    await settle()
    assert names(cache) == {"w-0", "w-1", "w-2", "w-3"}
    assert woken == ["A"]  # the unrelated pod woke nobody

    server.put("w-1", {"app": "x"})  # moves from A's selection to B's: both wake
    await settle()
    assert sorted(woken[1:]) == ["A", "B"]
    await cache.stop()


async def test_owners_stay_visible_after_their_labels_stop_matching() -> None:
    server = ApiServer()
    server.put("w-0", {"app": "w"})
    server.put("w-1", {"app": "w"})
    cache, woken = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),), frozenset({"w-0"})))
    server.put("w-0", {"app": "retired"})
    server.put("w-1", {"app": "retired"})
    await settle()
    assert names(cache) == {"w-0"}  # w-1 owned nothing: dropped
    assert woken == ["A", "A"]
    await cache.want("A", Want("ns", (selector(app="w"),)))  # w-0 handed its units off
    assert names(cache) == set()
    await cache.stop()


async def test_an_owner_unselected_while_the_operator_was_away_is_fetched_by_name() -> None:
    server = ApiServer()
    server.put("w-0", {"app": "retired"})
    cache, _ = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),), frozenset({"w-0", "gone"})))
    assert names(cache) == {"w-0"}
    assert {"fields": {"metadata.name": "gone"}} in server.lists
    await cache.stop()


async def test_a_relist_after_a_broken_watch_drops_pods_deleted_meanwhile() -> None:
    server = ApiServer()
    server.put("w-0", {"app": "w"})
    server.put("w-1", {"app": "w"})
    cache, woken = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),)))
    server.delete("w-1", tell_watch=False)  # the watch never hears of it
    server.watch_queue.put_nowait(ConnectionError("dropped"))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if cache.relists and names(cache) == {"w-0"}:
            break
    assert names(cache) == {"w-0"}
    assert "A" in woken
    await cache.stop()


async def test_a_deletion_seen_during_a_fill_is_not_undone_by_the_fill() -> None:
    server = ApiServer()
    server.put("w-0", {"app": "w"})
    server.put("w-1", {"app": "w"})
    cache, _ = await started(server)

    def deleted_while_listing() -> None:
        # The LIST has its answer (both pods); w-1 goes before the answer is handled, and the
        # watch reports it first.
        server.before_list_returns = None
        server.delete("w-1")

    async def slow_fill() -> None:
        await cache.want("A", Want("ns", (selector(app="w"),)))

    server.before_list_returns = deleted_while_listing
    original = server.list

    def list_then_yield(resource: Any, namespace: str | None, **query: Any) -> Any:
        listing = original(resource, namespace, **query)

        class Slow(Listing):
            def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
                async def each() -> AsyncIterator[dict[str, Any]]:
                    await settle()  # the watch delivers the deletion now
                    for item in listing.items:
                        yield item

                return each()

        return Slow(listing.items, listing.resourceVersion)

    server.list = list_then_yield  # type: ignore[method-assign]
    await slow_fill()
    assert names(cache) == {"w-0"}
    await cache.stop()


def test_a_want_is_filed_under_one_label_pair_and_lists_by_all() -> None:
    both = Want("ns", (selector(app="w"), selector(tier="a")))
    assert both.buckets() == [("app", "w")]
    assert both.query() == {"app": "w", "tier": "a"}
    assert both.matches("x", {"app": "w", "tier": "a"})
    assert not both.matches("x", {"app": "w"})
    assert Want("ns", names=frozenset({"x"})).query() is None
    assert Want("ns", names=frozenset({"x"})).matches("x", {})
