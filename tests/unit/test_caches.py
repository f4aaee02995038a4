"""The caches of selected pods (`controllers.caches`): what is kept, whom an event wakes,
and that no deleted pod lingers, against a scripted API server on loopback
(tests/unit/fake_apiserver.py: list, watch, label and field selectors, 410 Gone)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from apportion import listwatch
from apportion.api.common import LabelSelector
from apportion.api.pods import WorkerPod
from apportion.controllers.caches import SelectedCache, Want
from tests.unit.fake_apiserver import FakeApiServer, serving


def selector(**labels: str) -> LabelSelector:
    return LabelSelector(match_labels=labels)


def pod_body_fact(body: Any) -> WorkerPod:
    return WorkerPod.from_body({**body, "status": {}})


@pytest_asyncio.fixture(loop_scope="function")  # the test's loop serves and reads
async def server() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    async with serving() as running:
        yield running


def put(server: FakeApiServer, name: str, labels: dict[str, str]) -> None:
    server.put("pods", "ns", name, labels)


async def started(
    running: tuple[FakeApiServer, Any],
) -> tuple[SelectedCache[WorkerPod], list[str]]:
    _, client = running
    woken: list[str] = []
    cache = SelectedCache("pods", "Pod", "", pod_body_fact, client, woken.append)
    await cache.start()
    return cache, woken


async def eventually(done: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not done():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), 10)


def names(cache: SelectedCache[WorkerPod]) -> set[str]:
    return {pod.name for pod in cache.get("ns", ())}


def read_by(cache: SelectedCache[WorkerPod], key: str) -> set[str]:
    """What set `key` reads: its own view, not the namespace's."""
    return {pod.name for pod in cache.selected("ns", key)}


def label_lists(server: FakeApiServer) -> list[dict[str, str]]:
    """The selectors of the LISTs after the cache's first (every pod of every namespace)."""
    lists = server.full_lists()
    assert lists[0].namespace is None
    assert "labelSelector" not in lists[0].params
    return [
        {k: v for k, v in r.params.items() if k in ("labelSelector", "fieldSelector")}
        for r in lists[1:]
    ]


async def test_only_selected_pods_are_kept_and_only_their_sets_woken(server) -> None:
    api, _ = server
    for i in range(3):
        put(api, f"w-{i}", {"app": "w"})
    for i in range(50):
        put(api, f"other-{i}", {"app": "other"})
    cache, woken = await started(server)
    assert cache.kept() == 0  # nobody wants anything yet
    await cache.want("A", Want("ns", (selector(app="w"),)))
    assert names(cache) == {"w-0", "w-1", "w-2"}
    assert label_lists(api) == [{"labelSelector": "app=w"}]  # filled by a filtered LIST
    await cache.want("B", Want("ns", (selector(app="x"),)))

    put(api, "other-0", {"app": "other", "touched": "yes"})
    put(api, "w-3", {"app": "w"})
    await eventually(lambda: "w-3" in names(cache))  # the watch delivers in order
    assert names(cache) == {"w-0", "w-1", "w-2", "w-3"}
    assert woken == ["A"]  # the unrelated pod woke nobody

    assert read_by(cache, "A") == {"w-0", "w-1", "w-2", "w-3"}
    assert read_by(cache, "B") == set()

    put(api, "w-1", {"app": "x"})  # moves from A's selection to B's: both wake
    await eventually(lambda: len(woken) == 3)
    assert sorted(woken[1:]) == ["A", "B"]
    assert read_by(cache, "A") == {"w-0", "w-2", "w-3"}
    assert read_by(cache, "B") == {"w-1"}
    await cache.want("B", Want("ns", (selector(app="w"),)))  # a new want sees what is kept
    assert read_by(cache, "B") == {"w-0", "w-2", "w-3"}
    api.delete("pods", "ns", "w-2")
    await eventually(lambda: "w-2" not in names(cache))
    assert read_by(cache, "A") == read_by(cache, "B") == {"w-0", "w-3"}
    cache.forget("B", "ns")
    assert read_by(cache, "B") == set()
    assert read_by(cache, "A") == {"w-0", "w-3"}
    await cache.stop()


async def test_owners_stay_visible_after_their_labels_stop_matching(server) -> None:
    api, _ = server
    put(api, "w-0", {"app": "w"})
    put(api, "w-1", {"app": "w"})
    cache, woken = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),), frozenset({"w-0"})))
    put(api, "w-0", {"app": "retired"})
    put(api, "w-1", {"app": "retired"})
    await eventually(lambda: len(woken) == 2)
    assert names(cache) == {"w-0"}  # w-1 owned nothing: dropped
    assert read_by(cache, "A") == {"w-0"}
    assert woken == ["A", "A"]
    await cache.want("A", Want("ns", (selector(app="w"),)))  # w-0 handed its units off
    assert names(cache) == set()
    await cache.stop()


async def test_an_owner_unselected_while_the_operator_was_away_is_fetched_by_name(
    server,
) -> None:
    api, _ = server
    put(api, "w-0", {"app": "retired"})
    cache, _ = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),), frozenset({"w-0", "gone"})))
    assert names(cache) == {"w-0"}
    assert {"fieldSelector": "metadata.name=gone"} in label_lists(api)
    await cache.stop()


async def test_a_relist_after_410_drops_pods_deleted_meanwhile_and_wakes_their_sets(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch drops, w-1 is deleted and the history compacted before it resumes: the
    server answers 410 Gone, and the relist replaces what the cache keeps."""
    monkeypatch.setattr(listwatch, "RETRY_MIN", 0.01)
    api, _ = server
    put(api, "w-0", {"app": "w"})
    put(api, "w-1", {"app": "w"})
    cache, woken = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),)))
    await eventually(lambda: bool(api._streams))
    api.drop()
    api.delete("pods", "ns", "w-1")
    api.compact()
    await eventually(lambda: cache.relists == 1)
    assert names(cache) == {"w-0"}
    assert woken == ["A"]
    await cache.stop()


async def test_a_deletion_seen_during_a_fill_is_not_undone_by_the_fill(server) -> None:
    api, _ = server
    put(api, "w-0", {"app": "w"})
    put(api, "w-1", {"app": "w"})
    cache, _ = await started(server)

    async def deleted_while_listing() -> None:
        # The LIST has its answer (both pods); w-1 goes before the answer is sent, and the
        # watch reports it first.
        api.before_list_returns = None
        api.delete("pods", "ns", "w-1")
        await eventually(lambda: bool(cache._deleted))

    api.before_list_returns = deleted_while_listing
    await cache.want("A", Want("ns", (selector(app="w"),)))
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


async def test_a_restore_from_backup_puts_back_the_older_pods(server) -> None:
    """etcd restored from a backup: the pods come back as they were, under versions older than
    the ones held. The relist that follows replaces what is held: a drain mark set after the
    backup is gone, a pod created after it too, and the sets are woken."""
    api, _ = server
    put(api, "w-0", {"app": "w"})
    put(api, "w-1", {"app": "w"})
    cache, woken = await started(server)
    await cache.want("A", Want("ns", (selector(app="w"),)))
    backup = api.backup()
    put(api, "w-1", {"app": "w", "zone": "b"})
    put(api, "w-2", {"app": "w"})
    await eventually(lambda: names(cache) == {"w-0", "w-1", "w-2"})
    woken.clear()
    api.restore(backup)
    await eventually(lambda: labels(cache) == {"w-0": {"app": "w"}, "w-1": {"app": "w"}})
    assert "A" in woken
    await cache.stop()


def labels(cache: SelectedCache[WorkerPod]) -> dict[str, dict[str, str]]:
    return {pod.name: dict(pod.labels) for pod in cache.get("ns", ())}
