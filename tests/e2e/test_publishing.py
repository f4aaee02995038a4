"""The conditional ConfigMap write that fences two operator replicas, against the real API
server (issue 10): `write_conditionally`, `AssignmentStore` (plain and chunked tables) and what
`load` makes of a table that is gone, garbled or missing a chunk."""

from __future__ import annotations

import functools
import json
import random

import pytest
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    ResourceRef,
    UnitState,
    assignment_config_map,
    encode_assignment,
)
from apportion.publishing import configmaps
from apportion.publishing.configmaps import AssignmentStore, PublishConflict

MEMBERS = (Incarnation("a", "uid-a"), Incarnation("b", "uid-b"))


def table(ref: ResourceRef, epoch: int, count: int = 8) -> AssignmentTable:
    rng = random.Random(epoch)  # owners and unit epochs that do not compress away
    units = {
        str(u): UnitState(rng.choice(MEMBERS).name, rng.randint(0, epoch)) for u in range(count)
    }
    return AssignmentTable(ref, 1, "akka", count, epoch, MEMBERS, units)


def real_set(kubectl, namespace: str, name: str) -> ResourceRef:
    """A ShardSet that exists, as the owner of its tables: the garbage collector deletes a
    ConfigMap whose owner reference names no object, and would race these tests."""
    body = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ShardSet",
        "metadata": {"name": name},
        "spec": {"shards": 8, "selector": {"matchLabels": {"app": "nobody"}}},
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    uid = kubectl("get", "-n", namespace, "shardset", name, "-o", "jsonpath={.metadata.uid}")
    return ResourceRef("ShardSet", namespace, name, uid.stdout.strip())


@pytest.fixture
def client(dev_cluster) -> AsyncClient:
    # Made per test, on the test's own event loop; the process ends the connections.
    return AsyncClient(KubeConfig.from_file(dev_cluster.kubeconfig), trust_env=False)


async def test_two_writers_one_wins_and_the_other_rereads(client, namespace, kubectl, crds) -> None:
    ref = real_set(kubectl, namespace, "fenced")
    name = assignment_config_map("ShardSet", "fenced")
    leader, standby = AssignmentStore(client, ref, name), AssignmentStore(client, ref, name)
    assert (await leader.load()).table is None
    assert (await standby.load()).table is None
    await leader.publish(table(ref, 1))
    # The standby read "absent" before the leader's create: its create must not overwrite.
    with pytest.raises(PublishConflict):
        await standby.publish(table(ref, 1))
    assert (await standby.load()).table == table(ref, 1)
    await standby.publish(table(ref, 2))
    # The leader's read is now stale: its replace carries the old resourceVersion.
    with pytest.raises(PublishConflict):
        await leader.publish(table(ref, 2))
    assert (await leader.load()).table == table(ref, 2)


async def test_a_chunked_table_round_trips_and_a_missing_chunk_is_reported(
    client, namespace, kubectl, monkeypatch, crds
) -> None:
    # Chunks of 4 KiB instead of 768 KiB: the same code path with a table of a few thousand
    # units instead of one too big to write quickly.
    small_chunks = functools.partial(encode_assignment, inline_limit=1024, chunk_limit=4096)
    monkeypatch.setattr(configmaps, "encode_assignment", small_chunks)
    ref = real_set(kubectl, namespace, "big")
    name = assignment_config_map("ShardSet", "big")
    store = AssignmentStore(client, ref, name)
    assert (await store.load()).table is None
    big = table(ref, 3000, count=5000)
    await store.publish(big)
    assert (await AssignmentStore(client, ref, name).load()).table == big
    chunks = json.loads(
        kubectl(
            "get", "configmap", "-n", namespace, "-l", "apportion.dev/part=chunk", "-o", "json"
        ).stdout
    )["items"]
    assert len(chunks) > 1, "the table is chunked"
    kubectl("delete", "configmap", "-n", namespace, chunks[0]["metadata"]["name"])
    loaded = await AssignmentStore(client, ref, name).load()
    assert loaded.table is None
    assert "incomplete" in (loaded.unreadable or "")


async def test_gone_garbled_and_foreign_tables(client, namespace, kubectl, crds) -> None:
    ref = real_set(kubectl, namespace, "carts")
    name = assignment_config_map("ShardSet", "carts")
    store = AssignmentStore(client, ref, name)
    await store.load()
    await store.publish(table(ref, 4))
    patch = {"data": {"assignments.json": "{this is not json"}}
    kubectl("patch", "-n", namespace, "configmap", name, "--type=merge", "-p", json.dumps(patch))
    garbled = await store.load()
    assert garbled.table is None
    assert "not JSON" in (garbled.unreadable or "")
    # The version of the garbled object is remembered: the repair replaces exactly it.
    await store.publish(table(ref, 5))
    assert (await store.load()).table == table(ref, 5)
    kubectl("delete", "-n", namespace, "configmap", name)
    assert await store.load() == type(garbled)(None)
    # A table left by another set under this name (an earlier set of the same name) is not
    # this set's.
    earlier = real_set(kubectl, namespace, "other")
    await AssignmentStore(client, earlier, name).publish(table(earlier, 9))
    assert (await store.load()).table is None
